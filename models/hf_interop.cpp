#include "models/hf_interop.h"

#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "core/atomic_file.h"
#include "core/error.h"
#include "models/registry.h"
#include "tensor/ops.h"
#include "tensor/safetensors.h"

namespace strata::models {

namespace {

namespace fs = std::filesystem;
using tensor::SafetensorsEntry;
using tensor::SafetensorsReader;
using tensor::Shape;
using tensor::Tensor;

const ModelRegistry& registry_or_global(const ModelRegistry* registry) {
  return registry ? *registry : ModelRegistry::global();
}

// A JSON object from `path`; strata::user_error naming it when unreadable or not an object.
nlohmann::json read_json_object(const std::string& path, std::string_view what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) user_error("{}: cannot open for reading", path);
  std::stringstream ss;
  ss << in.rdbuf();
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(ss.str());
  } catch (const nlohmann::json::exception& e) {
    user_error("{}: not valid JSON ({})", path, e.what());
  }
  if (!j.is_object()) user_error("{}: expected a JSON object of {}", path, what);
  return j;
}

// The tensors of a checkpoint: one safetensors file, or the shards an index names
// (model.safetensors.index.json, as save_pretrained writes for large models).
struct HfFiles {
  std::string path;  // the file or the index: what messages about the whole checkpoint name
  std::vector<std::unique_ptr<SafetensorsReader>> readers;
  struct Item {
    const SafetensorsReader* reader;
    const SafetensorsEntry* entry;
  };
  std::vector<Item> items;  // shard by shard, each in file order
};

HfFiles open_hf_files(const std::string& path_in) {
  HfFiles files;
  files.path = path_in;
  if (fs::is_directory(path_in)) {
    const fs::path dir(path_in), index = dir / "model.safetensors.index.json";
    files.path = (dir / "model.safetensors").string();
    if (!fs::exists(files.path) && fs::exists(index)) files.path = index.string();
  }
  if (!files.path.ends_with(".index.json")) {
    files.readers.push_back(std::make_unique<SafetensorsReader>(files.path));
  } else {
    const nlohmann::json index = read_json_object(files.path, "a sharded checkpoint's index");
    auto wm = index.find("weight_map");
    if (wm == index.end() || !wm->is_object() || wm->empty())
      user_error("{}: no \"weight_map\" of tensor names to shard files", files.path);
    std::map<std::string, std::string> file_of;  // tensor -> shard file name
    std::map<std::string, size_t> shards;        // shard file name -> reader
    for (auto& [name, v] : wm->items()) {
      if (!v.is_string())
        user_error("{}: weight_map['{}'] is {}, expected a file name", files.path, name, v.dump());
      const std::string f = v.get<std::string>();
      if (f.empty() || f.find('/') != std::string::npos || f == "." || f == ".." ||
          !f.ends_with(".safetensors"))
        user_error(
            "{}: weight_map['{}'] is \"{}\", expected a .safetensors file beside the "
            "index",
            files.path, name, f);
      file_of[name] = f;
      if (!shards.contains(f)) {
        const std::string shard = (fs::path(files.path).parent_path() / f).string();
        std::error_code ec;
        if (!fs::is_regular_file(shard, ec))
          user_error("{}: weight_map puts '{}' in {}, which is not a file ({})", files.path, name,
                     f, shard);
        shards[f] = files.readers.size();
        files.readers.push_back(std::make_unique<SafetensorsReader>(shard));
      }
    }
    for (auto& [name, f] : file_of)
      if (!files.readers[shards.at(f)]->contains(name))
        user_error("{}: weight_map puts '{}' in {}, which has no such tensor", files.path, name, f);
    for (auto& [f, k] : shards)
      for (const SafetensorsEntry& e : files.readers[k]->entries()) {
        auto it = file_of.find(e.name);
        if (it == file_of.end() || it->second != f)
          user_error("{}: tensor '{}' is not in {}'s weight_map{}", files.readers[k]->path(),
                     e.name, files.path,
                     it == file_of.end() ? "" : " for this file (it says " + it->second + ")");
      }
  }
  for (const auto& r : files.readers) {
    // Strata's own files hold the same names in Strata's layouts; loading one as HF's would
    // permute LLaMA's q/k rows with every shape still matching.
    auto format = r->metadata().find("format");
    if (format != r->metadata().end() && format->second == "strata")
      user_error(
          "{}: a Strata checkpoint file (metadata format \"strata\": Strata's layouts, not "
          "Hugging Face's); resume its checkpoint with training.resume, or write a Hugging Face "
          "directory with `convert --checkpoint DIR --to-hf OUT` and start from that",
          r->path());
    for (const SafetensorsEntry& e : r->entries()) files.items.push_back({r.get(), &e});
  }
  return files;
}

// config.json's model_type, when it has one, is the mapping's; another registered family's is
// named as such.
void check_model_type(const ModelRegistry& registry, const HfMapping& mapping,
                      const nlohmann::json& config, const std::string& path) {
  auto it = config.find("model_type");
  if (it == config.end() || it->is_null()) return;
  if (!it->is_string())
    user_error("{}: config.json field 'model_type' is {}, expected a string", path, it->dump());
  const std::string type = it->get<std::string>();
  if (type == mapping.model_type()) return;
  for (const HfMapping* other : registry.hf_mappings())
    if (other->model_type() == type)
      user_error(
          "{}: model_type is \"{}\": a {} checkpoint, but the model is {}-family: choose a "
          "{}-family model.name to load it",
          path, type, other->display_name(), mapping.family(), other->family());
  user_error(
      "{}: model_type is \"{}\", not a {} checkpoint (\"{}\"), which the {}-family model "
      "needs",
      path, type, mapping.display_name(), mapping.model_type(), mapping.family());
}

// When `files` lack `mapping`'s marker: the other registered family whose marker it has.
std::string other_family_hint(const ModelRegistry& registry, const HfMapping& mapping,
                              const HfFiles& files) {
  for (const HfMapping* other : registry.hf_mappings()) {
    if (other == &mapping) continue;
    for (const HfFiles::Item& t : files.items)
      if (other->strata_name(t.entry->name) == other->marker())
        return fmt::format(
            "; it is a {} checkpoint (it has '{}'), but the model is {}-family: choose a "
            "{}-family model.name to load it",
            other->display_name(), t.entry->name, mapping.family(), other->family());
  }
  if (files.items.empty()) return " and no tensors at all";
  return fmt::format("; its first tensor is '{}'", files.items.front().entry->name);
}

}  // namespace

namespace {

// What load_hf writes, validated: each parameter's tensor in the files and how it converts.
struct HfLoadPlan {
  struct Copy {
    HfFiles::Item item;
    std::string name;  // the parameter's full name
    Variable param;
    HfTensor hf;
  };
  HfFiles files;
  std::vector<Copy> copies;
  int64_t vocab_size = 0;

  void write(const Copy& c) const {
    write_to(c, c.param.data());  // a view into the flat buffer: copy in place
  }
  // The parameter's values as write() gives them, into `dst` (the parameter's shape).
  void write_to(const Copy& c, Tensor dst) const {
    Tensor src = c.item.reader->read(c.item.entry->name);
    if (c.hf.from_hf) src = c.hf.from_hf(src);
    if (c.hf.vocab_rows && dst.size(0) > vocab_size) {
      dst.narrow(0, 0, vocab_size).copy_(src);
      dst.narrow(0, vocab_size, dst.size(0) - vocab_size).zero_();  // Note [Padded vocabulary]
    } else {
      dst.copy_(src);
    }
  }
};

std::shared_ptr<HfLoadPlan> plan_hf_load(CausalLM& model, const std::string& path_in,
                                         const ModelRegistry* registry_in);

}  // namespace

void load_hf(CausalLM& model, const std::string& path_in, const ModelRegistry* registry_in) {
  const std::shared_ptr<HfLoadPlan> plan = plan_hf_load(model, path_in, registry_in);
  for (const HfLoadPlan::Copy& c : plan->copies) plan->write(c);
}

std::function<void(const FlatUnit&)> hf_unit_loader(CausalLM& model, const std::string& path,
                                                    const ModelRegistry* registry) {
  std::shared_ptr<const HfLoadPlan> plan = plan_hf_load(model, path, registry);
  return [plan](const FlatUnit& unit) {
    const std::set<std::string> names(unit.names.begin(), unit.names.end());
    for (const HfLoadPlan::Copy& c : plan->copies)
      if (names.contains(c.name)) plan->write(c);
  };
}

HfShardReader hf_shard_reader(CausalLM& model, const std::string& path,
                              const ModelRegistry* registry) {
  std::shared_ptr<const HfLoadPlan> plan = plan_hf_load(model, path, registry);
  auto by_name = std::make_shared<std::map<std::string, size_t>>();
  for (size_t i = 0; i < plan->copies.size(); ++i) (*by_name)[plan->copies[i].name] = i;
  return [plan, by_name](const std::string& name, const nn::ShardSpec& spec, int rank, int size,
                         Tensor dst) {
    auto it = by_name->find(name);
    STRATA_CHECK(it != by_name->end(), "no parameter '{}' to read from {}", name, plan->files.path);
    const HfLoadPlan::Copy& c = plan->copies[it->second];
    const SafetensorsEntry& e = *c.item.entry;
    // A tensor stored in the parameter's layout: the slice's elements alone, converted to fp32
    // as write() converts them. The others (a layout transform, vocabulary padding) go whole.
    if (!c.hf.from_hf && !c.hf.vocab_rows && e.shape == c.param.shape()) {
      nn::read_shard(
          c.param.shape(), spec, rank, size,
          [&](int64_t begin, Tensor part) {
            if (e.dtype == DType::F32) {
              c.item.reader->read_into(e.name, part, static_cast<uint64_t>(begin));
              return;
            }
            Tensor raw = Tensor::empty({part.numel()}, e.dtype);
            c.item.reader->read_into(e.name, raw, static_cast<uint64_t>(begin));
            part.copy_(raw);
          },
          dst);
      return;
    }
    Tensor whole = Tensor::empty(c.param.shape());
    plan->write_to(c, whole);
    dst.copy_(nn::shard_of(whole, spec, rank, size).reshape({-1}));
  };
}

namespace {

std::shared_ptr<HfLoadPlan> plan_hf_load(CausalLM& model, const std::string& path_in,
                                         const ModelRegistry* registry_in) {
  const ModelRegistry& registry = registry_or_global(registry_in);
  const HfMapping& mapping = registry.hf_mapping(model.family(), path_in);

  // The config first: a mismatch there names the field, which tensor shapes cannot (heads).
  const fs::path dir =
      fs::is_directory(path_in) ? fs::path(path_in) : fs::path(path_in).parent_path();
  const std::string config_path = (dir / "config.json").string();
  std::error_code ec;
  if (fs::exists(config_path, ec)) {
    const nlohmann::json config = read_json_object(config_path, "model settings");
    check_model_type(registry, mapping, config, config_path);
    mapping.check_config_json(model, config, config_path);
  }

  auto plan = std::make_shared<HfLoadPlan>();
  plan->files = open_hf_files(path_in);
  const HfFiles& files = plan->files;
  const std::string& path = files.path;
  const std::optional<HfTiedHead> tied = mapping.tied_head(model);
  const std::optional<std::string> tied_name =
      tied ? mapping.strata_name(tied->hf_name) : std::nullopt;

  // File names -> Strata names; two spellings of one name (with and without prefix) are refused.
  using Item = HfFiles::Item;
  std::map<std::string, Item> by_name;
  std::optional<Item> tied_item;
  int64_t file_layers = 0;
  for (const Item& t : files.items) {
    std::optional<std::string> name = mapping.strata_name(t.entry->name);
    if (!name) continue;
    if (tied_name && *name == *tied_name) {
      if (tied_item)
        user_error("{}: tensors '{}' and '{}' are both the LM head", path, tied_item->entry->name,
                   t.entry->name);
      tied_item = t;
      continue;
    }
    auto [it, fresh] = by_name.emplace(*name, t);
    if (!fresh)
      user_error(
          "{}: tensors '{}' and '{}' are both Strata's '{}' (a name with and without its "
          "prefix)",
          path, it->second.entry->name, t.entry->name, *name);
    if (auto k = mapping.layer_index(*name)) file_layers = std::max(file_layers, *k + 1);
  }
  if (!by_name.contains(mapping.marker()))
    user_error("{}: not a Hugging Face {} checkpoint: it has no '{}'{}", path,
               mapping.display_name(), mapping.hf_name(mapping.marker()),
               other_family_hint(registry, mapping, files));

  const int64_t V = model.vocab_size();
  const int64_t n_layer = mapping.num_layers(model);
  const std::string layer_hint =
      fmt::format("the file has {} layers, the model {} = {}: set {} to match", file_layers,
                  mapping.layers_key(), n_layer, mapping.layers_key());

  // Validate everything before writing anything.
  plan->vocab_size = V;
  std::vector<HfLoadPlan::Copy>& copies = plan->copies;
  std::set<std::string> used;
  for (auto& [name, p] : model.named_parameters()) {
    auto it = by_name.find(name);
    if (it == by_name.end()) {
      if (mapping.layer_index(name) && file_layers != n_layer)
        user_error("{}: missing tensor '{}' ({})", path, mapping.hf_name(name), layer_hint);
      const std::string hint = mapping.missing_hint(model, name);
      user_error("{}: missing tensor '{}'{}", path, mapping.hf_name(name),
                 hint.empty() ? "" : " (" + hint + ")");
    }
    const SafetensorsEntry& e = *it->second.entry;
    const std::string& file = it->second.reader->path();
    HfTensor hf = mapping.hf_tensor(model, name, p.shape());
    if (!(e.shape == hf.shape))
      user_error(
          "{}: tensor '{}' has shape {} but this model expects {}{}: the checkpoint was probably "
          "made with a different {}; set it to match the file",
          file, e.name, e.shape.str(), hf.shape.str(),
          hf.layout.empty() ? "" : " (" + hf.layout + ")",
          mapping.likely_key(name, e.shape, hf.shape));
    if (!is_floating(e.dtype))
      user_error("{}: tensor '{}' is {}; {} weights must be F32, F16 or BF16", file, e.name,
                 dtype_name(e.dtype), mapping.display_name());
    copies.push_back({it->second, name, p, std::move(hf)});
    used.insert(name);
  }
  for (auto& [name, t] : by_name)
    if (!used.contains(name)) {
      if (mapping.layer_index(name) && file_layers != n_layer)
        user_error("{}: unexpected tensor '{}' ({})", t.reader->path(), t.entry->name, layer_hint);
      user_error("{}: unexpected tensor '{}': this is not a {} model Strata knows{}",
                 t.reader->path(), t.entry->name, mapping.display_name(),
                 mapping.unexpected_hint(model, name));
    }
  if (tied_item) {
    // A tied model can take the head only as the copy of its parameter that save_pretrained
    // sometimes writes.
    const Item& source = by_name.at(tied->parameter);
    const SafetensorsEntry& head = *tied_item->entry;
    if (!(head.shape == source.entry->shape) || head.dtype != source.entry->dtype ||
        tensor::max_abs_diff(tied_item->reader->read(head.name),
                             source.reader->read(source.entry->name)) != 0.0)
      user_error(
          "{}: '{}' differs from '{}', but this model ties its LM head to it and cannot "
          "load an untied head; {}",
          tied_item->reader->path(), head.name, source.entry->name, tied->fix);
  }

  // A file Strata wrote carries digests (Note [Safetensors digests]): check them all before the
  // first write, so damaged bytes are refused with the model untouched.
  for (const auto& r : files.readers)
    if (r->has_digests()) r->verify();
  return plan;
}

}  // namespace

void export_hf(const CausalLM& model, const std::string& out_dir,
               const ModelRegistry* registry_in) {
  const ModelRegistry& registry = registry_or_global(registry_in);
  const HfMapping& mapping = registry.hf_mapping(model.family(), out_dir);

  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec || !fs::is_directory(out_dir))
    user_error("{}: cannot create the output directory ({})", out_dir,
               ec ? ec.message() : "exists and is not a directory");

  const int64_t V = model.vocab_size();
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const auto& [name, p] : model.named_parameters()) {
    const HfTensor hf = mapping.hf_tensor(model, name, p.shape());
    Tensor t = p.data();
    if (hf.vocab_rows) t = t.narrow(0, 0, V);  // Note [Padded vocabulary]
    if (hf.to_hf) t = hf.to_hf(t);
    STRATA_CHECK(t.shape() == hf.shape, "{}: HF layout gives {} for a tensor of {}", name,
                 t.shape().str(), hf.shape.str());
    tensors.emplace_back(mapping.hf_name(name), t.to(DType::F32));
  }
  tensor::save_safetensors((fs::path(out_dir) / "model.safetensors").string(), tensors,
                           {{"format", "pt"}, {"exported_by", "strata"}});
  write_file_atomically((fs::path(out_dir) / "config.json").string(),
                        mapping.config_json(model).dump(2) + "\n");  // Note [Atomic files]
}

}  // namespace strata::models

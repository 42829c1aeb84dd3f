#include "runtime/checkpoint_shards.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "parallel/engine.h"
#include "tensor/safetensors.h"

namespace strata::runtime {

namespace {

using nlohmann::json;
using tensor::SafetensorsReader;
using tensor::Tensor;

}  // namespace

int64_t unit_extent(const models::FlatUnit& u) {
  return u.names.empty() ? 0 : u.offsets.back() + u.numels.back();
}

FlatShardStream engine_shard_stream(parallel::Engine& engine, bool params) {
  FlatShardStream stream;
  const std::vector<parallel::Engine::ShardInfo> layout = engine.shard_layout();
  std::vector<size_t> local(layout.size(), 0);  // layout index -> index in the stream
  for (size_t i = 0; i < layout.size(); ++i) {
    const parallel::Engine::ShardInfo& sh = layout[i];
    if ((sh.key == "param") != params) continue;
    local[i] = stream.shards.size();
    stream.shards.push_back({sh.unit, sh.key, sh.begin, sh.numel, sh.dtype});
  }
  stream.produce = [&engine, params, local](const FlatShardStream::Emit& emit) {
    engine.stream_shards(params,
                         [&](size_t i, const tensor::Tensor& piece) { emit(local[i], piece); });
  };
  return stream;
}

void save_flat_shards(const std::string& path, const models::CausalLM& model,
                      const std::vector<FlatShard>& shards,
                      const std::map<std::string, std::string>& metadata) {
  FlatShardStream stream;
  for (const FlatShard& s : shards)
    stream.shards.push_back({s.unit, s.key, s.begin, s.data.numel(), s.data.dtype()});
  stream.produce = [&](const FlatShardStream::Emit& emit) {
    for (size_t i = 0; i < shards.size(); ++i) emit(i, shards[i].data);
  };
  save_flat_shards(path, model, stream, metadata);
}

void save_flat_shards(const std::string& path, const models::CausalLM& model,
                      const FlatShardStream& stream,
                      const std::map<std::string, std::string>& metadata) {
  std::map<std::string, int64_t> extent;
  for (const models::FlatUnit& u : model.flat_units()) extent[u.name] = unit_extent(u);
  std::vector<tensor::SafetensorsSpec> specs;
  std::vector<int64_t> keep(stream.shards.size(), 0);  // elements written of each shard
  std::vector<size_t> tensor_of(stream.shards.size(), 0);
  json index = json::object();
  for (size_t i = 0; i < stream.shards.size(); ++i) {
    const FlatShardInfo& s = stream.shards[i];
    // Optimizer states and masters are f32; a mixed-precision run's ZeRO-3 "param" shards are its
    // bf16/f16 parameters, which FlatShardIndex accepts back (Note [Mixed precision]).
    const bool low_param = s.key == "param" && (s.dtype == DType::BF16 || s.dtype == DType::F16);
    STRATA_CHECK(s.dtype == DType::F32 || low_param, "shard {} of unit {} is {}", s.key, s.unit,
                 dtype_name(s.dtype));
    auto e = extent.find(s.unit);
    STRATA_CHECK(e != extent.end(), "shard of unknown unit {}", s.unit);
    keep[i] = std::min<int64_t>(s.numel, e->second - s.begin);
    if (keep[i] <= 0) continue;  // all padding
    std::string name = fmt::format("{}/{}@{}", s.unit, s.key, s.begin);
    tensor_of[i] = specs.size();
    specs.push_back({name, s.dtype, tensor::Shape{keep[i]}});
    index[name] = {{"unit", s.unit}, {"key", s.key}, {"extent", e->second}, {"begin", s.begin}};
  }
  std::map<std::string, std::string> meta = metadata;
  meta["format"] = "strata-flat-shards";
  meta["shards"] = index.dump();
  tensor::SafetensorsWriter writer(path, std::move(specs), meta);
  std::vector<int64_t> at(stream.shards.size(), 0);  // elements produced of each shard
  stream.produce([&](size_t i, const Tensor& piece) {
    STRATA_CHECK(
        i < at.size() && piece.ndim() == 1 && at[i] + piece.numel() <= stream.shards[i].numel,
        "shard piece {} of {} elements after {}", i, piece.numel(), i < at.size() ? at[i] : 0);
    const int64_t n = std::min(piece.numel(), keep[i] - at[i]);  // the rest is padding
    if (n > 0) writer.append(tensor_of[i], piece.narrow(0, 0, n));
    at[i] += piece.numel();
  });
  writer.commit();  // checks that every shard came whole
}

FlatShardIndex::FlatShardIndex(const models::CausalLM& model,
                               const std::vector<std::string>& whole_model_files,
                               const std::vector<std::string>& shard_files) {
  std::map<std::string, std::pair<const models::FlatUnit*, size_t>> param_at;
  for (const models::FlatUnit& u : model.flat_units()) {
    unit_numel_[u.name] = unit_extent(u);
    for (size_t k = 0; k < u.names.size(); ++k) param_at[u.names[k]] = {&u, k};
  }
  for (const std::string& path : whole_model_files) {
    const int file = static_cast<int>(files_.size());
    files_.push_back(path);
    SafetensorsReader reader(path);
    for (const models::FlatUnit& u : model.flat_units()) {
      auto& list = pieces_[{u.name, "param"}];
      int64_t at = 0;
      for (size_t k = 0; k < u.names.size(); ++k) {
        if (!reader.contains(u.names[k]))
          user_error("{}: no parameter '{}'; the checkpoint was written for a different model",
                     path, u.names[k]);
        const auto& e = reader.entry(u.names[k]);
        // bf16/f16: a mixed-precision run's parameters (Note [Mixed precision]); fill converts.
        const bool float_ok =
            e.dtype == DType::F32 || e.dtype == DType::BF16 || e.dtype == DType::F16;
        if (!float_ok || !(e.shape == u.shapes[k]))
          user_error(
              "{}: parameter '{}' is {}{} but this model expects f32{}; the checkpoint was "
              "written for a different model size (compare the model config with the "
              "checkpoint's config.yaml)",
              path, u.names[k], dtype_name(e.dtype), e.shape.str(), u.shapes[k].str());
        if (u.offsets[k] > at) list.push_back({-1, {}, at, u.offsets[k] - at});
        list.push_back({file, u.names[k], u.offsets[k], u.numels[k]});
        at = u.offsets[k] + u.numels[k];
      }
    }
    for (const auto& e : reader.entries())
      if (!param_at.contains(e.name))
        user_error(
            "{}: unexpected parameter '{}'; the checkpoint was written for a different "
            "model",
            path, e.name);
  }
  for (const std::string& path : shard_files) {
    const int file = static_cast<int>(files_.size());
    files_.push_back(path);
    SafetensorsReader reader(path);
    auto it = reader.metadata().find("shards");
    if (it == reader.metadata().end() && index_group_file(reader, file, model)) continue;
    json index = it == reader.metadata().end() ? json() : json::parse(it->second, nullptr, false);
    if (!index.is_object())
      user_error("{}: not a Strata shard file (metadata 'shards' missing or not JSON)", path);
    for (const auto& e : reader.entries()) {
      if (!index.contains(e.name))
        user_error("{}: tensor '{}' is not described in the 'shards' metadata", path, e.name);
      const json& d = index[e.name];
      if (!d.is_object() || !d.contains("unit") || !d["unit"].is_string() || !d.contains("key") ||
          !d["key"].is_string() || !d.contains("extent") || !d["extent"].is_number_integer() ||
          !d.contains("begin") || !d["begin"].is_number_integer())
        user_error("{}: malformed 'shards' entry for '{}'", path, e.name);
      const std::string unit = d["unit"];
      const int64_t unit_numel = d["extent"], begin = d["begin"];
      auto known = unit_numel_.find(unit);
      if (known == unit_numel_.end())
        user_error(
            "{}: holds unit '{}', which this model does not have; the checkpoint was "
            "written for a different model",
            path, unit);
      if (known->second != unit_numel)
        user_error(
            "{}: unit '{}' spans {} elements in the checkpoint but {} in this model; the "
            "checkpoint was written for a different model size",
            path, unit, unit_numel, known->second);
      const bool low_ok = d["key"] == "param" && (e.dtype == DType::BF16 || e.dtype == DType::F16);
      if ((e.dtype != DType::F32 && !low_ok) || e.shape.ndim() != 1 || begin < 0 ||
          begin + e.shape[0] > unit_numel)
        user_error("{}: shard '{}' ({}{}) does not fit unit '{}' of {} elements", path, e.name,
                   dtype_name(e.dtype), e.shape.str(), unit, unit_numel);
      pieces_[{unit, d["key"].get<std::string>()}].push_back({file, e.name, begin, e.shape[0]});
    }
  }
  for (auto& [key, list] : pieces_)
    std::sort(list.begin(), list.end(),
              [](const Piece& a, const Piece& b) { return a.begin < b.begin; });
  description_ = files_.empty() ? std::string("(no files)") : files_.front();
  if (files_.size() > 1) description_ += fmt::format(" and {} more", files_.size() - 1);
}

bool FlatShardIndex::index_group_file(const tensor::SafetensorsReader& reader, int file,
                                      const models::CausalLM& model) {
  // A single-process Optimizer::state_dict() file: "group<i>.<state>", one group per flat unit
  // in order, each covering the whole unit.
  const auto& units = model.flat_units();
  std::vector<Piece> found;
  std::vector<std::pair<std::string, std::string>> at;
  for (const auto& e : reader.entries()) {
    size_t dot = e.name.find('.');
    if (!e.name.starts_with("group") || dot == std::string::npos) return false;
    size_t g = 0;
    auto [ptr, ec] = std::from_chars(e.name.data() + 5, e.name.data() + dot, g);
    if (ec != std::errc() || ptr != e.name.data() + dot) return false;
    if (g >= units.size() || e.dtype != DType::F32 || e.shape.ndim() != 1 ||
        e.shape[0] < unit_extent(units[g]))
      user_error(
          "{}: optimizer state '{}' ({}{}) does not match this model's flat unit {}; the "
          "checkpoint was written for a different model",
          reader.path(), e.name, dtype_name(e.dtype), e.shape.str(), g);
    found.push_back({file, e.name, 0, unit_extent(units[g])});
    at.emplace_back(units[g].name, e.name.substr(dot + 1));
  }
  for (size_t i = 0; i < found.size(); ++i) pieces_[at[i]].push_back(found[i]);
  return true;
}

bool FlatShardIndex::covers(const std::string& unit, const std::string& key, int64_t begin,
                            int64_t numel) const {
  auto u = unit_numel_.find(unit);
  if (u == unit_numel_.end()) return false;
  const int64_t end = std::min(begin + numel, u->second);
  if (begin >= end) return true;
  auto it = pieces_.find({unit, key});
  if (it == pieces_.end()) return false;
  int64_t at = begin;  // everything before `at` is covered
  for (const Piece& p : it->second) {
    if (p.begin > at) break;
    at = std::max(at, p.begin + p.numel);
    if (at >= end) return true;
  }
  return at >= end;
}

void FlatShardIndex::fill(const std::string& unit, const std::string& key, int64_t begin,
                          Tensor dst) const {
  STRATA_CHECK(is_floating(dst.dtype()) && dst.ndim() == 1 && dst.is_contiguous(), "fill into {}",
               dst.str());
  if (!covers(unit, key, begin, dst.numel()))
    user_error(
        "checkpoint {}: has no '{}' state for elements [{}, {}) of unit '{}'; it was "
        "written by a different optimizer or model, or files of it are missing",
        description_, key, begin, begin + dst.numel(), unit);
  dst.zero_();
  auto it = pieces_.find({unit, key});
  if (it == pieces_.end()) return;  // covered only by padding
  const int64_t end = begin + dst.numel();
  for (const Piece& p : it->second) {
    const int64_t lo = std::max(begin, p.begin), hi = std::min(end, p.begin + p.numel);
    if (lo >= hi || p.file < 0) continue;
    // Opened once per file: a streamed load fills many pieces from each.
    auto r = readers_.find(p.file);
    if (r == readers_.end()) r = readers_.emplace(p.file, SafetensorsReader(files_[p.file])).first;
    const SafetensorsReader& reader = r->second;
    Tensor part = dst.narrow(0, lo - begin, hi - lo);
    // Another dtype converts (Note [Mixed precision]); a device destination takes a host copy.
    if (reader.entry(p.name).dtype != dst.dtype() || !dst.device().is_cpu()) {
      part.copy_(reader.read(p.name).flatten().narrow(0, lo - p.begin, hi - lo));
      continue;
    }
    // Note [Streamed shards]: straight into dst, a piece at a time; a tensor read in parts is
    // checked against its digest once, streamed, before its first part is used.
    if (hi - lo != p.numel && reader.has_digests() && verified_.emplace(p.file, p.name).second)
      reader.verify(p.name);
    reader.read_into(p.name, part, static_cast<uint64_t>(lo - p.begin));
  }
}

std::vector<std::string> FlatShardIndex::keys(const std::string& unit) const {
  std::vector<std::string> out;
  for (const auto& [k, list] : pieces_)
    if (k.first == unit) out.push_back(k.second);
  return out;
}

}  // namespace strata::runtime

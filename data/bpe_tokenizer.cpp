#include "data/bpe_tokenizer.h"

#include <array>
#include <climits>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "data/unicode.h"

namespace strata::data {

namespace {

enum class CharClass : uint8_t { kLetter, kNumber, kSpace, kOther };

CharClass classify(uint32_t cp) {
  if (unicode::is_letter(cp)) return CharClass::kLetter;
  if (unicode::is_number(cp)) return CharClass::kNumber;
  if (unicode::is_space(cp)) return CharClass::kSpace;
  return CharClass::kOther;
}

// Length of the contraction ('s 't 're 've 'm 'll 'd) at s[i] == '\'', 0 when none.
size_t contraction_length(std::string_view s, size_t i) {
  if (i + 1 >= s.size()) return 0;
  const char a = s[i + 1];
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
  if (i + 2 >= s.size()) return 0;
  const char b = s[i + 2];
  if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
  return 0;
}

struct ByteUnicodeTable {
  std::array<uint32_t, 256> to_unicode{};
  std::unordered_map<uint32_t, uint8_t> to_byte;
  ByteUnicodeTable() {
    std::array<bool, 256> printable{};
    for (int b = '!'; b <= '~'; ++b) printable[b] = true;
    for (int b = 0xA1; b <= 0xAC; ++b) printable[b] = true;
    for (int b = 0xAE; b <= 0xFF; ++b) printable[b] = true;
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) to_unicode[b] = printable[b] ? b : next++;
    for (int b = 0; b < 256; ++b) to_byte[to_unicode[b]] = static_cast<uint8_t>(b);
  }
};

const ByteUnicodeTable& byte_table() {
  static const ByteUnicodeTable table;
  return table;
}

// A vocab/merges spelling back to raw bytes; false when a character is outside the table
// (added tokens such as "<|endoftext|>" are all printable ASCII and do translate).
bool unicode_to_bytes(std::string_view s, std::string& out) {
  out.clear();
  const auto& t = byte_table().to_byte;
  for (size_t i = 0; i < s.size();) {
    auto d = unicode::decode_utf8(s, i);
    auto it = t.find(d.code_point);
    if (it == t.end()) return false;
    out.push_back(static_cast<char>(it->second));
    i += d.length;
  }
  return true;
}

std::string read_file(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) user_error("{}: cannot open the {} file (missing or unreadable)", path, what);
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) user_error("{}: read error on the {} file", path, what);
  return ss.str();
}

}  // namespace

uint32_t gpt2_byte_to_unicode(uint8_t b) {
  return byte_table().to_unicode[b];
}

std::vector<std::string_view> gpt2_pretokenize(std::string_view s) {
  std::vector<std::string_view> out;
  const size_t n = s.size();
  size_t i = 0;
  auto class_at = [&](size_t k, size_t* len) {
    auto d = unicode::decode_utf8(s, k);
    *len = d.length;
    return classify(d.code_point);
  };
  while (i < n) {
    if (s[i] == '\'') {
      if (size_t len = contraction_length(s, i)) {
        out.push_back(s.substr(i, len));
        i += len;
        continue;
      }
    }
    size_t len = 0;
    CharClass c = class_at(i, &len);
    // ` ?\p{L}+`, ` ?\p{N}+`, ` ?[^\s\p{L}\p{N}]+`: an optional ASCII space, then a run of one
    // class.
    size_t run_start = i;
    CharClass run_class = c;
    if (s[i] == ' ' && i + 1 < n) {
      size_t next_len = 0;
      CharClass next = class_at(i + 1, &next_len);
      if (next != CharClass::kSpace) {
        run_start = i + 1;
        run_class = next;
      }
    }
    if (run_class != CharClass::kSpace) {
      size_t j = run_start;
      while (j < n) {
        size_t l = 0;
        if (class_at(j, &l) != run_class) break;
        j += l;
      }
      out.push_back(s.substr(i, j - i));
      i = j;
      continue;
    }
    // `\s+(?!\S)|\s+`: a whitespace run; unless it ends the text, leave its last character to
    // start the next piece (which then may be " word"), but never match less than one character.
    size_t j = i, last = i;
    while (j < n) {
      size_t l = 0;
      if (class_at(j, &l) != CharClass::kSpace) break;
      last = j;
      j += l;
    }
    const size_t end = (j < n && last > i) ? last : j;
    out.push_back(s.substr(i, end - i));
    i = end;
  }
  return out;
}

struct BpeTokenizer::Cache {
  // Bounded so a long tokenize run over varied text keeps steady memory.
  static constexpr size_t kMaxEntries = 1 << 18;
  std::mutex mu;
  std::unordered_map<std::string, std::vector<int32_t>> pieces;
};

BpeTokenizer::BpeTokenizer(const std::string& vocab_json, const std::string& merges_txt)
    : cache_(std::make_unique<Cache>()) {
  // ---- vocab.json: {"token": id, ...} ----
  nlohmann::json vocab;
  try {
    vocab = nlohmann::json::parse(read_file(vocab_json, "vocab.json"));
  } catch (const nlohmann::json::exception& e) {
    user_error("{}: not valid JSON ({}); expected the GPT-2 vocab.json {{\"token\": id, ...}}",
               vocab_json, e.what());
  }
  if (!vocab.is_object() || vocab.empty())
    user_error("{}: expected a non-empty JSON object {{\"token\": id, ...}} (GPT-2 vocab.json)",
               vocab_json);
  // Ids index a table of max id + 1 entries: a made-up id of a billion would ask for 32 GB
  // before anything else is checked. No byte-level BPE vocabulary comes near 2^22 (GPT-2's has
  // 50257 ids, the largest in use about 2^18).
  constexpr int64_t kIdLimit = int64_t{1} << 22;
  int64_t max_id = -1;
  for (const auto& [tok, id] : vocab.items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= kIdLimit)
      user_error("{}: token '{}' has id {}, expected an integer from 0 to {}", vocab_json, tok,
                 id.dump(), kIdLimit - 1);
    max_id = std::max(max_id, id.get<int64_t>());
  }
  id_to_bytes_.assign(static_cast<size_t>(max_id + 1), {});
  id_used_.assign(id_to_bytes_.size(), false);
  std::unordered_map<std::string, int32_t> bytes_to_id;
  std::string bytes;
  for (const auto& [tok, idj] : vocab.items()) {
    const auto id = idj.get<int32_t>();
    if (id_used_[id]) user_error("{}: id {} is used by two tokens", vocab_json, id);
    id_used_[id] = true;
    if (unicode_to_bytes(tok, bytes)) {
      id_to_bytes_[id] = bytes;
      bytes_to_id.emplace(bytes, id);
    } else {
      id_to_bytes_[id] = tok;  // an added token outside the byte alphabet decodes as its text
    }
  }
  for (int b = 0; b < 256; ++b) {
    auto it = bytes_to_id.find(std::string(1, static_cast<char>(b)));
    if (it == bytes_to_id.end())
      user_error("{}: byte 0x{:02X} has no token; a byte-level BPE vocab.json needs all 256",
                 vocab_json, b);
    byte_ids_[b] = it->second;
  }
  if (auto it = vocab.find("<|endoftext|>"); it != vocab.end()) eot_ = it->get<int32_t>();

  // ---- merges.txt: optional "#version" line, then "left right" per line, by rank ----
  const std::string text = read_file(merges_txt, "merges.txt");
  std::string left, right;
  int32_t rank = 0;
  size_t line_no = 0;
  for (size_t pos = 0; pos < text.size();) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string::npos) eol = text.size();
    std::string_view line(text.data() + pos, eol - pos);
    pos = eol + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty() || (line_no == 1 && line.starts_with("#version"))) continue;
    const size_t sp = line.find(' ');
    if (sp == std::string_view::npos || sp == 0 || sp + 1 == line.size() ||
        line.find(' ', sp + 1) != std::string_view::npos)
      user_error("{}:{}: expected two tokens separated by one space, got '{}'", merges_txt, line_no,
                 line);
    if (!unicode_to_bytes(line.substr(0, sp), left) ||
        !unicode_to_bytes(line.substr(sp + 1), right))
      user_error("{}:{}: '{}' is not spelled in GPT-2's byte alphabet", merges_txt, line_no, line);
    auto l = bytes_to_id.find(left), r = bytes_to_id.find(right),
         m = bytes_to_id.find(left + right);
    if (l == bytes_to_id.end() || r == bytes_to_id.end() || m == bytes_to_id.end())
      user_error(
          "{}:{}: merge '{}' uses or makes a token missing from {}; are the two files from "
          "the same model?",
          merges_txt, line_no, line, vocab_json);
    merges_[pair_key(l->second, r->second)] = Merge{rank++, m->second};
  }
}

BpeTokenizer::~BpeTokenizer() = default;

void BpeTokenizer::bpe(std::string_view piece, std::vector<int32_t>& out) const {
  std::vector<int32_t> sym(piece.size());
  for (size_t i = 0; i < piece.size(); ++i) sym[i] = byte_ids_[static_cast<uint8_t>(piece[i])];
  while (sym.size() > 1) {
    int32_t best_rank = INT32_MAX;
    Merge best{};
    int32_t best_left = 0, best_right = 0;
    for (size_t k = 0; k + 1 < sym.size(); ++k) {
      auto it = merges_.find(pair_key(sym[k], sym[k + 1]));
      if (it != merges_.end() && it->second.rank < best_rank) {
        best_rank = it->second.rank;
        best = it->second;
        best_left = sym[k];
        best_right = sym[k + 1];
      }
    }
    if (best_rank == INT32_MAX) break;
    size_t w = 0;
    for (size_t k = 0; k < sym.size(); ++k) {
      if (k + 1 < sym.size() && sym[k] == best_left && sym[k + 1] == best_right) {
        sym[w++] = best.merged;
        ++k;
      } else {
        sym[w++] = sym[k];
      }
    }
    sym.resize(w);
  }
  out.insert(out.end(), sym.begin(), sym.end());
}

std::vector<int32_t> BpeTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 1);
  for (std::string_view piece : gpt2_pretokenize(text)) {
    std::string key(piece);
    {
      std::lock_guard<std::mutex> lock(cache_->mu);
      auto it = cache_->pieces.find(key);
      if (it != cache_->pieces.end()) {
        out.insert(out.end(), it->second.begin(), it->second.end());
        continue;
      }
    }
    const size_t before = out.size();
    bpe(piece, out);
    std::lock_guard<std::mutex> lock(cache_->mu);
    if (cache_->pieces.size() >= Cache::kMaxEntries) cache_->pieces.clear();
    cache_->pieces.emplace(std::move(key), std::vector<int32_t>(out.begin() + before, out.end()));
  }
  return out;
}

std::string BpeTokenizer::decode(std::span<const int32_t> ids) const {
  std::string out;
  for (int32_t id : ids) {
    if (id >= 0 && id < vocab_size() && id_used_[id]) {
      out.append(id_to_bytes_[id]);
    } else {
      out.append(kReplacementChar);
    }
  }
  return out;
}

}  // namespace strata::data

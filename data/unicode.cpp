#include "data/unicode.h"

#include <algorithm>
#include <span>

#include "data/unicode_tables.h"

namespace strata::data::unicode {

namespace {

bool in_ranges(std::span<const unicode_tables::CodeRange> ranges, uint32_t cp) {
  // First range whose end is >= cp; cp is in the class when that range starts at or before it.
  auto it =
      std::lower_bound(ranges.begin(), ranges.end(), cp,
                       [](const unicode_tables::CodeRange& r, uint32_t c) { return r.last < c; });
  return it != ranges.end() && it->first <= cp;
}

}  // namespace

Decoded decode_utf8(std::string_view s, size_t i) {
  const auto b0 = static_cast<uint8_t>(s[i]);
  if (b0 < 0x80) return {b0, 1};
  size_t len;
  uint32_t cp;
  uint32_t min;
  if ((b0 & 0xE0) == 0xC0) {
    len = 2, cp = b0 & 0x1F, min = 0x80;
  } else if ((b0 & 0xF0) == 0xE0) {
    len = 3, cp = b0 & 0x0F, min = 0x800;
  } else if ((b0 & 0xF8) == 0xF0) {
    len = 4, cp = b0 & 0x07, min = 0x10000;
  } else {
    return {kInvalid, 1};
  }
  if (i + len > s.size()) return {kInvalid, 1};
  for (size_t k = 1; k < len; ++k) {
    const auto b = static_cast<uint8_t>(s[i + k]);
    if ((b & 0xC0) != 0x80) return {kInvalid, 1};
    cp = (cp << 6) | (b & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return {kInvalid, 1};
  return {cp, len};
}

std::string printable(std::string_view text) {
  constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD in UTF-8
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const Decoded d = decode_utf8(text, i);
    const uint32_t cp = d.code_point;
    const bool control = cp != '\n' && cp != '\t' && (cp < 0x20 || (cp >= 0x7F && cp <= 0x9F));
    if (cp == kInvalid || control) {
      out += kReplacement;
    } else {
      out.append(text.substr(i, d.length));
    }
    i += d.length;
  }
  return out;
}

bool is_letter(uint32_t cp) {
  if (cp < 0x80) return (cp | 0x20) >= 'a' && (cp | 0x20) <= 'z';
  return cp != kInvalid && in_ranges(unicode_tables::kLetter, cp);
}

bool is_number(uint32_t cp) {
  if (cp < 0x80) return cp >= '0' && cp <= '9';
  return cp != kInvalid && in_ranges(unicode_tables::kNumber, cp);
}

bool is_space(uint32_t cp) {
  if (cp < 0x80) return cp == ' ' || (cp >= '\t' && cp <= '\r');
  return cp != kInvalid && in_ranges(unicode_tables::kSpace, cp);
}

}  // namespace strata::data::unicode

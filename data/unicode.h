#pragma once
// Just enough Unicode for the GPT-2 pre-tokenizer: a lenient UTF-8 decoder and the \p{L}, \p{N}
// and \s classes of its pattern.
//
// Note [Unicode classes]
// The classes come from unicode_tables.h, generated from the Python `regex` module that OpenAI's
// GPT-2 encoder runs on, so classification is exact for that module's Unicode version (newer
// code points assigned later are "other" until the table is regenerated). \s is the White_Space
// property, as in `regex` (it does not include U+001C..U+001F, unlike Python's str.isspace).
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace strata::data::unicode {

// Code point used for a byte that does not start a valid UTF-8 sequence.
inline constexpr uint32_t kInvalid = 0xFFFFFFFF;

struct Decoded {
  uint32_t code_point;  // kInvalid for a malformed byte
  size_t length;        // bytes consumed, >= 1
};

// Decodes the code point at s[i]. Malformed input (bad lead byte, truncated or overlong
// sequences, surrogates, > U+10FFFF) yields kInvalid with length 1, so every byte of any input
// is consumed exactly once and byte-level BPE still round-trips it.
Decoded decode_utf8(std::string_view s, size_t i);

// `text` made safe to print on a terminal: valid UTF-8 is kept, and each malformed byte and each
// control character but newline and tab (C0 with carriage return and escape, DEL, C1) becomes
// U+FFFD. A byte-level model's samples can hold any byte, and an escape sequence or a stray byte
// would garble the console; `train` prints samples this way, `generate` when stdout is a terminal.
std::string printable(std::string_view text);

bool is_letter(uint32_t cp);  // \p{L}
bool is_number(uint32_t cp);  // \p{N}
bool is_space(uint32_t cp);   // \s

}  // namespace strata::data::unicode

#pragma once
// The safetensors file format (https://github.com/huggingface/safetensors): an 8-byte
// little-endian header length N, N bytes of JSON {name: {dtype, shape, data_offsets: [begin,
// end]}, "__metadata__": {str: str}}, then the raw little-endian tensor bytes, offsets relative
// to the end of the header. Used for HF checkpoint interop and the PyTorch reference values of
// tests/reference/.
//
// Reading validates the whole header up front (JSON shape, dtypes, sizes matching shapes,
// offsets inside the file and not overlapping) and raises strata::user_error naming the file on
// anything malformed. Writing goes to a temporary name, is fsynced, then renamed over the
// target, so a crash never leaves a half-written file (DESIGN.md decision 12).
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tensor/tensor.h"

namespace strata::tensor {

struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::F32;
  Shape shape;
  uint64_t begin = 0;  // byte offsets relative to the start of the data section
  uint64_t end = 0;
};

class SafetensorsReader {
 public:
  explicit SafetensorsReader(std::string path);

  const std::string& path() const { return path_; }
  // In file order (increasing offsets).
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  bool contains(std::string_view name) const;
  // strata::user_error naming the file when absent.
  const SafetensorsEntry& entry(std::string_view name) const;
  // A fresh contiguous CPU tensor, charged to the current category.
  Tensor read(std::string_view name) const;

 private:
  std::string path_;
  uint64_t data_start_ = 0;  // 8 + header length
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, std::string> metadata_;
};

// Every tensor of a file, by name.
std::map<std::string, Tensor> load_safetensors(const std::string& path);

// Writes `tensors` (any dtype Strata has, any layout and device) in the given order.
void save_safetensors(const std::string& path,
                      const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

}  // namespace strata::tensor

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
// target, so a crash never leaves a half-written file (docs/design.md decision 12).
//
// Note [Safetensors digests]
// A file that is well-formed can still have been damaged or changed after it was written (a
// flipped bit on disk, a copy cut short and padded, a hand edit): its tensors then load with
// other values and nothing says so. Every file Strata writes carries checksums in its metadata:
//   "strata.digest.<tensor>"  per tensor, over its bytes;
//   "strata.header_digest"    over the header's content: each entry's name, dtype, shape and
//                             offsets in file order, then every other metadata entry (the
//                             tensors' digests among them) by key, in a canonical form, so the
//                             JSON's spacing and key order do not matter. The form: per entry
//                             (ties in offset by name) name NUL dtype NUL each dim and ',' NUL
//                             begin NUL end LF, in decimal; then "--" LF; then per metadata
//                             entry but this one, key NUL value LF.
// Each is offload::checksum64 (XXH3-64, fixed by its specification; Note [Block checksum
// function]) written as 16 hex digits; a tensor's is taken block-wise, the checksum of the
// little-endian checksums of its 1 MiB blocks, so it can be checked in a stream (verify()) without
// holding the tensor, and its blocks summed by the OpenMP threads side by side. The reader checks
// the header digest when it opens a file and a tensor's digest whenever it reads the tensor; a
// mismatch is a UserError naming the file (and tensor). Files without digests (other writers',
// Strata's from before them) are read unchecked; has_digests() tells a caller that needs them
// (checkpoints: Note [Checkpoint digests]). A file with tensor digests but no header digest, or a
// header digest and a tensor without one, is refused: that is what a damaged key name looks like.
// Hugging Face's libraries ignore metadata they do not know, so exported files keep loading there.
//
// Note [Streamed safetensors]
// A checkpoint of a model larger than host memory cannot hold its tensors at once, so files are
// written by SafetensorsWriter: the tensors' names, dtypes and shapes are given up front, which
// fixes the header's length and every tensor's offsets; then each tensor's bytes are appended as
// they are produced, in order within the tensor, tensors in any interleaving (the writer places
// them with pwrite). The digests are fed as the bytes arrive; they are 16 hex digits each, so
// the header is written last, at commit(), over a placeholder of the same length. The file is an
// AtomicFile (Note [Atomic files]): a writer destroyed before commit() — a producer that threw —
// leaves nothing under the final name. save_safetensors is this writer given whole tensors, so
// both write the same bytes for the same tensors.
#include <cstdint>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
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
  std::optional<uint64_t> digest;  // "strata.digest.<name>" (Note [Safetensors digests])
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
  // A fresh contiguous CPU tensor, charged to the current category; its digest checked when the
  // file has one (a strata::user_error naming the file and tensor on a mismatch).
  Tensor read(std::string_view name) const;

  // Reads elements [element_begin, element_begin + dst.numel()) of the tensor into dst (CPU,
  // contiguous, the tensor's dtype) without allocating. The digest is checked when that is the
  // whole tensor (dst then holds the damaged bytes when it fails); a part is read unchecked:
  // verify(name) checks it.
  void read_into(std::string_view name, Tensor dst, uint64_t element_begin = 0) const;

  // Whether the file carries digests (Note [Safetensors digests]); its header digest was checked
  // when it was opened.
  bool has_digests() const { return has_digests_; }
  // Reads every tensor with a digest in a stream of 1 MiB blocks and checks it, holding nothing
  // (a strata::user_error naming the file and tensor on a mismatch).
  void verify() const;
  // The same for one tensor.
  void verify(std::string_view name) const;

 private:
  void verify_entry(std::ifstream& in, std::string& buf, const SafetensorsEntry& e) const;

  std::string path_;
  uint64_t data_start_ = 0;  // 8 + header length
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, std::string> metadata_;
  bool has_digests_ = false;
};

struct SafetensorsSpec {
  std::string name;
  DType dtype = DType::F32;
  Shape shape;
};

// Note [Streamed safetensors].
class SafetensorsWriter {
 public:
  // The file's tensors in file order, and its metadata (digest entries in it are replaced).
  // strata::user_error for a reserved or repeated name.
  SafetensorsWriter(std::string path, std::vector<SafetensorsSpec> tensors,
                    const std::map<std::string, std::string>& metadata = {});
  ~SafetensorsWriter();  // without commit(): the temporary goes, the final name is untouched
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  const std::string& path() const;
  size_t tensors() const;
  uint64_t bytes(size_t i) const;    // tensor i's size
  uint64_t written(size_t i) const;  // its bytes appended so far
  // The next `n` bytes of tensor i (little-endian, its dtype).
  void append(size_t i, const void* data, size_t n);
  // The next piece.numel() elements of tensor i: a tensor of its dtype, any layout and device.
  void append(size_t i, const Tensor& piece);
  // Every tensor must be complete: writes the header, fsyncs and renames into place.
  void commit();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Every tensor of a file, by name.
std::map<std::string, Tensor> load_safetensors(const std::string& path);

// Writes `tensors` (any dtype Strata has, any layout and device) in the given order, with their
// digests (Note [Safetensors digests]; digest entries in `metadata` are replaced).
void save_safetensors(const std::string& path,
                      const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

}  // namespace strata::tensor

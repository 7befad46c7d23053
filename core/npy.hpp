// NumPy .npy files holding one tensor's storage words (tensor.hpp): what `ulpgate export`
// writes and `ulpgate check --outputs` reads. Written as format version 1.0, little-endian,
// C order, one dimension; read from versions 1.0, 2.0 and 3.0, strictly (docs/guide/npy.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/format.hpp"
#include "core/tensor.hpp"

namespace ulpgate {

/// The NumPy dtype of format f's storage words: fp64 '<f8', fp32 and tf32 '<f4', fp16
/// '<f2', bf16 '<u2' and e4m3/e5m2 '|u1' (NumPy has no BF16 or FP8: their bits as integers).
std::string_view npy_dtype(Format f);

/// A .npy header as read: its keys' values, and where the data starts.
struct NpyHeader {
  int major = 1;                     ///< format version 1, 2 or 3
  std::string descr;                 ///< the dtype, e.g. "<f4"
  bool fortran_order = false;
  std::vector<std::int64_t> shape;   ///< () for a scalar
  std::size_t data_offset = 0;       ///< bytes before the first element
  std::int64_t elements = 1;         ///< the product of shape (at most 2^62)
};

/// Parses the magic, version and header dict of a .npy file. InputError, one line, for a
/// bad magic, an unsupported version, a header length past the end, a header that is not a
/// Python dict literal of exactly 'descr' (a string), 'fortran_order' (True/False) and
/// 'shape' (a tuple of non-negative integers), or one not ending in '\n'.
NpyHeader parse_npy_header(std::string_view bytes);

/// Throws InputError naming the first word of a TF32 tensor whose low 13 bits are not zero
/// (no TF32 value); other formats: nothing to check.
void check_tf32_words(const Tensor& t);

/// The storage words of a .npy file that must hold `elements` words of format f in C order
/// (any shape whose product is `elements`). InputError for what parse_npy_header refuses,
/// fortran_order True, a dtype other than npy_dtype(f) (a big-endian one named as such),
/// another element count, fewer data bytes than that (truncated) or more (trailing bytes),
/// and for TF32 a word whose low 13 bits are not zero.
Tensor tensor_from_npy(std::string_view bytes, Format f, std::int64_t elements);

/// A version 1.0 .npy file of t's storage words, shape (t.size(),).
std::string npy_bytes(const Tensor& t);

/// tensor_from_npy on a file's bytes; messages start with the path.
Tensor read_npy_file(const std::string& path, Format f, std::int64_t elements);
/// Writes npy_bytes(t) atomically (file_io.hpp); InputError naming the path.
void write_npy_file(const std::string& path, const Tensor& t);

}  // namespace ulpgate

// NumPy .npy files: how `flexjit run` exchanges tensors with any other implementation.
//
// Reads format versions 1.0, 2.0 and 3.0; writes 1.0 (2.0 when the header needs it). Element
// types, as numpy spells them:
//   '<f4' f32   '<f2' f16   '<i4' i32   '|b1' bool   '|u1' bool (nonzero becomes 1)
//   '<u2' and '<V2' bf16 (raw bit patterns; ml_dtypes' bfloat16 saves as '<V2')
// bf16 is written as '<u2': numpy has no bfloat16, and uint16 keeps the bits exact
// (np.load(...).view(ml_dtypes.bfloat16) recovers it). e4m3 (float8_e4m3fn) is read from and
// written as '|V1', as ml_dtypes saves it. '=' and native little-endian are
// accepted for '<'. Fortran-order files are transposed to C order on read.
#pragma once

#include <flexjit/error.h>
#include <flexjit/tensor.h>
#include <flexjit/types.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace flexjit::npy {

// A dense C-order host array that owns its bytes: what .npy files are read into and written
// from, and the CLI's host tensors. view() is how it crosses flexjit's API.
struct Array {
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  std::vector<char> bytes;  // numel * dtype_size(dtype)

  int64_t numel() const;  // product of shape (make_array and parse checked it fits int64)
  // The array as a contiguous CPU TensorRef. Non-owning: valid while the array lives and its
  // bytes are not resized. (TensorRef has no const form; the kernels only read their inputs.)
  TensorRef view() const;
  template <typename T>
  const T* as() const {
    return reinterpret_cast<const T*>(bytes.data());
  }
  template <typename T>
  T* as() {
    return reinterpret_cast<T*>(bytes.data());
  }
};

// An array of zero-initialized elements. Throws Error when an extent is negative, the element
// or byte count overflows int64 ("an array of shape [16777216, ...] has more than 2^63
// elements"), or the memory cannot be allocated ("cannot allocate 1024 TiB for ...").
Array make_array(DType dtype, std::vector<int64_t> shape);

// Parses the bytes of a .npy file; `name` names it in errors. Throws Error with a precise
// message: "x.npy: not a .npy file (bad magic)", "x.npy: unsupported dtype '<f8' (flexjit reads
// <f4 <f2 <i4 |b1 |u1 <u2 <V2)", "x.npy: truncated: header says 24 bytes of data, file has 12",
// "x.npy: malformed .npy header: dimension 99999999999999999999999 is too large", "x.npy: shape
// (7623851, 1229673, 3935371, 64) has more than 2^63 bytes of data". Every size is checked
// before anything is allocated or read (Fortran-order files too).
Array parse(std::string_view file_bytes, const std::string& name = "<memory>");
Array read(const std::string& path);  // also Error when the file cannot be opened

// The .npy bytes of `a` (format 1.0, or 2.0 for headers over 64 KiB).
std::string serialize(const Array& a);
void write(const std::string& path, const Array& a);  // Error when the file cannot be written

// The numpy descr flexjit writes for a dtype: "<f4", "<f2", "<u2" (bf16), "<i4", "|b1".
std::string_view descr(DType t);

}  // namespace flexjit::npy

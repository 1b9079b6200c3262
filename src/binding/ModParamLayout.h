// The byte layout of FjModParams: the by-value kernel argument that carries the captured
// buffers and runtime parameters of a mod set.
//
// Codegen emits the C struct from this layout (with static_asserts on sizeof and every offset,
// so a drift between host and device fails the NVRTC compile), and the runtime packs argument
// bytes by walking the same fields. The layout, in Mods::buffers then Mods::params order:
//
//   per buffer `name` of rank r:  const T* buf_<name>;        (8 bytes, T per dtype below)
//                                 fj_i64 stride_<name>[r];    (8 bytes each, in elements)
//   per param `name`:             float | int param_<name>;   (4 bytes; a bool param is an int)
//
// with natural alignment (pointers and fj_i64 at 8, scalars at 4) and the total size rounded up
// to 8 (the struct is alignas(8)). A mod set with no buffers or params has one member,
// `int unused_;`, not listed in `fields`, and size 8.
//
// With buffer checks (AttentionOptions::check_buffers; binding/BufferCheck.h) the layout goes on
// after that, so that the checked struct starts with the unchecked one:
//
//   per buffer `name` of rank r:  fj_i64 extent_<name>[r];           (8 bytes each)
//   then:                         unsigned long long* check_record;  (8 bytes)
//
// T is float (f32), unsigned short (f16 and bf16 bits), int (i32) or unsigned char (bool).
// User names are prefixed so that a buffer named `int` or a param named `exp` cannot clash with
// C keywords or prelude functions; names must be identifiers ([A-Za-z_][A-Za-z0-9_]*).
#pragma once

#include <flexjit/mods.h>

#include <string>
#include <string_view>
#include <vector>

namespace flexjit::cuda {

struct ModParamField {
  enum Kind { BufferPtr, BufferStride, ParamF32, ParamI32, ParamBool, BufferExtent, CheckRecord };
  // The member designator as offsetof takes it: "buf_bias", "stride_bias[1]", "param_cap",
  // "extent_bias[0]", "check_record".
  std::string name;
  Kind kind;
  int offset = 0;         // bytes from the start of FjModParams
  int size = 0;           // bytes: 8 for BufferPtr / BufferStride, 4 for params
  int buffer_index = -1;  // BufferPtr, BufferStride, BufferExtent: index into Mods::buffers
  int param_index = -1;   // Param*: index into Mods::params
  int dim = -1;           // BufferStride, BufferExtent: which dimension's
};

struct ModParamLayout {
  std::vector<ModParamField> fields;  // in memory order
  int size = 8;                       // sizeof(FjModParams): a multiple of 8, at least 8
};

// Computes the layout (`buffer_checks`: with the check members above, when `mods` have a
// buffer). Throws CompileError if a buffer or param name is not an identifier.
ModParamLayout layout_of(const Mods& mods, bool buffer_checks = false);

// C member names of a buffer's pointer and stride array and of a param.
std::string buffer_ptr_member(const std::string& buffer_name);     // "buf_<name>"
std::string buffer_stride_member(const std::string& buffer_name);  // "stride_<name>"
std::string buffer_extent_member(const std::string& buffer_name);  // "extent_<name>"
std::string param_member(const std::string& param_name);           // "param_<name>"
// The C element type of a buffer: "float", "unsigned short", "int", "unsigned char".
std::string_view buffer_element_type(DType dtype);

}  // namespace flexjit::cuda

// Scalar types of the mod language and element types of tensors and captured buffers.
#pragma once

#include <flexjit/export.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace flexjit {

// The type of a DSL expression. score is F32; b, h, q_idx, kv_idx are I32 in the language
// (generated code widens index arithmetic to 64 bits where it feeds an address).
enum class ScalarType : uint8_t { Bool, I32, F32 };

// Element type of a tensor or a captured buffer. E4M3 is OCP float8 e4m3fn (max 448, no
// infinities, one NaN pattern): only q, k, v of the sm_90a forward kernel take it
// (docs/kernels/forward_sm90.md, section FP8); captured buffers of E4M3 are refused.
enum class DType : uint8_t { F32, F16, BF16, I32, Bool, E4M3 };

FLEXJIT_API std::string_view to_string(ScalarType t);  // "bool", "i32", "f32"
// "f32", "f16", "bf16", "i32", "bool", "e4m3"
FLEXJIT_API std::string_view to_string(DType t);
// The dtype in NumPy's and PyTorch's words, for messages about arrays they hand over:
// "float32", "float16", "bfloat16", "int32", "bool", "float8_e4m3fn".
FLEXJIT_API std::string_view framework_name(DType t);
FLEXJIT_API std::optional<DType> parse_dtype(std::string_view s);
FLEXJIT_API std::optional<ScalarType> parse_scalar_type(
    std::string_view s);  // "bool", "i32", "f32"

// The scalar type a load from a buffer of this dtype produces: floats load as F32.
FLEXJIT_API ScalarType load_type(DType t);
FLEXJIT_API int dtype_size(DType t);  // bytes per element

}  // namespace flexjit

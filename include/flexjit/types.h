// Scalar types of the mod language and element types of tensors and captured buffers.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace flexjit {

// The type of a DSL expression. score is F32; b, h, q_idx, kv_idx are I32 in the language
// (generated code widens index arithmetic to 64 bits where it feeds an address).
enum class ScalarType : uint8_t { Bool, I32, F32 };

// Element type of a tensor or a captured buffer.
enum class DType : uint8_t { F32, F16, BF16, I32, Bool };

std::string_view to_string(ScalarType t);  // "bool", "i32", "f32"
std::string_view to_string(DType t);       // "f32", "f16", "bf16", "i32", "bool"
std::optional<DType> parse_dtype(std::string_view s);
std::optional<ScalarType> parse_scalar_type(std::string_view s);  // "bool", "i32", "f32"

// The scalar type a load from a buffer of this dtype produces: floats load as F32.
ScalarType load_type(DType t);
int dtype_size(DType t);  // bytes per element

}  // namespace flexjit

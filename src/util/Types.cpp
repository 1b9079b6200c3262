#include <flexjit/error.h>
#include <flexjit/types.h>

namespace flexjit {

std::string_view to_string(ScalarType t) {
  switch (t) {
    case ScalarType::Bool:
      return "bool";
    case ScalarType::I32:
      return "i32";
    case ScalarType::F32:
      return "f32";
  }
  FJ_ASSERT(false, "bad ScalarType");
}

std::string_view to_string(DType t) {
  switch (t) {
    case DType::F32:
      return "f32";
    case DType::F16:
      return "f16";
    case DType::BF16:
      return "bf16";
    case DType::I32:
      return "i32";
    case DType::Bool:
      return "bool";
    case DType::E4M3:
      return "e4m3";
  }
  FJ_ASSERT(false, "bad DType");
}

std::string_view framework_name(DType t) {
  switch (t) {
    case DType::F32:
      return "float32";
    case DType::F16:
      return "float16";
    case DType::BF16:
      return "bfloat16";
    case DType::I32:
      return "int32";
    case DType::Bool:
      return "bool";
    case DType::E4M3:
      return "float8_e4m3fn";
  }
  FJ_ASSERT(false, "bad DType");
}

std::optional<DType> parse_dtype(std::string_view s) {
  if (s == "f32" || s == "float32") return DType::F32;
  if (s == "f16" || s == "float16") return DType::F16;
  if (s == "bf16" || s == "bfloat16") return DType::BF16;
  if (s == "i32" || s == "int32") return DType::I32;
  if (s == "bool") return DType::Bool;
  if (s == "e4m3" || s == "float8_e4m3fn") return DType::E4M3;
  return std::nullopt;
}

std::optional<ScalarType> parse_scalar_type(std::string_view s) {
  if (s == "f32") return ScalarType::F32;
  if (s == "i32") return ScalarType::I32;
  if (s == "bool") return ScalarType::Bool;
  return std::nullopt;
}

ScalarType load_type(DType t) {
  switch (t) {
    case DType::F32:
    case DType::F16:
    case DType::BF16:
    case DType::E4M3:
      return ScalarType::F32;
    case DType::I32:
      return ScalarType::I32;
    case DType::Bool:
      return ScalarType::Bool;
  }
  FJ_ASSERT(false, "bad DType");
}

int dtype_size(DType t) {
  switch (t) {
    case DType::F32:
    case DType::I32:
      return 4;
    case DType::F16:
    case DType::BF16:
      return 2;
    case DType::Bool:
    case DType::E4M3:
      return 1;
  }
  FJ_ASSERT(false, "bad DType");
}

}  // namespace flexjit

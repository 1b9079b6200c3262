#include "binding/ModParamLayout.h"

#include <flexjit/error.h>

#include <fmt/format.h>

#include <algorithm>

namespace flexjit::cuda {

namespace {

bool is_identifier(const std::string& s) {
  if (s.empty()) return false;
  auto alpha = [](char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; };
  if (!alpha(s[0])) return false;
  for (char c : s) {
    if (!alpha(c) && !(c >= '0' && c <= '9')) return false;
  }
  return true;
}

void require_identifier(const char* what, const std::string& name) {
  if (is_identifier(name)) return;
  throw CompileError(fmt::format(
      "{} name '{}' is not an identifier (letters, digits and '_', not starting with a digit)",
      what, name));
}

int align_up(int v, int a) {
  return (v + a - 1) / a * a;
}

}  // namespace

std::string buffer_ptr_member(const std::string& buffer_name) {
  return "buf_" + buffer_name;
}
std::string buffer_stride_member(const std::string& buffer_name) {
  return "stride_" + buffer_name;
}
std::string buffer_extent_member(const std::string& buffer_name) {
  return "extent_" + buffer_name;
}
std::string param_member(const std::string& param_name) {
  return "param_" + param_name;
}

std::string_view buffer_element_type(DType dtype) {
  switch (dtype) {
    case DType::F32:
      return "float";
    case DType::F16:
    case DType::BF16:
      return "unsigned short";
    case DType::I32:
      return "int";
    case DType::Bool:
    case DType::E4M3:  // refused as a buffer dtype at declaration; the bytes if ever loaded
      return "unsigned char";
  }
  FJ_ASSERT(false, "bad DType");
}

ModParamLayout layout_of(const Mods& mods, bool buffer_checks) {
  ModParamLayout layout;
  int offset = 0;
  auto add = [&](ModParamField f, int size) {
    offset = align_up(offset, size);  // every member's alignment equals its size
    f.offset = offset;
    f.size = size;
    offset += size;
    layout.fields.push_back(std::move(f));
  };
  for (size_t i = 0; i < mods.buffers.size(); ++i) {
    const Buffer& buf = mods.buffers[i];
    require_identifier("buffer", buf.name());
    ModParamField ptr{buffer_ptr_member(buf.name()), ModParamField::BufferPtr};
    ptr.buffer_index = static_cast<int>(i);
    add(std::move(ptr), 8);
    for (int d = 0; d < buf.rank(); ++d) {
      ModParamField stride{fmt::format("{}[{}]", buffer_stride_member(buf.name()), d),
                           ModParamField::BufferStride};
      stride.buffer_index = static_cast<int>(i);
      stride.dim = d;
      add(std::move(stride), 8);
    }
  }
  for (size_t i = 0; i < mods.params.size(); ++i) {
    const Param& p = mods.params[i];
    require_identifier("param", p.name());
    ModParamField::Kind kind = p.type() == ScalarType::F32   ? ModParamField::ParamF32
                               : p.type() == ScalarType::I32 ? ModParamField::ParamI32
                                                             : ModParamField::ParamBool;
    ModParamField f{param_member(p.name()), kind};
    f.param_index = static_cast<int>(i);
    add(std::move(f), 4);
  }
  if (buffer_checks && !mods.buffers.empty()) {
    for (size_t i = 0; i < mods.buffers.size(); ++i) {
      const Buffer& buf = mods.buffers[i];
      for (int d = 0; d < buf.rank(); ++d) {
        ModParamField extent{fmt::format("{}[{}]", buffer_extent_member(buf.name()), d),
                             ModParamField::BufferExtent};
        extent.buffer_index = static_cast<int>(i);
        extent.dim = d;
        add(std::move(extent), 8);
      }
    }
    add(ModParamField{"check_record", ModParamField::CheckRecord}, 8);
  }
  layout.size = std::max(8, align_up(offset, 8));
  return layout;
}

}  // namespace flexjit::cuda

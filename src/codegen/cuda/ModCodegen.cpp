#include "codegen/cuda/ModCodegen.h"

#include "binding/BufferCheck.h"
#include "binding/ModParamLayout.h"
#include "codegen/cuda/SourceWriter.h"
#include "ir/IR.h"
#include "ir/Printer.h"
#include "ir/Visitor.h"
#include "passes/Autodiff.h"
#include "passes/LinearForm.h"
#include "passes/PositionDifference.h"

#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <unordered_map>

namespace flexjit::cuda {

namespace {

using ir::Op;

std::string_view c_type(ScalarType t) {
  switch (t) {
    case ScalarType::Bool:
      return "bool";
    case ScalarType::I32:
      return "int";
    case ScalarType::F32:
      return "float";
  }
  FJ_ASSERT(false, "bad ScalarType");
}

std::string_view load_function(DType dtype) {
  switch (dtype) {
    case DType::F32:
      return "fj_ld_f32";
    case DType::F16:
      return "fj_ld_f16";
    case DType::BF16:
      return "fj_ld_bf16";
    case DType::I32:
      return "fj_ld_i32";
    case DType::Bool:
      return "fj_ld_bool";
    case DType::E4M3:
      break;  // refused as a buffer dtype where a buffer is declared (dsl::Buffer, the parser)
  }
  FJ_ASSERT(false, "bad DType");
}

// The prelude function implementing a unary op on `t`; "" where a C operator is exact. With
// MathFunctions::Approx, the transcendentals that have a hardware approximation take it.
std::string_view unary_function(Op op, ScalarType t, MathFunctions math) {
  const bool f = t == ScalarType::F32;
  const bool approx = math == MathFunctions::Approx;
  switch (op) {
    case Op::Neg:
      return f ? "" : "fj_neg_i";  // -INT_MIN wraps
    case Op::Not:
      return "";
    case Op::Abs:
      return f ? "fj_fabs" : "fj_iabs";
    case Op::Exp:
      return approx ? "fj_exp_approx" : "fj_exp";
    case Op::Exp2:
      return approx ? "fj_exp2_approx" : "fj_exp2";
    case Op::Log:
      return approx ? "fj_log_approx" : "fj_log";
    case Op::Log2:
      return approx ? "fj_log2_approx" : "fj_log2";
    case Op::Tanh:
      return approx ? "fj_tanh_approx" : "fj_tanh";
    case Op::Sigmoid:
      return approx ? "fj_sigmoid_approx" : "fj_sigmoid";
    case Op::Sqrt:
      return "fj_sqrt";
    case Op::Rsqrt:
      return "fj_rsqrt";
    case Op::Floor:
      return "fj_floor";
    case Op::Ceil:
      return "fj_ceil";
    default:
      break;
  }
  FJ_ASSERT(false, fmt::format("not a unary op: {}", ir::op_name(op)));
}

// The prelude function implementing a binary op whose operands have type `t`; "" where the C
// operator has the language's semantics (f32 + - * /, comparisons, && ||). Under
// MathFunctions::Approx, f32 division is a multiply by the reciprocal (fj_fdiv_approx).
std::string_view binary_function(Op op, ScalarType t, MathFunctions math) {
  const bool i = t == ScalarType::I32;
  switch (op) {
    case Op::Add:
      return i ? "fj_iadd" : "";
    case Op::Sub:
      return i ? "fj_isub" : "";
    case Op::Mul:
      return i ? "fj_imul" : "";
    case Op::Div:
      if (i) return "fj_idiv_floor";
      return t == ScalarType::F32 && math == MathFunctions::Approx ? "fj_fdiv_approx" : "";
    case Op::Mod:
      return i ? "fj_imod_floor" : "fj_fmod_floor";
    case Op::Min:
      return i ? "fj_imin" : "fj_fminf";
    case Op::Max:
      return i ? "fj_imax" : "fj_fmaxf";
    case Op::Pow:
      return "fj_pow";
    default:
      return "";
  }
}

// Lowers the expressions of one function body into SSA temporaries of a SourceWriter.
// Whether `n` loads `buffer` at indices structurally equal to `indices`.
bool is_load_of(const ir::Node& n, const ir::BufferDecl& buffer, const std::vector<Expr>& indices) {
  if (n.op != Op::Load || !ir::equal(*n.buffer, buffer) || n.args.size() != indices.size()) {
    return false;
  }
  for (size_t d = 0; d < n.args.size(); ++d)
    if (!ir::equal(n.args[d], indices[d])) return false;
  return true;
}

// Where a lowering's loads are checked (BufferChecks::Record): which mod the function evaluates,
// at which position, and the numbered load sites of the mods (runtime::load_sites).
struct LoadCheck {
  const std::vector<runtime::LoadSite>* sites = nullptr;
  const std::vector<std::string>* buffers = nullptr;  // Mods::buffers' names
  runtime::CheckedMod mod = runtime::CheckedMod::ScoreMod;
  runtime::CheckPosition at = runtime::CheckPosition::Element;
};

// The checks of one generated section: none with BufferChecks::Off or without a buffer.
class Checks {
 public:
  Checks(const Mods& mods, BufferChecks mode)
      : on_(mode == BufferChecks::Record && !mods.buffers.empty()) {
    if (!on_) return;
    sites_ = runtime::load_sites(mods);
    for (const Buffer& b : mods.buffers)
      buffers_.push_back(b.name());
  }
  bool on() const { return on_; }
  std::optional<LoadCheck> at(runtime::CheckedMod mod, runtime::CheckPosition at) const {
    if (!on_) return std::nullopt;
    return LoadCheck{&sites_, &buffers_, mod, at};
  }

 private:
  bool on_;
  std::vector<runtime::LoadSite> sites_;
  std::vector<std::string> buffers_;
};

// The position arguments of fj_buffer_check_fail (b, h, q, kv) in a function of `at`'s
// parameters: a diagonal function has `int d`, the others the leaves they name.
std::string_view position_args(runtime::CheckPosition at) {
  switch (at) {
    case runtime::CheckPosition::Element:
      return "b, h, q_idx, kv_idx";
    case runtime::CheckPosition::Row:
      return "b, h, q_idx, 0";
    case runtime::CheckPosition::Column:
      return "b, h, 0, kv_idx";
    case runtime::CheckPosition::Diagonal:
      return "b, h, d, 0";
    case runtime::CheckPosition::Head:
      return "b, h, 0, 0";
  }
  FJ_ASSERT(false, "bad CheckPosition");
}

// A checked load of `buffer` at the C index values `idx`: the in-bounds test, the record of a
// failure, and the load guarded by the test. Returns the loaded value.
std::string checked_load(SourceWriter& w, const LoadCheck& check, const ir::BufferDecl& buffer,
                         const std::vector<Expr>& indices, const std::vector<std::string>& idx,
                         std::string_view type) {
  const std::string& name = buffer.name;
  std::vector<std::string> tests, terms, record_idx, record_ext;
  for (size_t d = 0; d < idx.size(); ++d) {
    const std::string extent = fmt::format("mp.{}[{}]", buffer_extent_member(name), d);
    tests.push_back(fmt::format("fj_in_extent({}, {})", idx[d], extent));
    terms.push_back(fmt::format("(fj_i64){} * mp.{}[{}]", idx[d], buffer_stride_member(name), d));
    record_idx.push_back(idx[d]);
    record_ext.push_back(extent);
  }
  for (size_t d = idx.size(); d < 4; ++d) {
    record_idx.push_back("0");
    record_ext.push_back("1");
  }
  // The site's number names the load in the host's message; a load that is not one of the
  // mods' own (none is expected) is recorded by its buffer alone (site -1).
  const int site = runtime::load_site_index(*check.sites, buffer, indices);
  int buffer_index = -1;
  for (size_t i = 0; i < check.buffers->size(); ++i)
    if ((*check.buffers)[i] == name) buffer_index = static_cast<int>(i);
  FJ_ASSERT(buffer_index >= 0, "a load of a buffer missing from Mods::buffers: " + name);
  const std::string ok = w.ssa("bool", fmt::format("{}", fmt::join(tests, " && ")));
  w.line(
      fmt::format("if (!{}) fj_buffer_check_fail(mp.check_record, {}, {}, {}, {}, {}, {}, {}, {});",
                  ok, site, buffer_index, static_cast<int>(check.mod), static_cast<int>(check.at),
                  position_args(check.at), idx.size(), fmt::join(record_idx, ", "),
                  fmt::join(record_ext, ", ")));
  const std::string off = w.ssa("fj_i64", fmt::format("{}", fmt::join(terms, " + ")));
  return w.ssa(type, fmt::format("{} ? {}(mp.{}, {}) : ({})0", ok, load_function(buffer.dtype),
                                 buffer_ptr_member(name), off, type));
}

// BufferChecks::Record's device functions (binding/BufferCheck.h describes the record).
void emit_check_functions(SourceWriter& w) {
  namespace rec = runtime::buffer_check;
  w.line("// check_buffers=1: every captured-buffer load tests its indices against the bound");
  w.line("// extents (FjModParams::extent_*). An index outside [0, extent) reads 0 instead of");
  w.line(
      "// memory, and the first such load claims the record at mp.check_record and fills it in;");
  w.line("// the host reads it after the launches and throws (flexjit's binding/BufferCheck.h).");
  w.line(
      "__device__ __forceinline__ bool fj_in_extent(int i, fj_i64 extent) { return i >= 0 && "
      "(fj_i64)i < extent; }");
  auto fn = w.block(
      "__device__ __noinline__ void fj_buffer_check_fail(unsigned long long* rec, int site, int "
      "buffer, int mod, int at, int b, int h, int q, int kv, int rank, int i0, int i1, int i2, "
      "int i3, fj_i64 e0, fj_i64 e1, fj_i64 e2, fj_i64 e3)");
  w.line(fmt::format("if (atomicCAS(rec + {}, 0ull, 1ull) != 0ull) return;", rec::kClaimed));
  w.line("const int idx[4] = {i0, i1, i2, i3};");
  w.line("const fj_i64 ext[4] = {e0, e1, e2, e3};");
  w.line("int dim = 0;");
  w.line("while (dim + 1 < rank && fj_in_extent(idx[dim], ext[dim])) ++dim;");
  for (auto [slot, value] :
       {std::pair{rec::kSite, "site"}, std::pair{rec::kBuffer, "buffer"},
        std::pair{rec::kDim, "dim"}, std::pair{rec::kIndex, "idx[dim]"},
        std::pair{rec::kMod, "mod"}, std::pair{rec::kAt, "at"}, std::pair{rec::kB, "b"},
        std::pair{rec::kH, "h"}, std::pair{rec::kQ, "q"}, std::pair{rec::kKv, "kv"}}) {
    w.line(fmt::format("rec[{}] = (unsigned long long)(long long)({});", slot, value));
  }
  w.line(fmt::format(
      "for (int d = 0; d < 4; ++d) rec[{} + d] = (unsigned long long)(long long)idx[d];",
      rec::kIndices));
  w.line("__threadfence();");
}

class ExprLowering {
 public:
  ExprLowering(SourceWriter& w, MathFunctions math, std::optional<LoadCheck> check = std::nullopt)
      : w_(w), math_(math), check_(check) {}

  // Lowers every load of `buffer` at indices structurally equal to `indices` to `value` (a C
  // expression) instead of a memory access.
  void substitute_load(std::shared_ptr<const ir::BufferDecl> buffer, std::vector<Expr> indices,
                       std::string value) {
    subst_ = Substitution{std::move(buffer), std::move(indices), std::move(value)};
  }

  // Returns the C value of `root`: a temporary, a function argument or a literal.
  std::string lower(const Expr& root) {
    // Children are visited before parents, each distinct node once.
    ir::for_each_node(root, [&](const Expr& n) { values_[n.get()] = lower_node(n); });
    return value(root);
  }

 private:
  const std::string& value(const Expr& e) const {
    auto it = values_.find(e.get());
    FJ_ASSERT(it != values_.end(), "ExprLowering: child lowered after its parent");
    return it->second;
  }

  std::string lower_node(const Expr& e) {
    const ir::Node& n = *e.get();
    const std::string_view type = c_type(n.type);
    switch (n.op) {
      case Op::IntImm:
        return cuda_int_literal(n.ival);
      case Op::FloatImm:
        return cuda_float_literal(static_cast<float>(n.fval));
      case Op::BoolImm:
        return n.ival ? "true" : "false";
      case Op::Var:
        return std::string(ir::to_string(n.var));
      case Op::Param: {
        std::string member = "mp." + param_member(n.param->name);
        return n.type == ScalarType::Bool ? "(" + member + " != 0)" : member;
      }
      case Op::Load:
        if (subst_ && is_load_of(n, *subst_->buffer, subst_->indices)) return subst_->value;
        return lower_load(e);
      case Op::Cast: {
        const Expr& a = n.args[0];
        if (n.type == ScalarType::I32 && a.type() == ScalarType::F32) {
          return w_.ssa(type, fmt::format("fj_f2i({})", value(a)));  // trunc, saturate, NaN->0
        }
        return w_.ssa(type, fmt::format("({}){}", type, value(a)));  // exact: i32/bool -> wider
      }
      case Op::Select:
        return w_.ssa(type, fmt::format("{} ? {} : {}", value(n.args[0]), value(n.args[1]),
                                        value(n.args[2])));
      default:
        break;
    }
    if (ir::is_unary(n.op)) {
      const std::string& a = value(n.args[0]);
      std::string_view fn = unary_function(n.op, n.type, math_);
      if (fn.empty()) return w_.ssa(type, fmt::format("{}{}", ir::op_spelling(n.op), a));
      return w_.ssa(type, fmt::format("{}({})", fn, a));
    }
    FJ_ASSERT(ir::is_binary(n.op), fmt::format("codegen of {}", ir::op_name(n.op)));
    const std::string& a = value(n.args[0]);
    const std::string& b = value(n.args[1]);
    std::string_view fn = binary_function(n.op, n.args[0].type(), math_);
    if (fn.empty()) return w_.ssa(type, fmt::format("{} {} {}", a, ir::op_spelling(n.op), b));
    return w_.ssa(type, fmt::format("{}({}, {})", fn, a, b));
  }

  // buf[i][j] -> fj_ld_<dtype>(mp.buf_<name>, (fj_i64)i * mp.stride_<name>[0] + ...): the
  // offset is formed in 64 bits so that large buffers address correctly.
  std::string lower_load(const Expr& e) {
    const ir::BufferDecl& buf = *e->buffer;
    if (check_) {
      std::vector<std::string> idx;
      for (const Expr& a : e->args)
        idx.push_back(value(a));
      return checked_load(w_, *check_, buf, e->args, idx, c_type(e->type));
    }
    std::string offset;
    for (size_t d = 0; d < e->args.size(); ++d) {
      if (d > 0) offset += " + ";
      offset += fmt::format("(fj_i64){} * mp.{}[{}]", value(e->args[d]),
                            buffer_stride_member(buf.name), d);
    }
    std::string off = w_.ssa("fj_i64", offset);
    return w_.ssa(c_type(e->type), fmt::format("{}(mp.{}, {})", load_function(buf.dtype),
                                               buffer_ptr_member(buf.name), off));
  }

  struct Substitution {
    std::shared_ptr<const ir::BufferDecl> buffer;
    std::vector<Expr> indices;
    std::string value;
  };
  SourceWriter& w_;
  MathFunctions math_;
  std::optional<LoadCheck> check_;
  std::optional<Substitution> subst_;
  std::unordered_map<const ir::Node*, std::string> values_;
};

void emit_struct(SourceWriter& w, const Mods& mods, bool checks) {
  const ModParamLayout layout = layout_of(mods, checks);
  w.line("// Captured buffers (pointer, strides in elements) and runtime parameters: the by-value");
  w.line("// kernel argument. The host packs it by flexjit's ModParamLayout; the asserts below");
  w.line("// fail the compile if the two ever disagree.");
  {
    auto s = w.block("struct alignas(8) FjModParams", ";");
    if (layout.fields.empty()) w.line("int unused_;");
    for (const ModParamField& f : layout.fields) {
      switch (f.kind) {
        case ModParamField::BufferPtr: {
          const Buffer& buf = mods.buffers[static_cast<size_t>(f.buffer_index)];
          w.line(fmt::format("const {}* {};  // {}: {}", buffer_element_type(buf.dtype()), f.name,
                             buf.name(), to_string(buf.dtype())));
          break;
        }
        case ModParamField::BufferStride: {
          if (f.dim != 0) break;  // one array member per buffer
          const Buffer& buf = mods.buffers[static_cast<size_t>(f.buffer_index)];
          w.line(fmt::format("fj_i64 {}[{}];", buffer_stride_member(buf.name()), buf.rank()));
          break;
        }
        case ModParamField::ParamF32:
          w.line(fmt::format("float {};", f.name));
          break;
        case ModParamField::ParamI32:
          w.line(fmt::format("int {};", f.name));
          break;
        case ModParamField::ParamBool:
          w.line(fmt::format("int {};  // bool", f.name));
          break;
        case ModParamField::BufferExtent: {
          if (f.dim != 0) break;  // one array member per buffer
          const Buffer& buf = mods.buffers[static_cast<size_t>(f.buffer_index)];
          w.line(fmt::format("fj_i64 {}[{}];  // check_buffers: the bound extents",
                             buffer_extent_member(buf.name()), buf.rank()));
          break;
        }
        case ModParamField::CheckRecord:
          w.line("unsigned long long* check_record;  // check_buffers: the first bad load");
          break;
      }
    }
  }
  // NVRTC's front end has no __builtin_offsetof (nor <cstddef>); __INTADDR__ is its
  // constant-folding equivalent. A host compiler (nvcc's host pass) has the builtin.
  w.line("#ifndef FJ_OFFSETOF");
  w.line("#if defined(__CUDACC_RTC__)");
  w.line("#define FJ_OFFSETOF(type, member) __INTADDR__(&((type*)0)->member)");
  w.line("#else");
  w.line("#define FJ_OFFSETOF(type, member) __builtin_offsetof(type, member)");
  w.line("#endif");
  w.line("#endif");
  w.line(fmt::format(
      "static_assert(sizeof(FjModParams) == {}, \"FjModParams size differs from ModParamLayout\");",
      layout.size));
  for (const ModParamField& f : layout.fields) {
    w.line(
        fmt::format("static_assert(FJ_OFFSETOF(FjModParams, {}) == {}, \"FjModParams::{} "
                    "offset differs from ModParamLayout\");",
                    f.name, f.offset, f.name));
  }
}

void emit_function(SourceWriter& w, const char* signature, const Expr& body,
                   const char* absent_value, MathFunctions math,
                   std::optional<LoadCheck> check = std::nullopt) {
  if (body.defined()) w.line("// " + ir::to_text(body));
  auto fn = w.block(signature);
  if (!body.defined()) {
    w.line(fmt::format("return {};", absent_value));
    return;
  }
  ExprLowering lowering(w, math, check);
  w.line("return " + lowering.lower(body) + ";");
}

bool is_float_buffer(DType d) {
  return d == DType::F32 || d == DType::F16 || d == DType::BF16;
}

// A diagonal site: a load of `buffer` at `indices` where every index depends on q_idx and
// kv_idx only through d = q_idx - kv_idx (passes::depends_only_on_position_difference: a
// relative-position index ±d + (b, h, params), T5's bucket of d, ...) and at least one reads
// them. Over a score tile it takes one value per diagonal (docs/kernels/backward_sm90.md).
struct DiagSite {
  std::shared_ptr<const ir::BufferDecl> buffer;
  std::vector<Expr> indices;
};

std::optional<DiagSite> as_diag_site(const std::shared_ptr<const ir::BufferDecl>& buffer,
                                     const std::vector<Expr>& indices) {
  bool reads = false;
  for (const Expr& e : indices) {
    if (!passes::depends_only_on_position_difference(e)) return std::nullopt;
    reads = reads || passes::reads_positions(e);
  }
  if (!reads) return std::nullopt;
  return DiagSite{buffer, indices};
}

// The score_mod's diagonal load (kFjDiagLoad): its first load of a float buffer (children
// before parents, as ir::for_each_node visits) that is a diagonal site; both the forward's and
// the backward's module pick it with this function, so the two agree.
std::optional<DiagSite> diag_load_site(const Mods& mods) {
  std::optional<DiagSite> site;
  if (!mods.score_mod.defined()) return site;
  ir::for_each_node(mods.score_mod, [&](const Expr& n) {
    if (site || n->op != Op::Load || !is_float_buffer(n->buffer->dtype)) return;
    site = as_diag_site(n->buffer, n->args);
  });
  return site;
}

// A lowering that reads the diagonal load `site` from the parameter fj_dl (none: plain).
ExprLowering diag_lowering(SourceWriter& w, MathFunctions math, const DiagSite* site,
                           std::optional<LoadCheck> check = std::nullopt) {
  ExprLowering lowering(w, math, check);
  if (site != nullptr) lowering.substitute_load(site->buffer, site->indices, "fj_dl");
  return lowering;
}

// The indices of `site` as C values inside a function with an `int d` parameter (the diagonal
// q_idx - kv_idx): the index expressions lowered with q_idx = d and kv_idx = 0, which give
// their value at every (q_idx, kv_idx) of that diagonal.
std::vector<std::string> diag_site_index_values(SourceWriter& w, MathFunctions math,
                                                const DiagSite& site,
                                                std::optional<LoadCheck> check = std::nullopt) {
  std::vector<std::string> text;
  for (const Expr& e : site.indices)
    text.push_back(ir::to_text(e));
  w.line(
      fmt::format("// {}[{}] at q_idx = d, kv_idx = 0", site.buffer->name, fmt::join(text, ", ")));
  w.line("const int q_idx = d, kv_idx = 0;");
  w.line("(void)q_idx, (void)kv_idx;");
  ExprLowering lowering(w, math, check);
  std::vector<std::string> idx;
  for (const Expr& e : site.indices)
    idx.push_back(lowering.lower(e));
  return idx;
}

// A function of `signature` (its last parameter `float fj_dl`) returning `body` with the
// diagonal load read from fj_dl (`absent` when body is undefined).
void emit_with_dl(SourceWriter& w, MathFunctions math, const std::string& signature,
                  const Expr& body, const char* absent, const DiagSite& site,
                  std::optional<LoadCheck> check = std::nullopt) {
  auto fn = w.block(signature);
  w.line("(void)fj_dl;");
  if (!body.defined()) {
    w.line(fmt::format("return {};", absent));
    return;
  }
  ExprLowering lowering = diag_lowering(w, math, &site, check);
  w.line("return " + lowering.lower(body) + ";");
}

// kFjDiagLoad (ModCodegen.h): the score_mod's diagonal load, its sign, index and load, and the
// fj_score_mod overload that takes its value as fj_dl.
void emit_diag_load(SourceWriter& w, const Mods& mods, MathFunctions math, const Checks& checks) {
  const std::optional<DiagSite> site = diag_load_site(mods);
  w.line("// The score_mod's diagonal load: a float buffer read at indices that depend on q_idx");
  w.line("// and kv_idx only through d = q_idx - kv_idx. The sm_90a kernels load a tile's");
  w.line("// diagonals once (fj_diag_load_at, only at diagonals that hold a position of the");
  w.line("// problem) and hand every element its value through the overloads that take fj_dl.");
  w.line(fmt::format("static constexpr bool kFjDiagLoad = {};", site ? "true" : "false"));
  const char* score_mod_dl =
      "__device__ __forceinline__ float fj_score_mod(const FjModParams& mp, float score, int b, "
      "int h, int q_idx, int kv_idx, float fj_dl)";
  if (!site) {
    // Forwarding overloads, so that the kernels' calls with fj_dl resolve in every module.
    w.line(
        "__device__ __forceinline__ float fj_diag_load_at(const FjModParams& mp, int b, int h, "
        "int d) { return (void)mp, (void)b, (void)h, (void)d, 0.0f; }");
    w.line(fmt::format("{} {{ return (void)fj_dl, fj_score_mod(mp, score, b, h, q_idx, kv_idx); }}",
                       score_mod_dl));
    return;
  }
  {
    // Read only at diagonals that hold a position of the problem (the kernels check): the
    // user's contract keeps the indices in bounds there.
    auto fn = w.block(
        "__device__ __forceinline__ float fj_diag_load_at(const FjModParams& mp, int b, int h, "
        "int d)");
    const std::string& name = site->buffer->name;
    const auto check = checks.at(runtime::CheckedMod::ScoreMod, runtime::CheckPosition::Diagonal);
    const std::vector<std::string> idx = diag_site_index_values(w, math, *site, check);
    if (check) {
      w.line("return " + checked_load(w, *check, *site->buffer, site->indices, idx, "float") + ";");
    } else {
      std::vector<std::string> terms;
      for (size_t d = 0; d < idx.size(); ++d) {
        terms.push_back(
            fmt::format("(fj_i64){} * mp.{}[{}]", idx[d], buffer_stride_member(name), d));
      }
      w.line(fmt::format("return {}(mp.{}, {});", load_function(site->buffer->dtype),
                         buffer_ptr_member(name), fmt::join(terms, " + ")));
    }
  }
  emit_with_dl(w, math, score_mod_dl, mods.score_mod, "score", *site,
               checks.at(runtime::CheckedMod::ScoreMod, runtime::CheckPosition::Element));
}

// A column site: a load of an i32 or f32 buffer in the mask_mod whose indices read kv_idx and
// neither q_idx nor a nested load (b, h, params and constants may appear): over a score tile it
// takes one value per column, the same in every row.
struct ColSite {
  std::shared_ptr<const ir::BufferDecl> buffer;
  std::vector<Expr> indices;
  ScalarType type;
};

bool has_load(const Expr& e) {
  return ir::any_node(e, [](const Expr& n) { return n->op == Op::Load; });
}

// The mask_mod's column load (kFjColLoad): its first column site (children before parents).
std::optional<ColSite> col_load_site(const Mods& mods) {
  std::optional<ColSite> site;
  if (!mods.mask_mod.defined()) return site;
  ir::for_each_node(mods.mask_mod, [&](const Expr& n) {
    if (site || n->op != Op::Load) return;
    if (n->buffer->dtype != DType::I32 && n->buffer->dtype != DType::F32) return;
    bool kv = false;
    for (const Expr& e : n->args) {
      if (ir::reads_var(e, ir::VarKind::QIdx) || has_load(e)) return;
      kv = kv || ir::reads_var(e, ir::VarKind::KvIdx);
    }
    if (kv) site = ColSite{n->buffer, n->args, n->type};
  });
  return site;
}

// kFjColLoad (ModCodegen.h): the mask_mod's column load, the load alone, and the fj_mask_mod
// overload that takes its value as fj_cl.
void emit_col_load(SourceWriter& w, const Mods& mods, const Checks& checks) {
  const std::optional<ColSite> site = col_load_site(mods);
  w.line(
      "// The mask_mod's column load: an i32 / f32 buffer read at indices that depend on kv_idx");
  w.line("// and not on q_idx. The sm_90a forward loads a tile's columns once per warp and hands");
  w.line("// every row its column's value (a shuffle) through the overload that takes fj_cl.");
  w.line(fmt::format("static constexpr bool kFjColLoad = {};", site ? "true" : "false"));
  const std::string_view type = site ? c_type(site->type) : "int";
  w.line(fmt::format("using FjColLoad = {};", type));
  const std::string mask_mod_cl = fmt::format(
      "__device__ __forceinline__ bool fj_mask_mod(const FjModParams& mp, int b, int h, int "
      "q_idx, int kv_idx, {} fj_cl)",
      type);
  if (!site) {
    w.line(
        "__device__ __forceinline__ int fj_col_load_at(const FjModParams& mp, int b, int h, int "
        "kv_idx) { return (void)mp, (void)b, (void)h, (void)kv_idx, 0; }");
    w.line(fmt::format("{} {{ return (void)fj_cl, fj_mask_mod(mp, b, h, q_idx, kv_idx); }}",
                       mask_mod_cl));
    return;
  }
  {
    // Read at in-range kv_idx only (the kernels clamp): the user's contract keeps it in bounds.
    auto fn = w.block(fmt::format(
        "__device__ __forceinline__ {} fj_col_load_at(const FjModParams& mp, int b, int h, int "
        "kv_idx)",
        type));
    w.line("(void)b, (void)h;");
    const auto check = checks.at(runtime::CheckedMod::MaskMod, runtime::CheckPosition::Column);
    ExprLowering lowering(w, MathFunctions::Exact, check);
    std::vector<std::string> terms;
    const std::string& name = site->buffer->name;
    if (check) {
      std::vector<std::string> idx;
      for (const Expr& e : site->indices)
        idx.push_back(lowering.lower(e));
      w.line("return " + checked_load(w, *check, *site->buffer, site->indices, idx, type) + ";");
    } else {
      for (size_t d = 0; d < site->indices.size(); ++d) {
        terms.push_back(fmt::format("(fj_i64){} * mp.{}[{}]", lowering.lower(site->indices[d]),
                                    buffer_stride_member(name), d));
      }
      w.line(fmt::format("return {}(mp.{}, {});", load_function(site->buffer->dtype),
                         buffer_ptr_member(name), fmt::join(terms, " + ")));
    }
  }
  auto fn = w.block(mask_mod_cl);
  w.line("(void)fj_cl;");
  ExprLowering lowering(w, MathFunctions::Exact,
                        checks.at(runtime::CheckedMod::MaskMod, runtime::CheckPosition::Element));
  lowering.substitute_load(site->buffer, site->indices, "fj_cl");
  w.line("return " + lowering.lower(mods.mask_mod) + ";");
}

}  // namespace

std::string cuda_float_literal(float v) {
  if (std::isnan(v) || std::isinf(v)) {
    uint32_t bits;
    std::memcpy(&bits, &v, sizeof bits);
    if (std::isnan(v)) bits = 0x7fffffffu;  // the canonical CUDA NaN
    return fmt::format("__int_as_float((int)0x{:08x}u)", bits);
  }
  // fmt prints a float in its shortest form that reads back to the same float.
  std::string s = fmt::format("{}", v);
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  s += 'f';
  return std::signbit(v) ? "(" + s + ")" : s;
}

std::string cuda_int_literal(int64_t v) {
  FJ_ASSERT(v >= std::numeric_limits<int32_t>::min() && v <= std::numeric_limits<int32_t>::max(),
            "i32 literal out of range");
  // -2147483648 is not a literal in C (the negation of an out-of-range int).
  if (v == std::numeric_limits<int32_t>::min()) return "(-2147483647 - 1)";
  return v < 0 ? fmt::format("({})", v) : fmt::format("{}", v);
}

bool has_score_mod(const Mods& mods) {
  const Expr& e = mods.score_mod;
  return e.defined() && !(e->op == Op::Var && e->var == ir::VarKind::Score);
}

bool has_mask_mod(const Mods& mods) {
  const Expr& e = mods.mask_mod;
  return e.defined() && !(e->op == Op::BoolImm && e->ival == 1);
}

namespace {

// A site whose indices (and whether it is reached) depend on b, h and params only: one address
// per (b, h), summed in a register and added once per head (fj_bufgrad_flush).
bool is_per_head_site(const passes::BufferGrad& g) {
  bool fixed = true;
  auto visit = [&](const Expr& root) {
    ir::for_each_node(root, [&](const Expr& n) {
      if (n->op == Op::Var && n->var != ir::VarKind::B && n->var != ir::VarKind::H) fixed = false;
    });
  };
  for (const Expr& e : g.indices)
    visit(e);
  visit(g.reached);
  return fixed;
}

}  // namespace

bool has_element_grad_sites(const Mods& mods) {
  if (!mods.score_mod.defined()) return false;
  for (const passes::BufferGrad& g : passes::differentiate(mods.score_mod).buffers)
    if (is_float_buffer(g.buffer->dtype) && !is_per_head_site(g)) return true;
  return false;
}

bool has_sink_grads(const Mods& mods) {
  if (!mods.sink_mod.defined()) return false;
  for (const passes::BufferGrad& g : passes::buffer_grads(mods.sink_mod))
    if (is_float_buffer(g.buffer->dtype)) return true;
  return false;
}

std::string_view to_string(MathFunctions math) {
  return math == MathFunctions::Approx ? "approx" : "exact";
}

std::string_view to_string(BufferChecks checks) {
  return checks == BufferChecks::Record ? "record" : "off";
}

std::string generate_mod_functions(const Mods& mods, MathFunctions math, BufferChecks mode) {
  const Checks checks(mods, mode);
  using runtime::CheckedMod;
  using runtime::CheckPosition;
  SourceWriter w;
  emit_struct(w, mods, checks.on());
  w.line("");
  if (checks.on()) emit_check_functions(w);
  if (math == MathFunctions::Approx) {
    w.line("// fast_math=1: the score_mod's exp / exp2 / log / log2 / tanh / sigmoid use the");
    w.line("// hardware approximations (fj_*_approx in the prelude; docs/math.md).");
  }
  emit_function(w,
                "__device__ __forceinline__ float fj_score_mod(const FjModParams& mp, float score, "
                "int b, int h, int q_idx, int kv_idx)",
                mods.score_mod, "score", math,
                checks.at(CheckedMod::ScoreMod, CheckPosition::Element));
  w.line("");
  // Always exact: a mask is a yes / no that an approximation could flip at a boundary, and the
  // block-mask kernel and the CPU reference must decide every position the same way.
  emit_function(w,
                "__device__ __forceinline__ bool fj_mask_mod(const FjModParams& mp, int b, int h, "
                "int q_idx, int kv_idx)",
                mods.mask_mod, "true", MathFunctions::Exact,
                checks.at(CheckedMod::MaskMod, CheckPosition::Element));
  w.line("");
  emit_diag_load(w, mods, math, checks);
  w.line("");
  emit_col_load(w, mods, checks);
  w.line("");
  // The sink_mod: one logit per row, evaluated once per row in the epilogues (always exact).
  w.line(fmt::format("static constexpr bool kFjHasSinkMod = {};",
                     mods.sink_mod.defined() ? "true" : "false"));
  emit_function(w,
                "__device__ __forceinline__ float fj_sink_mod(const FjModParams& mp, int b, int h, "
                "int q_idx)",
                mods.sink_mod, "__int_as_float((int)0xff800000u)", MathFunctions::Exact,
                checks.at(CheckedMod::SinkMod, CheckPosition::Row));
  return w.str();
}

namespace {

// fj_sink_mod_grad (ModCodegen.h): g * d sink_mod / d buffer[idx] for every float load site of
// the sink_mod, added straight into the gradient (the sink's gradient kernel runs after the
// dK/dV kernel and its reduction, so no partial slice is involved).
void emit_sink_grad(SourceWriter& w, const Mods& mods, bool ordered, const Checks& checks) {
  std::vector<passes::BufferGrad> sites;
  if (mods.sink_mod.defined()) {
    for (passes::BufferGrad& g : passes::buffer_grads(mods.sink_mod)) {
      if (is_float_buffer(g.buffer->dtype)) sites.push_back(std::move(g));
    }
  }
  w.line(
      fmt::format("static constexpr bool kFjHasSinkGrads = {};", sites.empty() ? "false" : "true"));
  w.line(ordered
             ? "// Every lane of a warp together; the lanes' sums are added in a fixed order by "
               "the one warp that owns the gradients (deterministic)."
             : "// Every lane of a warp together: lanes sharing an address sum first, then "
               "fp32 atomics.");
  auto fn = w.block(
      "__device__ __forceinline__ void fj_sink_mod_grad(const FjModParams& mp, const "
      "FjGradParams& gp, int b, int h, int q_idx, float g)");
  if (sites.empty()) {
    w.line("(void)mp, (void)gp, (void)b, (void)h, (void)q_idx, (void)g;");
    return;
  }
  w.line("if (__all_sync(0xffffffffu, g == 0.0f)) return;");
  ExprLowering lowering(w, MathFunctions::Exact,
                        checks.at(runtime::CheckedMod::SinkMod, runtime::CheckPosition::Row));
  for (const passes::BufferGrad& site : sites) {
    const std::string& name = site.buffer->name;
    std::vector<std::string> index_text, terms;
    for (const Expr& e : site.indices)
      index_text.push_back(ir::to_text(e));
    w.line(fmt::format("// d / d {}[{}]", name, fmt::join(index_text, ", ")));
    const std::string reached = lowering.lower(site.reached);
    const std::string deriv = lowering.lower(site.derivative);
    for (size_t d = 0; d < site.indices.size(); ++d) {
      const std::string idx = lowering.lower(site.indices[d]);
      const std::string clamped =
          w.ssa("fj_i64", fmt::format("fj_clamp_index({}, gp.gextent_{}[{}])", idx, name, d));
      terms.push_back(fmt::format("{} * gp.gstride_{}[{}]", clamped, name, d));
    }
    const std::string offset = terms.empty() ? "0" : fmt::format("{}", fmt::join(terms, " + "));
    w.line(fmt::format("{}(gp.grad_{} + ({}), ({} && g != 0.0f) ? g * {} : 0.0f);",
                       ordered ? "fj_grad_add_ordered" : "fj_grad_add", name, offset, reached,
                       deriv));
  }
}

// The deterministic mode's slice helpers (ModCodegen.h): emitted in both modes, so that the
// reduction kernel compiles beside every dK/dV kernel.
// with_add: also fj_bufgrad_add_to, the store's atomic twin (the private copy's flush).
void emit_slice_functions(SourceWriter& w, const Mods& mods, const GradParamLayout& layout,
                          bool with_add) {
  const bool any = !layout.entries.empty();
  {
    auto fn = w.block(
        "__device__ __forceinline__ FjGradParams fj_bufgrad_with_slice(const FjGradParams& gp, "
        "fj_i64 slice)");
    w.line("FjGradParams s = gp;");
    if (any) {
      w.line("s.partials = gp.partials + slice * gp.slice_elems;");
    } else {
      w.line("(void)slice;");
    }
    w.line("return s;");
  }
  {
    auto fn = w.block(
        "__device__ __forceinline__ const float* fj_bufgrad_partials(const FjGradParams& gp)");
    w.line(any ? "return gp.partials;" : "return (void)gp, nullptr;");
  }
  {
    auto fn =
        w.block("__device__ __forceinline__ fj_i64 fj_bufgrad_slice_elems(const FjGradParams& gp)");
    w.line(any ? "return gp.slice_elems;" : "return (void)gp, 0;");
  }
  // Element e of a slice to its gradient element, then stored (or added with an fp32 atomic).
  auto emit_to_gradient = [&](const char* signature, bool add) {
    auto fn = w.block(signature);
    if (!any) w.line("(void)gp, (void)e, (void)v;");
    for (const GradParamLayout::Entry& entry : layout.entries) {
      const std::string& name = mods.buffers[static_cast<size_t>(entry.buffer_index)].name();
      std::string count = "1";
      for (int d = 0; d < entry.rank; ++d)
        count += fmt::format(" * gp.gextent_{}[{}]", name, d);
      auto b =
          w.block(fmt::format("if (e >= gp.gslice_{0} && e < gp.gslice_{0} + {1})", name, count));
      w.line(fmt::format("fj_i64 r = e - gp.gslice_{}, off = 0;", name));
      for (int d = entry.rank - 1; d >= 0; --d) {
        w.line(fmt::format("off += (r % gp.gextent_{0}[{1}]) * gp.gstride_{0}[{1}];", name, d));
        w.line(fmt::format("r /= gp.gextent_{}[{}];", name, d));
      }
      w.line(add ? fmt::format("atomicAdd(gp.grad_{} + off, v);", name)
                 : fmt::format("gp.grad_{}[off] = v;", name));
      w.line("return;");
    }
  };
  w.line("// Element e of a slice (buffers one after another, each contiguous) to its gradient.");
  emit_to_gradient(
      "__device__ __forceinline__ void fj_bufgrad_store(const FjGradParams& gp, fj_i64 e, float v)",
      false);
  if (with_add) {
    w.line("// The same with an fp32 atomic add (the private copy's flush).");
    emit_to_gradient(
        "__device__ __forceinline__ void fj_bufgrad_add_to(const FjGradParams& gp, fj_i64 e, "
        "float v)",
        true);
  }
}

}  // namespace

GradParamLayout grad_param_layout(const Mods& mods) {
  GradParamLayout layout;
  int offset = 0;
  for (size_t i = 0; i < mods.buffers.size(); ++i) {
    const Buffer& buf = mods.buffers[i];
    if (!is_float_buffer(buf.dtype())) continue;
    layout.entries.push_back({static_cast<int>(i), offset, buf.rank()});
    offset += 8 * (2 + 2 * buf.rank());
  }
  if (!layout.entries.empty()) {
    layout.partials_offset = offset;
    offset += 16;
  }
  layout.size = std::max(offset, 8);
  return layout;
}

std::string generate_mod_grad_functions(const Mods& mods, MathFunctions math,
                                        GradAccumulation accumulation, BufferChecks mode,
                                        int smem_floats) {
  const bool ordered = accumulation == GradAccumulation::Ordered;
  FJ_ASSERT(smem_floats >= 0 && smem_floats % 32 == 0,
            fmt::format("the private buffer-gradient copy's size {} is not a multiple of 32 floats",
                        smem_floats));
  // The derivatives' loads are the score_mod's (and the sink_mod's): checked as those are.
  const Checks checks(mods, mode);
  using runtime::CheckedMod;
  using runtime::CheckPosition;
  const auto element = checks.at(CheckedMod::ScoreMod, CheckPosition::Element);
  SourceWriter w;
  const GradParamLayout layout = grad_param_layout(mods);
  w.line("// Gradients of the captured float buffers (f32, in the bound buffer's shape): the");
  w.line("// backward's by-value kernel argument, packed by flexjit's grad_param_layout().");
  {
    auto s = w.block("struct alignas(8) FjGradParams", ";");
    if (layout.entries.empty()) w.line("int unused_;");
    for (const GradParamLayout::Entry& e : layout.entries) {
      const std::string& name = mods.buffers[static_cast<size_t>(e.buffer_index)].name();
      w.line(fmt::format("float* grad_{};", name));
      w.line(fmt::format("fj_i64 gstride_{}[{}];", name, e.rank));
      w.line(fmt::format("fj_i64 gextent_{}[{}];", name, e.rank));
      w.line(fmt::format("fj_i64 gslice_{};", name));
    }
    if (!layout.entries.empty()) {
      w.line("float* partials;  // deterministic mode: the warp's partial slice");
      w.line("fj_i64 slice_elems;");
    }
  }
  w.line(
      fmt::format("static_assert(sizeof(FjGradParams) == {}, \"FjGradParams size differs from "
                  "grad_param_layout\");",
                  layout.size));
  for (const GradParamLayout::Entry& e : layout.entries) {
    const std::string& name = mods.buffers[static_cast<size_t>(e.buffer_index)].name();
    w.line(fmt::format(
        "static_assert(FJ_OFFSETOF(FjGradParams, grad_{}) == {}, \"FjGradParams::grad_{} offset "
        "differs from grad_param_layout\");",
        name, e.offset, name));
  }
  if (!layout.entries.empty()) {
    w.line(fmt::format(
        "static_assert(FJ_OFFSETOF(FjGradParams, partials) == {}, \"FjGradParams::partials offset "
        "differs from grad_param_layout\");",
        layout.partials_offset));
  }
  w.line("");
  const passes::ScoreModGrads grads = passes::differentiate(mods.score_mod);
  emit_function(w,
                "__device__ __forceinline__ float fj_dscore(const FjModParams& mp, float score, "
                "int b, int h, int q_idx, int kv_idx)",
                grads.d_score, "1.0f", math, element);
  // kFjDScoreConst: d score_mod / d score is a finite constant (any additive bias: ALiBi, a
  // relative-bias table). The kernels then skip the select that keeps ds at 0 where P is 0
  // (there ds_mod = P (dP - delta) is 0 already; the select guards a derivative that is inf or
  // NaN at a masked score), two instructions per score.
  const bool dscore_const = !grads.d_score.defined() || (grads.d_score->op == ir::Op::FloatImm &&
                                                         std::isfinite(grads.d_score->fval));
  w.line(
      fmt::format("static constexpr bool kFjDScoreConst = {};", dscore_const ? "true" : "false"));
  w.line("");
  // Only load sites of buffers that FjGradParams lists (float buffers) get a gradient; the
  // autodiff pass gives none to integer buffers anyway. A site whose indices (and whether it is
  // reached) depend on b, h and params only has one address per (b, h): its contributions are
  // summed in a register by the kernel and added once per head (fj_bufgrad_flush); the others
  // add at every element.
  std::vector<const passes::BufferGrad*> uniform, per_element;
  for (const passes::BufferGrad& g : grads.buffers) {
    if (!is_float_buffer(g.buffer->dtype)) continue;
    (is_per_head_site(g) ? uniform : per_element).push_back(&g);
  }
  const bool any = !uniform.empty() || !per_element.empty();
  w.line(fmt::format("static constexpr bool kFjHasBufferGrads = {};", any ? "true" : "false"));
  w.line(fmt::format("static constexpr int kFjUniformGradSites = {};", uniform.size()));
  w.line(fmt::format("static constexpr int kFjElementGradSites = {};", per_element.size()));
  w.line(
      fmt::format("static constexpr int kFjGradSlots = {};", std::max<size_t>(1, uniform.size())));
  // The CTA's private copy of the gradients in shared memory (Atomic mode, per-element sites:
  // docs/backward.md "Small buffer gradients in shared memory").
  const bool smem = !ordered && smem_floats > 0 && !per_element.empty();
  w.line(fmt::format("static constexpr int kFjGradSmemFloats = {};", smem ? smem_floats : 0));
  if (smem) {
    w.line(
        "// The CTA's private copy of the buffer gradients (the partial slice's layout); zeroed "
        "and flushed by the kernel (fj_bufgrad_smem_zero / fj_bufgrad_smem_flush).");
    w.line("static __shared__ __align__(16) float fj_grad_smem[kFjGradSmemFloats];");
  }
  // The address of a site: its indices clamped into the extents, as an element offset into the
  // gradient (Atomic), into the warp's partial slice (Ordered) or into the CTA's private copy
  // (smem), where each buffer is contiguous.
  auto address = [&](ExprLowering& lowering, const passes::BufferGrad& g, bool to_smem) {
    const std::string& name = g.buffer->name;
    std::vector<std::string> index_text;
    for (const Expr& e : g.indices)
      index_text.push_back(ir::to_text(e));
    w.line(fmt::format("// d / d {}[{}]", name, fmt::join(index_text, ", ")));
    std::vector<std::string> terms;
    std::string linear;  // Ordered, smem: the row-major element index within the buffer
    for (size_t d = 0; d < g.indices.size(); ++d) {
      const std::string idx = lowering.lower(g.indices[d]);
      if (to_smem) {
        // The copy holds at most kBufGradSmemMaxFloats: i32 arithmetic (fewer registers).
        const std::string c =
            w.ssa("int", fmt::format("fj_clamp_index32({}, (int)gp.gextent_{}[{}])", idx, name, d));
        linear =
            d == 0
                ? c
                : w.ssa("int", fmt::format("{} * (int)gp.gextent_{}[{}] + {}", linear, name, d, c));
        continue;
      }
      const std::string clamped =
          w.ssa("fj_i64", fmt::format("fj_clamp_index({}, gp.gextent_{}[{}])", idx, name, d));
      terms.push_back(fmt::format("{} * gp.gstride_{}[{}]", clamped, name, d));
      if (!ordered) continue;
      linear = d == 0 ? clamped
                      : w.ssa("fj_i64",
                              fmt::format("{} * gp.gextent_{}[{}] + {}", linear, name, d, clamped));
    }
    if (to_smem) {
      return linear.empty() ? fmt::format("fj_grad_smem + (int)gp.gslice_{}", name)
                            : fmt::format("fj_grad_smem + ((int)gp.gslice_{} + {})", name, linear);
    }
    if (ordered) {
      return linear.empty() ? fmt::format("gp.partials + gp.gslice_{}", name)
                            : fmt::format("gp.partials + (gp.gslice_{} + {})", name, linear);
    }
    const std::string offset = terms.empty() ? "0" : fmt::format("{}", fmt::join(terms, " + "));
    return fmt::format("gp.grad_{} + ({})", name, offset);
  };
  // The per-element sites' add; the per-head sites' (fj_bufgrad_flush) stays global in smem
  // mode.
  const char* add = ordered ? "fj_grad_add_ordered" : (smem ? "fj_grad_add_shared" : "fj_grad_add");
  const char* head_add = ordered ? "fj_grad_add_ordered" : "fj_grad_add";
  // The diagonal site (Atomic mode only): the first per-element site whose indices depend on
  // q_idx and kv_idx only through q_idx - kv_idx (DiagSite). A kernel that opts in
  // (fj_bufgrad<true>) leaves it out of fj_bufgrad and sums it along the tile's diagonals itself
  // (fj_bufgrad_diag_*; docs/backward.md).
  const passes::BufferGrad* diag = nullptr;
  std::optional<DiagSite> diag_site;
  for (const passes::BufferGrad* g : per_element) {
    if (ordered) break;
    diag_site = as_diag_site(g->buffer, g->indices);
    if (diag_site) {
      diag = g;
      break;
    }
  }
  w.line(fmt::format("static constexpr bool kFjDiagGradSite = {};", diag ? "true" : "false"));
  // The score_mod's diagonal load (kFjDiagLoad, emitted with the mods by
  // generate_mod_functions): lowered as the parameter fj_dl when `dl`.
  const std::optional<DiagSite> load_site = diag_load_site(mods);
  auto make_lowering = [&](bool dl) {
    return diag_lowering(w, math, dl ? &*load_site : nullptr, element);
  };
  // fj_bufgrad's body, with or without the diagonal site.
  auto emit_bufgrad_body = [&](bool with_diag, bool dl = false) {
    std::vector<const passes::BufferGrad*> sites;
    for (const passes::BufferGrad* g : per_element)
      if (with_diag || g != diag) sites.push_back(g);
    if (!sites.empty()) {
      // Called by every lane of a warp together (fj_grad_add combines lanes): the early return
      // is a warp vote.
      w.line("if (__all_sync(0xffffffffu, ds == 0.0f)) return;");
    } else if (!uniform.empty()) {
      w.line("if (ds == 0.0f) return;");
    }
    ExprLowering lowering = make_lowering(dl);
    for (size_t i = 0; i < uniform.size(); ++i) {
      const std::string reached = lowering.lower(uniform[i]->reached);
      const std::string deriv = lowering.lower(uniform[i]->derivative);
      w.line(fmt::format("// d / d {} (one address per head: summed in acc[{}])",
                         uniform[i]->buffer->name, i));
      w.line(fmt::format("acc[{}] += {} ? ds * {} : 0.0f;", i, reached, deriv));
    }
    for (const passes::BufferGrad* g : sites) {
      const std::string reached = lowering.lower(g->reached);
      const std::string deriv = lowering.lower(g->derivative);
      const std::string addr = address(lowering, *g, smem);
      w.line(
          fmt::format("{}({}, ({} && ds != 0.0f) ? ds * {} : 0.0f);", add, addr, reached, deriv));
    }
    if (sites.empty() && uniform.empty()) {
      w.line(
          "(void)mp, (void)gp, (void)ds, (void)score, (void)b, (void)h, (void)q_idx, "
          "(void)kv_idx, (void)acc;");
    }
    if (dl) w.line("(void)fj_dl;");
  };
  w.line("// kDiagByCaller: the caller sums the diagonal site itself (kFjDiagGradSite).");
  w.line("template <bool kDiagByCaller = false>");
  {
    auto fn = w.block(
        "__device__ __forceinline__ void fj_bufgrad(const FjModParams& mp, const FjGradParams& "
        "gp, float ds, float score, int b, int h, int q_idx, int kv_idx, float (&acc)"
        "[kFjGradSlots])");
    if (diag == nullptr) {
      emit_bufgrad_body(true);
    } else {
      {
        auto b = w.block("if constexpr (kDiagByCaller)");
        emit_bufgrad_body(false);
      }
      auto b = w.block("else");
      emit_bufgrad_body(true);
    }
  }
  w.line("");
  auto emit_diag_value = [&](bool dl) {
    const Expr& r = diag->reached;
    const Expr& d = diag->derivative;
    if (r->op == Op::BoolImm && r->ival != 0 && d->op == Op::FloatImm && std::isfinite(d->fval)) {
      // Always reached, a finite constant derivative (score + bias[...]): ds = 0 gives 0.
      w.line("(void)mp, (void)score, (void)b, (void)h, (void)q_idx, (void)kv_idx;");
      if (dl) w.line("(void)fj_dl;");
      w.line(fmt::format("return ds * {};", cuda_float_literal(static_cast<float>(d->fval))));
    } else {
      ExprLowering lowering = make_lowering(dl);
      const std::string reached = lowering.lower(r);
      const std::string deriv = lowering.lower(d);
      w.line(fmt::format("return ({} && ds != 0.0f) ? ds * {} : 0.0f;", reached, deriv));
    }
  };
  w.line(
      "// The diagonal site: its contribution at one element (0 where not reached), and the add");
  w.line("// of diagonal d's sum (d = q_idx - kv_idx; an fp32 atomic at the site's indices there,");
  w.line("// clamped into the extents). Without a diagonal site: 0 and a no-op.");
  {
    auto fn = w.block(
        "__device__ __forceinline__ float fj_bufgrad_diag_value(const FjModParams& mp, float ds, "
        "float score, int b, int h, int q_idx, int kv_idx)");
    if (diag == nullptr) {
      w.line(
          "return (void)mp, (void)ds, (void)score, (void)b, (void)h, (void)q_idx, "
          "(void)kv_idx, 0.0f;");
    } else {
      emit_diag_value(false);
    }
  }
  {
    auto fn = w.block(
        "__device__ __forceinline__ void fj_bufgrad_diag_add_at(const FjModParams& mp, const "
        "FjGradParams& gp, int b, int h, int d, float v)");
    if (diag == nullptr) {
      w.line("(void)mp, (void)gp, (void)b, (void)h, (void)d, (void)v;");
    } else {
      const std::string& name = diag->buffer->name;
      const std::vector<std::string> idx = diag_site_index_values(
          w, math, *diag_site, checks.at(CheckedMod::ScoreMod, CheckPosition::Diagonal));
      std::vector<std::string> terms;
      std::string linear;  // smem: the row-major element index within the buffer (i32)
      for (size_t d = 0; d < idx.size(); ++d) {
        if (smem) {
          const std::string c = w.ssa(
              "int", fmt::format("fj_clamp_index32({}, (int)gp.gextent_{}[{}])", idx[d], name, d));
          linear = d == 0 ? c
                          : w.ssa("int", fmt::format("{} * (int)gp.gextent_{}[{}] + {}", linear,
                                                     name, d, c));
          continue;
        }
        const std::string clamped =
            w.ssa("fj_i64", fmt::format("fj_clamp_index({}, gp.gextent_{}[{}])", idx[d], name, d));
        terms.push_back(fmt::format("{} * gp.gstride_{}[{}]", clamped, name, d));
      }
      if (smem) {
        // Every lane of the warp together (FjDiagGrad::flush passes 0 where it has no sum).
        w.line(fmt::format("fj_grad_add_shared(fj_grad_smem + ((int)gp.gslice_{} + {}), v);", name,
                           linear));
      } else {
        w.line(fmt::format("atomicAdd(gp.grad_{} + ({}), v);", name, fmt::join(terms, " + ")));
      }
    }
  }
  w.line("");
  // The overloads that take the score_mod's diagonal load as fj_dl (kFjDiagLoad; fj_score_mod's
  // comes with the mods).
  if (!load_site) {
    // Forwarding overloads, so that the kernels' calls with fj_dl resolve in every module.
    w.line(
        "__device__ __forceinline__ float fj_dscore(const FjModParams& mp, float score, int b, "
        "int h, int q_idx, int kv_idx, float fj_dl) { return (void)fj_dl, fj_dscore(mp, score, "
        "b, h, q_idx, kv_idx); }");
  } else {
    emit_with_dl(w, math,
                 "__device__ __forceinline__ float fj_dscore(const FjModParams& mp, float score, "
                 "int b, int h, int q_idx, int kv_idx, float fj_dl)",
                 grads.d_score, "1.0f", *load_site, element);
  }
  if (!load_site || diag == nullptr) {
    w.line(
        "__device__ __forceinline__ float fj_bufgrad_diag_value(const FjModParams& mp, float ds, "
        "float score, int b, int h, int q_idx, int kv_idx, float fj_dl) { return (void)fj_dl, "
        "fj_bufgrad_diag_value(mp, ds, score, b, h, q_idx, kv_idx); }");
  } else {
    auto fn = w.block(
        "__device__ __forceinline__ float fj_bufgrad_diag_value(const FjModParams& mp, float "
        "ds, float score, int b, int h, int q_idx, int kv_idx, float fj_dl)");
    emit_diag_value(true);
  }
  w.line("template <bool kDiagByCaller = false>");
  if (!load_site) {
    w.line(
        "__device__ __forceinline__ void fj_bufgrad(const FjModParams& mp, const FjGradParams& "
        "gp, float ds, float score, int b, int h, int q_idx, int kv_idx, float (&acc)"
        "[kFjGradSlots], float fj_dl) { (void)fj_dl; fj_bufgrad<kDiagByCaller>(mp, gp, ds, "
        "score, b, h, q_idx, kv_idx, acc); }");
  } else {
    auto fn = w.block(
        "__device__ __forceinline__ void fj_bufgrad(const FjModParams& mp, const FjGradParams& "
        "gp, float ds, float score, int b, int h, int q_idx, int kv_idx, float (&acc)"
        "[kFjGradSlots], float fj_dl)");
    if (diag == nullptr) {
      emit_bufgrad_body(true, true);
    } else {
      {
        auto b = w.block("if constexpr (kDiagByCaller)");
        emit_bufgrad_body(false, true);
      }
      auto b = w.block("else");
      emit_bufgrad_body(true, true);
    }
  }
  w.line("");
  {
    auto fn = w.block(
        "__device__ __forceinline__ void fj_bufgrad_flush(const FjModParams& mp, const "
        "FjGradParams& gp, int b, int h, float (&acc)[kFjGradSlots])");
    w.line(
        ordered
            ? "// Every lane of a warp together: the warp's sums (in a fixed order) go into its "
              "slice."
            : "// Every lane of a warp together: the warp's sums go out in one atomic per site.");
    ExprLowering lowering(w, math, checks.at(CheckedMod::ScoreMod, CheckPosition::Head));
    for (size_t i = 0; i < uniform.size(); ++i) {
      const std::string addr = address(lowering, *uniform[i], false);
      w.line(fmt::format("{}({}, acc[{}]);", head_add, addr, i));
      w.line(fmt::format("acc[{}] = 0.0f;", i));
    }
    if (uniform.empty()) w.line("(void)mp, (void)gp, (void)b, (void)h, (void)acc;");
  }
  w.line("");
  emit_sink_grad(w, mods, ordered, checks);
  w.line("");
  emit_slice_functions(w, mods, layout, smem);
  w.line("");
  w.line(
      "// The CTA's private copy (kFjGradSmemFloats > 0): zeroed by threads [0, nthreads) before");
  w.line(
      "// the first add, flushed by them after the last (each behind a barrier the kernel sets).");
  {
    auto fn =
        w.block("__device__ __forceinline__ void fj_bufgrad_smem_zero(int tid, int nthreads)");
    if (smem) {
      w.line("for (int e = tid; e < kFjGradSmemFloats; e += nthreads) fj_grad_smem[e] = 0.0f;");
    } else {
      w.line("(void)tid, (void)nthreads;");
    }
  }
  {
    auto fn = w.block(
        "__device__ __forceinline__ void fj_bufgrad_smem_flush(const FjGradParams& gp, int tid, "
        "int nthreads)");
    if (smem) {
      w.line(
          "// One fp32 atomic per element this CTA added to (gp.slice_elems <= kFjGradSmemFloats: "
          "the");
      w.line("// host sized the copy from the bound buffers).");
      auto loop =
          w.block("for (int e = tid; e < kFjGradSmemFloats && e < gp.slice_elems; e += nthreads)");
      w.line("const float v = fj_grad_smem[e];");
      w.line("if (v != 0.0f) fj_bufgrad_add_to(gp, e, v);");
    } else {
      w.line("(void)gp, (void)tid, (void)nthreads;");
    }
  }
  return w.str();
}

}  // namespace flexjit::cuda

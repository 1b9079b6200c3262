#include "codegen/llvm/LlvmCodegen.h"

#include "codegen/llvm/CpuModParams.h"
#include "codegen/llvm/OrcJit.h"
#include "ir/IR.h"
#include "ir/Visitor.h"

#include <fmt/format.h>

#include <llvm/ADT/StringMap.h>
#include <llvm/IR/Constants.h>
#include <llvm/IR/DerivedTypes.h>
#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/Intrinsics.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/MDBuilder.h>
#include <llvm/IR/Module.h>
#include <llvm/TargetParser/Host.h>

#include <functional>
#include <limits>
#include <unordered_map>

namespace flexjit::llvmjit {

namespace {

using ir::Op;
using Builder = llvm::IRBuilder<>;

bool host_has_f16c() {
  static const bool has = [] {
    llvm::StringMap<bool> features;
    return llvm::sys::getHostCPUFeatures(features) && features.lookup("f16c");
  }();
  return has;
}

// The values of the language's leaves in the function being emitted.
struct Leaves {
  llvm::Value* score = nullptr;  // f32; null where the mod may not use it (mask functions)
  llvm::Value* b = nullptr;
  llvm::Value* h = nullptr;
  llvm::Value* q = nullptr;
  llvm::Value* kv = nullptr;
};

// Lowers expressions of one mod set inside the functions of one module. Per function,
// begin_function() loads every buffer descriptor and param from the slot array at the current
// insertion point (the entry block), so loop bodies only compute.
class ModLowering {
 public:
  ModLowering(const Mods& mods, llvm::Module& module)
      : mods_(mods), module_(module), ctx_(module.getContext()), layout_(cpu_layout_of(mods)) {
    llvm::MDBuilder md(ctx_);
    llvm::MDNode* domain = md.createAnonymousAliasScopeDomain("fj");
    buffer_scope_ = llvm::MDNode::get(ctx_, {md.createAnonymousAliasScope(domain, "buffers")});
    out_scope_ = llvm::MDNode::get(ctx_, {md.createAnonymousAliasScope(domain, "rows")});
  }

  llvm::Type* f32() { return llvm::Type::getFloatTy(ctx_); }
  llvm::Type* i32() { return llvm::Type::getInt32Ty(ctx_); }
  llvm::Type* i64() { return llvm::Type::getInt64Ty(ctx_); }
  llvm::Type* ptr() { return llvm::PointerType::get(ctx_, 0); }

  // Marks a load or store of the row arrays as not aliasing any captured buffer.
  void mark_row_access(llvm::Instruction* inst) {
    inst->setMetadata(llvm::LLVMContext::MD_alias_scope, out_scope_);
    inst->setMetadata(llvm::LLVMContext::MD_noalias, buffer_scope_);
  }

  void begin_function(Builder& b, llvm::Value* params) {
    buffers_.clear();
    params_.clear();
    auto slot = [&](int i) {
      return b.CreateLoad(i64(), b.CreateConstInBoundsGEP1_64(i64(), params, i));
    };
    for (size_t bi = 0; bi < mods_.buffers.size(); ++bi) {
      const ir::BufferDecl& decl = *mods_.buffers[bi].decl();
      const int s = layout_.buffer_slot[bi];
      BufferInfo info;
      info.base = b.CreateLoad(ptr(), b.CreateConstInBoundsGEP1_64(i64(), params, s));
      for (int d = 0; d < decl.rank(); ++d) {
        info.extent.push_back(slot(s + 1 + d));
        info.stride.push_back(slot(s + 1 + decl.rank() + d));
      }
      buffers_[decl.name] = std::move(info);
    }
    for (size_t pi = 0; pi < mods_.params.size(); ++pi) {
      const ir::ParamDecl& decl = *mods_.params[pi].decl();
      llvm::Value* bits = b.CreateTrunc(slot(layout_.param_slot[pi]), i32());
      llvm::Value* v = bits;
      if (decl.type == ScalarType::F32) v = b.CreateBitCast(bits, f32());
      if (decl.type == ScalarType::Bool) v = b.CreateICmpNE(bits, b.getInt32(0));
      params_[decl.name] = v;
    }
  }

  // Emits `e` at the builder's insertion point, straight-line (no control flow).
  llvm::Value* emit(Builder& b, const Expr& e, const Leaves& leaves) {
    std::unordered_map<const ir::Node*, llvm::Value*> value;
    ir::for_each_node(e, [&](const Expr& n) {
      std::vector<llvm::Value*> a;
      for (const Expr& arg : n->args)
        a.push_back(value.at(arg.get()));
      value[n.get()] = emit_node(b, *n.get(), a, leaves);
    });
    return value.at(e.get());
  }

 private:
  struct BufferInfo {
    llvm::Value* base = nullptr;
    std::vector<llvm::Value*> extent, stride;
  };

  llvm::Function* intrinsic(llvm::Intrinsic::ID id, std::vector<llvm::Type*> types) {
    return llvm::Intrinsic::getDeclaration(&module_, id, types);
  }

  // A libm function through its opaque fj_ alias (see OrcJit.cpp for why).
  llvm::Value* call_math(Builder& b, const char* name, std::vector<llvm::Value*> args) {
    std::vector<llvm::Type*> types(args.size(), f32());
    auto callee = module_.getOrInsertFunction(name, llvm::FunctionType::get(f32(), types, false));
    auto* fn = llvm::cast<llvm::Function>(callee.getCallee());
    fn->setDoesNotAccessMemory();
    fn->setDoesNotThrow();
    fn->addFnAttr(llvm::Attribute::WillReturn);
    return b.CreateCall(callee, args);
  }

  llvm::Value* load(Builder& b, const ir::Node& n, const std::vector<llvm::Value*>& idx) {
    const ir::BufferDecl& decl = *n.buffer;
    auto it = buffers_.find(decl.name);
    FJ_ASSERT(it != buffers_.end(), "load from a buffer missing from Mods::buffers: " + decl.name);
    const BufferInfo& info = it->second;
    llvm::Value* offset = b.getInt64(0);
    for (int d = 0; d < decl.rank(); ++d) {
      llvm::Value* i = b.CreateSExt(idx[d], i64());
      i = b.CreateSelect(b.CreateICmpSLT(i, b.getInt64(0)), b.getInt64(0), i);
      llvm::Value* last = b.CreateSub(info.extent[d], b.getInt64(1));
      i = b.CreateSelect(b.CreateICmpSGT(i, last), last, i);
      offset = b.CreateAdd(offset, b.CreateMul(i, info.stride[d]));
    }
    auto element = [&](llvm::Type* t) {
      llvm::LoadInst* ld = b.CreateLoad(t, b.CreateGEP(t, info.base, offset));
      ld->setMetadata(llvm::LLVMContext::MD_alias_scope, buffer_scope_);
      ld->setMetadata(llvm::LLVMContext::MD_noalias, out_scope_);
      return ld;
    };
    switch (decl.dtype) {
      case DType::F32:
        return element(f32());
      case DType::I32:
        return element(i32());
      case DType::Bool:
        return b.CreateICmpNE(element(b.getInt8Ty()), b.getInt8(0));
      case DType::BF16: {
        llvm::Value* bits = b.CreateZExt(element(b.getInt16Ty()), i32());
        return b.CreateBitCast(b.CreateShl(bits, 16), f32());
      }
      case DType::F16: {
        llvm::Value* bits = element(b.getInt16Ty());
        if (host_has_f16c()) return b.CreateFPExt(b.CreateBitCast(bits, b.getHalfTy()), f32());
        auto callee = module_.getOrInsertFunction(
            "fj_f16_to_f32", llvm::FunctionType::get(f32(), {b.getInt16Ty()}, false));
        auto* fn = llvm::cast<llvm::Function>(callee.getCallee());
        fn->setDoesNotAccessMemory();
        fn->setDoesNotThrow();
        fn->addParamAttr(0, llvm::Attribute::ZExt);
        llvm::CallInst* call = b.CreateCall(callee, {bits});
        call->addParamAttr(0, llvm::Attribute::ZExt);
        return call;
      }
    }
    FJ_ASSERT(false, "bad DType");
  }

  llvm::Value* cast(Builder& b, ScalarType to, ScalarType from, llvm::Value* v) {
    if (to == from) return v;
    if (to == ScalarType::F32) {
      return from == ScalarType::Bool ? b.CreateUIToFP(v, f32()) : b.CreateSIToFP(v, f32());
    }
    FJ_ASSERT(to == ScalarType::I32, "cast to bool");
    if (from == ScalarType::Bool) return b.CreateZExt(v, i32());
    // Truncates toward zero, saturates, NaN -> 0: exactly fptosi.sat.
    return b.CreateCall(intrinsic(llvm::Intrinsic::fptosi_sat, {i32(), f32()}), {v});
  }

  llvm::Value* unary(Builder& b, Op op, ScalarType t, llvm::Value* x) {
    if (op == Op::Not) return b.CreateNot(x);
    if (t == ScalarType::I32) {
      llvm::Value* neg = b.CreateSub(b.getInt32(0), x);  // wraps: no nsw
      if (op == Op::Neg) return neg;
      FJ_ASSERT(op == Op::Abs, "math function of i32");
      return b.CreateSelect(b.CreateICmpSLT(x, b.getInt32(0)), neg, x);
    }
    llvm::Value* one = llvm::ConstantFP::get(f32(), 1.0);
    switch (op) {
      case Op::Neg:
        return b.CreateFNeg(x);
      case Op::Abs:
        return b.CreateCall(intrinsic(llvm::Intrinsic::fabs, {f32()}), {x});
      case Op::Exp:
        return call_math(b, "fj_expf", {x});
      case Op::Exp2:
        return call_math(b, "fj_exp2f", {x});
      case Op::Log:
        return call_math(b, "fj_logf", {x});
      case Op::Log2:
        return call_math(b, "fj_log2f", {x});
      case Op::Tanh:
        return call_math(b, "fj_tanhf", {x});
      case Op::Sigmoid:  // 1 / (1 + expf(-x))
        return b.CreateFDiv(one, b.CreateFAdd(one, call_math(b, "fj_expf", {b.CreateFNeg(x)})));
      case Op::Sqrt:
        return b.CreateCall(intrinsic(llvm::Intrinsic::sqrt, {f32()}), {x});
      case Op::Rsqrt:
        return b.CreateFDiv(one, b.CreateCall(intrinsic(llvm::Intrinsic::sqrt, {f32()}), {x}));
      case Op::Floor:
        return b.CreateCall(intrinsic(llvm::Intrinsic::floor, {f32()}), {x});
      case Op::Ceil:
        return b.CreateCall(intrinsic(llvm::Intrinsic::ceil, {f32()}), {x});
      default:
        break;
    }
    FJ_ASSERT(false, "unary: not a unary op");
  }

  llvm::Value* binary_i32(Builder& b, Op op, llvm::Value* x, llvm::Value* y) {
    llvm::Value* zero = b.getInt32(0);
    llvm::Value* one = b.getInt32(1);
    switch (op) {
      case Op::Add:
        return b.CreateAdd(x, y);  // wraps: no nsw / nuw
      case Op::Sub:
        return b.CreateSub(x, y);
      case Op::Mul:
        return b.CreateMul(x, y);
      case Op::Div: {
        // Floor division; x / 0 == 0. A divisor of 1 stands in for 0 and for -1 with
        // x == INT_MIN (where sdiv traps), which gives INT_MIN, the wrapped result.
        llvm::Value* y0 = b.CreateICmpEQ(y, zero);
        llvm::Value* overflow =
            b.CreateAnd(b.CreateICmpEQ(x, b.getInt32(std::numeric_limits<int32_t>::min())),
                        b.CreateICmpEQ(y, b.getInt32(-1)));
        llvm::Value* d = b.CreateSelect(b.CreateOr(y0, overflow), one, y);
        llvm::Value* q = b.CreateSDiv(x, d);
        llvm::Value* r = b.CreateSRem(x, d);
        // Round toward -inf: step down when the remainder is non-zero and signs differ.
        llvm::Value* adjust =
            b.CreateAnd(b.CreateICmpNE(r, zero), b.CreateICmpSLT(b.CreateXor(r, d), zero));
        q = b.CreateSub(q, b.CreateZExt(adjust, i32()));
        return b.CreateSelect(y0, zero, q);
      }
      case Op::Mod: {
        // Floor modulo; x % 0 == x % -1 == 0, which a divisor of 1 gives.
        llvm::Value* d = b.CreateSelect(
            b.CreateOr(b.CreateICmpEQ(y, zero), b.CreateICmpEQ(y, b.getInt32(-1))), one, y);
        llvm::Value* r = b.CreateSRem(x, d);
        llvm::Value* adjust =
            b.CreateAnd(b.CreateICmpNE(r, zero), b.CreateICmpSLT(b.CreateXor(r, d), zero));
        return b.CreateSelect(adjust, b.CreateAdd(r, d), r);
      }
      case Op::Min:
        return b.CreateSelect(b.CreateICmpSLT(x, y), x, y);
      case Op::Max:
        return b.CreateSelect(b.CreateICmpSGT(x, y), x, y);
      case Op::EQ:
        return b.CreateICmpEQ(x, y);
      case Op::NE:
        return b.CreateICmpNE(x, y);
      case Op::LT:
        return b.CreateICmpSLT(x, y);
      case Op::LE:
        return b.CreateICmpSLE(x, y);
      case Op::GT:
        return b.CreateICmpSGT(x, y);
      case Op::GE:
        return b.CreateICmpSGE(x, y);
      default:
        break;
    }
    FJ_ASSERT(false, "binary op not defined on i32");
  }

  llvm::Value* binary_f32(Builder& b, Op op, llvm::Value* x, llvm::Value* y) {
    switch (op) {
      case Op::Add:
        return b.CreateFAdd(x, y);
      case Op::Sub:
        return b.CreateFSub(x, y);
      case Op::Mul:
        return b.CreateFMul(x, y);
      case Op::Div:
        return b.CreateFDiv(x, y);
      case Op::Mod: {  // a - b * floor(a / b), each step rounded to float
        llvm::Value* q =
            b.CreateCall(intrinsic(llvm::Intrinsic::floor, {f32()}), {b.CreateFDiv(x, y)});
        return b.CreateFSub(x, b.CreateFMul(y, q));
      }
      case Op::Min:
      case Op::Max: {
        // glibc's fminf / fmaxf: a NaN operand yields the other; otherwise x < y ? x : y
        // (x > y ? x : y), which fixes the sign of equal zeros as glibc's minss / maxss does.
        llvm::Value* pick = op == Op::Min ? b.CreateFCmpOLT(x, y) : b.CreateFCmpOGT(x, y);
        llvm::Value* r = b.CreateSelect(pick, x, y);
        r = b.CreateSelect(b.CreateFCmpUNO(x, x), y, r);
        return b.CreateSelect(b.CreateFCmpUNO(y, y), x, r);
      }
      case Op::Pow:
        return call_math(b, "fj_powf", {x, y});
      case Op::EQ:
        return b.CreateFCmpOEQ(x, y);
      case Op::NE:
        return b.CreateFCmpUNE(x, y);
      case Op::LT:
        return b.CreateFCmpOLT(x, y);
      case Op::LE:
        return b.CreateFCmpOLE(x, y);
      case Op::GT:
        return b.CreateFCmpOGT(x, y);
      case Op::GE:
        return b.CreateFCmpOGE(x, y);
      default:
        break;
    }
    FJ_ASSERT(false, "binary op not defined on f32");
  }

  llvm::Value* emit_node(Builder& b, const ir::Node& n, const std::vector<llvm::Value*>& a,
                         const Leaves& leaves) {
    switch (n.op) {
      case Op::IntImm:
        return b.getInt32(static_cast<uint32_t>(static_cast<int32_t>(n.ival)));
      case Op::FloatImm:
        return llvm::ConstantFP::get(f32(), static_cast<double>(static_cast<float>(n.fval)));
      case Op::BoolImm:
        return b.getInt1(n.ival != 0);
      case Op::Var: {
        llvm::Value* v = nullptr;
        switch (n.var) {
          case ir::VarKind::Score:
            v = leaves.score;
            break;
          case ir::VarKind::B:
            v = leaves.b;
            break;
          case ir::VarKind::H:
            v = leaves.h;
            break;
          case ir::VarKind::QIdx:
            v = leaves.q;
            break;
          case ir::VarKind::KvIdx:
            v = leaves.kv;
            break;
        }
        FJ_ASSERT(v != nullptr, "score used where it is not defined (mask_mod)");
        return v;
      }
      case Op::Param: {
        auto it = params_.find(n.param->name);
        FJ_ASSERT(it != params_.end(), "param missing from Mods::params: " + n.param->name);
        return it->second;
      }
      case Op::Load:
        return load(b, n, a);
      case Op::Cast:
        return cast(b, n.type, n.args[0]->type, a[0]);
      case Op::Select:
        return b.CreateSelect(a[0], a[1], a[2]);
      case Op::And:
        return b.CreateAnd(a[0], a[1]);
      case Op::Or:
        return b.CreateOr(a[0], a[1]);
      default:
        break;
    }
    if (ir::is_unary(n.op)) return unary(b, n.op, n.args[0]->type, a[0]);
    FJ_ASSERT(ir::is_binary(n.op), "unknown node");
    const ScalarType t = n.args[0]->type;
    if (t == ScalarType::Bool) {
      FJ_ASSERT(n.op == Op::EQ || n.op == Op::NE, "arithmetic on bool");
      return n.op == Op::EQ ? b.CreateICmpEQ(a[0], a[1]) : b.CreateICmpNE(a[0], a[1]);
    }
    return t == ScalarType::I32 ? binary_i32(b, n.op, a[0], a[1]) : binary_f32(b, n.op, a[0], a[1]);
  }

  const Mods& mods_;
  llvm::Module& module_;
  llvm::LLVMContext& ctx_;
  CpuModParamLayout layout_;
  llvm::MDNode* buffer_scope_ = nullptr;
  llvm::MDNode* out_scope_ = nullptr;
  std::unordered_map<std::string, BufferInfo> buffers_;
  std::unordered_map<std::string, llvm::Value*> params_;
};

// Emits the functions of emit_mod_module.
class ModuleEmitter {
 public:
  ModuleEmitter(const Mods& mods, llvm::Module& m) : mods_(mods), m_(m), lower_(mods, m) {}

  void run() {
    emit_score();
    emit_mask();
    emit_score_row("fj_score_row", true);
    emit_score_row("fj_score_row_nomask", false);
    emit_mask_row();
    emit_mask_tile();
  }

 private:
  llvm::Function* function(const char* name, llvm::Type* ret, std::vector<llvm::Type*> args) {
    auto* fn = llvm::Function::Create(llvm::FunctionType::get(ret, args, false),
                                      llvm::Function::ExternalLinkage, name, m_);
    fn->setDoesNotThrow();
    fn->addParamAttr(0, llvm::Attribute::NoAlias);
    fn->addParamAttr(0, llvm::Attribute::ReadOnly);
    fn->addParamAttr(0, llvm::Attribute::NoCapture);
    return fn;
  }

  llvm::Value* score_of(Builder& b, llvm::Value* s, const Leaves& l) {
    if (!mods_.score_mod.defined()) return s;
    return lower_.emit(b, mods_.score_mod, l);
  }
  llvm::Value* keep_of(Builder& b, const Leaves& l) {
    if (!mods_.mask_mod.defined()) return b.getTrue();
    return lower_.emit(b, mods_.mask_mod, l);
  }

  // for (i = 0; i < n; ++i) body(i (i64), kv0 + i (i32)); then `ret void`.
  void row_loop(Builder& b, llvm::Function* fn, llvm::Value* kv0, llvm::Value* n,
                const std::function<void(llvm::Value*, llvm::Value*)>& body) {
    auto& ctx = m_.getContext();
    llvm::BasicBlock* entry = b.GetInsertBlock();
    auto* loop = llvm::BasicBlock::Create(ctx, "loop", fn);
    auto* exit = llvm::BasicBlock::Create(ctx, "exit", fn);
    llvm::Value* count = b.CreateZExt(n, b.getInt64Ty());
    b.CreateCondBr(b.CreateICmpSGT(n, b.getInt32(0)), loop, exit);
    b.SetInsertPoint(loop);
    llvm::PHINode* i = b.CreatePHI(b.getInt64Ty(), 2, "i");
    i->addIncoming(b.getInt64(0), entry);
    llvm::Value* kv = b.CreateAdd(kv0, b.CreateTrunc(i, b.getInt32Ty()), "kv");
    body(i, kv);
    llvm::Value* next = b.CreateAdd(i, b.getInt64(1), "", true, true);
    i->addIncoming(next, b.GetInsertBlock());
    b.CreateCondBr(b.CreateICmpULT(next, count), loop, exit);
    b.SetInsertPoint(exit);
    b.CreateRetVoid();
  }

  void emit_score() {
    auto* i32 = lower_.i32();
    llvm::Function* fn =
        function("fj_score", lower_.f32(), {lower_.ptr(), lower_.f32(), i32, i32, i32, i32});
    Builder b(llvm::BasicBlock::Create(m_.getContext(), "entry", fn));
    lower_.begin_function(b, fn->getArg(0));
    Leaves l{fn->getArg(1), fn->getArg(2), fn->getArg(3), fn->getArg(4), fn->getArg(5)};
    b.CreateRet(score_of(b, fn->getArg(1), l));
  }

  void emit_mask() {
    auto* i32 = lower_.i32();
    llvm::Function* fn = function("fj_mask", i32, {lower_.ptr(), i32, i32, i32, i32});
    Builder b(llvm::BasicBlock::Create(m_.getContext(), "entry", fn));
    lower_.begin_function(b, fn->getArg(0));
    Leaves l{nullptr, fn->getArg(1), fn->getArg(2), fn->getArg(3), fn->getArg(4)};
    b.CreateRet(b.CreateZExt(keep_of(b, l), i32));
  }

  void emit_score_row(const char* name, bool masked) {
    auto* i32 = lower_.i32();
    llvm::Function* fn = function(name, llvm::Type::getVoidTy(m_.getContext()),
                                  {lower_.ptr(), lower_.ptr(), i32, i32, i32, i32, i32});
    fn->addParamAttr(1, llvm::Attribute::NoAlias);
    fn->addParamAttr(1, llvm::Attribute::NoCapture);
    Builder b(llvm::BasicBlock::Create(m_.getContext(), "entry", fn));
    lower_.begin_function(b, fn->getArg(0));
    llvm::Value* scores = fn->getArg(1);
    row_loop(b, fn, fn->getArg(5), fn->getArg(6), [&](llvm::Value* i, llvm::Value* kv) {
      llvm::Value* at = b.CreateInBoundsGEP(lower_.f32(), scores, i);
      llvm::LoadInst* s = b.CreateLoad(lower_.f32(), at);
      lower_.mark_row_access(s);
      Leaves l{s, fn->getArg(2), fn->getArg(3), fn->getArg(4), kv};
      llvm::Value* r = score_of(b, s, l);
      if (masked && mods_.mask_mod.defined()) {
        llvm::Value* minus_inf = llvm::ConstantFP::getInfinity(lower_.f32(), /*Negative=*/true);
        r = b.CreateSelect(keep_of(b, l), r, minus_inf);
      }
      lower_.mark_row_access(b.CreateStore(r, at));
    });
  }

  void emit_mask_row() {
    auto* i32 = lower_.i32();
    llvm::Function* fn = function("fj_mask_row", llvm::Type::getVoidTy(m_.getContext()),
                                  {lower_.ptr(), lower_.ptr(), i32, i32, i32, i32, i32});
    fn->addParamAttr(1, llvm::Attribute::NoAlias);
    fn->addParamAttr(1, llvm::Attribute::NoCapture);
    Builder b(llvm::BasicBlock::Create(m_.getContext(), "entry", fn));
    lower_.begin_function(b, fn->getArg(0));
    row_loop(b, fn, fn->getArg(5), fn->getArg(6), [&](llvm::Value* i, llvm::Value* kv) {
      Leaves l{nullptr, fn->getArg(2), fn->getArg(3), fn->getArg(4), kv};
      llvm::Value* keep = b.CreateZExt(keep_of(b, l), b.getInt8Ty());
      lower_.mark_row_access(
          b.CreateStore(keep, b.CreateInBoundsGEP(b.getInt8Ty(), fn->getArg(1), i)));
    });
  }

  void emit_mask_tile() {
    auto& ctx = m_.getContext();
    auto* i32 = lower_.i32();
    llvm::Function* fn =
        function("fj_mask_tile", i32, {lower_.ptr(), i32, i32, i32, i32, i32, i32});
    llvm::Value *bb = fn->getArg(1), *hh = fn->getArg(2), *q0 = fn->getArg(3), *q1 = fn->getArg(4),
                *kv0 = fn->getArg(5), *kv1 = fn->getArg(6);
    auto* entry = llvm::BasicBlock::Create(ctx, "entry", fn);
    auto* empty = llvm::BasicBlock::Create(ctx, "empty", fn);
    auto* body = llvm::BasicBlock::Create(ctx, "body", fn);
    Builder b(entry);
    lower_.begin_function(b, fn->getArg(0));
    b.CreateCondBr(b.CreateOr(b.CreateICmpSGE(q0, q1), b.CreateICmpSGE(kv0, kv1)), empty, body);
    b.SetInsertPoint(empty);
    b.CreateRet(b.getInt32(kTileEmpty));
    b.SetInsertPoint(body);
    if (!mods_.mask_mod.defined()) {
      b.CreateRet(b.getInt32(kTileFull));
      return;
    }
    auto* outer = llvm::BasicBlock::Create(ctx, "q_loop", fn);
    auto* inner = llvm::BasicBlock::Create(ctx, "kv_loop", fn);
    auto* latch = llvm::BasicBlock::Create(ctx, "q_latch", fn);
    auto* partial = llvm::BasicBlock::Create(ctx, "partial", fn);
    auto* done = llvm::BasicBlock::Create(ctx, "done", fn);
    b.CreateBr(outer);

    b.SetInsertPoint(outer);
    llvm::PHINode* q = b.CreatePHI(i32, 2, "q");
    llvm::PHINode* any = b.CreatePHI(i32, 2, "any");
    llvm::PHINode* all = b.CreatePHI(i32, 2, "all");
    q->addIncoming(q0, body);
    any->addIncoming(b.getInt32(0), body);
    all->addIncoming(b.getInt32(1), body);
    b.CreateBr(inner);

    // The kv loop is a branch-free and/or reduction, which the loop vectoriser handles.
    b.SetInsertPoint(inner);
    llvm::PHINode* kv = b.CreatePHI(i32, 2, "kv");
    llvm::PHINode* row_any = b.CreatePHI(i32, 2, "row_any");
    llvm::PHINode* row_all = b.CreatePHI(i32, 2, "row_all");
    kv->addIncoming(kv0, outer);
    row_any->addIncoming(b.getInt32(0), outer);
    row_all->addIncoming(b.getInt32(1), outer);
    Leaves l{nullptr, bb, hh, q, kv};
    llvm::Value* m = b.CreateZExt(keep_of(b, l), i32);
    llvm::Value* row_any_next = b.CreateOr(row_any, m);
    llvm::Value* row_all_next = b.CreateAnd(row_all, m);
    llvm::Value* kv_next = b.CreateAdd(kv, b.getInt32(1), "", false, true);
    row_any->addIncoming(row_any_next, inner);
    row_all->addIncoming(row_all_next, inner);
    kv->addIncoming(kv_next, inner);
    b.CreateCondBr(b.CreateICmpSLT(kv_next, kv1), inner, latch);

    b.SetInsertPoint(latch);
    llvm::Value* any_next = b.CreateOr(any, row_any_next);
    llvm::Value* all_next = b.CreateAnd(all, row_all_next);
    llvm::Value* q_next = b.CreateAdd(q, b.getInt32(1), "", false, true);
    llvm::Value* mixed = b.CreateICmpNE(any_next, all_next);  // some kept, some not
    auto* next_row = llvm::BasicBlock::Create(ctx, "next_row", fn);
    b.CreateCondBr(mixed, partial, next_row);
    b.SetInsertPoint(next_row);
    b.CreateCondBr(b.CreateICmpSLT(q_next, q1), outer, done);
    q->addIncoming(q_next, next_row);
    any->addIncoming(any_next, next_row);
    all->addIncoming(all_next, next_row);

    b.SetInsertPoint(partial);
    b.CreateRet(b.getInt32(kTilePartial));
    b.SetInsertPoint(done);
    // Not mixed: either everything was kept (all == 1) or nothing was (any == 0).
    b.CreateRet(b.CreateSelect(b.CreateICmpNE(all_next, b.getInt32(0)), b.getInt32(kTileFull),
                               b.getInt32(kTileEmpty)));
  }

  const Mods& mods_;
  llvm::Module& m_;
  ModLowering lower_;
};

}  // namespace

std::unique_ptr<llvm::Module> emit_mod_module(const Mods& mods, llvm::LLVMContext& ctx) {
  mods.check();
  auto m = std::make_unique<llvm::Module>("flexjit_mods", ctx);
  ModuleEmitter(mods, *m).run();
  return m;
}

CpuModFunctions compile_cpu_mods(const Mods& mods) {
  mods.check();
  CpuModFunctions f;
  f.module = OrcJit::instance().get(
      kModsKind, mods, [&](llvm::LLVMContext& ctx) { return emit_mod_module(mods, ctx); });
  auto get = [&](const char* name) {
    void* p = f.module->lookup(name);
    FJ_ASSERT(p != nullptr, fmt::format("compiled CPU mods lack {}", name));
    return p;
  };
  f.score = reinterpret_cast<CpuScoreFn>(get("fj_score"));
  f.mask = reinterpret_cast<CpuMaskFn>(get("fj_mask"));
  f.score_row = reinterpret_cast<CpuScoreRowFn>(get("fj_score_row"));
  f.score_row_nomask = reinterpret_cast<CpuScoreRowFn>(get("fj_score_row_nomask"));
  f.mask_row = reinterpret_cast<CpuMaskRowFn>(get("fj_mask_row"));
  f.mask_tile = reinterpret_cast<CpuMaskTileFn>(get("fj_mask_tile"));
  f.has_score_mod = mods.score_mod.defined();
  f.has_mask_mod = mods.mask_mod.defined();
  return f;
}

}  // namespace flexjit::llvmjit

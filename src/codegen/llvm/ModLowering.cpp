#include "codegen/llvm/ModLowering.h"

#include "ir/Visitor.h"

#include <llvm/ADT/StringMap.h>
#include <llvm/IR/Constants.h>
#include <llvm/IR/DerivedTypes.h>
#include <llvm/IR/Intrinsics.h>
#include <llvm/IR/MDBuilder.h>
#include <llvm/TargetParser/Host.h>

#include <limits>

namespace flexjit::llvmjit {

using ir::Op;

namespace {

bool host_has_f16c() {
  static const bool has = [] {
    llvm::StringMap<bool> features;
    return llvm::sys::getHostCPUFeatures(features) && features.lookup("f16c");
  }();
  return has;
}

}  // namespace

ModLowering::ModLowering(const Mods& mods, llvm::Module& module)
    : mods_(mods), module_(module), ctx_(module.getContext()), layout_(cpu_layout_of(mods)) {
  llvm::MDBuilder md(ctx_);
  llvm::MDNode* domain = md.createAnonymousAliasScopeDomain("fj");
  buffer_scope_ = llvm::MDNode::get(ctx_, {md.createAnonymousAliasScope(domain, "buffers")});
  out_scope_ = llvm::MDNode::get(ctx_, {md.createAnonymousAliasScope(domain, "rows")});
}

// Marks a load or store of the row arrays as not aliasing any captured buffer.
void ModLowering::mark_row_access(llvm::Instruction* inst) {
  inst->setMetadata(llvm::LLVMContext::MD_alias_scope, out_scope_);
  inst->setMetadata(llvm::LLVMContext::MD_noalias, buffer_scope_);
}

void ModLowering::begin_function(llvm::IRBuilder<>& b, llvm::Value* params) {
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
llvm::Value* ModLowering::emit(llvm::IRBuilder<>& b, const Expr& e, const Leaves& leaves) {
  std::unordered_map<const ir::Node*, llvm::Value*> value;
  ir::for_each_node(e, [&](const Expr& n) {
    std::vector<llvm::Value*> a;
    for (const Expr& arg : n->args)
      a.push_back(value.at(arg.get()));
    value[n.get()] = emit_node(b, *n.get(), a, leaves);
  });
  return value.at(e.get());
}

llvm::Function* ModLowering::intrinsic(llvm::Intrinsic::ID id, std::vector<llvm::Type*> types) {
  return llvm::Intrinsic::getDeclaration(&module_, id, types);
}

// A libm function through its opaque fj_ alias (see OrcJit.cpp for why).
llvm::Value* ModLowering::call_math(llvm::IRBuilder<>& b, const char* name,
                                    std::vector<llvm::Value*> args) {
  std::vector<llvm::Type*> types(args.size(), f32());
  auto callee = module_.getOrInsertFunction(name, llvm::FunctionType::get(f32(), types, false));
  auto* fn = llvm::cast<llvm::Function>(callee.getCallee());
  fn->setDoesNotAccessMemory();
  fn->setDoesNotThrow();
  fn->addFnAttr(llvm::Attribute::WillReturn);
  return b.CreateCall(callee, args);
}

llvm::Value* ModLowering::load(llvm::IRBuilder<>& b, const ir::Node& n,
                               const std::vector<llvm::Value*>& idx) {
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
    case DType::E4M3:
      break;  // refused as a buffer dtype where a buffer is declared (dsl::Buffer, the parser)
  }
  FJ_ASSERT(false, "bad DType");
}

llvm::Value* ModLowering::cast(llvm::IRBuilder<>& b, ScalarType to, ScalarType from,
                               llvm::Value* v) {
  if (to == from) return v;
  if (to == ScalarType::F32) {
    return from == ScalarType::Bool ? b.CreateUIToFP(v, f32()) : b.CreateSIToFP(v, f32());
  }
  FJ_ASSERT(to == ScalarType::I32, "cast to bool");
  if (from == ScalarType::Bool) return b.CreateZExt(v, i32());
  // Truncates toward zero, saturates, NaN -> 0: exactly fptosi.sat.
  return b.CreateCall(intrinsic(llvm::Intrinsic::fptosi_sat, {i32(), f32()}), {v});
}

llvm::Value* ModLowering::unary(llvm::IRBuilder<>& b, Op op, ScalarType t, llvm::Value* x) {
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

llvm::Value* ModLowering::binary_i32(llvm::IRBuilder<>& b, Op op, llvm::Value* x, llvm::Value* y) {
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

llvm::Value* ModLowering::binary_f32(llvm::IRBuilder<>& b, Op op, llvm::Value* x, llvm::Value* y) {
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

llvm::Value* ModLowering::emit_node(llvm::IRBuilder<>& b, const ir::Node& n,
                                    const std::vector<llvm::Value*>& a, const Leaves& leaves) {
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

}  // namespace flexjit::llvmjit

#include "codegen/llvm/BackwardCodegen.h"

#include "codegen/llvm/CpuModParams.h"
#include "codegen/llvm/ModLowering.h"
#include "ir/IR.h"
#include "passes/Autodiff.h"

#include <fmt/format.h>

#include <llvm/IR/Constants.h>
#include <llvm/IR/DerivedTypes.h>
#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/Module.h>

#include <functional>
#include <string>

namespace flexjit::llvmjit {

namespace {

using Builder = llvm::IRBuilder<>;

int buffer_index(const Mods& mods, const std::string& name) {
  for (size_t i = 0; i < mods.buffers.size(); ++i) {
    if (mods.buffers[i].name() == name) return static_cast<int>(i);
  }
  FJ_ASSERT(false, fmt::format("gradient of undeclared buffer {}", name));
  return -1;
}

class BackwardEmitter {
 public:
  BackwardEmitter(const Mods& mods, const passes::ScoreModGrads& grads, llvm::Module& m)
      : mods_(mods), grads_(grads), m_(m), lower_(mods, m), layout_(cpu_layout_of(mods)) {}

  void run() {
    if (mods_.score_mod.defined()) emit_dscore_row();
    for (size_t k = 0; k < grads_.buffers.size(); ++k) {
      emit_bufgrad(k, false);
      emit_bufgrad(k, true);
    }
  }

 private:
  llvm::Function* function(const std::string& name, std::vector<llvm::Type*> args) {
    auto* fn = llvm::Function::Create(
        llvm::FunctionType::get(llvm::Type::getVoidTy(m_.getContext()), args, false),
        llvm::Function::ExternalLinkage, name, m_);
    fn->setDoesNotThrow();
    fn->addParamAttr(0, llvm::Attribute::NoAlias);
    fn->addParamAttr(0, llvm::Attribute::ReadOnly);
    fn->addParamAttr(0, llvm::Attribute::NoCapture);
    for (unsigned a = 1; a < args.size() && args[a]->isPointerTy(); ++a) {
      fn->addParamAttr(a, llvm::Attribute::NoAlias);
      fn->addParamAttr(a, llvm::Attribute::NoCapture);
    }
    return fn;
  }

  // for (i = 0; i < n; ++i) body(i (i64), kv0 + i (i32), latch block to branch to); ret void.
  // `body` must end its last block with a branch to the latch it is given.
  void row_loop(Builder& b, llvm::Function* fn, llvm::Value* kv0, llvm::Value* n,
                const std::function<void(llvm::Value*, llvm::Value*, llvm::BasicBlock*)>& body) {
    auto& ctx = m_.getContext();
    llvm::BasicBlock* entry = b.GetInsertBlock();
    auto* loop = llvm::BasicBlock::Create(ctx, "loop", fn);
    auto* latch = llvm::BasicBlock::Create(ctx, "latch", fn);
    auto* exit = llvm::BasicBlock::Create(ctx, "exit", fn);
    llvm::Value* count = b.CreateZExt(n, b.getInt64Ty());
    b.CreateCondBr(b.CreateICmpSGT(n, b.getInt32(0)), loop, exit);
    b.SetInsertPoint(loop);
    llvm::PHINode* i = b.CreatePHI(b.getInt64Ty(), 2, "i");
    i->addIncoming(b.getInt64(0), entry);
    llvm::Value* kv = b.CreateAdd(kv0, b.CreateTrunc(i, b.getInt32Ty()), "kv");
    body(i, kv, latch);
    b.SetInsertPoint(latch);
    llvm::Value* next = b.CreateAdd(i, b.getInt64(1), "", true, true);
    i->addIncoming(next, latch);
    b.CreateCondBr(b.CreateICmpULT(next, count), loop, exit);
    b.SetInsertPoint(exit);
    b.CreateRetVoid();
  }

  void emit_dscore_row() {
    auto* i32 = lower_.i32();
    auto* f32 = lower_.f32();
    llvm::Function* fn = function(
        "fj_dscore_row", {lower_.ptr(), lower_.ptr(), lower_.ptr(), i32, i32, i32, i32, i32});
    fn->addParamAttr(2, llvm::Attribute::ReadOnly);
    Builder b(llvm::BasicBlock::Create(m_.getContext(), "entry", fn));
    lower_.begin_function(b, fn->getArg(0));
    row_loop(b, fn, fn->getArg(6), fn->getArg(7),
             [&](llvm::Value* i, llvm::Value* kv, llvm::BasicBlock* latch) {
               llvm::Value* d_at = b.CreateInBoundsGEP(f32, fn->getArg(1), i);
               llvm::LoadInst* pre = b.CreateLoad(f32, b.CreateInBoundsGEP(f32, fn->getArg(2), i));
               lower_.mark_row_access(pre);
               llvm::LoadInst* d = b.CreateLoad(f32, d_at);
               lower_.mark_row_access(d);
               Leaves l{pre, fn->getArg(3), fn->getArg(4), fn->getArg(5), kv};
               llvm::Value* r = b.CreateFMul(d, lower_.emit(b, grads_.d_score, l));
               lower_.mark_row_access(b.CreateStore(r, d_at));
               b.CreateBr(latch);
             });
  }

  void emit_bufgrad(size_t k, bool f64) {
    const passes::BufferGrad& g = grads_.buffers[k];
    const int bi = buffer_index(mods_, g.buffer->name);
    const int slot = layout_.buffer_slot[bi];
    const int rank = g.buffer->rank();
    auto* i32 = lower_.i32();
    auto* f32 = lower_.f32();
    llvm::Type* acc = f64 ? llvm::Type::getDoubleTy(m_.getContext()) : f32;
    std::string name = fmt::format("fj_bufgrad_{}{}", k, f64 ? "_f64" : "");
    llvm::Function* fn = function(
        name, {lower_.ptr(), lower_.ptr(), lower_.ptr(), lower_.ptr(), i32, i32, i32, i32, i32});
    fn->addParamAttr(2, llvm::Attribute::ReadOnly);
    fn->addParamAttr(3, llvm::Attribute::ReadOnly);
    auto& ctx = m_.getContext();
    Builder b(llvm::BasicBlock::Create(ctx, "entry", fn));
    lower_.begin_function(b, fn->getArg(0));
    // Extents from the slot array; the gradient's row-major strides.
    std::vector<llvm::Value*> extent(rank), stride(rank);
    for (int d = 0; d < rank; ++d) {
      extent[d] = b.CreateLoad(
          lower_.i64(), b.CreateConstInBoundsGEP1_64(lower_.i64(), fn->getArg(0), slot + 1 + d));
    }
    llvm::Value* s = b.getInt64(1);
    for (int d = rank - 1; d >= 0; --d) {
      stride[d] = s;
      s = b.CreateMul(s, extent[d]);
    }
    row_loop(
        b, fn, fn->getArg(7), fn->getArg(8),
        [&](llvm::Value* i, llvm::Value* kv, llvm::BasicBlock* latch) {
          llvm::LoadInst* ds = b.CreateLoad(acc, b.CreateInBoundsGEP(acc, fn->getArg(2), i));
          lower_.mark_row_access(ds);
          llvm::LoadInst* pre = b.CreateLoad(f32, b.CreateInBoundsGEP(f32, fn->getArg(3), i));
          lower_.mark_row_access(pre);
          Leaves l{pre, fn->getArg(4), fn->getArg(5), fn->getArg(6), kv};
          llvm::Value* reached = lower_.emit(b, g.reached, l);
          llvm::Value* nonzero = b.CreateFCmpONE(ds, llvm::ConstantFP::get(acc, 0.0));
          auto* store = llvm::BasicBlock::Create(ctx, "accumulate", fn, latch);
          b.CreateCondBr(b.CreateAnd(nonzero, reached), store, latch);
          b.SetInsertPoint(store);
          llvm::Value* deriv = lower_.emit(b, g.derivative, l);
          if (f64) deriv = b.CreateFPExt(deriv, acc);
          llvm::Value* off = b.getInt64(0);
          for (int d = 0; d < rank; ++d) {
            llvm::Value* idx = b.CreateSExt(lower_.emit(b, g.indices[d], l), lower_.i64());
            llvm::Value* hi = b.CreateSub(extent[d], b.getInt64(1));
            idx = b.CreateSelect(b.CreateICmpSLT(idx, b.getInt64(0)), b.getInt64(0), idx);
            idx = b.CreateSelect(b.CreateICmpSGT(idx, hi), hi, idx);
            off = b.CreateAdd(off, b.CreateMul(idx, stride[d]));
          }
          llvm::Value* at = b.CreateInBoundsGEP(acc, fn->getArg(1), off);
          llvm::LoadInst* old = b.CreateLoad(acc, at);
          lower_.mark_row_access(old);
          lower_.mark_row_access(b.CreateStore(b.CreateFAdd(old, b.CreateFMul(ds, deriv)), at));
          b.CreateBr(latch);
        });
  }

  const Mods& mods_;
  const passes::ScoreModGrads& grads_;
  llvm::Module& m_;
  ModLowering lower_;
  CpuModParamLayout layout_;
};

}  // namespace

CpuBackwardFunctions compile_cpu_backward(const Mods& mods) {
  mods.check();
  const passes::ScoreModGrads grads = passes::differentiate(mods.score_mod);
  CpuBackwardFunctions f;
  f.module = OrcJit::instance().get(kBackwardKind, mods, [&](llvm::LLVMContext& ctx) {
    auto m = std::make_unique<llvm::Module>("flexjit_backward", ctx);
    BackwardEmitter(mods, grads, *m).run();
    return m;
  });
  auto get = [&](const std::string& name) {
    void* p = f.module->lookup(name);
    FJ_ASSERT(p != nullptr, fmt::format("compiled CPU backward lacks {}", name));
    return p;
  };
  if (mods.score_mod.defined())
    f.dscore_row = reinterpret_cast<CpuDScoreRowFn>(get("fj_dscore_row"));
  for (size_t k = 0; k < grads.buffers.size(); ++k) {
    CpuBackwardFunctions::BufferGrad g;
    g.buffer = buffer_index(mods, grads.buffers[k].buffer->name);
    g.f32 = reinterpret_cast<CpuBufGradRowFn>(get(fmt::format("fj_bufgrad_{}", k)));
    g.f64 = reinterpret_cast<CpuBufGradRowF64Fn>(get(fmt::format("fj_bufgrad_{}_f64", k)));
    f.buffers.push_back(g);
  }
  return f;
}

}  // namespace flexjit::llvmjit

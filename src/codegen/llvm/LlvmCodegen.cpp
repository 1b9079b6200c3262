#include "codegen/llvm/LlvmCodegen.h"

#include "codegen/llvm/CpuModParams.h"
#include "codegen/llvm/ModLowering.h"
#include "codegen/llvm/OrcJit.h"
#include "ir/IR.h"

#include <fmt/format.h>

#include <llvm/IR/Constants.h>
#include <llvm/IR/DerivedTypes.h>
#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/Module.h>

#include <functional>
#include <limits>
#include <unordered_map>

namespace flexjit::llvmjit {

namespace {

using Builder = llvm::IRBuilder<>;

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

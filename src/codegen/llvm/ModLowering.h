// Lowering of mod-language expressions to straight-line LLVM IR: the building block of every
// CPU function flexjit generates (LlvmCodegen.cpp's mod functions; a backward pass's gradient
// functions the same way). Internal to src/codegen/llvm: this header includes LLVM headers, so
// only src/codegen/llvm/*.cpp may include it.
//
//   ModLowering lower(mods, module);
//   ... create a function whose first argument is the CpuModParams.h slot array ...
//   llvm::IRBuilder<> b(entry);
//   lower.begin_function(b, params_arg);          // loads buffer descriptors and params once
//   llvm::Value* v = lower.emit(b, expr, leaves);  // anywhere after, e.g. in a loop body
//
// `expr` may be any expression over the mods' buffers and params (the score_mod, the mask_mod,
// or an expression derived from them). Emitted code is branch-free and never traps (see
// LlvmCodegen.h for the semantics), so it may sit in a vectorisable loop. Row arrays written by
// the generated function should be marked with mark_row_access(), which tells LLVM that they do
// not alias the captured buffers.
#pragma once

#include <flexjit/mods.h>

#include "codegen/llvm/CpuModParams.h"
#include "ir/IR.h"

#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/Module.h>

#include <string>
#include <unordered_map>
#include <vector>

namespace flexjit::llvmjit {

// The values of the language's leaves in the function being emitted.
struct Leaves {
  llvm::Value* score = nullptr;  // f32; null where the mod may not use it (mask functions)
  llvm::Value* b = nullptr;
  llvm::Value* h = nullptr;
  llvm::Value* q = nullptr;
  llvm::Value* kv = nullptr;
};

class ModLowering {
 public:
  ModLowering(const Mods& mods, llvm::Module& module);

  llvm::Type* f32() { return llvm::Type::getFloatTy(ctx_); }
  llvm::Type* i32() { return llvm::Type::getInt32Ty(ctx_); }
  llvm::Type* i64() { return llvm::Type::getInt64Ty(ctx_); }
  llvm::Type* ptr() { return llvm::PointerType::get(ctx_, 0); }

  // Marks a load or store of a row array as not aliasing any captured buffer.
  void mark_row_access(llvm::Instruction* inst);

  // Loads every buffer descriptor and param from the slot array `params` at the builder's
  // insertion point (a function's entry block). Call once per function, before emit().
  void begin_function(llvm::IRBuilder<>& b, llvm::Value* params);

  // Emits `e` at the builder's insertion point, straight-line; returns its value (i1 for bool,
  // i32, float). Shared sub-expressions are emitted once per call.
  llvm::Value* emit(llvm::IRBuilder<>& b, const Expr& e, const Leaves& leaves);

 private:
  struct BufferInfo {
    llvm::Value* base = nullptr;
    std::vector<llvm::Value*> extent, stride;
  };

  llvm::Function* intrinsic(llvm::Intrinsic::ID id, std::vector<llvm::Type*> types);
  llvm::Value* call_math(llvm::IRBuilder<>& b, const char* name, std::vector<llvm::Value*> args);
  llvm::Value* load(llvm::IRBuilder<>& b, const ir::Node& n, const std::vector<llvm::Value*>& idx);
  llvm::Value* cast(llvm::IRBuilder<>& b, ScalarType to, ScalarType from, llvm::Value* v);
  llvm::Value* unary(llvm::IRBuilder<>& b, ir::Op op, ScalarType t, llvm::Value* x);
  llvm::Value* binary_i32(llvm::IRBuilder<>& b, ir::Op op, llvm::Value* x, llvm::Value* y);
  llvm::Value* binary_f32(llvm::IRBuilder<>& b, ir::Op op, llvm::Value* x, llvm::Value* y);
  llvm::Value* emit_node(llvm::IRBuilder<>& b, const ir::Node& n,
                         const std::vector<llvm::Value*>& a, const Leaves& leaves);

  const Mods& mods_;
  llvm::Module& module_;
  llvm::LLVMContext& ctx_;
  CpuModParamLayout layout_;
  llvm::MDNode* buffer_scope_ = nullptr;
  llvm::MDNode* out_scope_ = nullptr;
  std::unordered_map<std::string, BufferInfo> buffers_;
  std::unordered_map<std::string, llvm::Value*> params_;
};

}  // namespace flexjit::llvmjit

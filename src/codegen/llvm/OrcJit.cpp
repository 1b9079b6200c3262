#include "codegen/llvm/OrcJit.h"

#include "ir/Evaluate.h"

#include <fmt/format.h>

#include <llvm/ExecutionEngine/Orc/ExecutionUtils.h>
#include <llvm/ExecutionEngine/Orc/JITTargetMachineBuilder.h>
#include <llvm/ExecutionEngine/Orc/LLJIT.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/Module.h>
#include <llvm/IR/Verifier.h>
#include <llvm/Passes/PassBuilder.h>
#include <llvm/Support/TargetSelect.h>
#include <llvm/Support/raw_ostream.h>
#include <llvm/Target/TargetMachine.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <mutex>
#include <vector>

namespace flexjit::llvmjit {

namespace {

std::string to_message(llvm::Error err) {
  std::string s;
  llvm::raw_string_ostream os(s);
  os << err;
  return os.str();
}

template <typename T>
T unwrap(llvm::Expected<T> v, std::string_view what) {
  if (!v) throw JitError(fmt::format("LLVM {}: {}", what, to_message(v.takeError())));
  return std::forward<T>(*v);
}

// The libm functions generated code calls, under names of our own: LLVM recognises `expf` and
// would constant-fold it with the host's double-precision exp, which can differ from expf in
// the last bit. Opaque names keep every evaluation a real libm call, as the interpreter's.
float fj_f16_to_f32(uint16_t bits) {
  return ir::f16_bits_to_float(bits);
}
struct MathSymbol {
  const char* name;
  void* address;
};
std::vector<MathSymbol> math_symbols() {
  return {
      {"fj_expf", reinterpret_cast<void*>(static_cast<float (*)(float)>(expf))},
      {"fj_exp2f", reinterpret_cast<void*>(static_cast<float (*)(float)>(exp2f))},
      {"fj_logf", reinterpret_cast<void*>(static_cast<float (*)(float)>(logf))},
      {"fj_log2f", reinterpret_cast<void*>(static_cast<float (*)(float)>(log2f))},
      {"fj_tanhf", reinterpret_cast<void*>(static_cast<float (*)(float)>(tanhf))},
      {"fj_powf", reinterpret_cast<void*>(static_cast<float (*)(float, float)>(powf))},
      {"fj_f16_to_f32", reinterpret_cast<void*>(&fj_f16_to_f32)},
  };
}

}  // namespace

void* CpuModule::lookup(std::string_view name) const {
  auto it = symbols_.find(std::string(name));
  return it == symbols_.end() ? nullptr : it->second;
}

struct OrcJit::Impl {
  std::unique_ptr<llvm::orc::LLJIT> jit;
  std::unique_ptr<llvm::TargetMachine> tm;
  std::string cpu, features;
  mutable std::mutex mu;
  struct Entry {
    std::string kind;
    Mods mods;
    std::shared_ptr<const CpuModule> module;
  };
  std::unordered_map<uint64_t, std::vector<Entry>> cache;
  Stats stats;
  int64_t next_dylib = 0;
};

OrcJit& OrcJit::instance() {
  static OrcJit jit;
  return jit;
}

OrcJit::OrcJit() : impl_(std::make_unique<Impl>()) {
  llvm::InitializeNativeTarget();
  llvm::InitializeNativeTargetAsmPrinter();
  auto jtmb = unwrap(llvm::orc::JITTargetMachineBuilder::detectHost(), "host detection");
  jtmb.setCodeGenOptLevel(llvm::CodeGenOpt::Aggressive);
  impl_->cpu = jtmb.getCPU();
  impl_->features = jtmb.getFeatures().getString();
  impl_->tm = unwrap(jtmb.createTargetMachine(), "target machine");
  impl_->jit =
      unwrap(llvm::orc::LLJITBuilder().setJITTargetMachineBuilder(std::move(jtmb)).create(),
             "LLJIT creation");
}

OrcJit::~OrcJit() = default;

std::string OrcJit::host_cpu() const {
  return impl_->cpu + " " + impl_->features;
}

OrcJit::Stats OrcJit::stats() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->stats;
}

std::shared_ptr<const CpuModule> OrcJit::get(std::string_view kind, const Mods& mods,
                                             const ModuleBuilder& build) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  const uint64_t key = mods.hash() ^ std::hash<std::string_view>{}(kind);
  auto& bucket = impl_->cache[key];
  for (const auto& e : bucket) {
    if (e.kind == kind && equal(e.mods, mods)) {
      ++impl_->stats.hits;
      return e.module;
    }
  }
  const auto start = std::chrono::steady_clock::now();
  auto ctx = std::make_unique<llvm::LLVMContext>();
  std::unique_ptr<llvm::Module> m = build(*ctx);
  FJ_ASSERT(m != nullptr, "CPU module builder returned no module");
  m->setDataLayout(impl_->jit->getDataLayout());
  m->setTargetTriple(impl_->jit->getTargetTriple().str());
  {
    std::string err;
    llvm::raw_string_ostream os(err);
    if (llvm::verifyModule(*m, &os)) {
      throw JitError(fmt::format("generated LLVM IR for {} mods '{}' is invalid: {}", kind,
                                 mods.name, os.str()));
    }
  }
  {
    // The standard O2 pipeline (LICM hoists everything that depends only on b, h, q and the
    // params out of the row loops; the loop vectoriser then works on kv) for the host CPU.
    llvm::LoopAnalysisManager lam;
    llvm::FunctionAnalysisManager fam;
    llvm::CGSCCAnalysisManager cgam;
    llvm::ModuleAnalysisManager mam;
    // Vectorise, but neither interleave nor unroll: the row loops are short (one kv tile), and
    // the extra copies of the loop body double the compile time for no measurable gain.
    llvm::PipelineTuningOptions tuning;
    tuning.LoopInterleaving = false;
    tuning.LoopUnrolling = false;
    llvm::PassBuilder pb(impl_->tm.get(), tuning);
    pb.registerModuleAnalyses(mam);
    pb.registerCGSCCAnalyses(cgam);
    pb.registerFunctionAnalyses(fam);
    pb.registerLoopAnalyses(lam);
    pb.crossRegisterProxies(lam, fam, cgam, mam);
    llvm::ModulePassManager mpm = pb.buildPerModuleDefaultPipeline(llvm::OptimizationLevel::O2);
    mpm.run(*m, mam);
  }
  if (const char* dump = std::getenv("FLEXJIT_DUMP_LLVM"); dump != nullptr && *dump != '\0') {
    llvm::errs() << "; flexjit: optimised CPU module, kind " << kind << "\n" << *m;
  }
  std::vector<std::string> names;
  for (const llvm::Function& f : *m) {
    if (!f.isDeclaration() && f.hasExternalLinkage()) names.push_back(f.getName().str());
  }
  auto& es = impl_->jit->getExecutionSession();
  auto& jd = unwrap(impl_->jit->createJITDylib(fmt::format("fj_{}_{}", kind, impl_->next_dylib++)),
                    "JITDylib creation");
  const char prefix = impl_->jit->getDataLayout().getGlobalPrefix();
  jd.addGenerator(unwrap(llvm::orc::DynamicLibrarySearchGenerator::GetForCurrentProcess(prefix),
                         "process symbol generator"));
  llvm::orc::MangleAndInterner mangle(es, impl_->jit->getDataLayout());
  llvm::orc::SymbolMap math;
  for (const MathSymbol& s : math_symbols()) {
    math[mangle(s.name)] = llvm::JITEvaluatedSymbol(llvm::pointerToJITTargetAddress(s.address),
                                                    llvm::JITSymbolFlags::Exported);
  }
  if (auto err = jd.define(llvm::orc::absoluteSymbols(std::move(math)))) {
    throw JitError("LLVM math symbols: " + to_message(std::move(err)));
  }
  if (auto err =
          impl_->jit->addIRModule(jd, llvm::orc::ThreadSafeModule(std::move(m), std::move(ctx)))) {
    throw JitError("LLVM addIRModule: " + to_message(std::move(err)));
  }
  auto module = std::make_shared<CpuModule>();
  for (const std::string& name : names) {
    auto addr = unwrap(impl_->jit->lookup(jd, name), "lookup of " + name);
    module->symbols_[name] = addr.toPtr<void*>();
  }
  module->compile_ms_ =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  ++impl_->stats.misses;
  impl_->stats.compile_ms += module->compile_ms_;
  bucket.push_back(Impl::Entry{std::string(kind), mods, module});
  return module;
}

}  // namespace flexjit::llvmjit

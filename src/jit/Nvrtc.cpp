#include "jit/Nvrtc.h"

#include <flexjit/error.h>

#include <fmt/format.h>
#include <nvrtc.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <regex>
#include <set>
#include <sstream>

namespace flexjit::jit {

namespace {

// The name NVRTC gives the source in its log: "flexjit_kernel.cu(42): error: ...".
constexpr const char* kProgramName = "flexjit_kernel.cu";
constexpr int kContextLines = 3;

// Owns an nvrtcProgram.
class Program {
 public:
  explicit Program(const std::string& source) {
    check(nvrtcCreateProgram(&prog_, source.c_str(), kProgramName, 0, nullptr, nullptr),
          "nvrtcCreateProgram");
  }
  ~Program() { nvrtcDestroyProgram(&prog_); }
  Program(const Program&) = delete;
  Program& operator=(const Program&) = delete;
  nvrtcProgram get() const { return prog_; }

  std::string log() const {
    size_t size = 0;
    if (nvrtcGetProgramLogSize(prog_, &size) != NVRTC_SUCCESS || size == 0) return {};
    std::string out(size, '\0');
    if (nvrtcGetProgramLog(prog_, out.data()) != NVRTC_SUCCESS) return {};
    while (!out.empty() && (out.back() == '\0' || out.back() == '\n'))
      out.pop_back();
    return out;
  }

  static void check(nvrtcResult r, const char* what) {
    if (r != NVRTC_SUCCESS)
      throw JitError(fmt::format("{} failed: {}", what, nvrtcGetErrorString(r)));
  }

 private:
  nvrtcProgram prog_ = nullptr;
};

// The source lines around each "(line): error" in the log, numbered, the error line marked.
std::string error_context(const std::string& source, const std::string& log) {
  std::vector<std::string> lines;
  std::istringstream in(source);
  for (std::string l; std::getline(in, l);)
    lines.push_back(l);
  static const std::regex kError(R"(\((\d+)\): (?:catastrophic )?error)");
  std::set<int> error_lines;
  for (auto it = std::sregex_iterator(log.begin(), log.end(), kError); it != std::sregex_iterator();
       ++it) {
    error_lines.insert(std::stoi((*it)[1].str()));
  }
  std::string out;
  int width = std::max<int>(4, static_cast<int>(std::to_string(lines.size()).size()));
  for (int line : error_lines) {
    if (line < 1 || line > static_cast<int>(lines.size())) continue;
    out += fmt::format("\nsource around line {}:\n", line);
    int first = std::max(1, line - kContextLines);
    int last = std::min(static_cast<int>(lines.size()), line + kContextLines);
    for (int i = first; i <= last; ++i) {
      out += fmt::format("{} {:>{}} | {}\n", i == line ? '>' : ' ', i, width, lines[i - 1]);
    }
  }
  return out;
}

std::string join(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v)
    out += (out.empty() ? "" : " ") + s;
  return out;
}

}  // namespace

std::string nvrtc_version() {
  static const std::string version = [] {
    int major = 0, minor = 0;
    Program::check(nvrtcVersion(&major, &minor), "nvrtcVersion");
    return fmt::format("{}.{}", major, minor);
  }();
  return version;
}

std::vector<std::string> nvrtc_options(const CompileRequest& req) {
  // --ptxas-options=-v: ptxas writes registers, spills, stack and static shared memory into the
  // program log at no measurable cost. No -G or -lineinfo: they multiply cubin size (4x for a
  // forward kernel) and slow compiles. -default-device and --minimal saved nothing measurable
  // (the front end is ~2% of a compile; NVVM and ptxas are the rest), so they are left out.
  std::vector<std::string> opts = {"--gpu-architecture=" + req.arch, "-std=c++17",
                                   "--ptxas-options=-v"};
  opts.insert(opts.end(), req.options.begin(), req.options.end());
  return opts;
}

namespace {
std::atomic<uint64_t> g_nvrtc_compiles{0};
}  // namespace

uint64_t nvrtc_compile_count() {
  return g_nvrtc_compiles.load(std::memory_order_relaxed);
}

CompiledKernel nvrtc_compile(const CompileRequest& req) {
  auto start = std::chrono::steady_clock::now();
  g_nvrtc_compiles.fetch_add(1, std::memory_order_relaxed);
  const std::vector<std::string> opts = nvrtc_options(req);
  std::vector<const char*> argv;
  for (const auto& o : opts)
    argv.push_back(o.c_str());

  Program prog(req.source);
  // Registering the kernel as a name expression makes a misspelt kernel name a compile error and
  // gives the symbol name for templates or C++ linkage.
  Program::check(nvrtcAddNameExpression(prog.get(), req.kernel_name.c_str()),
                 "nvrtcAddNameExpression");
  nvrtcResult result = nvrtcCompileProgram(prog.get(), static_cast<int>(argv.size()), argv.data());
  std::string log = prog.log();
  if (result != NVRTC_SUCCESS) {
    throw JitError(fmt::format(
        "NVRTC failed to compile {} (kernel {}, arch {}): {}\noptions: {}\nNVRTC log:\n{}{}",
        req.label.empty() ? "a kernel" : "'" + req.label + "'", req.kernel_name, req.arch,
        nvrtcGetErrorString(result), join(opts), log, error_context(req.source, log)));
  }

  CompiledKernel k;
  const char* lowered = nullptr;
  Program::check(nvrtcGetLoweredName(prog.get(), req.kernel_name.c_str(), &lowered),
                 "nvrtcGetLoweredName");
  k.kernel_name = lowered;
  size_t size = 0;
  Program::check(nvrtcGetCUBINSize(prog.get(), &size), "nvrtcGetCUBINSize");
  if (size == 0) {
    throw JitError(
        fmt::format("NVRTC produced no cubin for {} (arch {}): a virtual arch "
                    "(compute_XY) gives PTX only; use sm_XY",
                    req.label, req.arch));
  }
  k.cubin.resize(size);
  Program::check(nvrtcGetCUBIN(prog.get(), k.cubin.data()), "nvrtcGetCUBIN");

  k.arch = req.arch;
  k.label = req.label;
  k.log = std::move(log);
  k.usage = usage_from_ptxas_log(k.log, k.kernel_name);
  // The ELF fills what the log does not say (max threads from __launch_bounds__), and stands in
  // for the log if a future NVRTC stops printing ptxas info.
  ResourceUsage elf = usage_from_cubin(k.cubin, k.kernel_name);
  if (k.usage.registers < 0) k.usage.registers = elf.registers;
  if (k.usage.stack_frame_bytes < 0) k.usage.stack_frame_bytes = elf.stack_frame_bytes;
  k.usage.max_threads_per_block = elf.max_threads_per_block;
  k.compile_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  return k;
}

}  // namespace flexjit::jit

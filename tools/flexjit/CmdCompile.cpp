// flexjit compile / inspect: compile a kernel (forward by default) through the caches and report
// it: the kernel description, the variant chosen and why, resources, optionally SASS.
#include <flexjit/error.h>
#include <flexjit/kernel.h>

#include "flexjit/Commands.h"
#include "flexjit/Options.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>

namespace flexjit::cli {

namespace {

// "disk hit" -> "disk-hit": the CLI's JSON spelling.
std::string outcome_name(std::string cache) {
  std::replace(cache.begin(), cache.end(), ' ', '-');
  return cache;
}

nlohmann::json to_json(const KernelBinary& k) {
  return {{"kernel", k.source.kernel_name},
          {"description", nlohmann::json::parse(k.source.description_json)},
          {"spec", k.source.description},
          {"selection", k.source.selection},
          {"arch", nlohmann::json::parse(k.source.description_json).at("arch")},
          {"cache_key", k.cache_key},
          {"source_key", k.source.source_key},
          {"cache", outcome_name(k.cache)},
          {"elapsed_ms", k.elapsed_ms},
          {"compile_ms", k.compile_ms},
          {"cubin_bytes", k.cubin.size()},
          {"registers", k.registers},
          {"spill_store_bytes", k.spill_store_bytes},
          {"spill_load_bytes", k.spill_load_bytes},
          {"stack_frame_bytes", k.stack_frame_bytes},
          {"static_shared_bytes", k.static_shared_bytes},
          {"wgmma_serialized", k.wgmma_serialized},
          {"dynamic_shared_bytes", k.source.dynamic_smem_bytes}};
}

// Runs a disassembler on the cubin if one is on PATH; returns false if none is. The cubin goes to
// a private temp file (mkstemp: mode 0600, a fresh name, no symlink followed) and the tool runs
// without a shell, its arguments passed as they are.
bool disassemble(const std::vector<char>& cubin, const std::string& tool, const std::string& flag) {
  std::error_code ec;
  std::filesystem::path dir = std::filesystem::temp_directory_path(ec);
  if (ec) dir = "/tmp";
  std::string path = (dir / "flexjit-inspect-XXXXXX").string();
  int fd = ::mkstemp(path.data());
  if (fd < 0)
    throw Error(fmt::format("cannot create a temp file '{}': {}", path, std::strerror(errno)));
  size_t done = 0;
  while (done < cubin.size()) {
    ssize_t n = ::write(fd, cubin.data() + done, cubin.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int err = errno;
      ::close(fd);
      ::unlink(path.c_str());
      throw Error(fmt::format("cannot write the temp file '{}': {}", path, std::strerror(err)));
    }
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  std::vector<std::string> args = {tool};
  if (!flag.empty()) args.push_back(flag);
  args.push_back(path);
  std::vector<char*> argv;
  for (auto& a : args)
    argv.push_back(a.data());
  argv.push_back(nullptr);
  std::fflush(stdout);
  pid_t pid = -1;
  int rc = ::posix_spawnp(&pid, tool.c_str(), nullptr, nullptr, argv.data(), environ);
  int status = 0;
  if (rc == 0) {
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
  }
  ::unlink(path.c_str());
  return rc == 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

void register_one(CLI::App& app, bool inspect) {
  const char* desc =
      inspect ? "Compile a kernel and show its description, resources and SASS\n\nExamples:\n"
                "  flexjit inspect --mods causal --arch sm_90a --sass\n"
                "  flexjit inspect --score-mod softcap --arch sm_80 --json\n"
                "  flexjit inspect --kernel block_mask --mask-mod causal --arch sm_90a"
              : "Compile a kernel through the caches and report resources\n\nExamples:\n"
                "  flexjit compile --score-mod alibi --mask-mod causal --arch sm_90a\n"
                "  flexjit compile --mods my.fx --head-dim 64 --arch sm_80 --json\n"
                "  flexjit compile --mods causal --arch sm_90a -o fwd.cubin";
  auto* cmd = app.add_subcommand(inspect ? "inspect" : "compile", desc);
  struct State {
    KernelOptions opts;
    bool json = false;
    bool sass = false;
    bool source = false;
    std::string out;
  };
  static State states[2];
  State& st = states[inspect ? 1 : 0];
  add_kernel_options(*cmd, st.opts);
  cmd->add_flag("--json", st.json, "Print JSON");
  cmd->add_option("-o,--output", st.out, "Write the cubin here");
  if (inspect) {
    cmd->add_flag("--sass", st.sass, "Disassemble the cubin (needs cuobjdump or nvdisasm)");
    cmd->add_flag("--source", st.source, "Print the generated CUDA source too");
  }
  cmd->callback([&st, inspect] {
    const double cpu0 = process_cpu_seconds();
    const KernelBinary k = compile_kernel(resolve(st.opts), make_query(st.opts));
    // CPU time of codegen and the compile (NVRTC runs on this thread): the cost a cold first
    // call pays, which wall time on a loaded machine overstates.
    const double cpu_ms = 1e3 * (process_cpu_seconds() - cpu0);
    if (!st.out.empty()) {
      std::ofstream f(st.out, std::ios::binary);
      f.write(k.cubin.data(), static_cast<std::streamsize>(k.cubin.size()));
      if (!f.flush()) throw Error(fmt::format("cannot write '{}'", st.out));
    }
    if (inspect && st.source) std::cout << k.source.source << "\n";
    if (st.json) {
      nlohmann::json j = to_json(k);
      j["cpu_ms"] = cpu_ms;
      std::cout << j.dump(2) << "\n";
    } else {
      fmt::print("kernel    {}\n", k.source.kernel_name);
      fmt::print("desc      {}\n", k.source.description);
      fmt::print("selected  {}\n", k.source.selection);
      fmt::print("cache     {} in {:.3f} ms, {:.1f} ms CPU (cold compile took {:.1f} ms)\n",
                 outcome_name(k.cache), k.elapsed_ms, cpu_ms, k.compile_ms);
      fmt::print("cubin     {} bytes, key {}\n", k.cubin.size(), k.cache_key.substr(0, 16));
      fmt::print(
          "resources {} registers, {} B spill stores, {} B spill loads, {} B stack, {} B "
          "static smem\n",
          k.registers, k.spill_store_bytes, k.spill_load_bytes, k.stack_frame_bytes,
          k.static_shared_bytes);
      if (!k.wgmma_serialized.empty()) {
        fmt::print(
            "warning   ptxas serialized the kernel's wgmma ({}): it runs far below its "
            "speed\n",
            k.wgmma_serialized);
      }
      fmt::print("dyn smem  {} bytes\n", k.source.dynamic_smem_bytes);
    }
    if (inspect && st.sass && !disassemble(k.cubin, "cuobjdump", "--dump-sass") &&
        !disassemble(k.cubin, "nvdisasm", "")) {
      fmt::print(stderr, "note: no cuobjdump or nvdisasm on PATH; SASS not shown\n");
    }
  });
}

}  // namespace

void register_compile(CLI::App& app) {
  register_one(app, false);
  register_one(app, true);
}

}  // namespace flexjit::cli

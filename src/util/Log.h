// Stage logging to stderr, switched on by FLEXJIT_LOG (a comma list of stage names, or "all"):
//   FLEXJIT_LOG=jit,cache  ->  "flexjit[jit] compiled forward alibi bf16 d128 in 512 ms (cache
//   miss)"
#pragma once

#include <fmt/format.h>

#include <string_view>

namespace flexjit::logging {

// Whether lines of `stage` are printed. FLEXJIT_LOG is read once, on first use.
bool enabled(std::string_view stage);

// Re-reads FLEXJIT_LOG (for tests and for programs that set it after start-up).
void reload();

// Prints "flexjit[stage] message" as one line on stderr.
void write(std::string_view stage, std::string_view message);

}  // namespace flexjit::logging

// FJ_LOG("jit", "compiled {} in {:.0f} ms", label, ms): formats only when the stage is enabled.
#define FJ_LOG(stage, ...)                                        \
  do {                                                            \
    if (::flexjit::logging::enabled(stage))                       \
      ::flexjit::logging::write(stage, fmt::format(__VA_ARGS__)); \
  } while (0)

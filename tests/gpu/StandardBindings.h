// Bindings for the standard mods in the GPU tests: host copies of the captured buffers, sized
// so that every index the mods form is in range for a shape, and parameter values.
#pragma once

#include <flexjit/mods.h>

#include "support/ReferenceAttention.h"

#include <cstdint>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

namespace flexjit::test {

// A host copy of a captured buffer (f32 or i32 here); tests upload it as its device twin.
struct HostBuffer {
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  std::vector<char> bytes;
};

template <typename T>
HostBuffer host_buffer(DType dtype, std::vector<int64_t> shape, const std::vector<T>& v) {
  HostBuffer b{dtype, std::move(shape), {}};
  b.bytes.resize(v.size() * sizeof(T));
  std::memcpy(b.bytes.data(), v.data(), b.bytes.size());
  return b;
}

// Adds a binding for every buffer and param of `mods` that `buffers` / `params` lack (ALiBi
// slopes, document ids, 1-D and 2-D biases, window / chunk / prefix / dilation / cap values).
// FAILs the test for a buffer it has no rule for.
void bind_standard_mods(const Mods& mods, const AttentionShape& s, std::mt19937_64& rng,
                        std::map<std::string, HostBuffer>& buffers,
                        std::vector<std::pair<std::string, double>>& params);

// The score_mods of the diagonal-site tests (test_forward.cpp, test_backward.cpp): a reversed
// per-head table `rel` of dtype `table` (f32 or f16) beside a mask_mod, a site reached only under
// where(), two sites of one table, and a nonlinear function of q - kv (|q - kv| mod 7: many
// diagonals per address, a derivative that changes sign across the main diagonal).
struct DiagonalSiteMod {
  std::string label, text;
};
std::vector<DiagonalSiteMod> diagonal_site_mods(DType table);

// The bindings that bind_standard_mods has no rule for: "per-head reversed" gets rel[Hq, Sq + Skv
// + 1] uniform in [-0.5, 0.5] (stored as `table`) and off = Sq, so kv - q + Sq lies in [1, Sq +
// Skv - 1]; the nonlinear one gets tab[Hq, 7] (f32) uniform in [-0.5, 0.5]. The other two take
// bind_standard_mods' bias and offset (bias[Sq + Skv + 1], offset = Skv).
void bind_diagonal_site_mod(const DiagonalSiteMod& mod, DType table, const AttentionShape& s,
                            std::mt19937_64& rng, std::map<std::string, HostBuffer>& buffers,
                            std::vector<std::pair<std::string, double>>& params);

}  // namespace flexjit::test

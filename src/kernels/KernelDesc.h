// KernelDesc: the one description of a kernel to build — which family, which variant of it,
// for which target, on which problem, with which configuration. Everything that shapes a
// kernel's source apart from the mods is a field here, and the description serializes to text
// (logs, generated-source headers, `flexjit emit`) and JSON (`--json`, tuning files), both of
// which parse back to an equal description. Its hash is taken from the text, so nothing can
// reach the source without reaching the hash (the builder memo then compares whole
// descriptions with operator==, which covers every field).
//
//   forward/sm80_mma sm_90a bf16 d=128/128 gqa=1 divisible=0 full_blocks=1 | block_m=128 ...
//   ^family  ^variant ^arch ^dtype ^head dims ^GQA  ^problem flags          ^config
//
// Families name what a kernel computes (docs/kernels/README.md); variants name how (mma.sync
// on sm_80, wgmma on sm_90a, ...). Flags are the family's problem facts that change the source
// (IS_DIVISIBLE, HAS_FULL_BLOCKS, the block mask's tile size); config is what the tuner varies.
#pragma once

#include <flexjit/types.h>

#include "codegen/cuda/Arch.h"

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace flexjit::kernels {

// A family's id. The enumerators are flexjit's own families; each is registered, with its name
// and everything else about it, by its own folder (kernels/<family>/, FamilyInfo in
// kernels/Family.h). A family registered from outside the library takes an id from
// external_family() (the test suite's toy family does).
enum class Family : uint8_t {
  Forward,             // attention forward: out (and lse) from q, k, v
  BlockMask,           // create_block_mask: kv_* / full_kv_* / q_* arrays from a mask_mod
  BackwardPreprocess,  // delta = rowsum(dO * O)
  BackwardDkDv,        // dK, dV over q tiles
  BackwardDq,          // dQ over kv tiles
  DecodeSplit,         // split-KV decoding: partial out / lse per split
  DecodeCombine,       // combines the splits
  CpMerge,             // context parallelism: merges partial results by their lse (src/cp)
  ForwardSchedule,     // a block mask as the union schedule of the sm_90a forward's 192-row tiles
  ForwardFp8Vt,        // V^T of e4m3 v for the sm_90a forward's P V (K-major)
};
// The id of the n-th family registered from outside the library (n < 128).
constexpr Family external_family(uint8_t n) {
  return static_cast<Family>(128 + n);
}

// The registered families' names (kernels/Family.h): "forward", "block_mask", ...; to_string of
// an unregistered id is an InternalError.
std::string_view to_string(Family f);
std::optional<Family> parse_family(std::string_view s);
std::vector<Family> all_families();  // registration order

// Named integers kept in name order: a family's problem flags, or a variant's config.
class Params {
 public:
  Params() = default;
  Params(std::initializer_list<std::pair<std::string, int64_t>> items);

  void set(const std::string& name, int64_t value);  // adds or replaces
  std::optional<int64_t> get(std::string_view name) const;
  // The value of `name`; InternalError if absent (a variant reading a field it did not set).
  int64_t at(std::string_view name) const;
  int at_int(std::string_view name) const { return static_cast<int>(at(name)); }
  bool has(std::string_view name) const { return get(name).has_value(); }
  bool empty() const { return items_.empty(); }
  const std::vector<std::pair<std::string, int64_t>>& items() const { return items_; }

  std::string str() const;  // "block_m=128 block_n=64" (name order)
  bool operator==(const Params&) const = default;

 private:
  std::vector<std::pair<std::string, int64_t>> items_;  // sorted by name, names unique
};

struct KernelDesc {
  Family family = Family::Forward;
  std::string variant;  // "sm80_mma"; empty while a description is a problem not yet selected
  cuda::Arch arch;
  DType dtype = DType::BF16;  // of the attention inputs (unused by the block-mask family)
  int head_dim_qk = 0;
  int head_dim_v = 0;
  int gqa_ratio = 1;
  Params flags;
  Params config;

  // The text form above. parse() reads it back (UnsupportedError naming the token it cannot
  // read); parse(d.str()) == d.
  std::string str() const;
  static KernelDesc parse(std::string_view text);

  // {"family": "forward", "variant": "sm80_mma", "arch": "sm_90a", "dtype": "bf16",
  //  "head_dim_qk": 128, "head_dim_v": 128, "gqa_ratio": 1, "flags": {...}, "config": {...}}
  nlohmann::json to_json() const;
  static KernelDesc from_json(const nlohmann::json& j);  // UnsupportedError on a bad document

  // XXH64 of str(): equal descriptions hash equal; the memo key of the kernel builder.
  uint64_t hash() const;
  // "forward/sm80_mma"
  std::string family_variant() const;

  bool operator==(const KernelDesc&) const = default;
};

}  // namespace flexjit::kernels

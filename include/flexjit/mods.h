// Mods: a score_mod, a mask_mod and/or a sink_mod with the buffers and parameters they capture.
//
// Built from C++ lambdas (Mods::from), from `.fx` text (parse_mods), or by standard name
// (standard_mods("alibi"), the files in dsl/ embedded in the library).
#pragma once

#include <flexjit/export.h>

#include <flexjit/dsl.h>
#include <flexjit/expr.h>

#include <functional>
#include <string>
#include <vector>

namespace flexjit {

using ScoreModFn = std::function<Expr(Expr score, Expr b, Expr h, Expr q_idx, Expr kv_idx)>;
using MaskModFn = std::function<Expr(Expr b, Expr h, Expr q_idx, Expr kv_idx)>;
using SinkModFn = std::function<Expr(Expr b, Expr h, Expr q_idx)>;

struct FLEXJIT_API Mods {
  Expr score_mod;  // f32; undefined means identity (score)
  Expr mask_mod;   // bool; undefined means "attend everywhere"
  // f32; undefined means no sink. An attention sink: an extra logit of row (b, h, q_idx) that
  // joins the softmax denominator and carries no value (GPT-OSS, StreamingLLM), in the units of
  // the scores after scale and score_mod. It reads b, h, q_idx, buffers and params only.
  Expr sink_mod;
  std::vector<Buffer> buffers;  // declaration order; every captured buffer
  std::vector<Param> params;    // declaration order; every runtime parameter
  std::string name;             // a standard name, a file path or "<inline>"; not hashed

  // Builds from C++ functions; buffers and params are collected from the expressions in order
  // of first appearance. Any function may be empty.
  static Mods from(const ScoreModFn& score_mod, const MaskModFn& mask_mod = {},
                   const SinkModFn& sink_mod = {});
  static Mods from_mask(const MaskModFn& mask_mod);

  // A copy with `sink_mod` as the sink_mod (replacing any), its buffers and params added.
  Mods with_sink_mod(const SinkModFn& sink_mod) const;

  // Type checks the mods (score_mod -> f32, mask_mod -> bool, sink_mod -> f32 and reading
  // neither score nor kv_idx); throws CompileError.
  void check() const;

  // The mods as `.fx` text; parse_mods(to_text()) gives equal Mods.
  std::string to_text() const;

  // Structural hash: ignores parameter values, buffer contents and `name`.
  uint64_t hash() const;
};

// Structural equality (parameter default values and `name` ignored).
FLEXJIT_API bool equal(const Mods& a, const Mods& b);

// Combines two mod sets: the score_mod and the sink_mod of whichever has one (CompileError if
// both do), the mask_mods ANDed, buffers and params united (CompileError if one name is
// declared twice differently).
FLEXJIT_API Mods combine(const Mods& a, const Mods& b);

// The mask_mod of `mods` alone (score_mod and sink_mod dropped), with only the buffers and
// params it uses: what a block mask is built from. Throws CompileError if `mods` has no mask_mod.
FLEXJIT_API Mods mask_only(const Mods& mods);

// Parses `.fx` text. `file` names the text in diagnostics ("my.fx", "<inline>").
FLEXJIT_API Mods parse_mods(const std::string& text, const std::string& file = "<inline>");
// Reads and parses a file; throws Error if it cannot be read.
FLEXJIT_API Mods load_mods_file(const std::string& path);

// The standard mods shipped in dsl/ (embedded in the library).
FLEXJIT_API std::vector<std::string> standard_mod_names();
FLEXJIT_API const std::string& standard_mod_source(
    const std::string& name);                             // throws Error if unknown
FLEXJIT_API Mods standard_mods(const std::string& name);  // throws Error if unknown

// Resolves what the CLI accepts: a standard name, a path to an existing file, or inline text
// (anything containing '='). Throws Error with the list of standard names when it is none.
FLEXJIT_API Mods resolve_mods(const std::string& spec);

}  // namespace flexjit

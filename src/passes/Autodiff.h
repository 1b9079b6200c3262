// Reverse-mode differentiation of a score_mod, for the attention backward pass.
//
// The backward of FlexAttention recomputes s' = score_mod(score, b, h, q, kv) and needs, at each
// (b, h, q, kv) point:
//   dScore = dS' * d_score(score_mod)                  the gradient flowing on into Q and K
//   grad_buf[indices] += dS' * derivative              for every BufferGrad (an atomic add)
// Both derivatives are f32 expressions of the same leaves, params and buffers as the score_mod,
// so codegen emits them next to the recomputed forward value.
//
// The derivatives are taken by one reverse sweep over the DAG (Halide's Derivative.cpp style):
// every f32 node gets an adjoint, the sum over its users of what each user's derivative rule
// passes down; integer and bool sub-expressions carry none (so i32/bool buffers, params, and
// the indices of a load get no gradient). Rules that are not differentiable everywhere pick a
// one-sided value, as PyTorch's autograd does: abs'(0) = 0, floor' = ceil' = 0, min/max route the
// whole adjoint to the first argument on a tie, pow(a, b) gives b no gradient where a <= 0. The
// table with every rule is in docs/autodiff.md.
//
// Results are simplified (passes::simplify) and hash-consed (passes::cse).
#pragma once

#include "ir/IR.h"

#include <memory>
#include <vector>

namespace flexjit::passes {

// The gradient into one load site of a captured float (f32 / f16 / bf16) buffer.
struct BufferGrad {
  std::shared_ptr<const ir::BufferDecl> buffer;
  std::vector<Expr> indices;  // the load's index expressions (i32), as in the score_mod
  Expr derivative;            // f32: d score_mod / d buffer[indices]
  // bool: whether the forward evaluates this load at all. A load inside an unselected where()
  // branch (or the right operand of a short-circuited && / ||) may be out of bounds there; its
  // derivative is 0 then, and the backward must not touch grad_buf[indices]. `true` when the
  // load is always evaluated.
  Expr reached;
};

// All gradients of a score_mod in one sweep.
struct ScoreModGrads {
  Expr d_score;                     // f32: d score_mod / d score (0.0 when score is not used)
  std::vector<BufferGrad> buffers;  // one per distinct load site, in order of first appearance
};

// Differentiates `score_mod` (an f32 expression). Load sites are merged when they read the same
// buffer at structurally equal indices: derivatives summed, `reached` ORed. An undefined
// score_mod is the identity (d_score 1.0, no buffers).
ScoreModGrads differentiate(const Expr& score_mod);

// differentiate(score_mod).d_score.
Expr d_score(const Expr& score_mod);
// differentiate(score_mod).buffers.
std::vector<BufferGrad> buffer_grads(const Expr& score_mod);

}  // namespace flexjit::passes

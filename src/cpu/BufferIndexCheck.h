// AttentionOptions::check_buffers on the CPU backend. Its loads clamp every index into the
// buffer's extent (codegen/llvm/LlvmCodegen.h), so an index computed from data
// (bias[doc_id[q_idx]]) that falls outside it would give a silently wrong answer; the check
// finds it before the kernels run, in the words of the GPU's check (binding/BufferCheck.h).
//
// Every load site of the mods (runtime::load_sites: inner loads before the loads whose index
// they compute) has its index expressions evaluated by the interpreter at every position of the
// call over the leaves they read — doc_id[q_idx] at each q_idx, bias[doc_id[q_idx]] at each
// q_idx, a site reading q_idx and kv_idx at each pair — so the cost is the product of those
// leaves' ranges, not the whole B x H x Sq x Skv unless an index reads all four. Like the GPU's,
// the check covers both branches of a where() and positions a block mask would skip: the
// contract of docs/dsl.md.
#pragma once

#include <flexjit/mods.h>

#include "binding/ModArgs.h"

#include <vector>

namespace flexjit::cpu {

// Throws RuntimeError (runtime::buffer_check_message, CheckedOn::Cpu) for the first load site,
// and the first position in (b, h, q_idx, kv_idx) order, whose index falls outside its buffer's
// extent. `extents` must have every leaf's range (batch, heads_q, seqlen_q, seqlen_kv);
// `kv_lengths` (a KV cache's lengths, one per b) narrows kv_idx to [0, kv_lengths[b]).
void check_buffer_indices(const Mods& mods, const runtime::BoundModArgs& args,
                          const runtime::CallExtents& extents,
                          const std::vector<int>* kv_lengths = nullptr);

}  // namespace flexjit::cpu

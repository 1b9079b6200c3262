"""The drop-in's mods table: attention-gym-style mods written once as torch code and passed
unchanged to torch.nn.attention.flex_attention (compiled, as torch recommends) and to
flexjit.torch.flex_attention (eager, the drop-in), on a GPU. Per mod pair, one row:

  - forward and forward+backward time of each (triton's do_bench, median ms) and the speedup,
    at B x H x S x D (default 4 x 16 x 4096 x 128, bf16);
  - the largest absolute error of out and of dq (and of the captured table's gradient where
    the score_mod reads a learnable one) against a float64 reference built from the same mods
    on the same rounded inputs, for both libraries, at B = 1 and S = --err-seq (the dense
    float64 reference is B x H x S x S).

Usage (GPU machine, flexjit's module on PYTHONPATH):
  python3 scripts/dropin_table.py [--shape 4,16,4096,128] [--err-seq 1024] [--csv FILE]
"""

import argparse
import csv
import math

import torch
from torch.nn.attention import flex_attention as tfa_module
from triton.testing import do_bench

import flexjit.torch as fjt

tfa = tfa_module
torch_flex = torch.compile(tfa.flex_attention, dynamic=False)
for knob in ("recompile_limit", "cache_size_limit"):
    if hasattr(torch._dynamo.config, knob):
        setattr(torch._dynamo.config, knob, 1024)


def t5_bucket(rel, num_buckets=32, max_distance=128):
    num_buckets //= 2
    ret = (rel > 0).long() * num_buckets
    n = rel.abs()
    max_exact = num_buckets // 2
    large = max_exact + (torch.log(n.float() / max_exact) / math.log(max_distance / max_exact)
                         * (num_buckets - max_exact)).long()
    return ret + torch.where(n < max_exact, n, torch.clamp(large, max=num_buckets - 1))


def make_mods(H, S, device, table_dtype=torch.float32):
    """The mods of tests/python/test_torch_dropin.py at any H and S (documents of random
    lengths from int64 ids, the learnable tables float32)."""
    g = torch.Generator().manual_seed(7)
    slopes = torch.exp2(-8.0 * torch.arange(1, H + 1) / H).to(device)
    rel_table = (0.1 * torch.randn(H, 2 * S - 1, generator=g)).to(device, table_dtype)
    t5_table = (0.1 * torch.randn(H, 32, generator=g)).to(device, table_dtype)
    cuts = torch.sort(torch.randperm(S - 1, generator=g)[:S // 512 + 3] + 1).values
    doc_ids = torch.zeros(S, dtype=torch.int64)
    doc_ids[cuts] = 1
    doc_ids = torch.cumsum(doc_ids, 0).to(device)  # int64, as torch.cumsum gives
    prefix = S // 8
    window, block, n_global = 256, 512, 64

    def alibi(score, b, h, q_idx, kv_idx):
        return score + slopes[h] * (kv_idx - q_idx)

    def softcap(score, b, h, q_idx, kv_idx):
        return 20.0 * torch.tanh(score / 20.0)

    def relative_bias(score, b, h, q_idx, kv_idx):
        return score + rel_table[h, q_idx - kv_idx + S - 1]

    def t5(score, b, h, q_idx, kv_idx):
        return score + t5_table[h, t5_bucket(kv_idx - q_idx)]

    def causal(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx

    def sliding_window(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) & (q_idx - kv_idx <= window)

    def prefix_lm(b, h, q_idx, kv_idx):
        return (kv_idx <= prefix) | (q_idx >= kv_idx)

    def document(b, h, q_idx, kv_idx):
        return (doc_ids[q_idx] == doc_ids[kv_idx]) & (q_idx >= kv_idx)

    def block_global(b, h, q_idx, kv_idx):
        return (q_idx // block == kv_idx // block) | (kv_idx < n_global) | (q_idx < n_global)

    score_mods = {"alibi": alibi, "softcap": softcap, "relative_bias": relative_bias, "t5": t5}
    mask_mods = {"causal": causal, "sliding_window": sliding_window, "prefix_lm": prefix_lm,
                 "document": document, "block_global": block_global,
                 "and_masks(causal, block_global)": fjt.and_masks(causal, block_global)}
    tables = {"relative_bias": rel_table, "t5": t5_table}
    return score_mods, mask_mods, tables


CASES = [("alibi", "causal"), ("softcap", "sliding_window"), ("relative_bias", "causal"),
         ("t5", None), (None, "prefix_lm"), (None, "document"), (None, "block_global"),
         ("softcap", "and_masks(causal, block_global)")]


def dense_reference(q, k, v, score_mod, mask_mod):
    dev = q.device
    b = torch.arange(q.shape[0], device=dev)[:, None, None, None]
    h = torch.arange(q.shape[1], device=dev)[None, :, None, None]
    qi = torch.arange(q.shape[2], device=dev)[None, None, :, None]
    ki = torch.arange(k.shape[2], device=dev)[None, None, None, :]
    s = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    if score_mod is not None:
        s = score_mod(s, b, h, qi, ki)
    if mask_mod is not None:
        s = s.masked_fill(~mask_mod(b, h, qi, ki).expand_as(s), float("-inf"))
    return torch.softmax(s, -1) @ v


def run(lib, flex, q, k, v, smod, mmod, dout, table):
    """out, dq and the table's gradient of one library's call."""
    qq, kk, vv = (x.detach().clone().requires_grad_() for x in (q, k, v))
    if table is not None:
        table.requires_grad_(True)
        table.grad = None
    bm = lib.create_block_mask(mmod, None, None, q.shape[2], k.shape[2], device="cuda") \
        if mmod is not None else None
    out = flex(qq, kk, vv, score_mod=smod, block_mask=bm)
    out.backward(dout)
    dtable = table.grad.clone() if table is not None else None
    if table is not None:
        table.requires_grad_(False)
    return out.detach(), qq.grad, dtable


def errors(sm, mm, H, S, D):
    score_mods, mask_mods, tables = make_mods(H, S, "cuda")
    smod, mmod, table = score_mods.get(sm), mask_mods.get(mm), tables.get(sm)
    q, k, v, dout = (torch.randn(1, H, S, D, device="cuda", dtype=torch.bfloat16)
                     for _ in range(4))
    ours = run(fjt, fjt.flex_attention, q, k, v, smod, mmod, dout, table)
    try:
        theirs = run(tfa, torch_flex, q, k, v, smod, mmod, dout, table)
    except Exception:  # reported by times()
        torch._dynamo.reset()
        theirs = None
    qq = q.double().requires_grad_()
    ref_smod, t64 = smod, None
    if table is not None:  # the reference reads a float64 copy of the table
        score64, _, tables64 = make_mods(H, S, "cuda", torch.float64)
        ref_smod, t64 = score64[sm], tables64[sm].requires_grad_()
    ref = dense_reference(qq, k.double(), v.double(), ref_smod, mmod)
    ref.backward(dout.double())
    result = []
    for lib in (theirs, ours):
        if lib is None:
            result.append([None, None, None])
            continue
        row = [(lib[0].double() - ref).abs().max().item(),
               (lib[1].double() - qq.grad).abs().max().item()]
        row.append((lib[2].double() - t64.grad).abs().max().item() if table is not None else None)
        result.append(row)
    return result


def times(sm, mm, B, H, S, D):
    score_mods, mask_mods, tables = make_mods(H, S, "cuda")
    smod, mmod, table = score_mods.get(sm), mask_mods.get(mm), tables.get(sm)
    q, k, v, dout = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16)
                     for _ in range(4))
    result = []
    for lib, flex in ((tfa, torch_flex), (fjt, fjt.flex_attention)):
        bm = lib.create_block_mask(mmod, None, None, S, S, device="cuda") \
            if mmod is not None else None
        qq, kk, vv = (x.detach().clone().requires_grad_() for x in (q, k, v))

        def step():
            flex(qq, kk, vv, score_mod=smod, block_mask=bm).backward(dout)

        fwd = both = None
        try:
            fwd = do_bench(lambda: flex(q, k, v, score_mod=smod, block_mask=bm))
            if table is not None:
                table.requires_grad_(True)
            both = do_bench(step)
        except Exception as e:  # a library that cannot run the case: the row says so
            print(f"  {lib.__name__} on {sm}/{mm}: {type(e).__name__}: "
                  f"{str(e).splitlines()[-1][:160]}", flush=True)
            torch._dynamo.reset()
        if table is not None:
            table.requires_grad_(False)
        result.append((fwd, both))
    return result


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="4,16,4096,128", help="B,H,S,D for the times")
    ap.add_argument("--err-seq", type=int, default=1024, help="S for the errors (B = 1)")
    ap.add_argument("--csv")
    ap.add_argument("--only", help="comma-separated cases to run, each a score_mod name (all its "
                    "rows) or score_mod+mask_mod ('-' for none): e.g. t5 or -+document")
    a = ap.parse_args()
    cases = CASES
    if a.only:
        wanted = a.only.split(",")
        cases = [(sm, mm) for sm, mm in CASES
                 if (sm or "-") in wanted or f"{sm or '-'}+{mm or '-'}" in wanted]
        if not cases:
            ap.error(f"--only {a.only}: no case; the cases are " + ", ".join(
                f"{sm or '-'}+{mm or '-'}" for sm, mm in CASES))
    B, H, S, D = (int(x) for x in a.shape.split(","))
    print(f"# {torch.cuda.get_device_name()}; times at B={B} H={H} S={S} D={D} bf16 "
          f"(do_bench median ms; torch flex compiled, flexjit.torch eager); max abs errors at "
          f"B=1 S={a.err_seq} against float64")
    head = ["score_mod", "mask_mod", "torch fwd", "flexjit fwd", "x", "torch fwd+bwd",
            "flexjit fwd+bwd", "x", "err out torch/fj", "err dq torch/fj", "err dtable torch/fj"]
    print(" | ".join(head))
    rows = []
    for sm, mm in cases:
        (tf, tb), (ff, fb) = times(sm, mm, B, H, S, D)
        et, ef = errors(sm, mm, H, a.err_seq, D)

        def ms(x):
            return f"{x:.3f}" if x is not None else "failed"

        def ratio(t, f):
            return f"{t / f:.2f}" if t is not None and f is not None else "-"

        def pair(i):
            if ef[i] is None:
                return "-"
            return f"{et[i]:.1e}/{ef[i]:.1e}" if et[i] is not None else f"failed/{ef[i]:.1e}"

        cells = [sm or "-", mm or "-", ms(tf), ms(ff), ratio(tf, ff), ms(tb), ms(fb),
                 ratio(tb, fb), pair(0), pair(1), pair(2)]
        print(" | ".join(cells), flush=True)
        rows.append(cells)
    if a.csv:
        with open(a.csv, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(head)
            w.writerows(rows)


if __name__ == "__main__":
    main()

"""Host cost of a flexjit call from Python on a GPU, for a small shape where the kernel itself
takes a few microseconds: the time per call of

  - flexjit.flex_attention on CUDA torch tensors (DLPack in, torch tensors out),
  - the same with a Mods object instead of a name,
  - flexjit.torch.flex_attention (the drop-in: the custom op, eager) with a mask name, and with
    torch-written mods (a traced score_mod capturing a bias tensor, a create_block_mask mask),
    eager and under torch.compile,
  - torch.nn.attention.flex_attention compiled with the same mods (PyTorch's own, for scale),

each as the median over repeats of (N back-to-back calls, then one synchronize) / N, the rows
taking turns within each repeat, after a warm-up that compiles everything. A call is
asynchronous, so while the kernel is shorter than the host work this is the host cost per call. Usage (GPU machine, flexjit's module on
PYTHONPATH): python3 scripts/py_overhead.py [--n 2000] [--repeats 7] [--profile DIR]
(--profile: also a cProfile of N calls of each row, its top functions by own time written to
DIR/<row>.txt, to see where the host time goes).
"""

import argparse
import cProfile
import io
import os
import pstats
import statistics
import time

import torch

import flexjit
import flexjit.torch as fjt


def per_call_us(rows, n, repeats):
    """Median µs per call of each row. The rows take turns within every repeat, so a drift of
    the machine (clocks, other processes) reaches every row alike."""
    for _, fn in rows:
        for _ in range(20):
            fn()
    torch.cuda.synchronize()
    times = [[] for _ in rows]
    for _ in range(repeats):
        for i, (_, fn) in enumerate(rows):
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            torch.cuda.synchronize()
            times[i].append((time.perf_counter() - t0) / n * 1e6)
    return [statistics.median(t) for t in times]


def profile_to(path, fn, n):
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    prof.disable()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(30)
    with open(path, "w") as f:
        f.write(text.getvalue())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--profile", metavar="DIR", help="write a cProfile of each row into DIR")
    a = ap.parse_args()
    q = torch.randn(1, 2, 64, 64, device="cuda", dtype=torch.bfloat16)
    mods = flexjit.make_mods(None, "causal")
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    bias = torch.randn(128, device="cuda")

    def rel(score, b, h, q_idx, kv_idx):
        return score + bias[q_idx - kv_idx + 64]

    def causal(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx

    bm = create_block_mask(causal, 1, 2, 64, 64, device="cuda")
    fj_bm = fjt.create_block_mask(causal, 1, 2, 64, 64, device="cuda")
    torch_flex = torch.compile(flex_attention)
    fj_compiled = torch.compile(fjt.flex_attention)
    rows = [
        ("flexjit.flex_attention(mask_mod='causal')",
         lambda: flexjit.flex_attention(q, q, q, mask_mod="causal")),
        ("flexjit.flex_attention(Mods)", lambda: flexjit.flex_attention(q, q, q, mods)),
        ("flexjit.torch.flex_attention(mask_mod='causal')",
         lambda: fjt.flex_attention(q, q, q, mask_mod="causal")),
        ("flexjit.torch.flex_attention(rel, block_mask)",
         lambda: fjt.flex_attention(q, q, q, score_mod=rel, block_mask=fj_bm)),
        ("  same, torch.compile", lambda: fj_compiled(q, q, q, score_mod=rel, block_mask=fj_bm)),
        ("torch flex_attention(rel, block_mask) compiled",
         lambda: torch_flex(q, q, q, score_mod=rel, block_mask=bm)),
    ]
    print(f"# {torch.cuda.get_device_name()}, q = k = v [1, 2, 64, 64] bf16, causal; "
          f"median of {a.repeats} x {a.n} calls")
    for (name, _), us in zip(rows, per_call_us(rows, a.n, a.repeats)):
        print(f"{name:50s} {us:8.1f} us/call")
    if a.profile:
        os.makedirs(a.profile, exist_ok=True)
        for i, (name, fn) in enumerate(rows):
            profile_to(os.path.join(a.profile, f"row{i}.txt"), fn, a.n)


if __name__ == "__main__":
    main()

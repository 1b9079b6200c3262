#!/usr/bin/env python3
"""Anchor benchmark: PyTorch FlexAttention (torch.compile, Triton templates) and
PyTorch SDPA on the same shapes and masks that the project's benchmark uses.

Run on a GPU machine that has PyTorch >= 2.5:
    python3 torch_flex_bench.py [--quick] [--csv out.csv]
    python3 torch_flex_bench.py --head-dims [--csv out.csv]   # the model head dims only

flexjit's copy of ../shared/anchors/torch_flex_bench.py (the anchors): the same cases and
timing, plus the head dims real models use (`--head-dims`: B=4 H=16 S=4096, qk/v head dims
96/96 (Phi-3) and 192/128 (DeepSeek-V3's prefill), noop and causal), compared with
`flexjit bench --shape 4,16,16,4096,96` and `--shape 4,16,16,4096,192/128` in the same device
call (docs/benchmarks.md). With qk != v a
forward is 2*B*H*Sq*Skv*(Dqk + Dv) FLOPs (the two GEMMs), which is 4*B*H*Sq*Skv*D when equal.

Prints one row per case: forward and forward+backward time (median, ms) and
TFLOP/s counted over the blocks that the block mask keeps (the same rule that
attention-gym uses), so numbers compare across sparsity patterns.
"""
import argparse, csv, math, sys, time
import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import flex_attention, create_block_mask, and_masks, or_masks
from triton.testing import do_bench

torch.backends.cuda.matmul.allow_tf32 = False
# Every case is a new graph: without a high limit, dynamo falls back to the
# unfused eager path after 8 recompiles and the numbers measure that instead.
import torch._dynamo
for knob in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit", "accumulated_cache_size_limit"):
    if hasattr(torch._dynamo.config, knob):
        setattr(torch._dynamo.config, knob, 4096)
flex = torch.compile(flex_attention, dynamic=False)

def causal(b, h, q, kv): return q >= kv
def sliding(w):
    def m(b, h, q, kv): return (q >= kv) & (q - kv <= w)
    return m
def prefix_lm(p):
    def m(b, h, q, kv): return (kv <= p) | (q >= kv)
    return m
def document(doc_ids):
    def m(b, h, q, kv): return (doc_ids[q] == doc_ids[kv]) & (q >= kv)
    return m

def alibi_mod(H, device):
    slopes = torch.exp2(-torch.arange(1, H + 1, device=device, dtype=torch.float32) * 8.0 / H)
    def s(score, b, h, q, kv): return score + slopes[h] * (kv - q)
    return s
def softcap_mod(cap):
    def s(score, b, h, q, kv): return cap * torch.tanh(score / cap)
    return s
def rel_bias_mod(S, device, dtype):
    bias = torch.randn(2 * S, device=device, dtype=dtype)
    def s(score, b, h, q, kv): return score + bias[q - kv + S]
    return s

def cases(B, Hq, Hkv, S, D, device, dtype):
    doc = torch.zeros(S, dtype=torch.int32, device=device)
    # documents of lengths cycling 1/8, 1/4, 1/16 ... of S (deterministic)
    bounds, pos, k = [], 0, 0
    lens = [S // 8, S // 4, S // 16, S // 2, S // 16]
    while pos < S:
        n = lens[k % len(lens)]; doc[pos:pos + n] = k; pos += n; k += 1
    yield "noop", None, None
    yield "causal", None, causal
    yield "alibi+causal", alibi_mod(Hq, device), causal
    yield "sliding1024", None, sliding(1024)
    yield "prefix_lm", None, prefix_lm(S // 4)
    yield "document+causal", None, document(doc)
    yield "softcap30+causal", softcap_mod(30.0), causal
    yield "relbias+causal", rel_bias_mod(S, device, torch.float32), causal

def run(B, Hq, Hkv, S, D, dtype, quick, writer, Sq=None, Dv=None, only=None):
    dev = "cuda"
    Sq = Sq or S
    Dv = Dv or D
    for name, score_mod, mask_mod in cases(B, Hq, Hkv, S, D, dev, dtype):
        if quick and name not in ("noop", "causal", "alibi+causal", "document+causal"):
            continue
        if only is not None and name not in only:
            continue
        if Sq != S:  # decoding: the query sits at the end, so only score-only cases apply
            if mask_mod is not None and score_mod is None:
                continue
            mask_mod = None
        q = torch.randn(B, Hq, Sq, D, device=dev, dtype=dtype, requires_grad=True)
        k = torch.randn(B, Hkv, S, D, device=dev, dtype=dtype, requires_grad=True)
        v = torch.randn(B, Hkv, S, Dv, device=dev, dtype=dtype, requires_grad=True)
        bm = create_block_mask(mask_mod, None, None, Sq, S, device=dev) if mask_mod else None
        density = 1.0
        if bm is not None:
            # fraction of (q,kv) block pairs that are computed
            kvn = bm.kv_num_blocks.sum().item() + (bm.full_kv_num_blocks.sum().item() if bm.full_kv_num_blocks is not None else 0)
            total = bm.kv_num_blocks.numel() * math.ceil(S / bm.BLOCK_SIZE[1])
            density = kvn / total
        gqa = Hq != Hkv
        t0 = time.time()
        fn = lambda: flex(q, k, v, score_mod=score_mod, block_mask=bm, enable_gqa=gqa)
        out = fn()
        compile_s = time.time() - t0
        dout = torch.randn_like(out)
        t_f = do_bench(fn, warmup=25, rep=100, return_mode="median")
        t0 = time.time()
        out.backward(dout, retain_graph=False)
        bwd_compile_s = time.time() - t0
        def fb():
            o = fn(); o.backward(dout)
        t_fb = do_bench(fb, warmup=25, rep=100, return_mode="median")
        flops_f = 2.0 * B * Hq * Sq * S * (D + Dv) * density
        flops_b = 2.5 * flops_f
        row = dict(impl="torch-flex", case=name, B=B, Hq=Hq, Hkv=Hkv, Sq=Sq, Skv=S, D=D if Dv == D else f"{D}/{Dv}", dtype=str(dtype).split(".")[-1],
                   density=round(density, 4), fwd_ms=round(t_f, 4), fwd_tflops=round(flops_f / t_f / 1e9, 1),
                   bwd_ms=round(t_fb - t_f, 4), bwd_tflops=round(flops_b / max(t_fb - t_f, 1e-9) / 1e9, 1),
                   first_call_s=round(compile_s, 2), first_bwd_s=round(bwd_compile_s, 2))
        writer(row)
        # SDPA reference points where SDPA can express the case
        if name in ("noop", "causal") and not gqa and Sq == S:
            for backend in ("FLASH_ATTENTION", "CUDNN_ATTENTION"):
                try:
                    from torch.nn.attention import sdpa_kernel, SDPBackend
                    be = getattr(SDPBackend, backend)
                    with sdpa_kernel([be]):
                        sfn = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=(name == "causal"))
                        sfn()
                        ts = do_bench(sfn, warmup=25, rep=100, return_mode="median")
                        def sfb():
                            o = sfn(); o.backward(dout)
                        tsb = do_bench(sfb, warmup=25, rep=100, return_mode="median")
                    writer(dict(row, impl="sdpa-" + backend.lower(), fwd_ms=round(ts, 4), fwd_tflops=round(flops_f / ts / 1e9, 1),
                                bwd_ms=round(tsb - ts, 4), bwd_tflops=round(flops_b / max(tsb - ts, 1e-9) / 1e9, 1),
                                first_call_s=0, first_bwd_s=0))
                except Exception as e:  # backend not available for this shape
                    print(f"# sdpa {backend} {name}: {type(e).__name__}: {e}", file=sys.stderr)
        del q, k, v, out, dout
        torch.cuda.empty_cache()

def bench_block_masks():
    """create_block_mask time (ms, median) for causal and document masks, eager and compiled."""
    print("impl,mask,S,ms")
    for S in (4096, 16384, 65536):
        doc = torch.arange(S, device="cuda", dtype=torch.int32) // 1000
        for name, m in (("causal", causal), ("document+causal", document(doc))):
            for compiled in (False, True):
                fn = lambda: create_block_mask(m, 1, 1, S, S, device="cuda", _compile=compiled)
                try:
                    fn()
                    t = do_bench(fn, warmup=5, rep=50, return_mode="median")
                    print(f"torch-create_block_mask{'-compiled' if compiled else ''},{name},{S},{t:.3f}", flush=True)
                except Exception as e:
                    print(f"# {name} S={S} compiled={compiled}: {type(e).__name__}: {str(e)[:120]}", flush=True)
                torch.cuda.empty_cache()

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--csv", default=None)
    ap.add_argument("--only-extra", action="store_true", help="skip the main shape")
    ap.add_argument("--block-mask", action="store_true", help="time create_block_mask only")
    ap.add_argument("--head-dims", action="store_true",
                    help="the model head dims only: 96 and 192/128 at B=4 H=16 S=4096, noop and causal")
    a = ap.parse_args()
    print(f"# torch {torch.__version__}, {torch.cuda.get_device_name()}", flush=True)
    if a.block_mask:
        return bench_block_masks()
    rows = []
    cols = ["impl", "case", "B", "Hq", "Hkv", "Sq", "Skv", "D", "dtype", "density", "fwd_ms", "fwd_tflops", "bwd_ms", "bwd_tflops", "first_call_s", "first_bwd_s"]
    print(",".join(cols), flush=True)
    def writer(r):
        rows.append(r); print(",".join(str(r[c]) for c in cols), flush=True)
    if a.head_dims:
        for dqk, dv in ((96, 96), (192, 128)):
            run(4, 16, 16, 4096, dqk, torch.bfloat16, False, writer, Dv=dv, only=("noop", "causal"))
    elif not a.only_extra:
        run(4, 16, 16, 4096, 128, torch.bfloat16, a.quick, writer)
    if not a.quick and not a.head_dims:
        run(4, 32, 8, 4096, 128, torch.bfloat16, True, writer)      # GQA 4:1
        run(8, 16, 16, 2048, 64, torch.bfloat16, True, writer)      # head dim 64
        run(2, 16, 16, 16384, 128, torch.bfloat16, True, writer)    # long context
        run(8, 32, 8, 8192, 128, torch.bfloat16, True, writer, Sq=1)  # decoding: one query token
    if a.csv:
        with open(a.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=cols); w.writeheader(); w.writerows(rows)

if __name__ == "__main__":
    main()

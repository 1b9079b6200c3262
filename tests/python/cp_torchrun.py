"""flexjit.distributed on GPUs, under torchrun (not collected by pytest: the name is no test_*.py):

    PYTHONPATH=.carry/py3.12 torchrun --nproc_per_node 2 tests/python/cp_torchrun.py
    (options: --seqlen 4096 --heads 8 --kv-heads 2 --head-dim 128 --batch 1 --seed 0)

Every rank builds the same random whole q, k, v and output gradient (seeded, bf16, GQA 4:1),
takes its shard (shard_sequence), runs context_parallel_attention forward and backward for
causal, document (int64 ids captured), sliding-window, ALiBi (captured slopes, with a gradient)
and relative-bias (a captured table, with a gradient) mods, both strategies and both layouts,
gathers out, lse and the shards' gradients (gather_sequence) and compares them with
single-GPU flexjit.torch.flex_attention on the whole tensors and with the same attention in fp64
torch ops (the rule of tests/python/test_torch.py: relative Frobenius error vs fp64 <= 1e-2 for
out (bf16), lse max relative error <= 1e-2, gradients <= 2e-2 with the RMS floor). Rank 0
prints one table line per case; every rank exits non-zero if any rank saw a failure.

NVLink multicast stays off (the device machines' rule: it can put the host's shared GPUs out of
service): the guard below sets NCCL_NVLS_ENABLE=0 and its PyTorch / NVSHMEM equivalents before
NCCL loads, and refuses to run where the environment says otherwise.
"""

import os

_MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                  "NVSHMEM_DISABLE_NVLS": "1"}
for _name, _value in _MULTICAST_OFF.items():
    os.environ.setdefault(_name, _value)
    if os.environ[_name] != _value:
        raise SystemExit(f"cp_torchrun.py: {_name}={os.environ[_name]!r}; NVLink multicast must "
                         f"stay off ({_name}={_value})")

import argparse  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import flexjit  # noqa: E402
import flexjit.torch as fjt  # noqa: E402
from flexjit.distributed import (  # noqa: E402
    context_parallel_attention, gather_sequence, nccl_available, release_communicator,
    shard_sequence)

TOL_OUT, TOL_LSE, TOL_GRAD = 1e-2, 1e-2, 2e-2  # tests/python/test_torch.py's bf16 rule


def rel(x, ref):
    ref = ref.double()
    return ((x.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def rel_floor(x, ref):
    """test_torch.py's rule for gradients: |ref| floored at an RMS of 0.01 per element."""
    ref = ref.double()
    floor = 1e-2 * ref.numel() ** 0.5
    return ((x.double() - ref).norm() / max(ref.norm().item(), floor)).item()


def lse_err(x, ref):
    """The largest |x - ref| / max(|ref|, 1) where ref is finite; inf where the two disagree on
    which rows are fully masked (-inf)."""
    finite = torch.isfinite(ref)
    if not bool(torch.equal(finite, torch.isfinite(x))):
        return float("inf")
    err = (x[finite].double() - ref[finite]).abs() / ref[finite].abs().clamp_min(1.0)
    return err.max().item() if err.numel() else 0.0


def dense_attention(q, k, v, score_mod, mask_mod):
    """The fp64 reference (test_torch.py's): the mods called once on broadcast index grids."""
    B, Hq, S, D = q.shape
    k = k.repeat_interleave(Hq // k.shape[1], dim=1)
    v = v.repeat_interleave(Hq // v.shape[1], dim=1)
    s = (q @ k.transpose(-1, -2)) * D ** -0.5
    dev = q.device
    b = torch.arange(B, device=dev).view(B, 1, 1, 1)
    h = torch.arange(Hq, device=dev).view(1, Hq, 1, 1)
    qi = torch.arange(S, device=dev).view(1, 1, S, 1)
    kv = torch.arange(S, device=dev).view(1, 1, 1, S)
    if score_mod is not None:
        s = score_mod(s, b, h, qi, kv)
    if mask_mod is not None:
        s = s.masked_fill(~mask_mod(b, h, qi, kv).expand_as(s), float("-inf"))
    return torch.softmax(s, dim=-1) @ v, torch.logsumexp(s, dim=-1)


def make_mods(name, S, Hq, dev, gen):
    """(score_mod, mask_mod, captured float tensor or None) as a user writes them: torch
    functions over global positions; captured tensors whole, on the rank's device."""
    if name == "causal":
        return None, lambda b, h, q, kv: q >= kv, None
    if name == "document":
        lengths = torch.randint(S // 16, S // 3, (32,), generator=gen)
        ids = torch.repeat_interleave(torch.arange(32), lengths)[:S]
        doc = torch.cat([ids, ids.new_full((S - ids.numel(),), 32)]).to(dev)  # int64
        return None, lambda b, h, q, kv: (doc[q] == doc[kv]) & (q >= kv), None
    if name == "sliding_window":
        w = S // 8
        return None, lambda b, h, q, kv: (q >= kv) & (q - kv < w), None
    if name == "alibi":
        slopes = torch.exp2(-8.0 * torch.arange(1, Hq + 1) / Hq).to(dev)
        return (lambda s, b, h, q, kv: s + slopes[h] * (kv - q)), \
            (lambda b, h, q, kv: q >= kv), slopes
    if name == "rel_bias":
        table = (0.5 * torch.randn(2 * S, generator=gen)).to(dev)
        return (lambda s, b, h, q, kv: s + table[q - kv + S]), None, table
    raise ValueError(name)


def with_table(name, score_mod, table, S):
    """score_mod reading `table` (a leaf of the caller's: fp64 for the reference, a fresh copy
    per case for the context-parallel call, so each gets its own gradient)."""
    if table is None:
        return score_mod
    if name == "alibi":
        return lambda s, b, h, q, kv: s + table[h] * (kv - q)
    return lambda s, b, h, q, kv: s + table[q - kv + S]


def extra_checks(q, k, v, rank, world):
    """What the table does not show, on a causal ring call: the call without autograd gives the
    autograd call's bits; a second NCCL group (its own flexjit communicator) gives them too; a
    loss through lse raises NotImplementedError on every rank. Returns this rank's failures."""
    causal = "causal"
    shards = [shard_sequence(t) for t in (q, k, v)]
    results = []
    with torch.no_grad():
        plain = context_parallel_attention(*shards, mask_mod=causal, enable_gqa=True)
    leaves = [t.clone().requires_grad_(True) for t in shards]
    graded = context_parallel_attention(*leaves, mask_mod=causal, enable_gqa=True)
    results.append(("no_grad == autograd forward, bitwise", torch.equal(plain, graded.detach())))
    other = dist.new_group(backend="nccl")
    with torch.no_grad():
        again = context_parallel_attention(*shards, mask_mod=causal, enable_gqa=True, group=other)
    results.append(("a second NCCL group gives the same bits", torch.equal(plain, again)))
    out, lse = context_parallel_attention(*leaves, mask_mod=causal, enable_gqa=True,
                                          return_lse=True)
    try:
        (out.float().sum() + lse.sum()).backward()
        results.append(("a loss through lse raises NotImplementedError", False))
    except NotImplementedError:
        results.append(("a loss through lse raises NotImplementedError", True))
    release_communicator(other)
    dist.destroy_process_group(other)
    lines = [None] * world
    dist.all_gather_object(lines, results)
    if rank == 0:
        for i, (what, _) in enumerate(results):
            oks = [r[i][1] for r in lines]
            print(f"{what}: " + ("ok" if all(oks) else f"FAIL on ranks "
                                 f"{[r for r, ok in enumerate(oks) if not ok]}"), flush=True)
    return sum(1 for _, ok in results if not ok)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seqlen", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--mods", default="causal,document,sliding_window,alibi,rel_bias")
    ap.add_argument("--strategies", default="ring,allgather")
    ap.add_argument("--layouts", default="zigzag,contiguous")
    args = ap.parse_args()

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
    rank, world = dist.get_rank(), dist.get_world_size()
    dev = torch.device("cuda", local_rank)
    B, Hq, Hkv, S, D = args.batch, args.heads, args.kv_heads, args.seqlen, args.head_dim
    if rank == 0:
        print(f"flexjit {flexjit.__version__}, torch {torch.__version__}, {world} x "
              f"{torch.cuda.get_device_name(dev)}, NCCL available to flexjit: {nccl_available()}, "
              f"NCCL_NVLS_ENABLE={os.environ['NCCL_NVLS_ENABLE']}")
        print(f"B={B} Hq={Hq} Hkv={Hkv} S={S} D={D} bf16 seed={args.seed}; errors vs fp64 "
              f"(rule: out {TOL_OUT}, lse {TOL_LSE}, grads {TOL_GRAD}); 'single' = one-GPU "
              f"flexjit.torch.flex_attention; max|d| = max |cp - single| of out "
              f"(relative to single within {TOL_OUT} too); fwd ms: a warm forward, wall")
        print(f"{'mods':<15}{'strategy':<10}{'layout':<11}{'out':>9}{'single':>9}{'lse':>9}"
              f"{'max|d|':>9}{'dq':>9}{'dk':>9}{'dv':>9}{'dbuf':>9}{'fwd ms':>8}  result")

    gen = torch.Generator().manual_seed(args.seed)  # the same numbers on every rank
    q, k, v = (torch.randn(B, H, S, D, generator=gen).to(dev, torch.bfloat16)
               for H in (Hq, Hkv, Hkv))
    dout = torch.randn(B, Hq, S, D, generator=gen).to(dev, torch.bfloat16)
    failures = 0
    for name in args.mods.split(","):
        score_mod, mask_mod, captured = make_mods(name, S, Hq, dev, gen)
        # The references, once per mod, on the whole tensors: one-GPU flexjit (forward), and
        # fp64 torch ops (forward and backward, the loss sum(out * dout)).
        with torch.no_grad():
            single = fjt.flex_attention(q, k, v, score_mod, mask_mod=mask_mod, enable_gqa=True)
        leaves64 = [t.detach().double().requires_grad_(True) for t in (q, k, v)]
        buf64 = captured.double().requires_grad_(True) if captured is not None else None
        ref, ref_lse = dense_attention(*leaves64, with_table(name, score_mod, buf64, S), mask_mod)
        (ref * dout.double()).sum().backward()
        ref, ref_lse = ref.detach(), ref_lse.detach()
        ref_grads = [t.grad for t in leaves64] + ([buf64.grad] if buf64 is not None else [])
        e_single = rel(single, ref)

        for strategy in args.strategies.split(","):
            for layout in args.layouts.split(","):
                line = f"{name:<15}{strategy:<10}{layout:<11}"
                ok = True
                try:
                    shards = [shard_sequence(t, layout=layout).requires_grad_(True)
                              for t in (q, k, v)]
                    mine = captured.clone().requires_grad_(True) if captured is not None else None
                    smod = with_table(name, score_mod, mine, S)
                    out, lse = context_parallel_attention(
                        *shards, smod, mask_mod, strategy=strategy, layout=layout,
                        enable_gqa=True, return_lse=True)
                    assert out.shape == (B, Hq, S // world, D) and out.dtype == torch.bfloat16
                    (out.float() * shard_sequence(dout, layout=layout).float()).sum().backward()
                    full = gather_sequence(out.detach(), layout=layout)
                    full_lse = gather_sequence(lse.detach(), layout=layout)
                    grads = [gather_sequence(t.grad, layout=layout) for t in shards]
                    if mine is not None:
                        grads.append(mine.grad)  # summed over the ranks by flexjit
                    e_out = rel(full, ref)
                    # One more forward, warm (the first compiled the kernels), timed.
                    torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    with torch.no_grad():
                        context_parallel_attention(*shards, smod, mask_mod, strategy=strategy,
                                                   layout=layout, enable_gqa=True)
                    torch.cuda.synchronize()
                    fwd_ms = (time.perf_counter() - t0) * 1e3
                except Exception:  # noqa: BLE001 - reported, counted, the run goes on
                    ok = False
                    line += "  ERROR " + traceback.format_exc().strip().splitlines()[-1]
                else:
                    e_lse = lse_err(full_lse, ref_lse)
                    d_single = (full.float() - single.float()).abs().max().item()
                    e_vs_single = rel(full, single)
                    e_grads = [rel_floor(g, r) for g, r in zip(grads, ref_grads)]
                    finite = all(bool(torch.isfinite(t).all()) for t in [full, *grads])
                    ok = (finite and e_out <= TOL_OUT and e_vs_single <= TOL_OUT
                          and e_lse <= TOL_LSE and all(e <= TOL_GRAD for e in e_grads))
                    errs = [e_out, e_single, e_lse, d_single] + e_grads[:3] + \
                        [e_grads[3] if len(e_grads) > 3 else float("nan")]
                    line += "".join(f"{e:>9.2e}" for e in errs) + f"{fwd_ms:>8.1f}"
                    line += "  ok" if ok else ("  FAIL" + ("" if finite else " (non-finite)"))
                failures += 0 if ok else 1
                # Rank 0's line, and any rank's that disagrees with it about failing.
                lines = [None] * world
                dist.all_gather_object(lines, (ok, line))
                if rank == 0:
                    print(lines[0][1], flush=True)
                    for r, (r_ok, r_line) in enumerate(lines[1:], 1):
                        if r_ok != lines[0][0] or not r_ok:
                            print(f"  rank {r}: {r_line.strip()}", flush=True)
        del leaves64, ref_grads, ref, ref_lse

    failures += extra_checks(q, k, v, rank, world)
    total = torch.tensor([failures], device=dev)
    dist.all_reduce(total)
    if rank == 0:
        print(f"{int(total.item())} failing case(s) over {world} ranks" if total.item() else
              "all cases within the rule")
    release_communicator()
    dist.destroy_process_group()
    sys.exit(1 if total.item() else 0)


if __name__ == "__main__":
    main()

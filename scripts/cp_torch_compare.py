"""flexjit's context parallelism beside PyTorch's own, on the same GPUs in the same run (issue 32).

    PYTHONPATH=<flexjit module> torchrun --nproc_per_node N scripts/cp_torch_compare.py \
        [--seqlen 131072] [--heads 16] [--kv-heads 4] [--head-dim 128] [--iters 5] \
        [--torch-backends cudnn,flash] [--out DIR]

N = 2 or 4 (any N >= 2 the sequence divides into 2N chunks). B = 1, causal, bf16, the zigzag
(head-tail) layout on both sides. Rows, each timed for the forward and for forward + backward:

- torch: torch.distributed.tensor.experimental.context_parallel around
  F.scaled_dot_product_attention(is_causal=True), its ring rotation (set_rotate_method
  "alltoall": K / V passed rank to rank) and its "allgather" rotation, for each SDPA backend of
  --torch-backends (the aten flash / efficient / cuDNN ops that its CP dispatches). Its SDPA
  ops take no GQA, so its K / V carry all --heads heads (repeated from --kv-heads, as SDPA's
  enable_gqa would expand them too): 4x the bytes that flexjit sends at 4:1.
- flexjit: flexjit.distributed.context_parallel_attention (strategy ring and allgather), K / V
  with --kv-heads heads (enable_gqa).

Every rank builds the same seeded whole q, k, v and output gradient; each side shards them its
own way (context_parallel's buffers, flexjit's shard_sequence). Times are per call, the slowest
rank's (CUDA events around `--iters` calls after warm-up, max over ranks); TFLOP/s per GPU count
the causal attention's FLOPs, 4 B H S^2 D / 2 for the forward and 3.5x that for forward +
backward. Before timing, each row's gathered output is compared with flexjit's ring output on
the whole sequence (relative Frobenius error <= 2e-2, both bf16), so that a row that computes
something else fails instead of being timed. Rank 0 prints one table (and writes it, as JSON,
to --out or $OUT when given).

Nothing is skipped quietly: a missing torch API, NCCL, too few ranks, or a row whose call
raises prints the reason, and the script exits non-zero (after the table, which shows the
failed rows). NVLink multicast stays off: the guard below sets NCCL_NVLS_ENABLE=0 and its
PyTorch / NVSHMEM equivalents before NCCL loads and refuses to run where the environment says
otherwise.
"""

import os

_MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                  "NVSHMEM_DISABLE_NVLS": "1"}
for _name, _value in _MULTICAST_OFF.items():
    os.environ.setdefault(_name, _value)
    if os.environ[_name] != _value:
        raise SystemExit(f"cp_torch_compare.py: {_name}={os.environ[_name]!r}; NVLink multicast "
                         f"must stay off ({_name}={_value})")

import argparse  # noqa: E402
import datetime  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import traceback  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402

TOL_AGREE = 2e-2
SDPA_BACKENDS = ("cudnn", "flash", "efficient")


def fail(message):
    """Every rank stops with the reason (no quiet skip)."""
    print(f"cp_torch_compare.py: {message}", file=sys.stderr, flush=True)
    raise SystemExit(2)


def torch_cp_api():
    """(context_parallel, context_parallel_unshard, set_rotate_method) of this PyTorch, or a loud
    failure naming what is missing. The public context manager is in
    torch.distributed.tensor.experimental; set_rotate_method moved from ._attention to
    ._context_parallel in recent releases, so both places are tried."""
    try:
        from torch.distributed.tensor.experimental import context_parallel
    except ImportError as e:
        fail(f"torch {torch.__version__} has no torch.distributed.tensor.experimental."
             f"context_parallel ({e}); it needs PyTorch >= 2.5")
    tried = []
    for where in ("torch.distributed.tensor.experimental._context_parallel",
                  "torch.distributed.tensor.experimental._attention"):
        try:
            module = __import__(where, fromlist=["set_rotate_method"])
        except ImportError as e:
            tried.append(f"{where}: {e}")
            continue
        missing = [n for n in ("set_rotate_method", "context_parallel_unshard")
                   if not hasattr(module, n)]
        if missing:
            tried.append(f"{where}: no {', '.join(missing)}")
            continue
        return context_parallel, module.context_parallel_unshard, module.set_rotate_method
    fail(f"torch {torch.__version__}: set_rotate_method / context_parallel_unshard not found ("
         + "; ".join(tried) + ")")


def sdpa_backend(name):
    from torch.nn.attention import SDPBackend

    return {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION}[name]


def timed(step, iters, warmup):
    """Seconds per call of step(), the slowest rank's: `warmup` calls, then `iters` between two
    CUDA events on the current stream (every rank starts together: a barrier)."""
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    dist.barrier()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        step()
    stop.record()
    torch.cuda.synchronize()
    seconds = torch.tensor([start.elapsed_time(stop) / 1e3 / iters], device="cuda")
    dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
    return seconds.item()


def time_both(call, q, k, v, dout, args):
    """(forward s, forward + backward s, this rank's out) of call(q, k, v) on its shards: the
    forward without autograd, then the backward of dout through fresh leaves (their gradients
    dropped before each call, as a training step's zero_grad does)."""
    with torch.no_grad():
        out = call(q, k, v)
        fwd = timed(lambda: call(q, k, v), args.iters, args.warmup)
    leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]

    def both():
        for t in leaves:
            t.grad = None
        call(*leaves).backward(dout)

    return fwd, timed(both, args.iters, args.warmup), out


def rel(x, ref):
    ref = ref.double()
    return ((x.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


class Whole:
    """The whole sequence's tensors, the same on every rank (seeded on the device)."""

    def __init__(self, args, device):
        gen = torch.Generator(device=device).manual_seed(args.seed)
        B, S, D = 1, args.seqlen, args.head_dim

        def randn(h):
            return torch.randn(B, h, S, D, generator=gen, device=device, dtype=torch.bfloat16)

        self.q, self.k, self.v, self.dout = (randn(args.heads), randn(args.kv_heads),
                                             randn(args.kv_heads), randn(args.heads))
        self.groups = args.heads // args.kv_heads


def flexjit_row(whole, strategy, args):
    """flexjit.distributed.context_parallel_attention: (fwd s, fwd+bwd s, gathered out)."""
    from flexjit.distributed import context_parallel_attention, gather_sequence, shard_sequence

    q, k, v, dout = (shard_sequence(t) for t in (whole.q, whole.k, whole.v, whole.dout))

    def call(qq, kk, vv):
        return context_parallel_attention(qq, kk, vv, mask_mod="causal", enable_gqa=True,
                                          strategy=strategy)

    fwd, fwd_bwd, out = time_both(call, q, k, v, dout, args)
    with torch.no_grad():
        return fwd, fwd_bwd, gather_sequence(out)


def torch_row(whole, rotate, backend, mesh, api, args):
    """torch's context_parallel around SDPA: (fwd s, fwd+bwd s, gathered out)."""
    from torch.nn.attention import sdpa_kernel

    context_parallel, unshard, set_rotate_method = api
    set_rotate_method(rotate)
    # The buffers are sharded in place (resized) inside the context: fresh copies, K / V with
    # every head (SDPA's CP ops take no GQA).
    q = whole.q.clone()
    k = whole.k.repeat_interleave(whole.groups, dim=1)
    v = whole.v.repeat_interleave(whole.groups, dim=1)
    dout = whole.dout.clone()
    buffers = [q, k, v, dout]
    with context_parallel(mesh, buffers=buffers, buffer_seq_dims=[2, 2, 2, 2],
                          no_restore_buffers=set(buffers)):
        with sdpa_kernel([sdpa_backend(backend)]):
            def call(qq, kk, vv):
                return F.scaled_dot_product_attention(qq, kk, vv, is_causal=True)

            fwd, fwd_bwd, out = time_both(call, q, k, v, dout, args)
    (gathered,) = unshard(mesh, [out], [2])
    return fwd, fwd_bwd, gathered


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seqlen", type=int, default=131072)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--torch-backends", default="cudnn,flash",
                   help="SDPA backends of the torch rows, comma-separated ("
                        + ", ".join(SDPA_BACKENDS) + ")")
    p.add_argument("--out", default=os.environ.get("OUT"),
                   help="folder for cp_torch_compare_<N>gpu.json (default: $OUT; none: no file)")
    args = p.parse_args()
    backends = [b for b in args.torch_backends.split(",") if b]
    for b in backends:
        if b not in SDPA_BACKENDS:
            p.error(f"--torch-backends: {b!r} is not one of {', '.join(SDPA_BACKENDS)}")
    if args.heads % args.kv_heads:
        p.error(f"--heads {args.heads} is not a multiple of --kv-heads {args.kv_heads}")

    if "LOCAL_RANK" not in os.environ:
        fail("run it under torchrun --nproc_per_node N (N >= 2): LOCAL_RANK is not set")
    if not torch.cuda.is_available():
        fail("no CUDA device visible to PyTorch")
    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    # A rank that fails inside a collective leaves the others waiting: torch's watchdog ends
    # them after 5 minutes rather than its default 10.
    dist.init_process_group("nccl", device_id=torch.device("cuda", local),
                            timeout=datetime.timedelta(minutes=5))
    rank, world = dist.get_rank(), dist.get_world_size()
    if world < 2:
        fail(f"{world} rank: context parallelism needs at least 2 (torchrun --nproc_per_node 2)")
    if args.seqlen % (2 * world):
        fail(f"--seqlen {args.seqlen} does not divide into {2 * world} zigzag chunks")
    api = torch_cp_api()
    import flexjit.distributed as fjd

    if not fjd.nccl_available():
        fail("flexjit cannot load libnccl.so.2 (docs/context_parallel.md, \"NCCL\"; "
             "FLEXJIT_NCCL_LIBRARY names the file)")
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cuda", (world,))
    whole = Whole(args, torch.device("cuda", local))

    rows, reference, failed = [], None, False
    plan = [("flexjit", "ring", None), ("flexjit", "allgather", None)]
    plan += [("torch", rotate, b) for b in backends for rotate in ("alltoall", "allgather")]
    for who, strategy, backend in plan:
        label = (f"flexjit {strategy}" if who == "flexjit"
                 else f"torch {'ring (alltoall)' if strategy == 'alltoall' else strategy}, "
                      f"SDPA {backend}")
        row = {"library": who, "strategy": strategy, "backend": backend, "label": label}
        out = None
        try:
            if who == "flexjit":
                fwd, both, out = flexjit_row(whole, strategy, args)
            else:
                fwd, both, out = torch_row(whole, strategy, backend, mesh, api, args)
            if reference is None:
                reference = out
            row["agreement"] = rel(out, reference)
            if not row["agreement"] <= TOL_AGREE:
                raise RuntimeError(f"its output differs from flexjit ring's by "
                                   f"{row['agreement']:.3g} (relative), above {TOL_AGREE}")
            row.update(fwd_ms=fwd * 1e3, fwd_bwd_ms=both * 1e3)
        except Exception as e:  # reported in the table, and the exit status
            row["error"] = f"{type(e).__name__}: {e}".splitlines()[0][:300]
            failed = True
            if rank == 0:
                traceback.print_exc()
        rows.append(row)
        out = None
        torch.cuda.empty_cache()

    flops = 4.0 * args.heads * args.seqlen ** 2 * args.head_dim / 2
    if rank == 0:
        print(f"\ncontext parallelism on {world} GPUs ({torch.cuda.get_device_name()}), torch "
              f"{torch.__version__}: B=1 Hq={args.heads} Hkv={args.kv_heads} d={args.head_dim} "
              f"S={args.seqlen} causal bf16, zigzag; {args.iters} calls after {args.warmup} "
              f"warm-up, the slowest rank's\n")
        print("| library / strategy | fwd ms | fwd TFLOP/s per GPU | fwd+bwd ms | "
              "fwd+bwd TFLOP/s per GPU | fwd+bwd vs torch ring | out vs flexjit ring |")
        print("|---|---|---|---|---|---|---|")
        torch_ring = min((r["fwd_bwd_ms"] for r in rows
                          if r["library"] == "torch" and r["strategy"] == "alltoall"
                          and "fwd_bwd_ms" in r), default=None)
        for r in rows:
            if "error" in r:
                print(f"| {r['label']} | FAILED: {r['error']} | | | | | |")
                continue
            r["fwd_tflops_per_gpu"] = flops / (r["fwd_ms"] * 1e-3) / world / 1e12
            r["fwd_bwd_tflops_per_gpu"] = 3.5 * flops / (r["fwd_bwd_ms"] * 1e-3) / world / 1e12
            vs = f"{torch_ring / r['fwd_bwd_ms']:.2f}x" if torch_ring else "-"
            print(f"| {r['label']} | {r['fwd_ms']:.2f} | {r['fwd_tflops_per_gpu']:.1f} | "
                  f"{r['fwd_bwd_ms']:.2f} | {r['fwd_bwd_tflops_per_gpu']:.1f} | {vs} | "
                  f"{r['agreement']:.1e} |")
        print("\n(fwd+bwd vs torch ring: the fastest torch ring row's time over the row's; torch's "
              "K / V carry all query heads, flexjit's the KV heads)")
        if args.out:
            os.makedirs(args.out, exist_ok=True)
            path = os.path.join(args.out, f"cp_torch_compare_{world}gpu.json")
            with open(path, "w") as f:
                json.dump({"world": world, "device": torch.cuda.get_device_name(),
                           "torch": torch.__version__, "args": vars(args), "rows": rows}, f,
                          indent=1)
            print(f"wrote {path}")
    dist.barrier()
    dist.destroy_process_group()
    if failed:
        raise SystemExit(1)


if __name__ == "__main__":
    main()

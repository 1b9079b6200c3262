"""Context parallelism over ``torch.distributed``: one attention over a sequence split across the
ranks of an NCCL process group (docs/python.md, "Context parallelism"; the C++ side and the
strategies: docs/context_parallel.md).

    # torchrun --nproc_per_node 2 train.py
    import torch, torch.distributed as dist
    from flexjit.distributed import context_parallel_attention, shard_sequence, gather_sequence
    dist.init_process_group("nccl")
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    q, k, v = (shard_sequence(t) for t in (q_full, k_full, v_full))   # this rank's rows, zigzag
    def causal(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx
    out = context_parallel_attention(q, k, v, mask_mod=causal)   # its rows of the whole attention
    out.sum().backward()                                          # q.grad, k.grad, v.grad: shards
    full = gather_sequence(out)                                   # [B, H, S, D] on every rank

The mods are written as for ``flexjit.torch.flex_attention`` (torch functions, traced; flexjit's
names and ``.fx`` text too) and see **global** positions: ``q_idx`` and ``kv_idx`` index the whole
sequence, so every mask and bias keeps its meaning. A tensor a mod captures is bound whole, with
the whole sequence's values, on every rank (``doc_id[S]``, not a shard of it).

This module is separate from ``flexjit.torch`` (the drop-in for
``torch.nn.attention.flex_attention``, whose API is torch's): context parallelism is a
``torch.distributed`` feature, so it lives where a PyTorch user looks for one, and importing
``flexjit.torch`` never pulls in ``torch.distributed``. It reuses ``flexjit.torch``'s tracing,
binding and ``kernel_options``.

flexjit runs its own NCCL communicator beside the process group's (never the group's own: two
streams must not share one ``ncclComm_t``), made once per group and device: rank 0 of the group
makes the NCCL unique id, ``torch.distributed.broadcast_object_list`` sends it over the group, and
every rank joins on its current CUDA device.
"""

import atexit
from typing import Any, Dict, List, Mapping, NamedTuple, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
from torch import Tensor
from torch.utils.dlpack import to_dlpack as _to_dlpack

import flexjit
from flexjit import torch as _fjt

__all__ = ["context_parallel_attention", "context_parallel_attention_cpu", "communicator",
           "gather_sequence", "nccl_available", "release_communicator", "sequence_positions",
           "shard_sequence", "unshard_sequence"]

STRATEGIES = ("ring", "allgather")
LAYOUTS = ("zigzag", "contiguous")


# --- sharding: which positions each rank holds ----------------------------------------------


def _check_layout(layout: str) -> None:
    if layout not in LAYOUTS:
        raise ValueError(f"layout {layout!r}: the sequence is cut 'zigzag' (rank r holds chunks r "
                         f"and 2N-1-r of 2N; load-balances a causal mask) or 'contiguous' (chunk r "
                         f"of N)")


def _check_strategy(strategy: str) -> None:
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy {strategy!r}: context parallelism has 'ring' (K / V shards "
                         f"passed rank to rank, memory O(S/N)) and 'allgather' (the whole K / V on "
                         f"every rank)")


def _rank_chunks(rank: int, world_size: int, layout: str) -> Tuple[int, ...]:
    """The chunks rank `rank` holds, in its shard's order."""
    return (rank, 2 * world_size - 1 - rank) if layout == "zigzag" else (rank,)


def _num_chunks(world_size: int, layout: str) -> int:
    return 2 * world_size if layout == "zigzag" else world_size


def _check_world(rank: int, world_size: int) -> None:
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} of world_size {world_size}: need 0 <= rank < world_size")


def _check_seqlen(what: str, seqlen: int, world_size: int, layout: str) -> None:
    chunks = _num_chunks(world_size, layout)
    if seqlen % chunks != 0:
        padded = -(-seqlen // chunks) * chunks
        raise ValueError(f"{what} has {seqlen} positions; {layout} over {world_size} ranks cuts it "
                         f"into {chunks} chunks of equal length, so it must be a multiple of "
                         f"{chunks} (pad it to {padded})")


def sequence_positions(seqlen: int, rank: int, world_size: int, layout: str = "zigzag",
                       device: Any = None) -> Tensor:
    """The global positions (int64, ascending within each chunk) of a sequence of ``seqlen``
    that rank ``rank`` of ``world_size`` holds, in its shard's order: with ``zigzag`` chunks
    ``rank`` and ``2N-1-rank`` of 2N (N = 2, S = 16: rank 0 holds 0..3 then 12..15), with
    ``contiguous`` chunk ``rank`` of N. ``x_shard = x[..., positions, :]`` is ``shard_sequence``;
    a rotary embedding's positions of a shard are these."""
    _check_layout(layout)
    _check_world(rank, world_size)
    _check_seqlen("the sequence", seqlen, world_size, layout)
    length = seqlen // _num_chunks(world_size, layout)
    return torch.cat([torch.arange(c * length, (c + 1) * length, device=device)
                      for c in _rank_chunks(rank, world_size, layout)])


def _rank_and_size(rank: Optional[int], world_size: Optional[int], group: Any) -> Tuple[int, int]:
    if rank is not None and world_size is not None:
        return int(rank), int(world_size)
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError("give rank and world_size, or initialize torch.distributed "
                           "(init_process_group) so that they are the group's")
    return (int(rank) if rank is not None else dist.get_rank(group),
            int(world_size) if world_size is not None else dist.get_world_size(group))


def shard_sequence(x: Tensor, rank: Optional[int] = None, world_size: Optional[int] = None, *,
                   group: Any = None, layout: str = "zigzag", dim: int = 2) -> Tensor:
    """Rank ``rank``'s shard of ``x``, the whole sequence along ``dim`` (2: q / k / v
    ``[B, H, S, D]``, lse ``[B, H, S]``): its chunks one after the other, as
    ``context_parallel_attention`` takes them (a new contiguous tensor; differentiable).
    ``rank`` / ``world_size`` default to the process group's (``group``; None: the default
    group). S must be a multiple of the chunk count (2N zigzag, N contiguous)."""
    _check_layout(layout)
    rank, world_size = _rank_and_size(rank, world_size, group)
    _check_world(rank, world_size)
    dim = dim % x.dim()
    _check_seqlen(f"x (dim {dim} of shape {list(x.shape)})", x.shape[dim], world_size, layout)
    length = x.shape[dim] // _num_chunks(world_size, layout)
    parts = [x.narrow(dim, c * length, length) for c in _rank_chunks(rank, world_size, layout)]
    return torch.cat(parts, dim) if len(parts) > 1 else parts[0].contiguous()


def unshard_sequence(shards: Sequence[Tensor], *, layout: str = "zigzag", dim: int = 2) -> Tensor:
    """The whole sequence from every rank's shard (``shards[r]``: rank r's, as
    ``shard_sequence`` cuts it or ``context_parallel_attention`` returns it): the inverse of
    ``shard_sequence`` (differentiable)."""
    _check_layout(layout)
    if len(shards) == 0:
        raise ValueError("unshard_sequence takes every rank's shard; got none")
    world_size = len(shards)
    first = shards[0]
    dim = dim % first.dim()
    for r, s in enumerate(shards):
        if s.shape != first.shape:
            raise ValueError(f"shard {r} has shape {list(s.shape)} and shard 0 {list(first.shape)}"
                             f"; every rank holds the same number of positions")
    per_rank = len(_rank_chunks(0, world_size, layout))
    if first.shape[dim] % per_rank != 0:
        raise ValueError(f"a shard has {first.shape[dim]} positions along dim {dim}; a zigzag "
                         f"shard holds two chunks of equal length, so it must be even")
    length = first.shape[dim] // per_rank
    pieces: List[Optional[Tensor]] = [None] * _num_chunks(world_size, layout)
    for r, s in enumerate(shards):
        for i, c in enumerate(_rank_chunks(r, world_size, layout)):
            pieces[c] = s.narrow(dim, i * length, length)
    return torch.cat(pieces, dim)  # type: ignore[arg-type]


def gather_sequence(x: Tensor, *, group: Any = None, layout: str = "zigzag",
                    dim: int = 2) -> Tensor:
    """The whole sequence on every rank from each rank's shard ``x`` (an all-gather over
    ``group``, then ``unshard_sequence``). Differentiable when x requires a gradient (through
    ``torch.distributed.nn.functional.all_gather``: each rank gets its shard's part of the
    gradients of every rank's use)."""
    _check_layout(layout)
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError("gather_sequence needs torch.distributed initialized "
                           "(init_process_group); unshard_sequence puts shards together locally")
    x = x.contiguous()
    if torch.is_grad_enabled() and x.requires_grad:
        from torch.distributed.nn.functional import all_gather

        shards = list(all_gather(x, group=group if group is not None else dist.group.WORLD))
    else:
        shards = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
        dist.all_gather(shards, x, group=group)
    return unshard_sequence(shards, layout=layout, dim=dim)


# --- the communicator -----------------------------------------------------------------------


def nccl_available() -> bool:
    """Whether flexjit can load libnccl.so.2 (docs/context_parallel.md, "NCCL")."""
    return bool(flexjit._C._nccl_available()[0])


def _nccl_group(group: Any) -> Any:
    """The process group (None: the default one), checked: initialized, with the NCCL backend."""
    if not dist.is_available():
        raise RuntimeError("flexjit.distributed needs torch.distributed, which this PyTorch build "
                           "does not have")
    if not dist.is_initialized():
        raise RuntimeError("torch.distributed is not initialized: call "
                           "torch.distributed.init_process_group('nccl') first (torchrun sets the "
                           "environment it reads)")
    if group is None:
        group = dist.group.WORLD
    backend = str(dist.get_backend(group))
    if "nccl" not in backend.lower():
        raise ValueError(f"context parallelism runs over NCCL: the process group has backend "
                         f"{backend!r}; use init_process_group('nccl') or "
                         f"torch.distributed.new_group(backend='nccl')")
    return group


# (id(group), device) -> (group, communicator): the entry keeps the group, so its id stays its.
_communicators: Dict[Tuple[int, int], Tuple[Any, Any]] = {}


def communicator(group: Any = None, device: Any = None):
    """flexjit's NCCL communicator (``flexjit._C.NcclCommunicator``) of this rank in ``group``
    (None: the default group; NCCL backend) on ``device`` (None: the current CUDA device), made
    at the first call: a collective call, every rank of the group must make it (the first
    ``context_parallel_attention`` of a group does). Cached per group and device."""
    group = _nccl_group(group)
    d = torch.device("cuda", device) if isinstance(device, int) else torch.device(
        device if device is not None else "cuda")
    if d.type != "cuda":
        raise ValueError(f"device {d}: flexjit's NCCL communicator runs on a CUDA device")
    index = d.index if d.index is not None else torch.cuda.current_device()
    key = (id(group), index)
    hit = _communicators.get(key)
    if hit is not None and hit[0] is group:
        return hit[1]
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    if rank < 0:
        raise RuntimeError("this process is not a member of the process group")
    message: List[Any] = [None]
    if rank == 0:  # an error on rank 0 goes to every rank: none waits for an id that never comes
        try:
            message[0] = ("id", flexjit._C.NcclCommunicator.unique_id())
        except Exception as e:  # noqa: BLE001 - sent over, raised on every rank below
            message[0] = ("error", f"{type(e).__name__}: {e}")
    with torch.cuda.device(index):
        dist.broadcast_object_list(message, src=dist.get_global_rank(group, 0), group=group)
    kind, value = message[0]
    if kind == "error":
        raise RuntimeError(f"rank 0 of the process group could not make an NCCL unique id: "
                           f"{value}")
    comm = flexjit._C.NcclCommunicator.create(index, value, size, rank)
    _communicators[key] = (group, comm)
    return comm


def release_communicator(group: Any = None) -> None:
    """Drops flexjit's communicators of ``group`` (None: every group), destroying them once no
    call uses them: before ``torch.distributed.destroy_process_group``, or to free NCCL's
    buffers. A later call makes a new one."""
    for key in list(_communicators):
        if group is None or _communicators[key][0] is group:
            del _communicators[key]


atexit.register(release_communicator)  # destroyed while CUDA and NCCL are still loaded


# --- the attention --------------------------------------------------------------------------


class _Call(NamedTuple):
    comm: Any  # flexjit._C.NcclCommunicator; None: the CPU check
    mods_text: str  # the plan's (Mods by _fjt._mods: autograd's graph keeps no nanobind object)
    buffer_names: Tuple[str, ...]
    params: List[Tuple[str, float]]
    scale: Optional[float]
    strategy: str
    layout: str
    fwd_config: Optional[Dict[str, Any]]
    bwd_config: Optional[Dict[str, Any]]
    return_lse: bool
    world_size: int = 0  # the CPU check's rank count (comm None); 0 on GPUs
    num_threads: int = 0  # the CPU check's


def _forward(call: _Call, q: Tensor, k: Tensor, v: Tensor,
             buffers: Sequence[Tensor]) -> Tuple[Tensor, Tensor]:
    """(out, lse): on GPUs the rank's rows (out in q's dtype); for the CPU check the whole
    sequence's, f32 (as the CPU backward takes them)."""
    mods = _fjt._mods(call.mods_text)
    bound = [(n, _to_dlpack(t)) for n, t in zip(call.buffer_names, buffers)]
    if call.comm is None:
        out, lse, _, _, _ = flexjit._C._flex_attention_cp_cpu(
            _to_dlpack(q), _to_dlpack(k), _to_dlpack(v), call.world_size, mods, bound,
            call.params, call.scale, call.strategy, call.layout, call.num_threads)
        return torch.from_numpy(out), torch.from_numpy(lse)
    b, hq, s, _ = q.shape
    out = q.new_empty((b, hq, s, v.shape[3]))
    lse = q.new_empty((b, hq, s), dtype=torch.float32)
    flexjit._C._flex_attention_cp_into(
        call.comm, _to_dlpack(q), _to_dlpack(k), _to_dlpack(v), _to_dlpack(out), _to_dlpack(lse),
        mods, bound, call.params, call.scale, _fjt._stream_of(q), call.strategy, call.layout,
        config=call.fwd_config)
    return out, lse


_NO_DLSE = (
    "the loss reads the lse of context_parallel_attention(return_lse=True), and flexjit's "
    "context-parallel backward takes no lse gradient yet (flex_attention_cp_backward has no "
    "BackwardOptions.dlse; docs/context_parallel.md, \"Not done yet\"); use lse.detach() where "
    "it enters the loss, or flexjit.torch.flex_attention on the gathered sequence")


class _ContextParallelAttention(torch.autograd.Function):
    """A call that needs gradients: the forward keeps the final out and lse, the backward is
    flex_attention_cp_backward (dK / dV back around the ring or reduce-scattered, the buffers'
    gradients summed over the ranks)."""

    @staticmethod
    def forward(ctx, q, k, v, call, *buffers):
        out, lse = _forward(call, q, k, v, buffers)
        ctx.save_for_backward(q, k, v, out, lse, *buffers)
        ctx.call = call
        ctx.set_materialize_grads(False)  # an unused output's gradient stays None
        if not call.return_lse:
            ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse, *buffers = ctx.saved_tensors
        call: _Call = ctx.call
        if dlse is not None:
            raise NotImplementedError(_NO_DLSE)
        if dout is None:  # neither output reaches the loss
            return (None, None, None, None, *([None] * len(buffers)))
        mods = _fjt._mods(call.mods_text)
        bound = [(n, _to_dlpack(t)) for n, t in zip(call.buffer_names, buffers)]
        dout = dout.to(q.dtype).contiguous()  # both backwards read dout in q's dtype
        if call.comm is None:  # the CPU check: f32 gradients of the whole sequence
            dq, dk, dv, grads = flexjit._C._flex_attention_cp_backward_cpu(
                _to_dlpack(q), _to_dlpack(k), _to_dlpack(v), _to_dlpack(out), _to_dlpack(lse),
                _to_dlpack(dout), call.world_size, mods, bound, call.params, call.scale,
                call.strategy, call.layout, call.num_threads)
            convert = torch.from_numpy
        else:
            dq, dk, dv, grads = flexjit._C._flex_attention_cp_backward(
                call.comm, _to_dlpack(q), _to_dlpack(k), _to_dlpack(v), _to_dlpack(out),
                _to_dlpack(lse), _to_dlpack(dout), mods, bound, call.params, call.scale,
                _fjt._stream_of(q), call.strategy, call.layout, config=call.bwd_config)
            convert = torch.from_dlpack
        by_name = {name: convert(g) for name, g in grads}
        dbuffers = []
        for name, b in zip(call.buffer_names, buffers):
            g = by_name.get(name)
            dbuffers.append(g.reshape(b.shape).to(b.dtype)
                            if g is not None and b.is_floating_point() else None)
        return (convert(dq).to(q.dtype), convert(dk).to(k.dtype), convert(dv).to(v.dtype), None,
                *dbuffers)


def _check_block_mask(block_mask: Any, seqlen: int) -> None:
    lengths = tuple(int(n) for n in block_mask.seq_lengths)
    if lengths != (seqlen, seqlen):
        raise ValueError(f"block_mask was created for seq_lengths={lengths}; the whole sequence "
                         f"has {seqlen} positions (only its mask_mod is used: pass mask_mod= "
                         f"instead)")


class _Prepared(NamedTuple):
    plan: Any  # flexjit.torch's _CallPlan
    specs: tuple
    fwd_config: str
    bwd_config: str


def _prepare(query: Tensor, key: Tensor, value: Tensor, score_mod: Any, mask_mod: Any,
             block_mask: Any, enable_gqa: bool, strategy: str, layout: str,
             kernel_options: Optional[Mapping[str, Any]], buffers, params,
             seqlen: Optional[int]) -> _Prepared:
    """The checks and the plan shared by the GPU call and the CPU check; seqlen: the whole
    sequence's length, which a block mask's must be (None: checked later)."""
    for name, t in (("query", query), ("key", key), ("value", value)):
        _fjt._check_tensor(name, t)
    if not (query.device == key.device == value.device):
        raise ValueError(f"query, key and value must be on one device; got {query.device}, "
                         f"{key.device}, {value.device}")
    qs, ks, vs = query.shape, key.shape, value.shape
    if qs[3] != ks[3]:
        raise ValueError(f"query and key must have the same head dim; got {qs[3]} and {ks[3]}")
    if not (qs[0] == ks[0] == vs[0]) or ks[1] != vs[1]:
        raise ValueError(f"query {list(qs)}, key {list(ks)} and value {list(vs)} must agree on "
                         f"the batch, key and value on the heads")
    if not (qs[2] == ks[2] == vs[2]):
        raise ValueError(f"query, key and value hold {qs[2]}, {ks[2]} and {vs[2]} positions; "
                         f"context parallelism shards one sequence (self-attention): each rank "
                         f"holds the same S / N positions of all three")
    if not enable_gqa and qs[1] != ks[1]:
        raise ValueError(f"Expect query and key/value to have the same number of heads but got "
                         f"Hq={qs[1]} and Hkv={ks[1]}. Try setting enable_gqa=True for GQA.")
    if ks[1] == 0 or qs[1] % ks[1] != 0:
        raise ValueError(f"Expect number of query heads to be a multiple of kv heads for GQA but "
                         f"got Hq={qs[1]} and Hkv={ks[1]}.")
    _check_strategy(strategy)
    _check_layout(layout)
    mask_fn = mask_mod
    if block_mask is not None:
        if mask_mod is not None:
            raise ValueError("mask_mod= and block_mask=: give one (only a block mask's mask_mod "
                             "is used; each pair of shards builds its own block mask)")
        if seqlen is not None:
            _check_block_mask(block_mask, seqlen)
        mask_fn = getattr(block_mask, "mask_mod", None)
        if _fjt._is_noop(mask_fn):
            mask_fn = None
    fwd_config, bwd_config, deterministic = _fjt._kernel_options(kernel_options)
    if deterministic:
        raise flexjit.UnsupportedError(
            "deterministic: the context-parallel backward takes no BackwardOptions yet "
            "(docs/context_parallel.md, \"Not done yet\")")
    specs = (score_mod, mask_fn, None)
    plan = _fjt._plan(specs)
    if buffers or params:
        flexjit._check_names(_fjt._mods(plan.text), None, buffers, params)
    return _Prepared(plan, specs, fwd_config, bwd_config)


def context_parallel_attention(query: Tensor, key: Tensor, value: Tensor, score_mod: Any = None,
                               mask_mod: Any = None, *, group: Any = None,
                               strategy: str = "ring", layout: str = "zigzag",
                               scale: Optional[float] = None, enable_gqa: bool = False,
                               return_lse: bool = False, block_mask: Any = None,
                               kernel_options: Optional[Mapping[str, Any]] = None,
                               buffers: Optional[Mapping[str, Tensor]] = None,
                               params: Optional[Mapping[str, float]] = None):
    """This rank's rows of the attention over the whole sequence, split across the ranks of
    ``group`` (a ``torch.distributed`` process group with the NCCL backend; None: the default).

    ``query [B, Hq, S/N, E]``, ``key [B, Hkv, S/N, E]``, ``value [B, Hkv, S/N, Ev]``: this rank's
    shards (``shard_sequence`` with the same ``layout``), CUDA tensors on this rank's device
    (bf16, f16, f32), the same shapes on every rank. ``score_mod(score, b, h, q_idx, kv_idx)`` and
    ``mask_mod(b, h, q_idx, kv_idx)`` as ``flexjit.torch.flex_attention`` takes them (torch
    functions, traced; or flexjit's names / ``.fx`` text with ``buffers`` / ``params``), seeing
    global positions; captured tensors are bound whole (the whole sequence's values, on this
    rank's device) and get gradients. ``block_mask``: only its ``mask_mod`` is used (built for the
    whole sequence). ``strategy``: ``"ring"`` or ``"allgather"``; ``layout``: ``"zigzag"``
    (causal load balance) or ``"contiguous"``. ``kernel_options`` as flexjit.torch's (no
    ``deterministic``).

    Returns out ``[B, Hq, S/N, Ev]`` (q's dtype; this rank's rows, in its shard's order) or,
    with ``return_lse``, ``(out, lse [B, Hq, S/N] f32)``. Queued on the current CUDA stream; every
    rank must make the same calls in the same order (collectives). Differentiable in q, k, v
    and the captured float tensors; a loss that reads lse raises NotImplementedError in the
    backward (no lse gradient yet)."""
    prep = _prepare(query, key, value, score_mod, mask_mod, block_mask, enable_gqa, strategy,
                    layout, kernel_options, buffers, params, None)
    group = _nccl_group(group)
    world = dist.get_world_size(group)
    if block_mask is not None:
        _check_block_mask(block_mask, query.shape[2] * world)
    if layout == "zigzag" and query.shape[2] % 2 != 0:
        raise ValueError(f"each rank's shard has {query.shape[2]} positions; a zigzag shard holds "
                         f"two chunks of equal length, so it must be even (S a multiple of "
                         f"{2 * world})")
    if not query.is_cuda:
        raise ValueError(f"context_parallel_attention takes CUDA tensors; query is on "
                         f"{query.device} (context_parallel_attention_cpu runs the same "
                         f"partitioning on the CPU, for the whole sequence)")
    names, tensors, pnames, pvalues = _fjt._bind(prep.plan, prep.specs, buffers, params)
    for name, t in zip(names, tensors):
        if t.device != query.device:
            raise ValueError(f"the mod's tensor '{name}' is on {t.device} and the shards on "
                             f"{query.device}: captured tensors are bound whole on every rank's "
                             f"device (move it with .to({str(query.device)!r}))")
    comm = communicator(group, query.device)
    call = _Call(comm, prep.plan.text, tuple(names), list(zip(pnames, pvalues)),
                 float(scale) if scale is not None else None, strategy, layout,
                 _fjt._config(f"{prep.fwd_config}|{prep.bwd_config}", False),
                 _fjt._config(f"{prep.fwd_config}|{prep.bwd_config}", True), return_lse)
    # k and v are sent whole over NCCL: contiguous (no copy when they are).
    q, k, v = query.contiguous(), key.contiguous(), value.contiguous()
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v, *tensors)):
        out, lse = _ContextParallelAttention.apply(q, k, v, call, *tensors)
    else:
        out, lse = _forward(call, q, k, v, tensors)
    return (out, lse) if return_lse else out


def context_parallel_attention_cpu(query: Tensor, key: Tensor, value: Tensor, world_size: int,
                                   score_mod: Any = None, mask_mod: Any = None, *,
                                   strategy: str = "ring", layout: str = "zigzag",
                                   scale: Optional[float] = None, enable_gqa: bool = False,
                                   return_lse: bool = False, block_mask: Any = None,
                                   buffers: Optional[Mapping[str, Tensor]] = None,
                                   params: Optional[Mapping[str, float]] = None,
                                   num_threads: int = 0):
    """The partitioning of ``context_parallel_attention`` checked in one process on the CPU
    backend (C++ ``flex_attention_cp_cpu``): ``query`` / ``key`` / ``value`` are the **whole**
    sequence (CPU tensors), cut into ``world_size`` shards as ``layout`` says, every rank's rows
    computed as its GPU would (the same calls of ``strategy``, offsets and lse merges) and put
    back in sequence order. Returns out (q's dtype, computed in f32) or ``(out, lse)``,
    comparable with ``flexjit.torch.flex_attention`` on the same tensors. Differentiable (C++
    ``flex_attention_cp_backward_cpu``: each rank's backward in the GPUs' order, dK / dV summed
    as the ring or the reduce-scatter would), with the GPU call's limits: no lse gradient."""
    prep = _prepare(query, key, value, score_mod, mask_mod, block_mask, enable_gqa, strategy,
                    layout, None, buffers, params, None)
    if block_mask is not None:
        _check_block_mask(block_mask, query.shape[2])
    if query.is_cuda:
        raise ValueError("context_parallel_attention_cpu takes CPU tensors of the whole sequence; "
                         "query is on " + str(query.device))
    _check_world(0, int(world_size))
    _check_seqlen(f"query (shape {list(query.shape)})", query.shape[2], int(world_size), layout)
    names, tensors, pnames, pvalues = _fjt._bind(prep.plan, prep.specs, buffers, params)
    call = _Call(None, prep.plan.text, tuple(names), list(zip(pnames, pvalues)),
                 float(scale) if scale is not None else None, strategy, layout, None, None,
                 return_lse, int(world_size), int(num_threads))
    if torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value, *tensors)):
        out, lse = _ContextParallelAttention.apply(query, key, value, call, *tensors)
    else:
        out, lse = _forward(call, query, key, value, tensors)
    if out.dtype != query.dtype:  # the CPU backend computes in f32 (flexjit.torch's rule)
        out = out.to(query.dtype)
    return (out, lse) if return_lse else out

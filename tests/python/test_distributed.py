"""flexjit.distributed without a GPU: the sharding helpers (what each rank holds, the round trip
back to the whole sequence, for zigzag and contiguous at N = 2, 3, 4), the CPU check of the
partitioning through the Python layer (torch mods traced, captured tensors bound whole) against
flexjit.torch.flex_attention on the whole sequence, forward and backward, and the errors a user
meets before any GPU is involved. The GPU calls over NCCL: tests/python/cp_torchrun.py, under
torchrun (docs/python.md, "Context parallelism")."""

import os

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")
dist = pytest.importorskip("torch.distributed", reason="PyTorch has no torch.distributed")

import flexjit  # noqa: E402
import flexjit.torch as fjt  # noqa: E402
from flexjit.distributed import (  # noqa: E402
    context_parallel_attention, context_parallel_attention_cpu, release_communicator,
    sequence_positions, shard_sequence, unshard_sequence)

LAYOUTS = ["zigzag", "contiguous"]


# --- sharding --------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("n", [2, 3, 4])
def test_shard_unshard_round_trip(n, layout):
    S = 8 * n  # 2N chunks of 4 (zigzag), N of 8 (contiguous)
    x = torch.randn(2, 3, S, 5)
    shards = [shard_sequence(x, r, n, layout=layout) for r in range(n)]
    held = []
    for r, s in enumerate(shards):
        pos = sequence_positions(S, r, n, layout)
        assert s.shape == (2, 3, S // n, 5) and s.is_contiguous()
        assert torch.equal(s, x[:, :, pos])  # the rank's positions, in its shard's order
        held += pos.tolist()
    assert sorted(held) == list(range(S))  # every position on exactly one rank
    assert torch.equal(unshard_sequence(shards, layout=layout), x)
    # lse-shaped [B, H, S]: the sequence is dim 2 too; a negative dim is the same dim
    lse = torch.randn(2, 3, S)
    lse_shards = [shard_sequence(lse, r, n, layout=layout, dim=-1) for r in range(n)]
    assert torch.equal(unshard_sequence(lse_shards, layout=layout, dim=2), lse)


def test_zigzag_holds_chunks_r_and_2n_minus_1_minus_r():
    assert sequence_positions(16, 0, 2).tolist() == [0, 1, 2, 3, 12, 13, 14, 15]
    assert sequence_positions(16, 1, 2).tolist() == [4, 5, 6, 7, 8, 9, 10, 11]
    assert sequence_positions(12, 2, 3, "contiguous").tolist() == [8, 9, 10, 11]


@pytest.mark.parametrize("n", [2, 3, 4])
def test_zigzag_gives_every_rank_the_same_causal_work(n):
    """What the layout is for: the (query, key) pairs a causal mask keeps, per rank."""
    S = 16 * n
    work = {layout: [int((sequence_positions(S, r, n, layout) + 1).sum()) for r in range(n)]
            for layout in LAYOUTS}
    assert len(set(work["zigzag"])) == 1, work
    assert work["contiguous"][0] < work["contiguous"][-1], work


def test_shard_and_unshard_are_differentiable():
    x = torch.randn(1, 2, 12, 4, requires_grad=True)
    shards = [shard_sequence(x, r, 3) for r in range(3)]
    w = torch.randn(1, 2, 12, 4)
    (unshard_sequence(shards) * w).sum().backward()
    assert torch.equal(x.grad, w)


def test_sharding_errors_name_the_problem():
    x = torch.randn(1, 2, 10, 4)
    with pytest.raises(ValueError, match=r"10 positions; zigzag over 3 ranks cuts it into 6 "
                                         r"chunks.*pad it to 12"):
        shard_sequence(x, 0, 3)
    with pytest.raises(ValueError, match=r"layout 'zig'"):
        shard_sequence(x, 0, 2, layout="zig")
    with pytest.raises(ValueError, match=r"rank 2 of world_size 2"):
        shard_sequence(x, 2, 2)
    with pytest.raises(ValueError, match=r"shard 1 has shape \[1, 2, 4, 4\] and shard 0 "
                                         r"\[1, 2, 6, 4\]"):
        unshard_sequence([torch.zeros(1, 2, 6, 4), torch.zeros(1, 2, 4, 4)])
    with pytest.raises(ValueError, match=r"must be even"):
        unshard_sequence([torch.zeros(1, 2, 3, 4)] * 2)
    if not dist.is_initialized():
        with pytest.raises(RuntimeError, match=r"give rank and world_size"):
            shard_sequence(x)


# --- the CPU check through the Python layer ---------------------------------------------------


def mods(name, S, Hq):
    """(score_mod, mask_mod) written against torch, as a user writes them."""
    g = torch.Generator().manual_seed(7)
    if name == "causal":
        return None, lambda b, h, q, kv: q >= kv
    if name == "document":  # int64 ids, captured whole (global positions)
        doc = torch.sort(torch.randint(0, 4, (S,), generator=g)).values
        return None, lambda b, h, q, kv: (doc[q] == doc[kv]) & (q >= kv)
    if name == "sliding_window":
        return None, lambda b, h, q, kv: (q >= kv) & (q - kv < S // 5)
    if name == "alibi":  # a captured float tensor: it gets a gradient
        slopes = torch.rand(Hq, generator=g)
        return (lambda s, b, h, q, kv: s + slopes[h] * (kv - q)), (lambda b, h, q, kv: q >= kv)
    raise ValueError(name)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("strategy", ["ring", "allgather"])
@pytest.mark.parametrize("name", ["causal", "document", "sliding_window", "alibi"])
@pytest.mark.parametrize("n", [2, 3])
def test_cpu_check_matches_flex_attention(n, name, strategy, layout):
    """context_parallel_attention_cpu (every rank's calls, offsets and merges on the CPU) against
    flexjit.torch.flex_attention on the whole sequence: out, lse, and the gradients of q, k, v
    and of a captured tensor (ALiBi's slopes), GQA 4:2."""
    B, Hq, Hkv, S, D = 1, 4, 2, 24 * n, 16
    g = torch.Generator().manual_seed(n)
    q, k, v = (torch.randn(B, H, S, D, generator=g) for H in (Hq, Hkv, Hkv))
    dout = torch.randn(B, Hq, S, D, generator=g)
    score_mod, mask_mod = mods(name, S, Hq)
    captured = score_mod.__closure__[0].cell_contents if name == "alibi" else None

    results = []
    for fn in ("cp", "whole"):
        leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
        if captured is not None:
            captured.grad = None
            captured.requires_grad_(True)
        if fn == "cp":
            out, lse = context_parallel_attention_cpu(
                *leaves, n, score_mod, mask_mod, strategy=strategy, layout=layout,
                enable_gqa=True, return_lse=True)
        else:
            out, lse = fjt.flex_attention(*leaves, score_mod, mask_mod=mask_mod, enable_gqa=True,
                                          return_lse=True)
        (out * dout).sum().backward()
        grads = [t.grad for t in leaves] + ([captured.grad.clone()] if captured is not None
                                            else [])
        results.append((out.detach(), lse.detach(), grads))
    (out, lse, grads), (ref, ref_lse, ref_grads) = results
    assert out.shape == ref.shape and out.dtype == torch.float32
    assert (out - ref).abs().max().item() <= 1e-5
    assert (lse - ref_lse).abs().max().item() <= 1e-5
    for what, a, b in zip(("dq", "dk", "dv", "dslopes"), grads, ref_grads):
        err = ((a - b).norm() / b.norm()).item()
        assert err <= 1e-5, (what, err)


@pytest.mark.parametrize("strategy", ["ring", "allgather"])
def test_cpu_check_in_bf16(strategy):
    """bf16 inputs: out comes back in bf16 and the backward reads the output gradient in q's
    dtype (as the CPU backward requires), both as flexjit.torch.flex_attention does."""
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, H, 64, 16, generator=g).to(torch.bfloat16) for H in (4, 1, 1))
    dout = torch.randn(1, 4, 64, 16, generator=g).to(torch.bfloat16)
    results = []
    for fn in ("cp", "whole"):
        leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
        if fn == "cp":
            out = context_parallel_attention_cpu(*leaves, 4, mask_mod="causal", enable_gqa=True,
                                                 strategy=strategy)
        else:
            out = fjt.flex_attention(*leaves, mask_mod="causal", enable_gqa=True)
        (out.float() * dout.float()).sum().backward()
        results.append([out.detach()] + [t.grad for t in leaves])
    for what, a, b in zip(("out", "dq", "dk", "dv"), *results):
        assert a.dtype == torch.bfloat16, what
        err = ((a.double() - b.double()).norm() / b.double().norm()).item()
        assert err <= 1e-2, (what, err)


def test_cpu_check_loss_through_lse_is_not_implemented():
    q = torch.randn(1, 2, 16, 8, requires_grad=True)
    out, lse = context_parallel_attention_cpu(q, q, q, 2, mask_mod="causal", return_lse=True)
    out.sum().backward(retain_graph=True)  # out alone: fine
    assert q.grad is not None and torch.isfinite(q.grad).all()
    with pytest.raises(NotImplementedError, match=r"no lse gradient yet.*lse\.detach\(\)"):
        (out.sum() + lse.sum()).backward()


# --- errors of the GPU call before any GPU is used ------------------------------------------


def qkv(S=16, dtype=torch.float32):
    return (torch.randn(1, 4, S, 8, dtype=dtype), torch.randn(1, 2, S, 8, dtype=dtype),
            torch.randn(1, 2, S, 8, dtype=dtype))


def test_shape_and_argument_errors():
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"hold 16, 8 and 8 positions.*same S / N positions"):
        context_parallel_attention(q, k[:, :, :8], v[:, :, :8], enable_gqa=True)
    with pytest.raises(ValueError, match=r"Hq=4 and Hkv=2.*enable_gqa=True"):
        context_parallel_attention(q, k, v)
    with pytest.raises(ValueError, match=r"query has dtype torch.float64"):
        context_parallel_attention(q.double(), k, v, enable_gqa=True)
    with pytest.raises(ValueError, match=r"must be 4-D"):
        context_parallel_attention(q[0], k, v, enable_gqa=True)
    with pytest.raises(ValueError, match=r"strategy 'rings'.*'ring'.*'allgather'"):
        context_parallel_attention(q, k, v, enable_gqa=True, strategy="rings")
    with pytest.raises(ValueError, match=r"layout 'zig-zag'"):
        context_parallel_attention(q, k, v, enable_gqa=True, layout="zig-zag")
    with pytest.raises(flexjit.UnsupportedError, match=r"deterministic"):
        context_parallel_attention(q, k, v, enable_gqa=True,
                                   kernel_options={"deterministic": True})
    with pytest.raises(ValueError, match=r"kernel_options: unknown key 'BLOCKM'"):
        context_parallel_attention(q, k, v, enable_gqa=True, kernel_options={"BLOCKM": 64})
    with pytest.raises(ValueError, match=r"mask_mod= and block_mask="):
        bm = fjt.create_block_mask(lambda b, h, qi, kv: qi >= kv, None, None, 16, 16,
                                   device="cpu")
        context_parallel_attention(q, k, v, enable_gqa=True, mask_mod="causal", block_mask=bm)


@pytest.mark.skipif(dist.is_initialized(), reason="a process group is already initialized")
def test_without_a_process_group():
    q, k, v = qkv()
    with pytest.raises(RuntimeError, match=r"not initialized.*init_process_group\('nccl'\)"):
        context_parallel_attention(q, k, v, enable_gqa=True, mask_mod="causal")


@pytest.fixture
def gloo_group(tmp_path):
    if dist.is_initialized():
        pytest.skip("a process group is already initialized")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0,
                            world_size=1)
    try:
        yield dist.group.WORLD
    finally:
        dist.destroy_process_group()


def test_a_group_without_nccl_is_refused(gloo_group):
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"runs over NCCL: the process group has backend "
                                         r"'gloo'.*init_process_group\('nccl'\)"):
        context_parallel_attention(q, k, v, enable_gqa=True, mask_mod="causal")
    with pytest.raises(ValueError, match=r"backend 'gloo'"):
        context_parallel_attention(q, k, v, enable_gqa=True, group=gloo_group)
    # The sharding helpers take any group: rank and world size are the group's.
    x = torch.arange(8.0).view(1, 1, 8, 1)
    assert torch.equal(shard_sequence(x), x[:, :, sequence_positions(8, 0, 1)])


def test_communicator_binding_checks_the_unique_id():
    with pytest.raises(flexjit.RuntimeError, match=r"the unique id has 5 bytes; NCCL's has 128"):
        flexjit._C.NcclCommunicator.create(0, b"short", 2, 0)


def test_nccl_status_is_a_bool_and_a_reason():
    ok, reason = flexjit._C._nccl_available()
    assert isinstance(ok, bool)
    assert ok or "libnccl" in reason  # otherwise the places tried are named


# --- one GPU: the whole Python path over a one-rank NCCL group ---------------------------------

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="skipped: no GPU")


@pytest.fixture(scope="module")
def nccl_group_of_one(tmp_path_factory):
    """A one-rank NCCL process group (FileStore): the communicator, the bindings, the DLPack
    gradients and autograd of context_parallel_attention on one GPU. (Several ranks:
    tests/python/cp_torchrun.py under torchrun.)"""
    if not torch.cuda.is_available():
        pytest.skip("skipped: no GPU")
    if not dist.is_nccl_available():
        pytest.skip("skipped: this PyTorch has no NCCL")
    if dist.is_initialized():
        pytest.skip("a process group is already initialized")
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # NVLink multicast stays off
    store = tmp_path_factory.mktemp("nccl") / "store"
    dist.init_process_group("nccl", init_method=f"file://{store}", rank=0, world_size=1)
    try:
        yield dist.group.WORLD
    finally:
        release_communicator()
        dist.destroy_process_group()


@cuda
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("strategy", ["ring", "allgather"])
@pytest.mark.parametrize("name", ["causal", "document", "alibi"])
def test_one_rank_matches_flex_attention(nccl_group_of_one, name, strategy, layout):
    """With N = 1 the shard is the whole sequence: out and the gradients of q, k, v and of a
    captured tensor against flexjit.torch.flex_attention (bf16, GQA 4:1), within the bf16 rule
    of test_torch.py (relative 1e-2 forward, 2e-2 gradients with the RMS floor)."""
    B, Hq, Hkv, S, D = 1, 8, 2, 512, 64
    dev = torch.device("cuda", torch.cuda.current_device())
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(B, H, S, D, generator=g).to(dev, torch.bfloat16)
               for H in (Hq, Hkv, Hkv))
    dout = torch.randn(B, Hq, S, D, generator=g).to(dev, torch.bfloat16)
    score_mod, mask_mod = mods(name, S, Hq)
    table = None
    if name == "document":
        doc = torch.sort(torch.randint(0, 4, (S,), generator=g)).values.to(dev)  # int64

        def mask_mod(b, h, qi, kv):
            return (doc[qi] == doc[kv]) & (qi >= kv)
    if name == "alibi":
        table = torch.rand(Hq, generator=g).to(dev)
    results = []
    for fn in ("cp", "whole"):
        leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
        slopes = table.clone().requires_grad_(True) if table is not None else None
        smod = (lambda s, b, h, qi, kv: s + slopes[h] * (kv - qi)) if slopes is not None \
            else score_mod
        if fn == "cp":
            shards = [shard_sequence(t, layout=layout) for t in leaves]
            out = context_parallel_attention(*shards, smod, mask_mod, strategy=strategy,
                                             layout=layout, enable_gqa=True)
            assert out.dtype == torch.bfloat16 and out.shape == (B, Hq, S, D)
            (out.float() * shard_sequence(dout, layout=layout).float()).sum().backward()
            out = unshard_sequence([out.detach()], layout=layout)
        else:
            out = fjt.flex_attention(*leaves, smod, mask_mod=mask_mod, enable_gqa=True)
            (out.float() * dout.float()).sum().backward()
        grads = [t.grad for t in leaves] + ([slopes.grad] if slopes is not None else [])
        results.append((out.detach(), grads))
    (out, grads), (ref, ref_grads) = results
    err = ((out.double() - ref.double()).norm() / ref.double().norm()).item()
    assert err <= 1e-2, err
    for what, a, b in zip(("dq", "dk", "dv", "dslopes"), grads, ref_grads):
        assert a is not None and a.dtype == b.dtype and torch.isfinite(a).all(), what
        floor = 1e-2 * b.numel() ** 0.5
        e = ((a.double() - b.double()).norm() / max(b.double().norm().item(), floor)).item()
        assert e <= 2e-2, (what, e)

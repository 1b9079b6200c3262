"""The backward's early start in flexjit.torch (docs/caching.md "First call"): a forward whose
gradient is wanted first queues the backward's kernels to compile in the background
(flex_attention_backward_prepare), once per distinct call. On the CPU there is nothing to
build; on a GPU the gradients are bitwise those of the same call without the early start.
Skipped without PyTorch; the GPU tests without a GPU."""

import random

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")

import flexjit  # noqa: E402
import flexjit.torch as fjt  # noqa: E402

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="skipped: no GPU")


def test_binding_queues_nothing_for_cpu_tensors():
    q = torch.randn(1, 2, 64, 16)
    mods = flexjit.make_mods(None, "causal")
    assert flexjit._C._flex_attention_backward_prepare(
        *flexjit._arrays(q, q, q), mods, None, [], [], None) == 0


def test_cpu_autograd_is_unchanged_and_prepares_nothing():
    fjt._prepared.clear()
    q, k, v = (torch.randn(1, 2, 64, 16, requires_grad=True) for _ in range(3))
    out = fjt.flex_attention(q, k, v, score_mod=lambda s, b, h, qi, ki: s * 0.5)
    out.sum().backward()
    assert q.grad is not None and torch.isfinite(q.grad).all()
    assert not fjt._prepared  # CPU tensors: no kernels to build


def test_private_forward_op_takes_the_prepare_flag():
    """The compiled graph's forward op: prepare_backward=True on CPU tensors runs the forward
    (nothing to prepare), and its fake gives the same shapes."""
    q = torch.randn(1, 2, 32, 16)
    call = fjt._call_text("", "", "", None, True, False, "")
    out, lse = torch.ops.flexjit._flex_attention_fwd(q, q, q, call, [], [], [], [], True)
    ref, ref_lse = torch.ops.flexjit._flex_attention_fwd(q, q, q, call, [], [], [], [])
    assert torch.equal(out, ref) and torch.equal(lse, ref_lse)
    torch.library.opcheck(torch.ops.flexjit._flex_attention_fwd.default,
                          (q, q, q, call, [], [], [], [], True),
                          test_utils=("test_schema", "test_faketensor"))


@cuda
def test_gradients_with_the_early_start_are_bitwise_those_without(monkeypatch):
    """A score_mod new to the process (a random constant in it): the first forward queues the
    backward's kernels, which compile while the forward runs; the gradients (deterministic
    mode, a float buffer's too) equal bit for bit those of the same call with the early start
    off, and a second forward queues nothing."""
    dev, S = "cuda", 384
    c = round(random.uniform(0.5, 0.9), 6)
    bias = torch.randn(2 * S, device=dev)

    def run():
        gen = torch.Generator(device=dev).manual_seed(1234)
        q, k, v = (torch.randn(1, 2, S, 64, device=dev, dtype=torch.bfloat16, generator=gen)
                   .requires_grad_() for _ in range(3))
        b = bias.clone().requires_grad_()

        def mod(score, bb, h, q_idx, kv_idx):
            return score * c + b[q_idx - kv_idx + S]

        out = fjt.flex_attention(q, k, v, score_mod=mod,
                                 kernel_options={"deterministic": True})
        out.float().square().sum().backward()
        torch.cuda.synchronize()
        return [t.grad.clone() for t in (q, k, v, b)]

    fjt._prepared.clear()
    queued = []
    prepare = flexjit._C._flex_attention_backward_prepare

    def counting(*args, **kwargs):
        n = prepare(*args, **kwargs)
        queued.append(n)
        return n

    monkeypatch.setattr(flexjit._C, "_flex_attention_backward_prepare", counting)
    early = run()
    assert queued and queued[0] > 0  # the kernels were new: queued before the forward
    run()
    assert len(queued) == 1  # the same call again: skipped before planning
    monkeypatch.setattr(fjt, "_prepare_backward", lambda *args: None)
    late = run()
    for a, b in zip(early, late):
        assert torch.isfinite(a).all()
        assert torch.equal(a, b)

# Attention sinks (the sink_mod) from Python: make_mods' forms, the CPU backend's forward and
# backward against a NumPy reference that appends the sink as an extra column with no value,
# and the torch custom op's gradient into the sinks (skipped without torch).
import numpy as np
import pytest

import flexjit
from flexjit import dsl

SINKS_TEXT = "buffer sinks: f32[H]\nsink_mod = sinks[h]"


def _inputs(seed, B=2, H=4, S=9, D=8):
    rng = np.random.default_rng(seed)
    q, k, v, dout = (rng.standard_normal((B, H, S, D)).astype(np.float32) for _ in range(4))
    sinks = rng.uniform(-1.0, 2.0, H).astype(np.float32)
    return q, k, v, dout, sinks


def _reference(q, k, v, dout, sinks, causal, scale):
    """out, lse and d sinks of sum(out * dout), in float64, with the sink as a last column."""
    B, H, S, D = q.shape
    s = np.einsum("bhqd,bhkd->bhqk", q.astype(np.float64), k.astype(np.float64)) * scale
    if causal:
        s = np.where(np.tril(np.ones((S, S), dtype=bool)), s, -np.inf)
    col = np.broadcast_to(sinks.astype(np.float64)[None, :, None, None], (B, H, S, 1))
    full = np.concatenate([s, col], axis=-1)
    lse = np.logaddexp.reduce(full, axis=-1)
    p = np.exp(full - lse[..., None])
    out = np.einsum("bhqk,bhkd->bhqd", p[..., :S], v.astype(np.float64))
    delta = np.sum(dout.astype(np.float64) * out, axis=-1)
    dsinks = np.sum(-p[..., S] * delta, axis=(0, 2))
    return out, lse, dsinks


def test_make_mods_forms_of_a_sink_are_equal():
    sinks = dsl.Buffer("sinks", "f32", ["H"])
    from_text = flexjit.make_mods(mask_mod="causal", sink_mod=SINKS_TEXT)
    from_expr = flexjit.make_mods(mask_mod="causal", sink_mod=sinks[dsl.h_idx()])
    from_lambda = flexjit.make_mods(mask_mod="causal", sink_mod=lambda b, h, q_idx: sinks[h])
    whole = flexjit.parse_mods(SINKS_TEXT + "\nmask_mod = q_idx >= kv_idx")
    for m in (from_text, from_expr, from_lambda):
        assert m == whole
        assert m.hash() == whole.hash()
        assert m.sink_mod is not None
    # A program's sink_mod goes with its side; the standard file has one.
    assert flexjit.make_mods(score_mod="softcap", mask_mod=SINKS_TEXT).sink_mod is not None
    assert flexjit.standard_mods("sinks_sliding_window").sink_mod is not None
    assert "sink_mod = sinks[h]" in whole.to_text()


def test_sink_mod_errors_are_compile_errors():
    with pytest.raises(flexjit.CompileError, match="sink_mod cannot use `kv_idx`"):
        flexjit.make_mods(sink_mod=lambda b, h, q_idx: dsl.to_float(dsl.kv_idx()))
    with pytest.raises(flexjit.CompileError, match="both define a sink_mod"):
        flexjit.make_mods(mask_mod=SINKS_TEXT + "\nmask_mod = true", sink_mod=SINKS_TEXT)


@pytest.mark.parametrize("causal", [False, True])
def test_cpu_forward_and_backward_match_the_extra_column_reference(causal):
    q, k, v, dout, sinks = _inputs(1 + causal)
    scale = 0.3
    mask = "causal" if causal else None
    out, lse = flexjit.flex_attention(q, k, v, mask_mod=mask, sink_mod=SINKS_TEXT,
                                      buffers={"sinks": sinks}, scale=scale, return_lse=True)
    ref_out, ref_lse, ref_dsinks = _reference(q, k, v, dout, sinks, causal, scale)
    np.testing.assert_allclose(out, ref_out, atol=2e-5)
    np.testing.assert_allclose(lse, ref_lse, atol=2e-5)
    dq, dk, dv, grads = flexjit.flex_attention_backward(
        q, k, v, out, lse, dout, mask_mod=mask, sink_mod=SINKS_TEXT, buffers={"sinks": sinks},
        scale=scale)
    assert set(grads) == {"sinks"}
    np.testing.assert_allclose(grads["sinks"], ref_dsinks, rtol=1e-4, atol=1e-4)


def test_cpu_fully_masked_rows_give_zero_and_the_sink():
    q, k, v, _, sinks = _inputs(3)
    out, lse = flexjit.flex_attention(q, k, v, mask_mod="q_idx >= 3", sink_mod=SINKS_TEXT,
                                      buffers={"sinks": sinks}, return_lse=True)
    assert np.all(out[:, :, :3] == 0)
    np.testing.assert_array_equal(lse[:, :, :3], np.broadcast_to(sinks[None, :, None], (2, 4, 3)))


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_torch_sinks_gradient_flows_through_the_custom_op(device):
    torch = pytest.importorskip("torch")
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    import flexjit.torch as fjt

    q, k, v, dout, sinks = _inputs(4, S=40, D=64)
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    # The inputs the reference sees are the ones the kernel reads (rounded to dtype).
    tq, tk, tv = (torch.from_numpy(x).to(device, dtype).requires_grad_() for x in (q, k, v))
    q, k, v = (t.detach().float().cpu().numpy() for t in (tq, tk, tv))
    ts = torch.from_numpy(sinks).to(device).requires_grad_()
    out = fjt.flex_attention(tq, tk, tv, enable_gqa=True, mask_mod="causal", sink_mod=SINKS_TEXT,
                             buffers={"sinks": ts}, scale=0.3)
    tdo = torch.from_numpy(dout).to(device, dtype)
    dout = tdo.float().cpu().numpy()
    (out.float() * tdo.float()).sum().backward()
    ref_out, _, ref_dsinks = _reference(q, k, v, dout, sinks, True, 0.3)
    tol = 1e-4 if device == "cpu" else 3e-2
    np.testing.assert_allclose(out.detach().float().cpu().numpy(), ref_out, rtol=tol, atol=tol)
    np.testing.assert_allclose(ts.grad.cpu().numpy(), ref_dsinks, rtol=tol,
                               atol=tol * np.abs(ref_dsinks).max())
    assert tq.grad is not None and torch.isfinite(tq.grad).all()

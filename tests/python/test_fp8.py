# flexjit.flex_attention with torch.float8_e4m3fn q, k, v and descale factors (issue 31, "FP8";
# docs/attention.md "FP8 inputs"): the CPU backend against float32 attention of the dequantized
# values, the GPU (sm_90a) forward against the same within docs/math.md's FP8 rule, and the
# errors of misused factors.
import numpy as np
import pytest

import flexjit

torch = pytest.importorskip("torch")
if not hasattr(torch, "float8_e4m3fn"):
    pytest.skip("this torch has no float8_e4m3fn", allow_module_level=True)


def _quantized(shape, per_head, seed):
    """N(0, 1) values quantized as serving stacks do: x / (amax / 448) in e4m3, per tensor or
    per head; returns the e4m3 tensor, its descale factors and the dequantized float32 values."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g)
    amax = x.abs().amax(dim=(0, 2, 3)) if per_head else x.abs().amax().reshape(1)
    scale = (amax / 448.0).clamp_min(1e-6).float()
    xs = x / (scale.view(1, -1, 1, 1) if per_head else scale)
    q8 = xs.to(torch.float8_e4m3fn)
    deq = q8.float() * (scale.view(1, -1, 1, 1) if per_head else scale)
    return q8, scale, deq


def _sdpa(q, k, v, causal, scale):
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1).double()
    v = v.repeat_interleave(group, dim=1).double()
    s = torch.einsum("bhqd,bhkd->bhqk", q.double(), k) * scale
    if causal:
        sq, sk = s.shape[-2:]
        s = s.masked_fill(torch.ones(sq, sk, dtype=torch.bool).triu(1), float("-inf"))
    return torch.einsum("bhqk,bhkd->bhqd", s.softmax(-1), v)


@pytest.mark.parametrize("per_head", [False, True])
def test_cpu_e4m3_is_the_attention_of_the_dequantized_values(per_head):
    q8, qs, q = _quantized((1, 4, 50, 32), per_head, 1)
    k8, ks, k = _quantized((1, 2, 70, 32), per_head, 2)
    v8, vs, v = _quantized((1, 2, 70, 32), per_head, 3)
    out = flexjit.flex_attention(q8, k8, v8, mask_mod="causal", descale=(qs, ks, vs))
    want = flexjit.flex_attention(q, k, v, mask_mod="causal")
    assert out.dtype == torch.float32
    np.testing.assert_array_equal(out.numpy(), want.numpy())


def test_cpu_e4m3_descale_errors_name_the_factor():
    q8, _, _ = _quantized((1, 4, 16, 32), False, 4)
    bad = torch.ones(3)
    with pytest.raises(flexjit.RuntimeError, match="descale.q is f32\\[3\\]"):
        flexjit.flex_attention(q8, q8, q8, descale=(bad, None, None))
    with pytest.raises(flexjit.RuntimeError, match="descale factors were given for f32 inputs"):
        x = torch.zeros(1, 4, 16, 32)
        flexjit.flex_attention(x, x, x, descale=(torch.ones(1), None, None))
    with pytest.raises(ValueError, match="descale must be"):
        flexjit.flex_attention(q8, q8, q8, descale=(torch.ones(1),))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="skipped: no GPU")
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_e4m3_forward_within_the_fp8_rule(causal):
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("e4m3 runs on sm_90a")
    q8, qs, q = _quantized((2, 8, 300, 128), True, 5)
    k8, ks, k = _quantized((2, 2, 333, 128), False, 6)
    v8, vs, v = _quantized((2, 2, 333, 128), True, 7)
    dev = [t.cuda() for t in (q8, k8, v8, qs, ks, vs)]
    out = flexjit.flex_attention(*dev[:3], mask_mod="causal" if causal else None,
                                 descale=tuple(dev[3:]))
    assert out.dtype == torch.bfloat16
    scale = 128 ** -0.5
    ref = _sdpa(q, k, v, causal, scale)
    ref_abs = _sdpa(q, k, v.abs(), causal, scale)
    err = (out.double().cpu() - ref).abs()
    bound = ref_abs * 2.0 ** -4 + v.abs().max().double() * 2.0 ** -7
    assert bool((err <= bound).all()), f"worst error / bound {(err / bound).max().item():.3f}"
    assert (err.norm() / ref.norm()).item() <= 5e-2


# --- the PyTorch drop-in: e4m3 inputs with descales in kernel_options -----------------------


def _dropin_inputs(per_head):
    q8, qs, q = _quantized((2, 4, 40, 32), per_head, 11)
    k8, ks, k = _quantized((2, 2, 56, 32), per_head, 12)
    v8, vs, v = _quantized((2, 2, 56, 32), per_head, 13)
    return (q8, k8, v8), {"q_descale": qs, "k_descale": ks, "v_descale": vs}, (q, k, v)


@pytest.mark.parametrize("per_head", [False, True])
def test_dropin_cpu_e4m3_is_the_bf16_attention_of_the_dequantized_values(per_head):
    import flexjit.torch as fjt

    qkv8, descales, (q, k, v) = _dropin_inputs(per_head)
    out = fjt.flex_attention(*qkv8, enable_gqa=True, kernel_options=descales,
                             mask_mod="causal")
    assert out.dtype == torch.bfloat16 and out.shape == (2, 4, 40, 32)
    want = flexjit.flex_attention(q, k, v, mask_mod="causal").to(torch.bfloat16)
    assert torch.equal(out, want)
    ref = _sdpa(q, k, v, True, 32 ** -0.5)
    assert ((out.double() - ref).norm() / ref.norm()).item() <= 1e-2  # bf16 rounding of out
    if not per_head:  # numbers work as per-tensor factors
        numbers = {key: float(t) for key, t in descales.items()}
        assert torch.equal(fjt.flex_attention(*qkv8, enable_gqa=True, mask_mod="causal",
                                              kernel_options=numbers), out)


def test_dropin_e4m3_under_torch_compile_matches_eager():
    import flexjit.torch as fjt

    qkv8, descales, _ = _dropin_inputs(True)

    def f(q, k, v, qs, ks, vs):
        return fjt.flex_attention(q, k, v, score_mod="softcap", mask_mod="causal",
                                  enable_gqa=True, kernel_options={"q_descale": qs,
                                                                   "k_descale": ks,
                                                                   "v_descale": vs})

    eager = f(*qkv8, *descales.values())
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")(*qkv8, *descales.values())
    assert compiled.dtype == torch.bfloat16 and torch.equal(compiled, eager)


def test_dropin_e4m3_errors_name_the_tensor():
    import flexjit.torch as fjt

    (q8, k8, v8), descales, (q, k, v) = _dropin_inputs(False)
    with pytest.raises(flexjit.UnsupportedError, match="query requires grad, but "
                       "float8_e4m3fn inputs run the forward only \\(flexjit has no FP8 backward"):
        fjt.flex_attention(q8.clone().requires_grad_(), k8, v8, enable_gqa=True,
                           kernel_options=descales)
    with pytest.raises(flexjit.UnsupportedError,
                       match="kernel_options\\['k_descale'\\] requires grad"):
        fjt.flex_attention(q8, k8, v8, enable_gqa=True, kernel_options={
            **descales, "k_descale": descales["k_descale"].clone().requires_grad_()})
    with torch.no_grad():  # inference: fine
        fjt.flex_attention(q8.clone().requires_grad_(), k8, v8, enable_gqa=True,
                           kernel_options=descales)
    with pytest.raises(TypeError, match="kernel_options\\['v_descale'\\] must be a torch.Tensor"):
        fjt.flex_attention(q8, k8, v8, enable_gqa=True, kernel_options={"v_descale": "1"})
    with pytest.raises(flexjit.RuntimeError, match="descale factors were given for bf16 inputs"):
        fjt.flex_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), enable_gqa=True,
                           kernel_options=descales)
    with pytest.raises(flexjit.RuntimeError, match="q is bf16, k is e4m3"):
        fjt.flex_attention(q.bfloat16(), k8, v8, enable_gqa=True)
    with pytest.raises(flexjit.RuntimeError, match="descale.k is f32\\[3\\]"):
        fjt.flex_attention(q8, k8, v8, enable_gqa=True, kernel_options={"k_descale":
                                                                        torch.ones(3)})


@pytest.mark.skipif(not torch.cuda.is_available(), reason="skipped: no GPU")
def test_gpu_dropin_e4m3_matches_flexjit_flex_attention():
    import flexjit.torch as fjt

    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("e4m3 runs on sm_90a")
    qkv8, descales, (q, k, v) = _dropin_inputs(True)
    dev = [t.cuda() for t in qkv8]
    ds = {key: t.cuda() for key, t in descales.items()}

    def f(q8, k8, v8):
        return fjt.flex_attention(q8, k8, v8, enable_gqa=True, mask_mod="causal",
                                  kernel_options=ds)

    with torch.inference_mode():
        out = f(*dev)
        compiled = torch.compile(f, fullgraph=True)(*dev)
    want = flexjit.flex_attention(*dev, mask_mod="causal", descale=tuple(ds.values()))
    assert out.dtype == compiled.dtype == torch.bfloat16
    assert (out.float() - want.float()).abs().max().item() <= 1e-2
    assert torch.equal(compiled, out)
    ref = _sdpa(q, k, v, True, 32 ** -0.5)
    assert ((out.double().cpu() - ref).norm() / ref.norm()).item() <= 5e-2

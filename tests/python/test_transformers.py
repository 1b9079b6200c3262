"""flexjit inside Hugging Face transformers (flexjit.transformers, docs/transformers.md).

Tiny random-weight models (2 layers, nothing downloaded) of the architectures whose attention
features flexjit maps: Llama (GQA 4:1, d 128), Qwen2 (GQA 7:1, d 64), Mistral (sliding window),
Phi-3 (d 96), Gemma-2 (d 256, logit softcap, alternating sliding / full layers, scaling from
query_pre_attn_scalar) and GPT-OSS (attention sinks, alternating sliding / full layers). Each
model runs with attn_implementation="flexjit" against the same weights with "eager":

- logits: on a GPU the flexjit model in bf16 against eager in fp32, relative Frobenius error
  <= 3e-2; on the CPU backend both in fp32, <= 1e-4;
- a left-padded batch, compared at the non-pad positions (same bounds);
- 20 greedy generate() steps (KV cache: prefill, then one-token decoding steps with the query
  offset; left padding; prompts longer than the window, so the sliding layers' cache is
  cropped) on fp32 weights, with the dynamic and with a static cache: the same tokens as eager;
- the same cache path step by step in the logits test's dtypes (on a GPU bf16, so the decode
  kernels run; fp32 decoding takes the forward on tf32), against eager's one-pass logits;
- a training step's backward (a right-padded batch, labels masked at the padding): the loss and
  the gradients of the embeddings and every attention parameter (GPT-OSS's sinks too) against
  eager's, on a GPU in fp32 (tf32 attention, <= 1e-2) and in bf16 (<= 6e-2), on the CPU in
  fp32 (<= 1e-4).

Tests with "cuda" in their id need a GPU (skipped without one); the "cpu" ones run the CPU
backend anywhere. The whole module is skipped, with the reason, without PyTorch or
transformers (CI installs neither): `pytest -rs tests/python/test_transformers.py`.
"""

import copy
import math
import warnings

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")
transformers = pytest.importorskip("transformers", reason="transformers is not installed")
fjtr = pytest.importorskip("flexjit.transformers",
                           reason="this transformers has no AttentionInterface / masking_utils")

from transformers import AutoModelForCausalLM  # noqa: E402

HAS_CUDA = torch.cuda.is_available()
cuda_only = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
BACKENDS = [pytest.param("cpu", id="cpu"), pytest.param("cuda", id="cuda", marks=cuda_only)]

VOCAB = 256
# initializer_range 0.05 (not 0.02): attention is peaked enough that every feature matters (a
# model run without its window, softcap or padding differs from eager by 0.3 to 1.0).
COMMON = dict(vocab_size=VOCAB, num_hidden_layers=2, pad_token_id=0, bos_token_id=1,
              eos_token_id=2, initializer_range=0.05, attention_dropout=0.0)


def _config(arch):
    t = transformers
    if arch == "llama":
        return t.LlamaConfig(hidden_size=256, intermediate_size=256, num_attention_heads=4,
                             num_key_value_heads=1, head_dim=128, **COMMON)
    if arch == "qwen2":
        return t.Qwen2Config(hidden_size=448, intermediate_size=256, num_attention_heads=7,
                             num_key_value_heads=1, **COMMON)
    if arch == "mistral":
        return t.MistralConfig(hidden_size=256, intermediate_size=256, num_attention_heads=4,
                               num_key_value_heads=2, head_dim=64, sliding_window=8, **COMMON)
    if arch == "phi3":
        return t.Phi3Config(hidden_size=192, intermediate_size=256, num_attention_heads=2,
                            num_key_value_heads=2, sliding_window=None, **COMMON)
    if arch == "gemma2":
        return t.Gemma2Config(hidden_size=256, intermediate_size=256, num_attention_heads=2,
                              num_key_value_heads=1, head_dim=256, query_pre_attn_scalar=64,
                              attn_logit_softcapping=2.0, final_logit_softcapping=30.0,
                              sliding_window=8, **COMMON)
    if arch == "gpt_oss":
        if not hasattr(t, "GptOssConfig"):
            pytest.skip(f"transformers {t.__version__} has no GptOssConfig")
        return t.GptOssConfig(hidden_size=256, intermediate_size=128, num_attention_heads=4,
                              num_key_value_heads=2, head_dim=64, num_local_experts=4,
                              num_experts_per_tok=2, sliding_window=8, **COMMON)
    raise ValueError(arch)


# (architecture, what its attention exercises)
ARCHS = [
    pytest.param("llama", id="llama-gqa4-d128"),
    pytest.param("qwen2", id="qwen2-gqa7-d64"),
    pytest.param("mistral", id="mistral-window"),
    pytest.param("phi3", id="phi3-d96"),
    pytest.param("gemma2", id="gemma2-d256-softcap-window"),
    pytest.param("gpt_oss", id="gpt_oss-sinks-window"),
]


def _models(arch, device, dtype):
    """(eager fp32, flexjit in dtype) on device, with the same random weights."""
    cfg = _config(arch)
    torch.manual_seed(0)
    # Each model gets its own copy of the config: from_config records the attention
    # implementation in the config it is given.
    eager = AutoModelForCausalLM.from_config(copy.deepcopy(cfg), attn_implementation="eager")
    flex = AutoModelForCausalLM.from_config(copy.deepcopy(cfg), attn_implementation="flexjit")
    flex.load_state_dict(eager.state_dict())
    assert flex.config._attn_implementation == "flexjit"
    assert eager.config._attn_implementation == "eager"
    return (eager.to(device=device, dtype=torch.float32).eval(),
            flex.to(device=device, dtype=dtype).eval())


def rel(x, ref):
    return ((x.double() - ref.double()).norm() / ref.double().norm().clamp_min(1e-30)).item()


def _tolerance(device, dtype):
    if device == "cpu":
        return 1e-4  # fp32 on both sides
    return 3e-2 if dtype == torch.bfloat16 else 1e-2


def _model_tolerance(eager, device, dtype, run, ref):
    """The logits tolerance of a flexjit model in `dtype` against the fp32 eager model: 3e-2 for
    bf16, or 1.5x the error of the eager model itself cast to `dtype` where that is larger (a
    mixture of experts, GPT-OSS, routes some tokens to other experts in bf16: eager's own bf16
    logits differ from its fp32 ones by ~7.6e-2 there, whatever the attention)."""
    tol = _tolerance(device, dtype)
    if dtype == torch.float32:
        return tol
    with torch.no_grad():
        own = rel(run(copy.deepcopy(eager).to(dtype)), ref)
    print(f"eager itself in {dtype}: rel err {own:.2e}")
    return max(tol, 1.5 * own)


def _ids(batch, length, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, VOCAB, (batch, length), generator=g)


def _left_padding(lengths, total):
    mask = torch.zeros(len(lengths), total, dtype=torch.long)
    for i, n in enumerate(lengths):
        mask[i, total - n:] = 1
    return mask


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("arch", ARCHS)
def test_logits_match_eager(arch, backend):
    dtype = torch.bfloat16 if backend == "cuda" else torch.float32
    eager, flex = _models(arch, backend, dtype)
    ids = _ids(2, 48).to(backend)  # longer than the windows (8)
    with torch.no_grad():
        ref = eager(ids).logits
        out = flex(ids).logits
    err = rel(out, ref)
    print(f"{arch} {backend} {dtype}: logits rel err {err:.2e}")
    assert torch.isfinite(out).all()
    assert err <= _model_tolerance(eager, backend, dtype, lambda m: m(ids).logits, ref)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("arch", ARCHS)
def test_left_padded_batch(arch, backend):
    dtype = torch.bfloat16 if backend == "cuda" else torch.float32
    eager, flex = _models(arch, backend, dtype)
    total = 40
    mask = _left_padding([40, 33, 21], total).to(backend)
    ids = _ids(3, total).to(backend).masked_fill(mask == 0, 0)
    with torch.no_grad():
        ref = eager(ids, attention_mask=mask).logits
        out = flex(ids, attention_mask=mask).logits
    keep = mask.bool()
    err = rel(out[keep], ref[keep])
    print(f"{arch} {backend} {dtype}: padded batch logits rel err {err:.2e}")
    assert torch.isfinite(out[keep]).all()
    assert err <= _model_tolerance(eager, backend, dtype,
                                   lambda m: m(ids, attention_mask=mask).logits[keep], ref[keep])


@pytest.mark.parametrize("cache", ["dynamic", "static"])
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_generate_matches_eager(arch, backend, cache):
    """generate() with transformers' default (dynamic) cache, and with a static cache (keys
    up to max_cache_len, the query offset a device tensor, masks built ahead by generate())."""
    eager, flex = _models(arch, backend, torch.float32)
    mask = _left_padding([12, 9], 12).to(backend)  # prompts longer than the windows (8)
    ids = _ids(2, 12, seed=2).to(backend).masked_fill(mask == 0, 0)
    kwargs = dict(attention_mask=mask, max_new_tokens=20, min_new_tokens=20, do_sample=False,
                  pad_token_id=0)
    if cache == "static":
        kwargs["cache_implementation"] = "static"
    with torch.no_grad():
        ref = eager.generate(ids, **kwargs)
        out = flex.generate(ids, **kwargs)
    assert ref.shape == (2, 32)
    assert out.tolist() == ref.tolist()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("arch", ARCHS)
def test_cached_decoding_steps_match_eager(arch, backend):
    """The KV-cache path one token at a time (on a GPU in bf16: flexjit's decode kernels, the
    query offset a param): the prompt's prefill, then 19 single-token steps through the model's
    own cache, against eager's logits of the whole sequence in one pass."""
    dtype = torch.bfloat16 if backend == "cuda" else torch.float32
    eager, flex = _models(arch, backend, dtype)
    prompt = _left_padding([12, 9], 12)
    ids = _ids(2, 31, seed=6).to(backend)
    mask = torch.cat([prompt, torch.ones(2, 19, dtype=torch.long)], 1).to(backend)
    ids = ids.masked_fill(mask == 0, 0)
    with torch.no_grad():
        ref = eager(ids, attention_mask=mask).logits[:, 11:]
        step = flex(ids[:, :12], attention_mask=mask[:, :12], use_cache=True)
        logits = [step.logits[:, -1]]
        for t in range(12, 31):
            step = flex(ids[:, t:t + 1], attention_mask=mask[:, :t + 1],
                        past_key_values=step.past_key_values, use_cache=True)
            logits.append(step.logits[:, -1])
    out = torch.stack(logits, 1)
    err = rel(out, ref)
    print(f"{arch} {backend} {dtype}: cached decoding logits rel err {err:.2e}")
    assert torch.isfinite(out).all()
    assert err <= _model_tolerance(eager, backend, dtype,
                                   lambda m: m(ids, attention_mask=mask).logits[:, 11:], ref)


@pytest.mark.parametrize("backend,dtype", [
    pytest.param("cpu", torch.float32, id="cpu-fp32"),  # the CPU backend computes in fp32
    pytest.param("cuda", torch.float32, id="cuda-fp32", marks=cuda_only),
    pytest.param("cuda", torch.bfloat16, id="cuda-bf16", marks=cuda_only)])
@pytest.mark.parametrize("arch", ARCHS)
def test_training_step_gradients_match_eager(arch, backend, dtype):
    eager, flex = _models(arch, backend, dtype)
    eager.train()
    flex.train()
    mask = torch.ones(2, 32, dtype=torch.long)
    mask[1, 25:] = 0  # right padding, as a training collator makes
    mask = mask.to(backend)
    ids = _ids(2, 32, seed=3).to(backend).masked_fill(mask == 0, 0)
    labels = ids.masked_fill(mask == 0, -100)
    losses, grads = [], []
    for model in (eager, flex):
        model.zero_grad(set_to_none=True)
        loss = model(ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        losses.append(loss.detach().double())
        named = dict(model.named_parameters())
        # the embeddings and every attention parameter (q / k / v / o or Phi-3's fused qkv,
        # GPT-OSS's sinks) of both layers
        picked = ["model.embed_tokens.weight"] + [n for n in named if ".self_attn." in n]
        grads.append({n: named[n].grad for n in picked})
    tol = _tolerance(backend, dtype) * (2 if dtype == torch.bfloat16 else 1)
    loss_err = abs((losses[1] - losses[0]) / losses[0]).item()
    print(f"{arch} {backend} {dtype}: loss {losses[0].item():.5f} vs {losses[1].item():.5f}")
    assert loss_err <= tol
    for name, ref in grads[0].items():
        got = grads[1][name]
        assert got is not None, f"{name} got no gradient through flexjit"
        err = rel(got, ref)
        print(f"  {name}: grad rel err {err:.2e}")
        assert torch.isfinite(got).all()
        assert err <= tol, name


def test_from_pretrained_and_set_attn_implementation(tmp_path):
    """A saved checkpoint (written here: nothing is downloaded) loads with
    attn_implementation="flexjit", and a loaded model switches to it."""
    eager, _ = _models("qwen2", "cpu", torch.float32)
    eager.save_pretrained(tmp_path)
    flex = AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="flexjit").eval()
    assert flex.config._attn_implementation == "flexjit"
    switched = AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager").eval()
    switched.set_attn_implementation("flexjit")
    assert switched.config._attn_implementation == "flexjit"
    ids = _ids(2, 20)
    with torch.no_grad():
        ref = eager(ids).logits
        assert rel(flex(ids).logits, ref) <= 1e-4
        assert rel(switched(ids).logits, ref) <= 1e-4


@pytest.mark.parametrize("backend", BACKENDS)
def test_attention_dropout_is_refused(backend):
    cfg = _config("llama")
    cfg.attention_dropout = 0.1
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="flexjit").to(backend)
    ids = _ids(1, 8).to(backend)
    model.eval()
    with torch.no_grad():
        model(ids)  # dropout only applies in training mode
    model.train()
    with pytest.raises(ValueError, match=r"attention dropout 0\.1 is not supported"):
        model(ids)


def test_registered_with_both_interfaces():
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    assert ALL_ATTENTION_FUNCTIONS["flexjit"] is fjtr.flexjit_attention_forward
    assert ALL_MASK_ATTENTION_FUNCTIONS["flexjit"] is fjtr.flexjit_mask
    assert fjtr.register("flexjit-again") == "flexjit-again"
    assert ALL_ATTENTION_FUNCTIONS["flexjit-again"] is fjtr.flexjit_attention_forward


def test_mask_descriptions():
    m = transformers.masking_utils
    causal = fjtr.flexjit_mask(2, 1, 10, q_offset=9, kv_offset=0)
    assert (causal.causal, causal.window, causal.kv_valid, causal.dense) == (True, None, None, None)
    assert causal.query_offset == 9  # the decoding step's query is the last key
    # a sliding-window cache layer: keys from position 5 on, the query at position 12
    sliding = fjtr.flexjit_mask(2, 1, 8, q_offset=12, kv_offset=5,
                                mask_function=m.sliding_window_causal_mask_function(8),
                                local_size=8)
    assert (sliding.causal, sliding.window, sliding.query_offset) == (True, 8, 7)
    full = fjtr.flexjit_mask(2, 4, 4, mask_function=m.bidirectional_mask_function)
    assert (full.causal, full.window) == (False, None)
    padding = torch.tensor([[1, 1, 1, 1], [0, 0, 1, 1]])
    padded = fjtr.flexjit_mask(2, 4, 4, attention_mask=padding)
    assert padded.kv_valid.tolist() == [[True] * 4, [False, False, True, True]]
    unpadded = fjtr.flexjit_mask(2, 4, 4, attention_mask=torch.ones(2, 4, dtype=torch.long))
    assert unpadded.kv_valid is None
    # any other pattern: transformers' own dense mask, announced once
    chunked = m.chunked_causal_mask_function(2, torch.zeros(2, dtype=torch.long))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dense = fjtr.flexjit_mask(2, 4, 4, mask_function=chunked)
    assert any("materialised as a dense" in str(w.message) for w in caught)
    assert dense.dense.shape == (2, 1, 4, 4) and dense.dense.dtype == torch.bool
    assert dense.dense[0, 0].tolist() == [[True, False, False, False], [True, True, False, False],
                                         [False, False, True, False], [False, False, True, True]]


def _reference(q, k, v, allowed, scale, softcap=None, bias=None, sinks=None):
    """fp64 attention on [B, H, Sq, D] with a [B, H or 1, Sq, Skv] bool mask."""
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, 1).double(), v.repeat_interleave(rep, 1).double()
    s = q.double() @ k.transpose(-1, -2) * scale
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    if bias is not None:
        s = s + bias.double()
    s = s.masked_fill(~allowed, -math.inf)
    if sinks is not None:
        sink = sinks.double().view(1, -1, 1, 1).expand(*s.shape[:3], 1)
        p = torch.softmax(torch.cat([s, sink], -1), -1)[..., :-1]
    else:
        p = torch.softmax(s, -1)
    return (p @ v).transpose(1, 2)


class _Module(torch.nn.Module):
    is_causal = True


@pytest.mark.parametrize("backend", BACKENDS)
def test_attention_function_query_offset_window_and_masks(backend):
    """The attention function alone on a chunk of 5 queries at the end of 23 keys (a chunked
    prefill or several decoding tokens at once): causal with the query offset, a window, the
    softcap, padding keys, and a caller's dense 4D bool and additive float masks."""
    dtype = torch.bfloat16 if backend == "cuda" else torch.float32
    tol = 1e-2 if backend == "cuda" else 1e-5
    torch.manual_seed(4)
    b, hq, hkv, sq, skv, d = 2, 4, 2, 5, 23, 64
    q = torch.randn(b, hq, sq, d, device=backend, dtype=dtype)
    k = torch.randn(b, hkv, skv, d, device=backend, dtype=dtype)
    v = torch.randn(b, hkv, skv, d, device=backend, dtype=dtype)
    qpos = torch.arange(sq, device=backend).view(-1, 1) + (skv - sq)
    kpos = torch.arange(skv, device=backend).view(1, -1)
    causal = (kpos <= qpos).expand(b, 1, sq, skv)
    module, scale = _Module(), 0.3

    out, weights = fjtr.flexjit_attention_forward(module, q, k, v, None, scaling=scale)
    assert weights is None and out.shape == (b, sq, hq, d) and out.dtype == dtype
    assert rel(out, _reference(q, k, v, causal, scale)) <= tol

    window = causal & (qpos - kpos < 6)
    out, _ = fjtr.flexjit_attention_forward(module, q, k, v, None, scaling=scale,
                                            sliding_window=6, softcap=1.5)
    assert rel(out, _reference(q, k, v, window, scale, softcap=1.5)) <= tol

    valid = torch.ones(b, skv, dtype=torch.bool, device=backend)
    valid[1, :7] = False
    desc = fjtr.FlexjitMask(sq, skv, q_offset=skv - sq, kv_valid=valid)
    out, _ = fjtr.flexjit_attention_forward(module, q, k, v, desc, scaling=scale)
    allowed = causal & valid.view(b, 1, 1, skv)
    assert rel(out, _reference(q, k, v, allowed, scale)) <= tol

    dense = torch.rand(b, 1, sq, skv, device=backend) < 0.7
    dense[..., -1] = True  # no fully masked row
    out, _ = fjtr.flexjit_attention_forward(module, q, k, v, dense, scaling=scale)
    assert rel(out, _reference(q, k, v, dense, scale)) <= tol
    bias = torch.randn(b, hq, sq, skv, device=backend)
    out, _ = fjtr.flexjit_attention_forward(module, q, k, v, bias, scaling=scale)
    everything = torch.ones_like(bias, dtype=torch.bool)
    assert rel(out, _reference(q, k, v, everything, scale, bias=bias)) <= tol


@pytest.mark.parametrize("backend", BACKENDS)
def test_attention_function_sinks(backend):
    """A per-head sink logit joins the softmax denominator (GPT-OSS's s_aux), with a
    gradient into it."""
    dtype = torch.bfloat16 if backend == "cuda" else torch.float32
    tol = 2e-2 if backend == "cuda" else 1e-5
    torch.manual_seed(5)
    b, hq, hkv, s, d = 2, 4, 2, 17, 64
    q = torch.randn(b, hq, s, d, device=backend, dtype=dtype, requires_grad=True)
    k = torch.randn(b, hkv, s, d, device=backend, dtype=dtype)
    v = torch.randn(b, hkv, s, d, device=backend, dtype=dtype)
    sinks = torch.randn(hq, device=backend, requires_grad=True)
    causal = torch.ones(s, s, dtype=torch.bool, device=backend).tril().expand(b, 1, s, s)
    out, _ = fjtr.flexjit_attention_forward(_Module(), q, k, v, None, scaling=0.125,
                                            s_aux=sinks)
    sinks_ref = sinks.detach().double().requires_grad_()
    q_ref = q.detach().double().requires_grad_()
    ref = _reference(q_ref, k, v, causal, 0.125, sinks=sinks_ref)
    assert rel(out, ref) <= tol
    grad = torch.randn_like(ref)
    out.backward(grad.to(out.dtype))
    ref.backward(grad)
    assert rel(sinks.grad, sinks_ref.grad) <= tol
    assert rel(q.grad, q_ref.grad) <= tol


def test_clear_errors():
    q = torch.randn(1, 4, 3, 64)
    k = torch.randn(1, 3, 3, 64)
    with pytest.raises(ValueError, match="4 query heads are not a multiple of 3"):
        fjtr.flexjit_attention_forward(_Module(), q, k, k, None)
    with pytest.raises(ValueError, match="position_bias"):
        fjtr.flexjit_attention_forward(_Module(), q, q, q, None,
                                       position_bias=torch.zeros(1, 4, 3, 3))
    stale = fjtr.FlexjitMask(q_length=3, kv_length=5)
    with pytest.raises(ValueError, match="made for q_len 3 and kv_len 5"):
        fjtr.flexjit_attention_forward(_Module(), q, q, q, stale)
    with pytest.raises(ValueError, match="attention sinks with 3 values for 4 query heads"):
        fjtr.flexjit_attention_forward(_Module(), q, q, q, None, s_aux=torch.zeros(3))

"""flexjit's Python package on the CPU backend with NumPy: results, mods, errors, block masks."""
import os
import threading

import numpy as np
import pytest

import flexjit
from flexjit import dsl

from reference import alibi_slopes, attention_f64, causal, rel_error

F32_TOL = 1e-5  # CPU backend f32 vs fp64 (relative Frobenius)


def qkv(B=1, Hq=4, Hkv=None, Sq=200, Skv=None, D=32, Dv=None, seed=0):
    rng = np.random.default_rng(seed)
    Hkv = Hkv or Hq
    Skv = Skv or Sq
    Dv = Dv or D
    return (rng.standard_normal((B, Hq, Sq, D), dtype=np.float32),
            rng.standard_normal((B, Hkv, Skv, D), dtype=np.float32),
            rng.standard_normal((B, Hkv, Skv, Dv), dtype=np.float32))


# --- results -----------------------------------------------------------------------------


def test_plain_attention_matches_fp64_reference_and_returns_numpy():
    q, k, v = qkv()
    out = flexjit.flex_attention(q, k, v)
    assert isinstance(out, np.ndarray) and out.dtype == np.float32 and out.shape == q.shape
    ref, _ = attention_f64(q, k, v)
    assert rel_error(out, ref) < F32_TOL


@pytest.mark.parametrize("name", ["causal", "alibi_causal", "softcap", "sliding_window",
                                  "prefix_lm", "chunked_local"])
def test_standard_mods_match_reference(name):
    q, k, v = qkv(B=2, Hq=4, Sq=300, D=32)
    H = q.shape[1]
    slopes = alibi_slopes(H)
    refs = {
        "causal": (None, causal, {}),
        "alibi_causal": (lambda s, b, h, qi, ki: s + slopes[h].astype(np.float64) * (ki - qi), causal,
                         {"slopes": slopes}),
        "softcap": (lambda s, b, h, qi, ki: 30.0 * np.tanh(s / 30.0), None, {}),
        "sliding_window": (None, lambda b, h, qi, ki: (qi >= ki) & (qi - ki <= 64), {}),
        "prefix_lm": (None, lambda b, h, qi, ki: (ki <= 100) | (qi >= ki), {}),
        "chunked_local": (None, lambda b, h, qi, ki: (qi // 128 == ki // 128) & (qi >= ki), {}),
    }
    params = {"sliding_window": {"window": 64}, "prefix_lm": {"prefix": 100},
              "chunked_local": {"chunk": 128}}.get(name, {})
    smod, mmod, buffers = refs[name]
    mods = flexjit.standard_mods(name)
    out, lse = flexjit.flex_attention(q, k, v, score_mod=mods, buffers=buffers, params=params,
                                      return_lse=True)
    ref, ref_lse = attention_f64(q, k, v, smod, mmod)
    assert rel_error(out, ref) < F32_TOL
    assert lse.shape == q.shape[:3] and lse.dtype == np.float32
    np.testing.assert_allclose(lse, ref_lse, rtol=1e-5, atol=1e-5)


def test_params_change_the_result_without_new_mods():
    q, k, v = qkv()
    a = flexjit.flex_attention(q, k, v, score_mod="softcap", params={"cap": 2.0})
    b = flexjit.flex_attention(q, k, v, score_mod="softcap")  # default cap 30
    ref2, _ = attention_f64(q, k, v, lambda s, *_: 2.0 * np.tanh(s / 2.0))
    assert rel_error(a, ref2) < F32_TOL
    assert rel_error(b, ref2) > 1e-3


def test_gqa_scale_and_strided_readonly_inputs_need_no_copy():
    q, k, v = qkv(B=2, Hq=8, Hkv=2, Sq=65, Skv=130, D=16, Dv=24)
    # [B, S, H, D] storage viewed as [B, H, S, D]: strided, last dim contiguous.
    qs = np.ascontiguousarray(q.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3)
    qs.flags.writeable = False
    assert not qs.flags.c_contiguous
    out = flexjit.flex_attention(qs, k, v, mask_mod="causal", scale=0.3)
    ref, _ = attention_f64(q, k, v, None, causal, scale=0.3)
    assert out.shape == (2, 8, 65, 24)
    assert rel_error(out, ref) < F32_TOL


def test_fully_masked_rows_are_zero_with_lse_minus_inf():
    q, k, v = qkv(Sq=4, Skv=4)
    out, lse = flexjit.flex_attention(q, k, v, mask_mod="kv_idx > q_idx + 100", return_lse=True)
    assert np.all(out == 0) and np.all(np.isneginf(lse))


def test_float16_inputs_on_the_cpu_give_f32():
    q, k, v = qkv()
    out = flexjit.flex_attention(q.astype(np.float16), k.astype(np.float16), v.astype(np.float16))
    ref, _ = attention_f64(q.astype(np.float16), k.astype(np.float16), v.astype(np.float16))
    assert out.dtype == np.float32 and rel_error(out, ref) < F32_TOL


# --- the front ends give the same Mods ----------------------------------------------------


def test_alibi_from_name_text_dsl_and_lambda_are_equal_with_one_hash():
    by_name = flexjit.make_mods("alibi")
    by_text = flexjit.make_mods("buffer slopes: f32[H]\nscore_mod = score + slopes[h] * (kv_idx - q_idx)")
    slopes = dsl.Buffer("slopes", "f32", ["H"])
    by_dsl = flexjit.make_mods(dsl.score() + slopes[dsl.h_idx()] * (dsl.kv_idx() - dsl.q_idx()))
    by_fn = flexjit.make_mods(lambda score, b, h, q, kv: score + slopes[h] * (kv - q))
    for m in (by_text, by_dsl, by_fn):
        assert m == by_name
        assert m.hash() == by_name.hash() and hash(m) == hash(by_name)
    assert flexjit.make_mods("softcap") != by_name


def test_mask_mod_forms_are_equal_and_combine_with_a_score_mod():
    forms = ["causal", "q_idx >= kv_idx", "mask_mod = q_idx >= kv_idx",
             dsl.q_idx() >= dsl.kv_idx(), lambda b, h, q, kv: q >= kv]
    ref = flexjit.make_mods(mask_mod="causal")
    for f in forms:
        assert flexjit.make_mods(mask_mod=f) == ref
    both = flexjit.make_mods(score_mod="softcap", mask_mod="causal")
    assert both == flexjit.standard_mods("softcap_causal")
    # a name for one side contributes only that side
    assert flexjit.make_mods(score_mod="alibi_causal", mask_mod="sliding_window").mask_mod.__str__() \
        == flexjit.standard_mods("sliding_window").mask_mod.__str__()


def test_python_operators_follow_python_semantics():
    q, kv = dsl.q_idx(), dsl.kv_idx()
    assert flexjit.make_mods(mask_mod=(q - kv) // 4 == 0) == flexjit.make_mods(
        mask_mod="(q_idx - kv_idx) / 4 == 0")
    # `/` between i32 values: .fx floors, Python would divide exactly; an error names both ways.
    with pytest.raises(TypeError, match=r"write `a // b` for floor division"):
        (q - kv) / 4
    assert (dsl.to_float(q - kv) / 4).type == "f32"
    assert ((q - kv) // 4).type == "i32"
    assert (q % 3).type == "i32" and (q > 1).type == "bool" and (~(q > 1)).type == "bool"
    cap = dsl.Param("cap", "f32", 30.0)
    m = flexjit.make_mods(cap * dsl.tanh(dsl.score() / cap))
    assert m == flexjit.standard_mods("softcap")
    assert [p.name for p in m.params] == ["cap"]
    with pytest.raises(TypeError, match="no truth value"):
        if q >= kv:
            pass
    with pytest.raises(TypeError, match="cannot use a value of type str"):
        q + "x"


def test_two_dim_buffer_chained_and_tuple_indexing_agree():
    bias = dsl.Buffer("bias", "f32", ["Sq", "Skv"])
    a = flexjit.make_mods(dsl.score() + bias[dsl.q_idx()][dsl.kv_idx()])
    b = flexjit.make_mods(dsl.score() + bias[dsl.q_idx(), dsl.kv_idx()])
    assert a == b
    q, k, v = qkv(Sq=40)
    bvals = np.random.default_rng(1).standard_normal((40, 40), dtype=np.float32)
    out = flexjit.flex_attention(q, k, v, score_mod=a, buffers={"bias": bvals})
    ref, _ = attention_f64(q, k, v, lambda s, b_, h, qi, ki: s + bvals[qi, ki])
    assert rel_error(out, ref) < F32_TOL


def test_mods_text_round_trips():
    m = flexjit.standard_mods("relative_bias_causal")
    assert flexjit.parse_mods(m.to_text()) == m
    assert "relative_bias_causal" in flexjit.standard_mod_names()


# --- errors -------------------------------------------------------------------------------


def test_error_classes_form_a_hierarchy():
    for cls in (flexjit.CompileError, flexjit.UnsupportedError, flexjit.RuntimeError,
                flexjit.JitError, flexjit.CacheError):
        assert issubclass(cls, flexjit.Error)
    assert issubclass(flexjit.Error, Exception)


def test_parse_errors_carry_flexjit_diagnostics():
    with pytest.raises(flexjit.CompileError) as e:
        flexjit.make_mods("score_mod = score * ")
    assert "error:" in str(e.value) and "^" in str(e.value)
    with pytest.raises(flexjit.CompileError, match="mask_mod must return bool"):
        flexjit.make_mods(mask_mod=dsl.q_idx() + 1)


def test_shape_and_binding_errors_are_runtime_errors_with_precise_messages():
    q, k, v = qkv()
    with pytest.raises(flexjit.RuntimeError, match="k has 3 dims"):
        flexjit.flex_attention(q, k[0], v)
    with pytest.raises(flexjit.RuntimeError, match=r"read buffer 'slopes' \(f32\[H\]\); pass it as buffers="):
        flexjit.flex_attention(q, k, v, score_mod="alibi")
    with pytest.raises(flexjit.RuntimeError, match="windw"):
        flexjit.flex_attention(q, k, v, mask_mod="sliding_window", params={"windw": 3})
    with pytest.raises(flexjit.Error, match="int64|i64|code 0|bits 64"):
        flexjit.flex_attention(q.astype(np.int64), k, v)


def test_unknown_standard_name_lists_the_names():
    with pytest.raises(flexjit.Error, match="causal"):
        flexjit.standard_mods("casual")


# --- block masks --------------------------------------------------------------------------


def test_cpu_block_mask_of_causal_has_the_expected_tiles():
    bm = flexjit.create_block_mask("causal", 1, 1, 1024, 1024)
    assert bm.shape == [1, 1, 1024, 1024] and bm.device == "cpu"
    assert bm.density() == pytest.approx(36 / 64)
    arrays = bm.arrays()
    # q tile i: tile i partial (the diagonal), tiles 0..i-1 full
    np.testing.assert_array_equal(arrays["kv_num_blocks"][0, 0], np.ones(8))
    np.testing.assert_array_equal(arrays["full_kv_num_blocks"][0, 0], np.arange(8))
    assert "█" in bm.to_string() and "░" in bm.to_string()


def test_block_mask_supplies_the_mask_mod_on_the_cpu():
    q, k, v = qkv(Sq=256)
    bm = flexjit.create_block_mask("sliding_window", 1, 1, 256, 256, params={"window": 40})
    out = flexjit.flex_attention(q, k, v, score_mod="softcap", block_mask=bm,
                                 params={"window": 40})
    ref, _ = attention_f64(q, k, v, lambda s, *_: 30.0 * np.tanh(s / 30.0),
                           lambda b, h, qi, ki: (qi >= ki) & (qi - ki <= 40))
    assert rel_error(out, ref) < F32_TOL


# --- packaging ----------------------------------------------------------------------------


def test_type_stubs_ship_next_to_the_module():
    stub = os.path.join(os.path.dirname(flexjit._flexjit.__file__), "_flexjit.pyi")
    text = open(stub).read()
    assert "class Expr" in text and "def standard_mods" in text


def test_gil_is_released_while_attention_runs():
    q, k, v = qkv(B=2, Hq=8, Sq=1024, D=64)
    flexjit.flex_attention(q, k, v, mask_mod="causal", num_threads=1)  # compile first
    ticks = []
    done = threading.Event()

    def run():
        flexjit.flex_attention(q, k, v, mask_mod="causal", num_threads=1)  # ~0.1 s or more
        done.set()

    t = threading.Thread(target=run)
    t.start()
    while not done.is_set():
        ticks.append(1)
        done.wait(0.001)
    t.join()
    # The main thread kept ticking (1 ms waits) while the worker was inside flexjit; with the
    # GIL held it would get a tick or two.
    assert len(ticks) > 20


# --- backward, kernels -----------------------------------------------------------------------


def test_backward_on_the_cpu_matches_finite_differences_of_the_forward():
    q, k, v = qkv(Hq=2, Sq=24, Skv=30, D=16, seed=3)
    slopes = alibi_slopes(2)
    rng = np.random.default_rng(4)
    dout = rng.standard_normal((1, 2, 24, 16), dtype=np.float32)
    kw = dict(score_mod="alibi", mask_mod="causal", buffers={"slopes": slopes})
    out, lse = flexjit.flex_attention(q, k, v, return_lse=True, **kw)
    dq, dk, dv, grads = flexjit.flex_attention_backward(q, k, v, out, lse, dout, **kw)
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape
    assert set(grads) == {"slopes"} and grads["slopes"].shape == slopes.shape

    def loss(q_, k_, v_, s_):
        o = flexjit.flex_attention(q_, k_, v_, score_mod="alibi", mask_mod="causal",
                                   buffers={"slopes": s_})
        return float(np.sum(o.astype(np.float64) * dout))

    eps = 1e-2
    for name, x, g in (("q", q, dq), ("k", k, dk), ("v", v, dv), ("slopes", slopes,
                                                                   grads["slopes"])):
        for idx in [(0, 1, 5, 3), (0, 0, 20, 7)] if x.ndim == 4 else [(0,), (1,)]:
            if x.ndim == 4 and idx[2] >= x.shape[2]:
                continue
            args = {"q": q, "k": k, "v": v, "slopes": slopes}
            plus = {n: a.copy() for n, a in args.items()}
            minus = {n: a.copy() for n, a in args.items()}
            plus[name][idx] += eps
            minus[name][idx] -= eps
            fd = (loss(plus["q"], plus["k"], plus["v"], plus["slopes"]) -
                  loss(minus["q"], minus["k"], minus["v"], minus["slopes"])) / (2 * eps)
            assert abs(fd - g[idx]) <= 2e-2 * max(1.0, abs(fd)), (name, idx, fd, g[idx])
    # The CPU backend is deterministic either way: the flag is accepted, the result the same.
    d2 = flexjit.flex_attention_backward(q, k, v, out, lse, dout, deterministic=True, **kw)
    for a, b in zip((dq, dk, dv, grads["slopes"]), (d2[0], d2[1], d2[2], d2[3]["slopes"])):
        assert np.array_equal(a, b)


def test_emit_inspect_and_kernel_variants_without_a_gpu():
    src = flexjit.emit(score_mod="alibi", mask_mod="causal", arch="sm_90a")
    assert "flexjit_forward" in src and "fj_score_mod" in src
    bwd = flexjit.emit(score_mod="alibi", kernel="backward_dkdv", arch="sm_80", head_dim=64)
    assert "flexjit_bwd_dkdv" in bwd and "fj_bufgrad" in bwd
    info = flexjit.inspect(mask_mod="causal", arch="sm_80", head_dim=64)
    assert info["kernel_name"] == "flexjit_forward"
    assert info["description"].startswith("forward/sm80_mma sm_80 bf16 d=64/64")
    assert 0 < info["registers"] <= 255 and info["cubin_bytes"] > 0
    assert info["cache"] in ("compiled", "memory hit", "disk hit")
    assert info["wgmma_serialized"] == ""  # an sm_80 kernel has no wgmma
    names = {(v["family"], v["name"]) for v in flexjit.kernel_variants()}
    assert ("forward", "sm80_mma") in names and ("backward_dkdv", "sm80_mma") in names
    with pytest.raises(flexjit.UnsupportedError, match="head_dim_qk = 100; supported: multiples"):
        flexjit.emit(arch="sm_80", head_dim=100)
    with pytest.raises(flexjit.UnsupportedError, match="unknown kernel family 'nope'"):
        flexjit.emit(arch="sm_80", kernel="nope")


def test_kernel_families_list_each_familys_kind_math_and_config_keys():
    families = {f["name"]: f for f in flexjit.kernel_families()}
    assert list(families)[:2] == ["forward", "block_mask"]
    fwd = families["forward"]
    assert fwd["kind"] == "forward" and fwd["math"]
    keys = {k["name"]: k for k in fwd["config_keys"]}
    assert {"block_m", "q_tiles", "persistent"} <= set(keys)
    assert (keys["persistent"]["min"], keys["persistent"]["max"]) == (0, 1)
    assert families["block_mask"]["kind"] == "" and not families["block_mask"]["math"]
    assert [k["name"] for k in families["decode_split"]["config_keys"]] == [
        "block_n", "num_warps", "num_stages", "num_splits", "kv_copy"]
    # The config dict of a forward call takes the keys of the forward and decode families.
    q = np.zeros((1, 1, 4, 64), np.float32)
    with pytest.raises(flexjit.RuntimeError, match="num_splits, kv_copy, variant"):
        flexjit.flex_attention(q, q, q, config={"num_split": 2})


def test_cpu_backward_takes_a_block_masks_mask_mod_as_the_forward_does():
    q, k, v = qkv(Hq=2, Sq=40, D=16, seed=5)
    dout = np.random.default_rng(6).standard_normal(q.shape, dtype=np.float32)
    bm = flexjit.create_block_mask("causal", 1, 1, 40, 40)
    out, lse = flexjit.flex_attention(q, k, v, block_mask=bm, return_lse=True)
    with_mask = flexjit.flex_attention_backward(q, k, v, out, lse, dout, mask_mod="causal")
    with_block_mask = flexjit.flex_attention_backward(q, k, v, out, lse, dout, block_mask=bm)
    for a, b in zip(with_mask[:3], with_block_mask[:3]):
        np.testing.assert_array_equal(a, b)


# --- KV caches -----------------------------------------------------------------------------


def test_paged_kv_cache_on_the_cpu_matches_each_sequence_alone():
    """seq_lens + page_table on NumPy arrays: each sequence attends to its first seq_lens[b]
    keys, read through the page table of a shuffled pool; queries sit at the end of each
    sequence (q_pos[b]), so the mask reads b. Against the fp64 reference of each sequence run
    alone on its own keys."""
    rng = np.random.default_rng(7)
    B, Hq, Hkv, Sq, D, ps, max_pages = 3, 4, 2, 2, 16, 4, 6
    lens = np.array([21, 0, 13], dtype=np.int32)
    logical_k = rng.standard_normal((B, Hkv, ps * max_pages, D), dtype=np.float32)
    logical_v = rng.standard_normal((B, Hkv, ps * max_pages, D), dtype=np.float32)
    q = rng.standard_normal((B, Hq, Sq, D), dtype=np.float32)
    num_pages = B * max_pages + 1
    perm = rng.permutation(num_pages)
    table = np.full((B, max_pages), -1, dtype=np.int32)  # entries never read hold -1
    k_pool = np.full((num_pages, ps, Hkv, D), np.nan, dtype=np.float32)
    v_pool = np.full((num_pages, ps, Hkv, D), np.nan, dtype=np.float32)
    used = 0
    for b in range(B):
        for n in range(lens[b]):
            if n % ps == 0:
                table[b, n // ps] = perm[used]
                used += 1
            page = table[b, n // ps]
            k_pool[page, n % ps] = logical_k[b, :, n]
            v_pool[page, n % ps] = logical_v[b, :, n]
    q_pos = np.maximum(lens - Sq, 0).astype(np.int32)
    mods = flexjit.parse_mods("buffer q_pos: i32[B]\nmask_mod = q_idx + q_pos[b] >= kv_idx")
    out, lse = flexjit.flex_attention(q, k_pool, v_pool, mask_mod=mods, buffers={"q_pos": q_pos},
                                      seq_lens=lens, page_table=table, return_lse=True)
    assert out.shape == (B, Hq, Sq, D) and lse.shape == (B, Hq, Sq)
    for b in range(B):
        n = int(lens[b])
        if n == 0:  # an empty sequence: out 0, lse -inf
            assert np.all(out[b] == 0) and np.all(np.isneginf(lse[b]))
            continue
        offset = int(q_pos[b])
        ref, ref_lse = attention_f64(q[b:b + 1], logical_k[b:b + 1, :, :n],
                                     logical_v[b:b + 1, :, :n],
                                     mask_mod=lambda bb, h, qi, ki: qi + offset >= ki)
        assert rel_error(out[b:b + 1], ref) < F32_TOL
        assert np.allclose(lse[b:b + 1], ref_lse, rtol=1e-5, atol=1e-5)
    # Ragged contiguous k / v: the same lengths without a table.
    out2 = flexjit.flex_attention(q, logical_k, logical_v, mask_mod=mods,
                                  buffers={"q_pos": q_pos}, seq_lens=lens)
    np.testing.assert_allclose(out2, out, rtol=1e-5, atol=1e-6)


def test_kv_cache_errors_name_the_tensor_and_the_entry():
    q = np.zeros((1, 2, 1, 16), dtype=np.float32)
    pool = np.zeros((3, 4, 1, 16), dtype=np.float32)
    lens = np.array([9], dtype=np.int32)
    with pytest.raises(flexjit.RuntimeError, match="page_table has dtype f32; expected i32"):
        flexjit.flex_attention(q, pool, pool, seq_lens=lens,
                               page_table=np.zeros((1, 3), dtype=np.float32))
    with pytest.raises(flexjit.RuntimeError, match=r"page_table\[0\]\[2\] = 5 is not a page of the pool"):
        flexjit.flex_attention(q, pool, pool, seq_lens=lens,
                               page_table=np.array([[0, 1, 5]], dtype=np.int32))
    with pytest.raises(flexjit.RuntimeError, match="a paged KV cache needs seq_lens"):
        flexjit.flex_attention(q, pool, pool, page_table=np.array([[0, 1, 2]], dtype=np.int32))


def test_star_import_keeps_the_builtin_runtime_error():
    # Issue 34: `from flexjit import *` replaced Python's RuntimeError with flexjit's.
    import builtins
    ns = {}
    exec("from flexjit import *", ns)
    assert "RuntimeError" not in ns
    assert "RuntimeError" not in flexjit.__all__
    assert flexjit.RuntimeError is not builtins.RuntimeError
    assert issubclass(flexjit.RuntimeError, flexjit.Error)


def test_short_buffers_and_bad_lengths_are_errors_not_clamped():
    # Issue 34: 4 ALiBi slopes for 8 heads ran with the loads clamped (wrong by up to 3.9).
    rng = np.random.default_rng()
    q = rng.standard_normal((1, 8, 64, 16), dtype=np.float32)
    slopes = alibi_slopes(8).astype(np.float32)
    with pytest.raises(flexjit.RuntimeError,
                       match=r"buffer 'slopes' \(declared f32\[H\]\): dim 0 \(H\) has 4 entries, "
                             r"but this call has 8 query heads"):
        flexjit.flex_attention(q, q, q, score_mod="alibi", buffers={"slopes": slopes[:4]})
    out = flexjit.flex_attention(q, q, q, score_mod="alibi", buffers={"slopes": slopes})
    assert np.isfinite(out).all()
    # A document-id buffer of 10 for S = 64.
    doc = np.zeros(10, dtype=np.int32)
    with pytest.raises(flexjit.RuntimeError, match=r"dim 0 \(S\) has 10 entries"):
        flexjit.flex_attention(q, q, q, mask_mod="document", buffers={"doc_id": doc})
    # seq_lens outside [0, capacity] on the CPU: an error with or without check_pages.
    pool = np.zeros((2, 4, 1, 16), dtype=np.float32)
    q1 = np.zeros((1, 2, 1, 16), dtype=np.float32)
    table = np.array([[0, 1]], dtype=np.int32)
    for bad in (-5, 40):
        with pytest.raises(flexjit.RuntimeError, match=rf"seq_lens\[0\] = {bad}"):
            flexjit.flex_attention(q1, pool, pool, seq_lens=np.array([bad], dtype=np.int32),
                                   page_table=table)


def test_unknown_standard_names_get_the_closest_match():
    q = np.zeros((1, 1, 8, 16), dtype=np.float32)
    with pytest.raises(flexjit.Error, match=r"did you mean 'causal'\?"):
        flexjit.flex_attention(q, q, q, mask_mod="causl")


def test_a_block_mask_for_other_sizes_is_an_error_on_the_cpu():
    # Issue 34: a block mask built for 128 x 128 was accepted at S = 64 (its tiles ignored).
    q = np.zeros((1, 1, 64, 16), dtype=np.float32)
    bm = flexjit.create_block_mask(causal, 1, 1, 128, 128)
    with pytest.raises(flexjit.RuntimeError,
                       match=r"the block mask was built for Sq=128, Skv=128 but the inputs have "
                             r"Sq=64, Skv=64"):
        flexjit.flex_attention(q, q, q, block_mask=bm)
    ok = flexjit.create_block_mask(causal, 1, 1, 64, 64)
    assert flexjit.flex_attention(q, q, q, block_mask=ok).shape == (1, 1, 64, 16)


def test_a_missing_buffer_is_named_in_python_terms():
    # Issue 34: the C++ hint "pass a host tensor for it in bindings.buffers" reached Python users.
    q = np.zeros((1, 1, 64, 16), dtype=np.float32)
    with pytest.raises(flexjit.RuntimeError,
                       match=r"read buffer 'doc_id' \(i32\[S\]\); pass it as "
                             r"buffers=\{'doc_id': <array of i32\[S\]>\}"):
        flexjit.flex_attention(q, q, q, mask_mod="document_causal")
    with pytest.raises(flexjit.RuntimeError, match=r"pass it as buffers=\{'doc_id'"):
        flexjit.create_block_mask("document_causal", 1, 1, 64, 64)

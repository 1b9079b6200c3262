"""The mod language from Python, mirroring the C++ builders of <flexjit/dsl.h>.

    from flexjit import dsl
    slopes = dsl.Buffer("slopes", "f32", ["H"])
    cap = dsl.Param("cap", "f32", 30.0)
    score_mod = cap * dsl.tanh((dsl.score() + slopes[dsl.h_idx()] * (dsl.kv_idx() - dsl.q_idx())) / cap)
    mask_mod = dsl.q_idx() >= dsl.kv_idx()

Operators follow Python: ``//`` is floor division and ``/`` true division, except that ``/``
between two i32 values is a TypeError (in ``.fx`` text it floors; write ``//``, or
``to_float(a) / b`` for true division); ``%`` is the floor modulo; ``&``, ``|`` and ``~`` are and / or / not
(parenthesise comparisons: ``(q >= kv) & (q - kv <= w)``). Python ints are i32 constants,
floats f32. An expression has no truth value: ``if``, ``and`` and ``or`` raise TypeError.
Types are checked as in C++ (``CompileError`` naming the offending sub-expression).

A score_mod or mask_mod may also be a Python function of the leaves, as in PyTorch:
``lambda score, b, h, q_idx, kv_idx: score * 2`` and ``lambda b, h, q_idx, kv_idx: q_idx >= kv_idx``;
a sink_mod (an attention sink) one of ``(b, h, q_idx)``: ``lambda b, h, q_idx: sinks[h]``.
"""

from ._flexjit import (  # noqa: F401
    Buffer,
    BufferIndex,
    Expr,
    Mods,
    Param,
    abs,
    as_expr,
    b_idx,
    ceil,
    exp,
    exp2,
    floor,
    h_idx,
    kv_idx,
    log,
    log2,
    max,
    min,
    pow,
    q_idx,
    rsqrt,
    score,
    sigmoid,
    sqrt,
    tanh,
    to_float,
    to_int,
    where,
)

minimum = min
maximum = max

__all__ = [
    "Buffer", "Expr", "Mods", "Param", "abs", "as_expr", "b_idx", "ceil", "exp", "exp2", "floor",
    "h_idx", "kv_idx", "log", "log2", "max", "maximum", "min", "minimum", "pow", "q_idx", "rsqrt",
    "score", "sigmoid", "sqrt", "tanh", "to_float", "to_int", "where",
]

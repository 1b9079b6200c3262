"""Mods written against PyTorch, traced into flexjit's mod language (used by flexjit.torch).

A torch user's ``score_mod(score, b, h, q_idx, kv_idx)`` or ``mask_mod(b, h, q_idx, kv_idx)``
is a Python function of 0-d tensors. flexjit calls it once with stand-ins (:class:`Traced`
values, each wrapping a ``flexjit.dsl`` expression): what the function does to them --
operators, indexing the tensors it captures, torch functions (through ``__torch_function__``)
and tensor methods -- builds the expression. Nothing runs on a device.

What a function captures is found first, by a walk (:func:`captures`): its closure cells, the
globals its code names, its default arguments, the attributes its code names on the objects
among those (``self.bias``), and recursively the functions and tuples / lists of functions it
captures (``and_masks(a, b)``). Each leaf is addressed by a *path* from the function, so that
the same leaves can be read again on every call -- also by TorchDynamo under torch.compile,
which follows ``fn.__closure__[i].cell_contents`` and makes the tensors graph inputs.

- A captured tensor becomes a buffer named after its variable (``bias``); int64 and bool
  tensors are read as i32 / bool, float64 is refused (naming the variable).
- A captured int or float becomes a runtime param (a new value never recompiles), unless the
  function needs its Python value (``if window > 0:``, ``range(n)``, ``math.sqrt(d)``): the
  trace is then repeated with that number as a constant, and the plan remembers the value (a
  different value traces again).

The result is a :class:`Plan`: the mods as `.fx` text, and where each buffer and param comes
from. Anything the language cannot express raises :class:`TraceError`, naming the operation
and the user's source line, never a different kernel.
"""

from __future__ import annotations

import math
import traceback
import types
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

import torch

import flexjit
from flexjit import dsl

__all__ = ["Plan", "TraceError", "Traced", "captures", "plan_for"]


class TraceError(flexjit.CompileError):
    """A mod that cannot be traced into flexjit's language (the message names the operation
    and the source line)."""


# --- the walk: what a function captures ---------------------------------------------------

# A path step: ("c", i) closure cell i, ("g", name) a global, ("d", i) default i,
# ("k", name) a keyword-only default, ("a", name) an attribute, ("i", j) an item of a tuple/list.
Path = Tuple[Tuple[str, Any], ...]


class Leaf(NamedTuple):
    path: Path
    name: str  # the variable (or attribute) name, for the buffer / param name
    value: Any  # a tensor, an int / float, or a function (whose code the plan checks)


_MAX_DEPTH = 6
_MAX_ITEMS = 32


def _code_names(code: types.CodeType) -> set:
    """The global and attribute names a code object and its nested code objects (lambdas,
    comprehensions) use."""
    names = set(code.co_names)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            names |= _code_names(c)
    return names


def captures(fn: Callable) -> List[Leaf]:
    """Every tensor, number and function ``fn`` captures, with its path (see the module
    docstring). Functions are leaves too (their code objects key the plan)."""
    out: List[Leaf] = []
    _walk_function(fn, (), out, set(), 0)
    return out


def _walk_function(fn: types.FunctionType, path: Path, out: List[Leaf], seen: set,
                   depth: int) -> None:
    if id(fn) in seen or depth > _MAX_DEPTH:
        return
    seen.add(id(fn))
    out.append(Leaf(path, fn.__name__, fn))
    code = fn.__code__
    names = _code_names(code)
    for i, (name, cell) in enumerate(zip(code.co_freevars, fn.__closure__ or ())):
        try:
            value = cell.cell_contents
        except ValueError:  # an empty cell (a variable not assigned yet)
            continue
        _visit(value, path + (("c", i),), name, names, out, seen, depth)
    globs = fn.__globals__
    for name in sorted(names):
        if name in globs:
            _visit(globs[name], path + (("g", name),), name, names, out, seen, depth)
    defaults = fn.__defaults__ or ()
    first = code.co_argcount - len(defaults)
    for i, value in enumerate(defaults):
        _visit(value, path + (("d", i),), code.co_varnames[first + i], names, out, seen, depth)
    for name, value in (fn.__kwdefaults__ or {}).items():
        _visit(value, path + (("k", name),), name, names, out, seen, depth)


def _visit(value: Any, path: Path, name: str, names: set, out: List[Leaf], seen: set,
           depth: int) -> None:
    if isinstance(value, torch.Tensor):
        out.append(Leaf(path, name, value))
    elif isinstance(value, bool) or value is None:
        return  # a constant of the trace
    elif isinstance(value, (int, float)):
        out.append(Leaf(path, name, value))
    elif isinstance(value, types.FunctionType):
        _walk_function(value, path, out, seen, depth + 1)
    elif isinstance(value, (tuple, list)):
        if len(value) <= _MAX_ITEMS:
            for j, item in enumerate(value):
                _visit(item, path + (("i", j),), f"{name}_{j}", names, out, seen, depth + 1)
    elif isinstance(value, (types.ModuleType, type, types.BuiltinFunctionType, str, bytes,
                            dsl.Buffer, dsl.Param, dsl.Expr, dsl.BufferIndex)):
        return
    elif depth < _MAX_DEPTH and id(value) not in seen:
        # An object (an nn.Module, a config): the attributes the code names on it.
        seen.add(id(value))
        for attr in sorted(names):
            try:
                item = getattr(value, attr)
            except Exception:  # noqa: BLE001 - a property may raise; then it is not captured
                continue
            if isinstance(item, (torch.Tensor, int, float, types.FunctionType)):
                _visit(item, path + (("a", attr),), attr, names, out, seen, depth + 1)


def resolve(fn: Callable, path: Path) -> Any:
    """The value at ``path`` from ``fn``, read now (plain Python that TorchDynamo traces)."""
    value: Any = fn
    for kind, key in path:
        if kind == "c":
            value = value.__closure__[key].cell_contents
        elif kind == "g":
            value = value.__globals__[key]
        elif kind == "d":
            value = value.__defaults__[key]
        elif kind == "k":
            value = value.__kwdefaults__[key]
        elif kind == "a":
            value = getattr(value, key)
        else:
            value = value[key]
    return value


def uses_dsl(fn: Callable) -> bool:
    """Whether ``fn`` is written against flexjit.dsl (it captures dsl buffers or params): such a
    function takes dsl leaves (flexjit.make_mods), not traced torch values."""
    try:
        cells = [c.cell_contents for c in (fn.__closure__ or ())]
    except ValueError:
        cells = []
    globs = fn.__globals__
    values = cells + [globs[n] for n in _code_names(fn.__code__) if n in globs]
    values += list(fn.__defaults__ or ())
    return any(isinstance(v, (dsl.Buffer, dsl.Param, dsl.Expr, dsl.BufferIndex)) for v in values)


# --- traced values --------------------------------------------------------------------------

_TORCH_DTYPE = {"f32": torch.float32, "i32": torch.int32, "bool": torch.bool}


class _Specialize(Exception):
    """A param's Python value was needed: trace again with these params as constants."""

    def __init__(self, names: frozenset):
        super().__init__(", ".join(sorted(names)))
        self.names = names


def _user_line() -> str:
    """' (file.py:12: `return ...`)' for the innermost frame outside flexjit and torch."""
    here = __file__
    for frame in reversed(traceback.extract_stack()[:-1]):
        f = frame.filename
        if f == here or "/torch/" in f or f.startswith("<frozen"):
            continue
        line = (frame.line or "").strip()
        return f" ({f}:{frame.lineno}: `{line}`)" if line else f" ({f}:{frame.lineno})"
    return ""


def _fail(message: str) -> TraceError:
    return TraceError(message + _user_line())


class Traced:
    """A traced 0-d value of a mod: a dsl expression, its torch dtype, and the params it depends
    on (``deps``) or whether it depends on the indices / score (``varies``)."""

    __slots__ = ("expr", "deps", "varies", "const")

    def __init__(self, expr: Any, deps: frozenset = frozenset(), varies: bool = True,
                 const: Any = None):
        self.expr = dsl.as_expr(expr)
        self.deps = deps
        self.varies = varies
        self.const = const  # the Python value of a constant (new_ones, full_like ...)

    # -- what torch code reads off a tensor
    @property
    def dtype(self):
        return _TORCH_DTYPE[self.expr.type]

    @property
    def shape(self):
        return torch.Size([])

    @property
    def ndim(self):
        return 0

    def dim(self):
        return 0

    def size(self, dim=None):
        if dim is None:
            return torch.Size([])
        raise _fail("a mod's values are 0-d: size(dim) has no dim")

    def numel(self):
        return 1

    @property
    def device(self):
        return _STATE.device

    @property
    def is_cuda(self):
        return _STATE.device.type == "cuda"

    @property
    def requires_grad(self):
        return False

    def __repr__(self):
        return f"Traced({self.expr})"

    # -- Python values: only of params and constants (then the trace specializes)
    def _python_value(self, what: str):
        if self.const is not None:
            return self.const
        if not self.varies and self.deps:
            raise _Specialize(self.deps)
        raise _fail(f"{what} of a traced value (`{self.expr}`, which depends on the score or the "
                    f"indices) has no Python value inside a mod: use torch.where, &, |, ~ "
                    f"instead of if / and / or / not, and torch functions instead of math")

    def __bool__(self):
        return bool(self._python_value("the truth value"))

    def __index__(self):
        return int(self._python_value("an integer conversion (__index__)"))

    def __int__(self):
        return int(self._python_value("int()"))

    def __float__(self):
        return float(self._python_value("float()"))

    def __len__(self):
        raise _fail("a mod's values are 0-d tensors: len() of one is undefined")

    def __iter__(self):
        raise _fail("a mod's values are 0-d tensors: they cannot be iterated")

    def __getitem__(self, index):
        raise _fail("a mod's values are 0-d tensors: they cannot be indexed (index a captured "
                    "tensor with them instead)")

    # -- operators
    def __add__(self, o):
        return _arith("+", self, o)

    def __radd__(self, o):
        return _arith("+", o, self)

    def __sub__(self, o):
        return _arith("-", self, o)

    def __rsub__(self, o):
        return _arith("-", o, self)

    def __mul__(self, o):
        return _arith("*", self, o)

    def __rmul__(self, o):
        return _arith("*", o, self)

    def __truediv__(self, o):
        return _arith("/", self, o)

    def __rtruediv__(self, o):
        return _arith("/", o, self)

    def __floordiv__(self, o):
        return _arith("//", self, o)

    def __rfloordiv__(self, o):
        return _arith("//", o, self)

    def __mod__(self, o):
        return _arith("%", self, o)

    def __rmod__(self, o):
        return _arith("%", o, self)

    def __pow__(self, o):
        return _arith("**", self, o)

    def __rpow__(self, o):
        return _arith("**", o, self)

    def __neg__(self):
        return _unary(lambda e: -e, _arith_operand(self))

    def __pos__(self):
        return self

    def __abs__(self):
        return _unary(dsl.abs, _arith_operand(self))

    def __invert__(self):
        if self.expr.type != "bool":
            raise _fail(f"~ on an integer (`{self.expr}`) is a bitwise not, which mods do not "
                        f"have; ~ is the logical not of a bool")
        return _unary(lambda e: ~e, self)

    def __and__(self, o):
        return _logic("&", self, o)

    def __rand__(self, o):
        return _logic("&", o, self)

    def __or__(self, o):
        return _logic("|", self, o)

    def __ror__(self, o):
        return _logic("|", o, self)

    def __xor__(self, o):
        return _logic("^", self, o)

    def __rxor__(self, o):
        return _logic("^", o, self)

    def __eq__(self, o):  # type: ignore[override]
        return _compare("==", self, o)

    def __ne__(self, o):  # type: ignore[override]
        return _compare("!=", self, o)

    def __lt__(self, o):
        return _compare("<", self, o)

    def __le__(self, o):
        return _compare("<=", self, o)

    def __gt__(self, o):
        return _compare(">", self, o)

    def __ge__(self, o):
        return _compare(">=", self, o)

    __hash__ = None  # type: ignore[assignment]

    # -- tensor methods
    def abs(self):
        return abs(self)

    def neg(self):
        return -self

    def exp(self):
        return _math("exp", self)

    def exp2(self):
        return _math("exp2", self)

    def log(self):
        return _math("log", self)

    def log2(self):
        return _math("log2", self)

    def tanh(self):
        return _math("tanh", self)

    def sigmoid(self):
        return _math("sigmoid", self)

    def sqrt(self):
        return _math("sqrt", self)

    def rsqrt(self):
        return _math("rsqrt", self)

    def floor(self):
        return _math("floor", self)

    def ceil(self):
        return _math("ceil", self)

    def square(self):
        return self * self

    def reciprocal(self):
        return 1.0 / self

    def pow(self, o):
        return _arith("**", self, o)

    def clamp(self, min=None, max=None):  # noqa: A002 - torch's names
        return _clamp(self, min, max)

    def clamp_min(self, min):  # noqa: A002
        return _clamp(self, min, None)

    def clamp_max(self, max):  # noqa: A002
        return _clamp(self, None, max)

    clip = clamp

    def minimum(self, o):
        return _minmax(dsl.min, self, o)

    def maximum(self, o):
        return _minmax(dsl.max, self, o)

    def where(self, condition, other):
        return _where(condition, self, other)

    def logical_and(self, o):
        return _logic("&", self, o)

    def logical_or(self, o):
        return _logic("|", self, o)

    def logical_not(self):
        return ~_as_bool(self)

    def eq(self, o):
        return self == o

    def ne(self, o):
        return self != o

    def lt(self, o):
        return self < o

    def le(self, o):
        return self <= o

    def gt(self, o):
        return self > o

    def ge(self, o):
        return self >= o

    def float(self):
        return _convert(self, torch.float32)

    def half(self):
        return _convert(self, torch.float32)

    def bfloat16(self):
        return _convert(self, torch.float32)

    def double(self):
        return _convert(self, torch.float32)

    def int(self):
        return _convert(self, torch.int32)

    def long(self):
        return _convert(self, torch.int32)

    def bool(self):
        return _convert(self, torch.bool)

    def to(self, *args, **kwargs):
        dtype = kwargs.get("dtype")
        for a in args:
            if isinstance(a, torch.dtype):
                dtype = a
            elif isinstance(a, (Traced, torch.Tensor)):
                dtype = a.dtype
        return self if dtype is None else _convert(self, dtype)

    def type_as(self, other):
        return _convert(self, other.dtype)

    def contiguous(self, *args, **kwargs):
        return self

    def clone(self, *args, **kwargs):
        return self

    def detach(self):
        return self

    def view(self, *shape):
        return self._scalar_shape(shape, "view")

    def reshape(self, *shape):
        return self._scalar_shape(shape, "reshape")

    def squeeze(self, *dims):
        return self

    def _scalar_shape(self, shape, what):
        flat = shape[0] if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
        if all(int(s) in (1, -1) for s in flat):
            return self
        raise _fail(f"{what}{tuple(flat)} of a mod's 0-d value")

    def new_ones(self, *args, dtype=None, **kwargs):
        return _constant(1, dtype or self.dtype)

    def new_zeros(self, *args, dtype=None, **kwargs):
        return _constant(0, dtype or self.dtype)

    def new_full(self, size, fill_value, *, dtype=None, **kwargs):
        return _constant(fill_value, dtype or self.dtype)

    def new_tensor(self, data, dtype=None, **kwargs):
        return _constant(data, dtype or self.dtype)

    def item(self):
        return self._python_value(".item()")

    @classmethod
    def __torch_function__(cls, func, types_, args=(), kwargs=None):
        handler = _TORCH_FUNCTIONS.get(func)
        if handler is None:
            name = getattr(func, "__qualname__", None) or getattr(func, "__name__", repr(func))
            module = getattr(func, "__module__", None) or "torch"
            if module.startswith("torch._C"):
                module = "torch"
            raise _fail(f"{module}.{name} is not supported in a mod; supported torch functions: "
                        f"{', '.join(sorted(_SUPPORTED_NAMES))}")
        return handler(*args, **(kwargs or {}))


class CapturedTensor:
    """A tensor a mod captures, during a trace: indexing it reads the buffer."""

    __slots__ = ("buffer", "shape", "dtype", "name", "scalar")

    def __init__(self, name: str, tensor: torch.Tensor, dsl_dtype: str):
        self.name = name
        self.shape = tuple(tensor.shape)
        self.dtype = tensor.dtype
        rank = max(len(self.shape), 1)
        self.scalar = len(self.shape) == 0
        self.buffer = dsl.Buffer(name, dsl_dtype, [f"{name.upper()}_D{i}" for i in range(rank)])

    @property
    def ndim(self):
        return len(self.shape)

    def dim(self):
        return len(self.shape)

    def size(self, dim=None):
        return torch.Size(self.shape) if dim is None else self.shape[dim]

    def __len__(self):
        if not self.shape:
            raise _fail(f"len() of the 0-d tensor '{self.name}'")
        return self.shape[0]

    def __repr__(self):
        return f"CapturedTensor({self.name}, shape={list(self.shape)}, dtype={self.dtype})"

    def __getitem__(self, index):
        return _BufferView(self, ())[index]

    def value(self) -> Traced:
        """A 0-d (or one-element) tensor as a value: its only element."""
        if not self.scalar and self.shape != (1,):
            raise _fail(f"the captured tensor '{self.name}' has shape {list(self.shape)}: a mod "
                        f"uses it by indexing (`{self.name}[q_idx]`), not as a value")
        return Traced(self.buffer[0])

    def __getattr__(self, attr):
        # Tensor methods and operators of a one-element tensor act on its value.
        return getattr(self.value(), attr)

    @classmethod
    def __torch_function__(cls, func, types_, args=(), kwargs=None):  # noqa: D105
        return Traced.__torch_function__(func, types_, args, kwargs)


def _install_value_operators():
    for op in ("__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__",
               "__truediv__", "__rtruediv__", "__floordiv__", "__rfloordiv__", "__mod__",
               "__rmod__", "__pow__", "__rpow__", "__neg__", "__abs__", "__and__", "__rand__",
               "__or__", "__ror__", "__invert__", "__eq__", "__ne__", "__lt__", "__le__",
               "__gt__", "__ge__", "__bool__", "__float__", "__int__", "__index__"):
        setattr(CapturedTensor, op,
                (lambda name: lambda self, *a: getattr(self.value(), name)(*a))(op))
    CapturedTensor.__hash__ = None  # type: ignore[assignment]


_install_value_operators()


class _BufferView:
    """A captured tensor indexed by fewer indices than its rank (``table[h]`` before ``[q]``)."""

    __slots__ = ("tensor", "indices")

    def __init__(self, tensor: CapturedTensor, indices: tuple):
        self.tensor = tensor
        self.indices = indices

    def __getitem__(self, index):
        index = index if isinstance(index, tuple) else (index,)
        t = self.tensor
        for i in index:
            if isinstance(i, (slice, type(Ellipsis))) or i is None:
                raise _fail(f"slicing the captured tensor '{t.name}' ({i!r}): a mod reads one "
                            f"element per index, e.g. `{t.name}[h, q_idx]`")
        indices = self.indices + tuple(_index_expr(i, t) for i in index)
        rank = max(len(t.shape), 1)
        if len(indices) > rank:
            raise _fail(f"'{t.name}' has {len(t.shape)} dims (shape {list(t.shape)}) but is "
                        f"indexed by {len(indices)}")
        if len(indices) < rank:
            return _BufferView(t, indices)
        deps = frozenset().union(*(d for _, d in indices))
        expr = t.buffer[tuple(e for e, _ in indices)] if rank > 1 else t.buffer[indices[0][0]]
        return Traced(expr, deps=deps, varies=True)

    def __getattr__(self, attr):
        raise _fail(f"'{self.tensor.name}' indexed by {len(self.indices)} of its "
                    f"{len(self.tensor.shape)} dims is a tensor, not a value: index every dim")


def _index_expr(i: Any, t: CapturedTensor):
    if isinstance(i, CapturedTensor):
        i = i.value()
    if isinstance(i, Traced):
        if i.expr.type == "f32":
            raise _fail(f"'{t.name}' is indexed by a float (`{i.expr}`): indices are integers "
                        f"(use .long() or //)")
        e = dsl.to_int(i.expr) if i.expr.type == "bool" else i.expr
        return e, i.deps
    if isinstance(i, torch.Tensor):
        if i.numel() != 1:
            raise _fail(f"'{t.name}' is indexed by a tensor of shape {list(i.shape)}")
        i = i.item()
    if isinstance(i, bool) or not isinstance(i, int):
        raise _fail(f"'{t.name}' is indexed by {type(i).__name__} {i!r}")
    return dsl.as_expr(int(i)), frozenset()


# --- operations -----------------------------------------------------------------------------


def _operand(x: Any) -> Traced:
    if isinstance(x, Traced):
        return x
    if isinstance(x, CapturedTensor):
        return x.value()
    if isinstance(x, bool):
        return Traced(dsl.as_expr(x), varies=False, const=x)
    if isinstance(x, (int, float)):
        if isinstance(x, float) and not math.isfinite(x):
            return Traced(dsl.as_expr(x), varies=False, const=x)
        if isinstance(x, int) and not -(2 ** 31) <= x < 2 ** 31:
            raise _fail(f"the integer {x} does not fit in a mod's i32")
        return Traced(dsl.as_expr(x), varies=False, const=x)
    if isinstance(x, (dsl.Expr, dsl.Param, dsl.BufferIndex)):
        return Traced(x)
    if isinstance(x, torch.Tensor):
        _STATE.unknown_tensor(x)
    raise _fail(f"a mod cannot use a {type(x).__name__} ({x!r:.60})")


def _arith_operand(x: Any) -> Traced:
    t = _operand(x)
    return Traced(dsl.to_int(t.expr), t.deps, t.varies) if t.expr.type == "bool" else t


def _combine(expr, *parts: Traced) -> Traced:
    deps = frozenset().union(*(p.deps for p in parts))
    return Traced(expr, deps=deps, varies=any(p.varies for p in parts))


def _unary(f, a: Traced) -> Traced:
    return _combine(f(a.expr), a)


def _arith(op: str, a: Any, b: Any) -> Traced:
    a, b = _arith_operand(a), _arith_operand(b)
    x, y = a.expr, b.expr
    if op == "+":
        e = x + y
    elif op == "-":
        e = x - y
    elif op == "*":
        e = x * y
    elif op == "/":  # torch's true division: ints become floats
        e = (dsl.to_float(x) if x.type == "i32" else x) / (dsl.to_float(y) if y.type == "i32"
                                                           else y)
    elif op == "//":
        e = x // y
    elif op == "%":
        e = x % y
    else:
        e = dsl.pow(dsl.to_float(x) if x.type == "i32" else x,
                    dsl.to_float(y) if y.type == "i32" else y)
        if x.type == "i32" and y.type == "i32":
            e = dsl.to_int(e)
    return _combine(e, a, b)


def _as_bool(x: Any) -> Traced:
    t = _operand(x)
    if t.expr.type != "bool":
        return _combine(t.expr != 0, t)
    return t


def _logic(op: str, a: Any, b: Any) -> Traced:
    ta, tb = _operand(a), _operand(b)
    if ta.expr.type != "bool" or tb.expr.type != "bool":
        raise _fail(f"'{op}' between `{ta.expr}` ({ta.expr.type}) and `{tb.expr}` "
                    f"({tb.expr.type}) is bitwise on integers, which mods do not have; mods use "
                    f"'{op}' on bools (comparisons)")
    if op == "&":
        e = ta.expr & tb.expr
    elif op == "|":
        e = ta.expr | tb.expr
    else:
        e = ta.expr != tb.expr
    return _combine(e, ta, tb)


def _compare(op: str, a: Any, b: Any) -> Traced:
    ta, tb = _operand(a), _operand(b)
    x, y = ta.expr, tb.expr
    if x.type == "bool" and y.type != "bool":
        x = dsl.to_int(x)
    if y.type == "bool" and x.type != "bool":
        y = dsl.to_int(y)
    e = {"==": lambda: x == y, "!=": lambda: x != y, "<": lambda: x < y, "<=": lambda: x <= y,
         ">": lambda: x > y, ">=": lambda: x >= y}[op]()
    return _combine(e, ta, tb)


def _math(name: str, a: Any) -> Traced:
    t = _arith_operand(a)
    x = t.expr
    if name in ("floor", "ceil") and x.type == "i32":
        return t
    if x.type == "i32":
        x = dsl.to_float(x)
    return _combine(getattr(dsl, name)(x), t)


def _minmax(f, a: Any, b: Any) -> Traced:
    ta, tb = _arith_operand(a), _arith_operand(b)
    x, y = ta.expr, tb.expr
    if x.type != y.type:
        x, y = (dsl.to_float(x) if x.type == "i32" else x), (dsl.to_float(y) if y.type == "i32"
                                                             else y)
    return _combine(f(x, y), ta, tb)


def _clamp(a: Any, lo: Any, hi: Any) -> Traced:
    r = _arith_operand(a)
    if lo is not None:
        r = _minmax(dsl.max, r, lo)
    if hi is not None:
        r = _minmax(dsl.min, r, hi)
    return r


def _where(cond: Any, a: Any, b: Any) -> Traced:
    tc, ta, tb = _as_bool(cond), _operand(a), _operand(b)
    x, y = ta.expr, tb.expr
    if x.type != y.type:  # torch promotes: bool < i32 < f32
        order = {"bool": 0, "i32": 1, "f32": 2}
        target = max(x.type, y.type, key=order.get)
        x, y = _to_type(x, target), _to_type(y, target)
    return _combine(dsl.where(tc.expr, x, y), tc, ta, tb)


def _to_type(e, t: str):
    if e.type == t:
        return e
    if t == "f32":
        return dsl.to_float(e)
    if t == "i32":
        return dsl.to_int(e)
    return e != 0


def _convert(a: Any, dtype) -> Traced:
    t = _operand(a)
    if dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
        target = "f32"
    elif dtype in (torch.int32, torch.int64, torch.int16, torch.int8, torch.uint8):
        target = "i32"
    elif dtype == torch.bool:
        target = "bool"
    else:
        raise _fail(f"conversion to {dtype} in a mod (mods compute in float32, int32 and bool)")
    return _combine(_to_type(t.expr, target), t)


def _constant(value: Any, dtype=None) -> Traced:
    if isinstance(value, (Traced, CapturedTensor)):
        t = _operand(value)
        return _convert(t, dtype) if dtype is not None else t
    if isinstance(value, torch.Tensor):
        value = value.item()
    if dtype == torch.bool:  # converted in Python: `true`, not `1 != 0`
        value = bool(value)
    elif dtype is not None and dtype.is_floating_point:
        value = float(value)
    elif dtype is not None:
        value = int(value)
    return _operand(value)


def _div(a, b, rounding_mode=None):
    if rounding_mode is None:
        return _arith("/", a, b)
    if rounding_mode == "floor":
        return _arith("//", a, b)
    # trunc: toward zero
    q = _arith("/", a, b)
    t = _where(q < 0, _math("ceil", q), _math("floor", q))
    ta, tb = _operand(a), _operand(b)
    return _convert(t, torch.int32) if ta.expr.type == "i32" and tb.expr.type == "i32" else t


def _sign(a):
    t = _arith_operand(a)
    one, zero = (1.0, 0.0) if t.expr.type == "f32" else (1, 0)
    return _where(t > 0, one, _where(t < 0, -one, zero))


def _like(fill):
    def make(x, *args, dtype=None, **kwargs):
        return _constant(fill(args), dtype or (x.dtype if hasattr(x, "dtype") else None))

    return make


def _tensor_method(name):
    def call(self, *args, **kwargs):
        return getattr(_operand(self), name)(*args, **kwargs)

    return call


def _getitem(tensor, index):
    if isinstance(tensor, CapturedTensor):
        return tensor[index]
    if isinstance(tensor, torch.Tensor):
        return _STATE.captured(tensor)[index]
    raise _fail(f"indexing a {type(tensor).__name__}")


def _binary(op):
    return lambda a, b, *rest, **kw: _dispatch_binary(op, a, b, kw)


def _dispatch_binary(op, a, b, kw):
    a, b = _STATE.lift(a), _STATE.lift(b)
    alpha = kw.get("alpha")
    if alpha is not None:
        b = _arith("*", b, alpha)
    if op in ("+", "-", "*", "/", "//", "%", "**"):
        return _arith(op, a, b)
    if op in ("&", "|", "^"):
        return _logic(op, a, b)
    return _compare(op, a, b)


_T = torch.Tensor
_TORCH_FUNCTIONS: Dict[Any, Callable] = {}


def _register(funcs: Sequence[Any], handler: Callable) -> None:
    for f in funcs:
        if f is not None:
            _TORCH_FUNCTIONS[f] = handler


# Binary operators: torch.add, Tensor.add, Tensor.__add__ ...; a reflected dunder
# (Tensor.__rsub__(self, other) is other - self) swaps its operands.
_COMPARISONS = ("==", "!=", "<", "<=", ">", ">=")
for _op, _names in {
        "+": ("add", "__add__", "__radd__"), "-": ("sub", "subtract", "__sub__", "__rsub__"),
        "*": ("mul", "multiply", "__mul__", "__rmul__"),
        "/": ("true_divide", "__truediv__", "__rtruediv__"),
        "//": ("floor_divide", "__floordiv__", "__rfloordiv__"),
        "%": ("remainder", "__mod__", "__rmod__"), "**": ("pow", "__pow__", "__rpow__"),
        "&": ("logical_and", "bitwise_and", "__and__", "__rand__"),
        "|": ("logical_or", "bitwise_or", "__or__", "__ror__"),
        "^": ("logical_xor", "__xor__", "__rxor__"),
        "==": ("eq", "__eq__"), "!=": ("ne", "__ne__"), "<": ("lt", "less", "__lt__"),
        "<=": ("le", "less_equal", "__le__"), ">": ("gt", "greater", "__gt__"),
        ">=": ("ge", "greater_equal", "__ge__")}.items():
    for _n in _names:
        _fn = _binary(_op)
        if _n.startswith("__r") and _op not in _COMPARISONS:
            _fn = (lambda f: lambda a, b, *r, **k: f(b, a, *r, **k))(_fn)
        _register([None if _n.startswith("__") else getattr(torch, _n, None),
                   getattr(_T, _n, None)], _fn)

_register([torch.where], lambda c, a, b: _where(c, a, b))
_register([_T.where], lambda self, c, other: _where(c, self, other))
for _n in ("exp", "exp2", "log", "log2", "tanh", "sigmoid", "sqrt", "rsqrt", "floor", "ceil"):
    _register([getattr(torch, _n), getattr(_T, _n)],
              (lambda n: lambda a, *r, **k: _math(n, _STATE.lift(a)))(_n))
_register([torch.special.expit, torch.nn.functional.sigmoid],
          lambda a, *r, **k: _math("sigmoid", _STATE.lift(a)))
_register([torch.abs, _T.abs, _T.__abs__], lambda a: abs(_operand(_STATE.lift(a))))
_register([torch.neg, _T.neg, _T.__neg__], lambda a: -_operand(_STATE.lift(a)))
_register([torch.square, _T.square], lambda a: _arith("*", a, a))
_register([torch.reciprocal, _T.reciprocal], lambda a: _arith("/", 1.0, _STATE.lift(a)))
_register([torch.log1p], lambda a: _math("log", _arith("+", 1.0, _STATE.lift(a))))
_register([torch.expm1], lambda a: _arith("-", _math("exp", _STATE.lift(a)), 1.0))
_register([torch.sign, _T.sign], lambda a: _sign(_STATE.lift(a)))
_register([torch.minimum, _T.minimum, torch.fmin],
          lambda a, b: _minmax(dsl.min, _STATE.lift(a), _STATE.lift(b)))
_register([torch.maximum, _T.maximum, torch.fmax],
          lambda a, b: _minmax(dsl.max, _STATE.lift(a), _STATE.lift(b)))
_register([torch.clamp, torch.clip, _T.clamp, _T.clip],
          lambda a, min=None, max=None: _clamp(_STATE.lift(a), min, max))  # noqa: A006
_register([torch.clamp_min, _T.clamp_min], lambda a, min: _clamp(_STATE.lift(a), min, None))
_register([torch.clamp_max, _T.clamp_max], lambda a, max: _clamp(_STATE.lift(a), None, max))
_register([torch.logical_not, _T.logical_not, _T.__invert__, torch.bitwise_not],
          lambda a: ~_as_bool(_STATE.lift(a)))
_register([torch.div, _T.div, torch.divide],
          lambda a, b, rounding_mode=None: _div(_STATE.lift(a), _STATE.lift(b), rounding_mode))
_register([torch.zeros_like], _like(lambda a: 0))
_register([torch.ones_like], _like(lambda a: 1))
_register([torch.full_like], lambda x, fill, *a, dtype=None, **k: _constant(fill, dtype or x.dtype))
_register([_T.__getitem__], _getitem)
for _n in ("float", "int", "long", "bool", "half", "bfloat16", "double", "to", "type_as",
           "new_ones", "new_zeros", "new_full", "new_tensor", "contiguous", "clone", "detach",
           "view", "reshape", "squeeze"):
    _register([getattr(_T, _n)], _tensor_method(_n))

_SUPPORTED_NAMES = sorted({getattr(f, "__name__", "") for f in _TORCH_FUNCTIONS
                           if getattr(f, "__name__", "") and not getattr(f, "__name__", "")
                           .startswith("__")})


# --- one trace --------------------------------------------------------------------------------

_DSL_DTYPE = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16",
              torch.int32: "i32", torch.int64: "i32", torch.int16: "i32", torch.int8: "i32",
              torch.uint8: "i32", torch.bool: "bool"}
# Names the .fx language reserves (leaves, keywords, functions): a capture of that name is
# renamed (`cap_where`).
_RESERVED = {"score", "b", "h", "q_idx", "kv_idx", "true", "false", "buffer", "param",
             "score_mod", "mask_mod", "sink_mod", "where", "min", "max", "abs", "exp", "exp2",
             "log", "log2", "tanh", "sigmoid", "sqrt", "rsqrt", "floor", "ceil", "pow", "float",
             "int", "bool", "f32", "f16", "bf16", "i32", "inf", "nan"}


def tensor_dtype(name: str, tensor: torch.Tensor) -> str:
    """The dsl dtype a captured tensor is read as; float64 and others are refused by name."""
    dtype = _DSL_DTYPE.get(tensor.dtype)
    if dtype is None:
        raise TraceError(f"the mod captures '{name}', a {tensor.dtype} tensor; mods read "
                         f"float32, float16, bfloat16, int32 (int64 and smaller ints are "
                         f"converted, checked to fit) and bool tensors"
                         + (" (convert it with .float())" if tensor.dtype == torch.float64
                            else ""))
    if tensor.dim() > 4:
        raise TraceError(f"the mod captures '{name}' with {tensor.dim()} dims; buffers have 1 "
                         f"to 4")
    return dtype


class _TraceState:
    """The trace in progress (one at a time; tracing happens on the host)."""

    def __init__(self):
        self.device = torch.device("cpu")
        self.by_id: Dict[int, CapturedTensor] = {}
        self.names: Dict[str, Any] = {}

    def reset(self, device):
        self.device = device
        self.by_id = {}
        self.names = {}

    def unique(self, name: str) -> str:
        base = name if name.isidentifier() and name not in _RESERVED and not name.startswith(
            "_fj") else f"cap_{name.strip('_') or 'x'}"
        n, i = base, 1
        while n in self.names:
            n, i = f"{base}_{i}", i + 1
        return n

    def captured(self, tensor: torch.Tensor, name: str = "") -> CapturedTensor:
        c = self.by_id.get(id(tensor))
        if c is None:
            if not name:
                raise _fail(
                    f"the mod reads a tensor of shape {list(tensor.shape)} that it does not "
                    f"capture directly (a closure variable, a global, a default argument, or an "
                    f"attribute of one of those that the mod's own code names): flexjit "
                    f"cannot find it again on the next call; capture it in a variable")
            name = self.unique(name)
            c = CapturedTensor(name, tensor, tensor_dtype(name, tensor))
            self.by_id[id(tensor)] = c
            self.names[name] = c
        return c

    def lift(self, x):
        """A real tensor met in a torch function: its capture (0-d: its value)."""
        if isinstance(x, torch.Tensor) and not isinstance(x, (Traced,)):
            c = self.captured(x)
            return c.value() if c.scalar or c.shape == (1,) else c
        return x

    def unknown_tensor(self, x):
        self.lift(x)


_STATE = _TraceState()


class Plan(NamedTuple):
    """How to call flexjit for a traced mod set: constant for a call site (hashable)."""

    text: str  # the mods as one line of .fx (empty: none)
    buffers: Tuple[Tuple[str, int, Path, str], ...]  # (name, root, path, dsl dtype)
    params: Tuple[Tuple[str, int, Path, str], ...]  # (name, root, path, "i32" | "f32")
    # What the plan assumed (root, path, kind, value): a function's code, a tensor's (dtype,
    # dim), a number's type or, for a specialized number, its value.
    checks: Tuple[Tuple[int, Path, str, Any], ...]


def _substitute(fn: types.FunctionType, replace: Dict[Path, Any], path: Path = ()) -> Any:
    """A copy of ``fn`` whose captured leaves at the given paths (relative to the root) are
    replaced, rebuilding the functions on the way."""
    code = fn.__code__
    mine = {p[len(path):]: v for p, v in replace.items() if p[:len(path)] == path}
    if not mine:
        return fn
    closure = fn.__closure__
    if closure:
        cells = []
        for i, cell in enumerate(closure):
            sub = {p: v for p, v in mine.items() if p[0] == ("c", i)}
            if not sub:
                cells.append(cell)
                continue
            cells.append(types.CellType(_replaced(cell.cell_contents, sub, path + (("c", i),),
                                                  replace)))
        closure = tuple(cells)
    globs = fn.__globals__
    gsub = {p[0][1] for p in mine if p[0][0] == "g"}
    if gsub:
        globs = dict(globs)
        for name in gsub:
            globs[name] = _replaced(globs[name], {p: v for p, v in mine.items()
                                                  if p[0] == ("g", name)},
                                    path + (("g", name),), replace)
    defaults = fn.__defaults__
    if defaults:
        defaults = tuple(_replaced(d, {p: v for p, v in mine.items() if p[0] == ("d", i)},
                                   path + (("d", i),), replace)
                         for i, d in enumerate(defaults))
    new = types.FunctionType(code, globs, fn.__name__, defaults, closure)
    kw = fn.__kwdefaults__
    if kw:
        new.__kwdefaults__ = {k: _replaced(v, {p: x for p, x in mine.items() if p[0] == ("k", k)},
                                           path + (("k", k),), replace) for k, v in kw.items()}
    return new


def _replaced(value: Any, sub: Dict[Path, Any], at: Path, replace: Dict[Path, Any]) -> Any:
    """``value`` (at path ``at``) with the replacements below it; sub's keys start with the
    step that reached value."""
    if () in {p[1:] for p in sub}:
        return sub[next(p for p in sub if len(p) == 1)]
    if isinstance(value, types.FunctionType):
        return _substitute(value, replace, at)
    if isinstance(value, (tuple, list)):
        items = [_replaced(x, {p[1:]: v for p, v in sub.items() if p[1] == ("i", j)},
                           at + (("i", j),), replace) if any(p[1] == ("i", j) for p in sub) else x
                 for j, x in enumerate(value)]
        return type(value)(items) if isinstance(value, list) else tuple(items)
    attrs = {}
    for step in {p[1] for p in sub if p[1][0] == "a"}:
        below = {p[1:]: v for p, v in sub.items() if p[1] == step}
        attrs[step[1]] = _replaced(getattr(value, step[1]), below, at + (step,), replace)
    return _AttributeProxy(value, attrs)


class _AttributeProxy:
    """An object whose captured attributes read as their stand-ins during a trace."""

    __slots__ = ("_fj_obj", "_fj_attrs")

    def __init__(self, obj, attrs):
        object.__setattr__(self, "_fj_obj", obj)
        object.__setattr__(self, "_fj_attrs", attrs)

    def __getattr__(self, name):
        attrs = object.__getattribute__(self, "_fj_attrs")
        if name in attrs:
            return attrs[name]
        return getattr(object.__getattribute__(self, "_fj_obj"), name)


_KINDS = ("score_mod", "mask_mod", "sink_mod")
_ARGS = {"score_mod": ("score", "b", "h", "q_idx", "kv_idx"),
         "mask_mod": ("b", "h", "q_idx", "kv_idx"), "sink_mod": ("b", "h", "q_idx")}


def _leaves_for(kind: str) -> List[Traced]:
    leaves = {"score": dsl.score(), "b": dsl.b_idx(), "h": dsl.h_idx(), "q_idx": dsl.q_idx(),
              "kv_idx": dsl.kv_idx()}
    return [Traced(leaves[a]) for a in _ARGS[kind]]


def plan_for(fns: Sequence[Optional[Callable]], device: torch.device) -> Plan:
    """Traces (score_mod, mask_mod, sink_mod) -- each None or a function written against torch
    -- into a Plan (see the module docstring). Raises TraceError."""
    walked = [captures(f) if f is not None else [] for f in fns]
    specialized: set = set()
    for _attempt in range(64):
        try:
            return _trace_once(fns, walked, specialized, device)
        except _Specialize as s:
            new = set(s.names) - specialized
            if not new:
                raise TraceError(f"the mod needs the Python value of {', '.join(sorted(s.names))} "
                                 f"in a way flexjit cannot specialize") from None
            specialized |= new
    raise TraceError("the mod needed too many Python values of captured numbers")


def _trace_once(fns, walked, specialized: set, device) -> Plan:
    _STATE.reset(device)
    exprs = {}
    buffers, params, checks = [], [], []
    param_at: Dict[str, Tuple[int, Path, Any]] = {}
    for root, (fn, leaves) in enumerate(zip(fns, walked)):
        if fn is None:
            continue
        replace: Dict[Path, Any] = {}
        for leaf in leaves:
            v = leaf.value
            if isinstance(v, types.FunctionType):
                checks.append((root, leaf.path, "code", v.__code__))
            elif isinstance(v, torch.Tensor):
                checks.append((root, leaf.path, "tensor", (v.dtype, v.dim())))
                existing = _STATE.by_id.get(id(v))
                c = existing or _STATE.captured(v, leaf.name)
                if existing is None:
                    buffers.append((c.name, root, leaf.path, c.buffer.dtype))
                replace[leaf.path] = c
            else:
                key = f"{root}:{leaf.path}"
                if key in specialized:
                    checks.append((root, leaf.path, "value", v))
                    continue
                checks.append((root, leaf.path, "number", type(v).__name__))
                ptype = "f32" if isinstance(v, float) else "i32"
                if ptype == "i32" and not -(2 ** 31) <= v < 2 ** 31:
                    checks[-1] = (root, leaf.path, "value", v)
                    continue
                name = _STATE.unique(leaf.name)
                p = dsl.Param(name, ptype, v)
                _STATE.names[name] = p
                param_at[name] = (root, leaf.path, key)
                params.append((name, root, leaf.path, ptype))
                replace[leaf.path] = Traced(p.expr(), deps=frozenset([key]), varies=False)
        kind = _KINDS[root]
        traced_fn = _substitute(fn, replace) if replace else fn
        try:
            result = traced_fn(*_leaves_for(kind))
        except (_Specialize, TraceError):
            raise
        except flexjit.Error as e:
            raise TraceError(f"{kind} {fn.__name__}: {e}{_user_line_of(e)}") from None
        except Exception as e:  # noqa: BLE001 - the user's code raised while traced
            raise TraceError(f"{kind} {fn.__name__} raised {type(e).__name__} while flexjit "
                             f"traced it: {e}{_user_line_of(e)}") from e
        exprs[kind] = _result(kind, fn, result)
    mods = flexjit.Mods(**exprs, name="+".join(f.__name__ for f in fns if f is not None))
    used = {d.name for d in mods.buffers} | {d.name for d in mods.params}
    text = "; ".join(line for line in mods.to_text().splitlines() if line.strip())
    return Plan(text, tuple(b for b in buffers if b[0] in used),
                tuple((n, r, p, t) for n, r, p, t in params if n in used), tuple(checks))


def _user_line_of(e: BaseException) -> str:
    tb = traceback.extract_tb(e.__traceback__)
    for frame in reversed(tb):
        if frame.filename != __file__ and "/torch/" not in frame.filename:
            return f" ({frame.filename}:{frame.lineno}: `{(frame.line or '').strip()}`)"
    return ""


def _result(kind: str, fn: Callable, result: Any):
    try:
        t = _operand(result)
    except TraceError:
        raise
    except Exception:  # noqa: BLE001
        t = None
    if t is None:
        raise TraceError(f"{kind} {fn.__name__} returned a {type(result).__name__}, not a value "
                         f"of its arguments")
    if kind == "mask_mod":
        if t.expr.type != "bool":
            raise TraceError(f"mask_mod {fn.__name__} returned `{t.expr}` ({t.expr.type}); a "
                             f"mask_mod returns a bool (a comparison)")
        return t.expr
    return dsl.to_float(t.expr) if t.expr.type != "f32" else t.expr


def check(plan: Plan, fns: Sequence[Optional[Callable]]) -> bool:
    """Whether ``plan`` still describes ``fns`` (same code, captured tensors of the same dtype
    and rank, numbers of the same type, specialized numbers of the same value)."""
    for root, path, kind, expected in plan.checks:
        try:
            v = resolve(fns[root], path)
        except Exception:  # noqa: BLE001 - a leaf gone
            return False
        if kind == "code":
            if getattr(v, "__code__", None) is not expected:
                return False
        elif kind == "tensor":
            if not isinstance(v, torch.Tensor) or (v.dtype, v.dim()) != expected:
                return False
        elif kind == "number":
            if type(v).__name__ != expected:
                return False
        elif v != expected or type(v) is not type(expected):
            return False
    return True


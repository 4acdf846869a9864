"""Translation of ATen ops (torch.export's training IR) into graphtrain's IR, one function per op.

Each translator receives the FX node and the translation context and returns the name(s) of the
IR value(s) holding its result. Adding an op is one entry in _translate.TRANSLATORS
(the @op decorator); importing this module fills the table, which only a capture needs.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ._translate import op, rank, val

if TYPE_CHECKING:
    from ._capture import Translator

aten = torch.ops.aten
GT = "graphtrain"
INT64_MAX = 2**63 - 1


def axis(a: int, r: int) -> int:
    return a + r if a < 0 else a


# ---- elementwise -------------------------------------------------------------------------------


def _binary(onnx_op: str) -> Callable:
    def translate(n: torch.fx.Node, t: Translator) -> str:
        a, b = n.args[0], n.args[1]
        dtype = val(n).dtype  # torch's promotion of the operands: compute in the result's type
        x, y = t.promoted(a, b, dtype)
        alpha = n.kwargs.get("alpha", 1)
        if alpha != 1:
            y = t.emit("Mul", [y, t.const(np.array(alpha, dtype=t.np_dtype(dtype)))])
        return t.emit(onnx_op, [x, y])

    return translate


op(aten.add.Tensor, aten.add.Scalar)(_binary("Add"))
op(aten.sub.Tensor, aten.sub.Scalar)(_binary("Sub"))
op(aten.mul.Tensor, aten.mul.Scalar)(_binary("Mul"))


# In-place forms: the capture marks their first argument as written (later readers see the result).
op(aten.add_.Tensor)(_binary("Add"))
op(aten.sub_.Tensor)(_binary("Sub"))
op(aten.mul_.Tensor)(_binary("Mul"))


@op(aten.div.Tensor, aten.div.Scalar, aten.div_.Tensor, aten.div_.Scalar)
def _div(n: torch.fx.Node, t: Translator) -> str:
    if n.kwargs.get("rounding_mode") is not None:
        t.unsupported(n, "division with a rounding mode")
    return _binary("Div")(n, t)


@op(aten.rsub.Scalar, aten.rsub.Tensor)
def _rsub(n: torch.fx.Node, t: Translator) -> str:
    a, b = n.args[0], n.args[1]
    x, y = t.promoted(b, a, val(n).dtype)
    return t.emit("Sub", [x, y])


def _unary(onnx_op: str, domain: str = "") -> Callable:
    return lambda n, t: t.emit(onnx_op, [t.value(n.args[0])], domain=domain)


for _target, _name in [
    (aten.relu.default, "Relu"),
    (aten.relu_.default, "Relu"),
    (aten.tanh.default, "Tanh"),
    (aten.sigmoid.default, "Sigmoid"),
    (aten.exp.default, "Exp"),
    (aten.log.default, "Log"),
    (aten.sqrt.default, "Sqrt"),
    (aten.neg.default, "Neg"),
    (aten.abs.default, "Abs"),
    (aten.erf.default, "Erf"),
    (aten.reciprocal.default, "Reciprocal"),
    (aten.cos.default, "Cos"),
    (aten.sin.default, "Sin"),
]:
    op(_target)(_unary(_name))


@op(aten.detach.default, aten.detach_.default)
def _detach(n: torch.fx.Node, t: Translator) -> str:
    return t.emit("StopGradient", [t.value(n.args[0])], domain=GT)


@op(aten.contiguous.default, aten.clone.default, aten.alias.default, aten.lift_fresh_copy.default)
def _identity(n: torch.fx.Node, t: Translator) -> str:
    return t.emit("Identity", [t.value(n.args[0])])


@op(aten.rsqrt.default)
def _rsqrt(n: torch.fx.Node, t: Translator) -> str:
    return t.emit("Reciprocal", [t.emit("Sqrt", [t.value(n.args[0])])])


@op(aten.silu.default, aten.silu_.default)
def _silu(n: torch.fx.Node, t: Translator) -> str:
    x = t.value(n.args[0])
    return t.emit("Mul", [x, t.emit("Sigmoid", [x])])


@op(aten.gelu.default)
def _gelu(n: torch.fx.Node, t: Translator) -> str:
    return t.emit("Gelu", [t.value(n.args[0])], approximate=n.kwargs.get("approximate", "none"))


@op(aten.leaky_relu.default)
def _leaky_relu(n: torch.fx.Node, t: Translator) -> str:
    slope = n.args[1] if len(n.args) > 1 else 0.01
    return t.emit("LeakyRelu", [t.value(n.args[0])], alpha=float(slope))


@op(aten.pow.Tensor_Scalar, aten.pow.Tensor_Tensor, aten.pow.Scalar)
def _pow(n: torch.fx.Node, t: Translator) -> str:
    dtype = val(n).dtype
    if not dtype.is_floating_point:
        t.unsupported(n, "integer powers")
    base, exponent = n.args[0], n.args[1]
    if (
        isinstance(exponent, (int, float))
        and float(exponent).is_integer()
        and not isinstance(exponent, bool)
    ):
        x, _ = t.promoted(base, 0.0, dtype)  # x ** 2: a float exponent keeps the kernel's fast path
        return t.emit("Pow", [x, t.const(np.array(exponent, np.float32))])
    return t.emit("Pow", t.promoted(base, exponent, dtype))


@op(aten.square.default)
def _square(n: torch.fx.Node, t: Translator) -> str:
    x = t.value(n.args[0])
    return t.emit("Mul", [x, x])


def _compare(onnx_op: str, negate: bool = False) -> Callable:
    def translate(n: torch.fx.Node, t: Translator) -> str:
        out = t.emit(onnx_op, t.promoted(*n.args))
        return t.emit("Not", [out]) if negate else out

    return translate


op(aten.eq.Tensor, aten.eq.Scalar)(_compare("Equal"))
op(aten.ne.Tensor, aten.ne.Scalar)(_compare("Equal", negate=True))
op(aten.lt.Tensor, aten.lt.Scalar)(_compare("Less"))
op(aten.gt.Tensor, aten.gt.Scalar)(_compare("Greater"))
op(aten.le.Tensor, aten.le.Scalar)(_compare("LessOrEqual"))
op(aten.ge.Tensor, aten.ge.Scalar)(_compare("GreaterOrEqual"))


op(aten.minimum.default, aten.min.other)(_binary("Min"))
op(aten.maximum.default, aten.max.other)(_binary("Max"))


@op(
    aten.logical_and.default,
    aten.bitwise_and.Tensor,
    aten.__and__.Tensor,
    aten.logical_or.default,
    aten.bitwise_or.Tensor,
    aten.__or__.Tensor,
)
def _logical(n: torch.fx.Node, t: Translator) -> str:
    a, b = n.args[0], n.args[1]
    if val(a).dtype != torch.bool or val(b).dtype != torch.bool:
        t.unsupported(n, "bitwise logic on integers")
    name = "And" if "and" in str(n.target) else "Or"
    return t.emit(name, [t.value(a), t.value(b)])


@op(
    aten.clamp.default,
    aten.clamp.Tensor,
    aten.clamp_min.default,
    aten.clamp_max.default,
    aten.clip.default,
)
def _clamp(n: torch.fx.Node, t: Translator) -> str:
    x = n.args[0]
    if n.target == aten.clamp_min.default:
        lo, hi = n.args[1], None
    elif n.target == aten.clamp_max.default:
        lo, hi = None, n.args[1]
    else:
        lo = n.args[1] if len(n.args) > 1 else n.kwargs.get("min")
        hi = n.args[2] if len(n.args) > 2 else n.kwargs.get("max")
    if (
        isinstance(lo, torch.fx.Node)
        and val(lo).numel() != 1
        or isinstance(hi, torch.fx.Node)
        and val(hi).numel() != 1
    ):
        t.unsupported(n, "clamp by tensor bounds of more than one element")
    bounds = ["" if b is None else t.operand(b, x) for b in (lo, hi)]
    while bounds and not bounds[-1]:
        bounds.pop()
    return t.emit("Clip", [t.value(x)] + bounds)


@op(aten.hardsigmoid.default, aten.hardswish.default, aten.hardswish_.default)
def _hard(n: torch.fx.Node, t: Translator) -> str:
    x = n.args[0]
    gate = t.emit(
        "Clip",
        [
            t.emit("Add", [t.emit("Div", [t.value(x), t.scalar(6.0, x)]), t.scalar(0.5, x)]),
            t.scalar(0.0, x),
            t.scalar(1.0, x),
        ],
    )
    if n.target == aten.hardsigmoid.default:
        return gate
    return t.emit("Mul", [t.value(x), gate])


@op(aten.cumsum.default)
def _cumsum(n: torch.fx.Node, t: Translator) -> str:
    x = n.args[0]
    dtype = n.kwargs.get("dtype") or val(n).dtype
    xv = (
        t.value(x)
        if val(x).dtype == dtype
        else t.emit("Cast", [t.value(x)], to=t.onnx_dtype(dtype))
    )
    if dtype not in (torch.float32, torch.int64, torch.int32):
        t.unsupported(n, f"cumsum in {dtype}")
    return t.emit("CumSum", [xv, t.ints([axis(n.args[1], rank(x))])])


@op(aten.diff.default)
def _diff(n: torch.fx.Node, t: Translator) -> str:
    x = n.args[0]
    order = n.args[1] if len(n.args) > 1 else 1
    dim = axis(n.args[2] if len(n.args) > 2 else -1, rank(x))
    if len(n.args) > 3 and any(a is not None for a in n.args[3:]):
        t.unsupported(n, "diff with prepend or append")
    out = t.value(x)
    for _ in range(order):
        head = t.emit("Slice", [out, t.ints([1]), t.ints([INT64_MAX]), t.ints([dim])])
        tail = t.emit("Slice", [out, t.ints([0]), t.ints([-1]), t.ints([dim])])
        out = t.emit("Sub", [head, tail])
    return out


@op(aten.logical_not.default, aten.bitwise_not.default)
def _not(n: torch.fx.Node, t: Translator) -> str:
    return t.emit("Not", [t.value(n.args[0])])


@op(aten.where.self, aten.where.ScalarOther, aten.where.ScalarSelf)
def _where(n: torch.fx.Node, t: Translator) -> str:
    c, x, y = n.args
    return t.emit("Where", [t.value(c), *t.promoted(x, y, val(n).dtype)])


@op(
    aten.masked_fill.Scalar,
    aten.masked_fill.Tensor,
    aten.masked_fill_.Scalar,
    aten.masked_fill_.Tensor,
)
def _masked_fill(n: torch.fx.Node, t: Translator) -> str:
    x, mask, value = n.args
    return t.emit("Where", [t.value(mask), t.operand(value, x), t.value(x)])


@op(
    aten.to.dtype, aten.to.dtype_layout, aten._to_copy.default, aten.type_as.default, aten.to.device
)
def _cast(n: torch.fx.Node, t: Translator) -> str:
    src, dst = val(n.args[0]).dtype, val(n).dtype
    x = t.value(n.args[0])
    return t.emit("Identity", [x]) if src == dst else t.emit("Cast", [x], to=t.onnx_dtype(dst))


# ---- linear algebra ----------------------------------------------------------------------------


@op(aten.linear.default)
def _linear(n: torch.fx.Node, t: Translator) -> str:
    x, w = n.args[0], n.args[1]
    b = n.args[2] if len(n.args) > 2 else None
    y = t.emit("FusedMatMul", [t.value(x), t.value(w)], domain=GT, transB=1)
    return t.emit("Add", [y, t.value(b)]) if b is not None else y


@op(aten.matmul.default, aten.bmm.default, aten.mm.default)
def _matmul(n: torch.fx.Node, t: Translator) -> str:
    return t.emit("MatMul", [t.value(n.args[0]), t.value(n.args[1])])


@op("transformers.grouped_mm_fallback.default", aten._grouped_mm.default)
def _grouped_mm(n: torch.fx.Node, t: Translator) -> str:
    """A mixture of experts' grouped product (transformers' MoE layers, torch._grouped_mm): X's
    rows, sorted by expert, times their expert's W[e] [K, N] up to offs[e]. A transposed view of
    W [E, N, K] (a Linear-style weight) is read in place (transB)."""
    x, w = n.args[0], n.args[1]
    offs = n.args[2] if len(n.args) > 2 else n.kwargs.get("offs")
    if (
        offs is None
        or rank(x) != 2
        or rank(w) != 3
        or len(n.args) > 3
        or any(v is not None for k, v in n.kwargs.items() if k != "offs")
        or val(x).dtype != torch.float32
    ):
        t.unsupported(n, "a grouped matmul other than float32 X [S, K] by W [E, K, N] with offs")
    trans = 0
    if w.target == aten.transpose.int and sorted(a % 3 for a in w.args[1:3]) == [1, 2]:
        w, trans = w.args[0], 1
    return t.emit("GroupedMatMul", [t.value(x), t.value(w), t.value(offs)], domain=GT, transB=trans)


@op(aten.addmm.default)
def _addmm(n: torch.fx.Node, t: Translator) -> str:
    c, a, b = n.args[:3]
    return t.emit(
        "Gemm",
        [t.value(a), t.value(b), t.value(c)],
        alpha=float(n.kwargs.get("alpha", 1.0)),
        beta=float(n.kwargs.get("beta", 1.0)),
    )


# ---- shapes and data movement ------------------------------------------------------------------


@op(aten.numpy_T.default)
def _numpy_t(n: torch.fx.Node, t: Translator) -> str:
    return t.emit("Transpose", [t.value(n.args[0])], perm=list(reversed(range(rank(n.args[0])))))


@op(aten.repeat.default)
def _repeat(n: torch.fx.Node, t: Translator) -> str:
    """x.repeat(r0, r1, ...): each dim d_i becomes r_i copies, [r0 * d0, r1 * d1, ...], as
    Unsqueeze -> Expand to [r0, d0, r1, d1, ...] -> Reshape (gradients through their rules)."""
    x, repeats = n.args[0], list(n.args[1])
    r = len(repeats)
    xv = t.value(x)
    if r > rank(x):  # leading new dims
        xv = t.emit(
            "Reshape",
            [xv, t.emit("Concat", [t.ints([1] * (r - rank(x))), t.emit("Shape", [xv])], axis=0)],
        )
    spread = t.emit("Unsqueeze", [xv, t.ints(list(range(0, 2 * r, 2)))])
    expanded = t.emit("Expand", [spread, t.shape_vector([v for k in repeats for v in (k, 1)])])
    target = t.emit("Mul", [t.emit("Shape", [xv]), t.shape_vector(repeats)])
    return t.emit("Reshape", [expanded, target])


@op(aten.baddbmm.default, aten.addbmm.default, aten.addmv.default)
def _baddbmm(n: torch.fx.Node, t: Translator) -> str:
    inp, b1, b2 = n.args[:3]
    beta, alpha = n.kwargs.get("beta", 1), n.kwargs.get("alpha", 1)
    prod = t.emit("MatMul", [t.value(b1), t.value(b2)])
    if n.target == aten.addbmm.default:
        prod = t.emit("ReduceSum", [prod, t.ints([0])], keepdims=0)
    if alpha != 1:
        prod = t.emit("Mul", [prod, t.scalar(alpha, b1)])
    if beta == 0:
        return prod
    base = t.value(inp) if beta == 1 else t.emit("Mul", [t.value(inp), t.scalar(beta, inp)])
    return t.emit("Add", [base, prod])


@op(aten.t.default)
def _t(n: torch.fx.Node, t: Translator) -> str:
    return (
        t.emit("Transpose", [t.value(n.args[0])], perm=[1, 0])
        if rank(n.args[0]) == 2
        else t.value(n.args[0])
    )


@op(aten.transpose.int)
def _transpose(n: torch.fx.Node, t: Translator) -> str:
    r = rank(n.args[0])
    perm = list(range(r))
    a, b = axis(n.args[1], r), axis(n.args[2], r)
    perm[a], perm[b] = perm[b], perm[a]
    return t.emit("Transpose", [t.value(n.args[0])], perm=perm)


@op(aten.permute.default)
def _permute(n: torch.fx.Node, t: Translator) -> str:
    r = rank(n.args[0])
    return t.emit("Transpose", [t.value(n.args[0])], perm=[axis(d, r) for d in n.args[1]])


@op(aten.reshape.default, aten.view.default, aten._unsafe_view.default)
def _reshape(n: torch.fx.Node, t: Translator) -> str:
    return t.emit("Reshape", [t.value(n.args[0]), t.shape_vector(n.args[1])])


@op(aten.flatten.using_ints)
def _flatten(n: torch.fx.Node, t: Translator) -> str:
    r = rank(n.args[0])
    start = axis(n.args[1] if len(n.args) > 1 else 0, r)
    end = axis(n.args[2] if len(n.args) > 2 else -1, r)
    if end == r - 1 and start == 1:
        return t.emit("Flatten", [t.value(n.args[0])], axis=1)
    shape = t.emit("Shape", [t.value(n.args[0])])
    parts = []
    if start > 0:
        parts.append(t.emit("Slice", [shape, t.ints([0]), t.ints([start])]))
    parts.append(t.ints([-1]))
    if end < r - 1:
        parts.append(t.emit("Slice", [shape, t.ints([end + 1]), t.ints([INT64_MAX])]))
    return t.emit("Reshape", [t.value(n.args[0]), t.emit("Concat", parts, axis=0)])


@op(aten.unsqueeze.default)
def _unsqueeze(n: torch.fx.Node, t: Translator) -> str:
    return t.emit("Unsqueeze", [t.value(n.args[0]), t.ints([n.args[1]])])


@op(aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default)
def _squeeze(n: torch.fx.Node, t: Translator) -> str:
    x = n.args[0]
    dims = n.args[1] if len(n.args) > 1 else None
    if dims is None:
        return t.emit("Squeeze", [t.value(x)])
    dims = [dims] if isinstance(dims, int) else list(dims)
    shape = val(x).shape
    dims = [d for d in dims if shape[d] == 1]  # torch ignores dims that are not 1
    return (
        t.emit("Squeeze", [t.value(x), t.ints(dims)]) if dims else t.emit("Identity", [t.value(x)])
    )


@op(aten.expand_as.default)
def _expand_as(n: torch.fx.Node, t: Translator) -> str:
    return t.emit("Expand", [t.value(n.args[0]), t.emit("Shape", [t.value(n.args[1])])])


@op(aten.expand.default)
def _expand(n: torch.fx.Node, t: Translator) -> str:
    x = n.args[0]
    sizes = list(n.args[1])
    r_in = rank(x)
    # -1 keeps the input's size: take it from the input's shape.
    offset = len(sizes) - r_in
    parts = []
    for i, s in enumerate(sizes):
        if isinstance(s, int) and s == -1:
            parts.append(t.emit("Shape", [t.value(x)], start=i - offset, end=i - offset + 1))
        else:
            parts.append(t.shape_vector([s]))
    return t.emit("Expand", [t.value(x), t.emit("Concat", parts, axis=0)])


@op(aten.split.Tensor, aten.split_with_sizes.default, aten.chunk.default)
def _split(n: torch.fx.Node, t: Translator) -> list[str]:
    x = n.args[0]
    dim = n.args[2] if len(n.args) > 2 else n.kwargs.get("dim", 0)
    outs = val(n)
    sizes = [
        int(o.shape[dim]) if not isinstance(o.shape[dim], torch.SymInt) else None for o in outs
    ]
    if None in sizes:
        t.unsupported(n, "a split along a dynamic dimension")
    outs = t.emit("Split", [t.value(x), t.ints(sizes)], n_out=len(sizes), axis=dim)
    return [outs] if len(sizes) == 1 else outs  # one part: emit gives a name, not a list


@op(operator.getitem)
def _getitem(n: torch.fx.Node, t: Translator) -> str:
    source = t.values[n.args[0]]
    return source[n.args[1]]


@op(aten.slice.Tensor)
def _slice(n: torch.fx.Node, t: Translator) -> str:
    x = n.args[0]
    dim = n.args[1] if len(n.args) > 1 else 0
    start = n.args[2] if len(n.args) > 2 else 0
    end = n.args[3] if len(n.args) > 3 else INT64_MAX
    step = n.args[4] if len(n.args) > 4 else 1
    start = 0 if start is None else start
    end = INT64_MAX if end is None else min(end, INT64_MAX) if isinstance(end, int) else end
    return t.emit(
        "Slice",
        [t.value(x), t.shape_vector([start]), t.shape_vector([end]), t.ints([dim]), t.ints([step])],
    )


@op(aten.slice_scatter.default, aten.select_scatter.default)
def _scatter_into_slice(n: torch.fx.Node, t: Translator) -> str:
    """base with src written over base[start:end] along dim (step 1), as functionalization writes
    an in-place update of a slice or a selected index: Where(inside, Gather(src, pos - start), base)."""
    base, src = n.args[0], n.args[1]
    r = rank(base)
    if n.target == aten.select_scatter.default:
        dim, index = axis(n.args[2], r), n.args[3]
        size = val(base).shape[dim]
        if isinstance(index, int) and isinstance(size, int) and index < 0:
            index += size
        if not isinstance(index, int) or index < 0:
            t.unsupported(n, "writing at a negative or computed index")
        start, end = index, index + 1
        src_value = t.emit("Unsqueeze", [t.value(src), t.ints([dim])])
    else:
        dim = axis(n.args[2] if len(n.args) > 2 else 0, r)
        start = n.args[3] if len(n.args) > 3 and n.args[3] is not None else 0
        end = n.args[4] if len(n.args) > 4 and n.args[4] is not None else INT64_MAX
        if (n.args[5] if len(n.args) > 5 else 1) != 1:
            t.unsupported(n, "writing a strided slice")
        if not isinstance(start, int) or start < 0 or isinstance(end, int) and end < 0:
            t.unsupported(n, "writing a slice with negative or computed bounds")
        src_value = t.value(src)
    n_dim = t.emit(
        "Squeeze", [t.emit("Shape", [t.value(base)], start=dim, end=dim + 1), t.ints([0])]
    )
    positions = t.emit(
        "Range", [t.const(np.array(0, np.int64)), n_dim, t.const(np.array(1, np.int64))]
    )
    end_v = t.scalar_int(min(end, INT64_MAX)) if isinstance(end, int) else t.scalar_int(end)
    inside = t.emit(
        "And",
        [
            t.emit("GreaterOrEqual", [positions, t.scalar_int(start)]),
            t.emit("Less", [positions, end_v]),
        ],
    )
    src_len = t.emit("Shape", [src_value], start=dim, end=dim + 1)
    last = t.emit("Sub", [src_len, t.ints([1])])
    shifted = t.emit(
        "Clip",
        [
            t.emit("Sub", [positions, t.scalar_int(start)]),
            t.scalar_int(0),
            t.emit("Squeeze", [last, t.ints([0])]),
        ],
    )
    gathered = t.emit("Gather", [src_value, shifted], axis=dim)
    # inside, shaped [n, 1, ..., 1] to broadcast along dim.
    mask = t.emit(
        "Reshape", [inside, t.emit("Concat", [t.ints([-1]), t.ints([1] * (r - 1 - dim))], axis=0)]
    )
    return t.emit("Where", [mask, gathered, t.value(base)])


@op(aten.select.int)
def _select(n: torch.fx.Node, t: Translator) -> str:
    x, dim, index = n.args
    return t.emit("Gather", [t.value(x), t.scalar_int(index)], axis=dim)


@op(aten.cat.default)
def _cat(n: torch.fx.Node, t: Translator) -> str:
    tensors = [x for x in n.args[0] if val(x).numel() != 0 or val(x).dim() != 1]
    dim = n.args[1] if len(n.args) > 1 else 0
    return t.emit("Concat", [t.value(x) for x in tensors], axis=dim)


@op(aten.stack.default)
def _stack(n: torch.fx.Node, t: Translator) -> str:
    dim = n.args[1] if len(n.args) > 1 else 0
    parts = [t.emit("Unsqueeze", [t.value(x), t.ints([dim])]) for x in n.args[0]]
    return t.emit("Concat", parts, axis=dim)


@op(aten.meshgrid.default, aten.meshgrid.indexing)
def _meshgrid(n: torch.fx.Node, t: Translator) -> list[str]:
    """Coordinate grids (BEiT's and Swin's relative position indices): each 1-D input unsqueezed
    to its own axis and expanded to all of them; 'xy' indexing swaps the first two axes."""
    xs = list(n.args[0])
    indexing = n.args[1] if len(n.args) > 1 else n.kwargs.get("indexing", "ij")
    if any(rank(x) != 1 for x in xs):
        t.unsupported(n, "meshgrid of inputs that are not 1-D")
    axis = list(range(len(xs)))
    if indexing == "xy" and len(xs) > 1:
        axis[0], axis[1] = 1, 0
    by_axis = sorted(range(len(xs)), key=lambda k: axis[k])
    shape = t.emit("Concat", [t.emit("Shape", [t.value(xs[k])]) for k in by_axis], axis=0)
    out = []
    for k, x in enumerate(xs):
        others = [a for a in range(len(xs)) if a != axis[k]]
        grid = t.emit("Unsqueeze", [t.value(x), t.ints(others)]) if others else t.value(x)
        out.append(t.emit("Expand", [grid, shape]))
    return out


@op(aten.embedding.default)
def _embedding(n: torch.fx.Node, t: Translator) -> str:
    w, ids = n.args[0], n.args[1]
    padding_idx = n.args[2] if len(n.args) > 2 else -1
    if len(n.args) > 4 and n.args[4]:
        t.unsupported(n, "embedding with sparse gradients")
    if len(n.args) > 3 and n.args[3]:
        t.unsupported(n, "embedding with scale_grad_by_freq")
    table = t.value(w)
    if padding_idx not in (-1, None):
        # The padding row reads its value but gets no gradient: graphtrain's Gather, whose
        # gradient skips that row (no per-step copy of the table).
        return t.emit(
            "Gather", [table, t.value(ids)], domain=GT, axis=0, padding_idx=int(padding_idx)
        )
    return t.emit("Gather", [table, t.value(ids)], axis=0)


@op(aten.gather.default)
def _gather(n: torch.fx.Node, t: Translator) -> str:
    x, dim, index = n.args[:3]
    if len(n.args) > 3 and n.args[3] or n.kwargs.get("sparse_grad"):
        t.unsupported(n, "gather with sparse_grad")
    return t.emit("GatherElements", [t.value(x), t.value(index)], axis=axis(dim, rank(x)))


@op(aten.index.Tensor)
def _index(n: torch.fx.Node, t: Translator) -> str:
    x, indices = n.args
    used = [(d, i) for d, i in enumerate(indices) if i is not None]
    if any(val(i).dtype not in (torch.int64, torch.int32) for _, i in used):
        t.unsupported(n, "indexing with a boolean mask")
    if len(used) == 1:
        d, idx = used[0]
        return t.emit("Gather", [t.value(x), t.value(idx)], axis=d)
    if [d for d, _ in used] != list(range(len(used))):
        t.unsupported(n, "indexing with index tensors that are not the leading dims")
    # x[i0, i1, ...] over the leading k dims: one Gather of the flattened leading dims with the
    # linear index i0 * (d1 * ... * dk-1) + i1 * (d2 ...) + ..., indices broadcast together.
    shape = t.emit("Shape", [t.value(x)])
    linear = None
    for d, idx in used:
        size = t.emit("Shape", [t.value(x)], start=d, end=d + 1)
        i = t.value(idx)
        if val(idx).dtype != torch.int64:
            i = t.emit("Cast", [i], to=t.onnx_dtype(torch.int64))
        i = t.emit("Where", [t.emit("Less", [i, t.ints([0])]), t.emit("Add", [i, size]), i])
        linear = i if linear is None else t.emit("Add", [t.emit("Mul", [linear, size]), i])
    k = len(used)
    rest = t.emit("Slice", [shape, t.ints([k]), t.ints([INT64_MAX])])
    flat = t.emit("Reshape", [t.value(x), t.emit("Concat", [t.ints([-1]), rest], axis=0)])
    return t.emit("Gather", [flat, linear], axis=0)


@op(aten.unbind.int)
def _unbind(n: torch.fx.Node, t: Translator) -> list[str]:
    x = n.args[0]
    dim = axis(n.args[1] if len(n.args) > 1 else 0, rank(x))
    count = val(x).shape[dim]
    if not isinstance(count, int):
        t.unsupported(n, "unbind over a dimension whose size changes between calls")
    parts = (
        t.emit("Split", [t.value(x), t.ints([1] * count)], n_out=count, axis=dim)
        if count > 1
        else [t.value(x)]
    )
    return [t.emit("Squeeze", [p, t.ints([dim])]) for p in parts]


@op(aten.pad.default, aten.constant_pad_nd.default)
def _pad(n: torch.fx.Node, t: Translator) -> str:
    x, pads = n.args[0], list(n.args[1])
    mode = (
        n.args[2]
        if n.target == aten.pad.default and len(n.args) > 2
        else n.kwargs.get("mode", "constant")
    )
    if mode != "constant":
        t.unsupported(n, f"padding in {mode} mode")
    value = (
        n.args[3]
        if n.target == aten.pad.default and len(n.args) > 3
        else (
            n.args[2]
            if n.target == aten.constant_pad_nd.default and len(n.args) > 2
            else n.kwargs.get("value")
        )
    )
    r = rank(x)
    # torch lists (begin, end) pairs from the last dim backwards; ONNX all begins, then all ends.
    begins, ends = [0] * r, [0] * r
    for k in range(len(pads) // 2):
        begins[r - 1 - k], ends[r - 1 - k] = pads[2 * k], pads[2 * k + 1]
    inputs = [t.value(x), t.shape_vector(begins + ends)]  # sizes may be computed from the inputs
    if value:
        inputs.append(t.scalar(value, x))
    return t.emit("Pad", inputs, mode="constant")


# ---- creation ----------------------------------------------------------------------------------


@op(aten.arange.default, aten.arange.start, aten.arange.start_step)
def _arange(n: torch.fx.Node, t: Translator) -> str:
    args = list(n.args)
    if n.target == aten.arange.default:
        args = [0, args[0], 1]
    elif n.target == aten.arange.start:
        args = [args[0], args[1], 1]
    like = val(n)
    return t.emit("Range", [t.scalar_of(a, like.dtype) for a in args[:3]])


@op(aten.full.default, aten.zeros.default, aten.ones.default)
def _full(n: torch.fx.Node, t: Translator) -> str:
    value = {aten.zeros.default: 0, aten.ones.default: 1}.get(
        n.target, n.args[1] if len(n.args) > 1 else 0
    )
    return _filled(t, val(n).dtype, t.shape_vector(n.args[0]), value)


def _filled(t: Translator, dtype: torch.dtype, shape: str, value: Any) -> str:
    fill = t.const(np.array([value], dtype=t.np_dtype(dtype)))
    return t.emit("ConstantOfShape", [shape], value=t.tensor_attr(fill))


@op(aten.new_zeros.default, aten.new_ones.default, aten.new_full.default, aten.new_empty.default)
def _new_filled(n: torch.fx.Node, t: Translator) -> str:
    value = {aten.new_zeros.default: 0, aten.new_ones.default: 1, aten.new_empty.default: 0}.get(
        n.target
    )
    if value is None:
        value = n.args[2]
    return _filled(t, val(n).dtype, t.shape_vector(n.args[1]), value)


@op(
    aten.zeros_like.default, aten.ones_like.default, aten.full_like.default, aten.empty_like.default
)
def _filled_like(n: torch.fx.Node, t: Translator) -> str:
    value = {aten.zeros_like.default: 0, aten.ones_like.default: 1, aten.empty_like.default: 0}.get(
        n.target
    )
    if value is None:
        value = n.args[1]
    return _filled(t, val(n).dtype, t.emit("Shape", [t.value(n.args[0])]), value)


@op(aten.fill_.Scalar, aten.fill.Scalar, aten.fill_.Tensor, aten.fill.Tensor)
def _fill(n: torch.fx.Node, t: Translator) -> str:
    x, value = n.args[0], n.args[1]
    dtype = val(x).dtype
    if isinstance(value, torch.fx.Node):
        v = t.value(value)
        if val(value).dtype != dtype:
            v = t.emit("Cast", [v], to=t.onnx_dtype(dtype))
        out = t.emit("Expand", [v, t.emit("Shape", [t.value(x)])])
    else:
        out = _filled(t, dtype, t.emit("Shape", [t.value(x)]), value)
    return out


@op(aten.copy_.default, aten.copy.default)
def _copy(n: torch.fx.Node, t: Translator) -> str:
    dst, src = n.args[0], n.args[1]
    v = t.value(src)
    if val(src).dtype != val(dst).dtype:
        v = t.emit("Cast", [v], to=t.onnx_dtype(val(dst).dtype))
    return t.emit("Expand", [v, t.emit("Shape", [t.value(dst)])])


@op(aten.scalar_tensor.default)
def _scalar_tensor(n: torch.fx.Node, t: Translator) -> str:
    return t.const(np.array(n.args[0], dtype=t.np_dtype(val(n).dtype)))


@op(aten.triu.default, aten.tril.default)
def _trilu(n: torch.fx.Node, t: Translator) -> str:
    k = n.args[1] if len(n.args) > 1 else 0
    return t.emit(
        "Trilu", [t.value(n.args[0]), t.scalar_int(k)], upper=int(n.target == aten.triu.default)
    )


# ---- reductions and normalization --------------------------------------------------------------


def _reduce(onnx_op: str) -> Callable:
    def translate(n: torch.fx.Node, t: Translator) -> str:
        x = n.args[0]
        dims = n.args[1] if len(n.args) > 1 else None
        keep = bool(n.args[2]) if len(n.args) > 2 else bool(n.kwargs.get("keepdim", False))
        if n.kwargs.get("dtype") is not None:
            t.unsupported(n, "a reduction with a dtype argument")
        inputs = [t.value(x)]
        if dims is not None and list(dims) != []:
            inputs.append(t.ints([dims] if isinstance(dims, int) else list(dims)))
        return t.emit(onnx_op, inputs, keepdims=int(keep))

    return translate


op(aten.sum.dim_IntList, aten.sum.default)(_reduce("ReduceSum"))
op(aten.mean.dim, aten.mean.default)(_reduce("ReduceMean"))
op(aten.amax.default)(_reduce("ReduceMax"))
op(aten.amin.default)(_reduce("ReduceMin"))


@op(aten.softmax.int, aten._softmax.default)
def _softmax(n: torch.fx.Node, t: Translator) -> str:
    return t.emit("Softmax", [t.value(n.args[0])], axis=n.args[1])


@op(aten.log_softmax.int, aten._log_softmax.default)
def _log_softmax(n: torch.fx.Node, t: Translator) -> str:
    return t.emit("LogSoftmax", [t.value(n.args[0])], axis=n.args[1])


@op(aten.scaled_dot_product_attention.default)
def _attention(n: torch.fx.Node, t: Translator) -> list[str] | str:
    names = ["query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa"]
    a = dict(zip(names, n.args)) | dict(n.kwargs)
    q, k, v, mask = a["query"], a["key"], a["value"], a.get("attn_mask")
    if any(val(x).dtype != torch.float32 for x in (q, k, v)):
        t.unsupported(n, "attention on other than float32 tensors")
    if mask is not None and val(mask).dtype not in (torch.bool, torch.float32):
        t.unsupported(n, f"an attention mask of type {val(mask).dtype}")
    hq, hk = val(q).shape[-3:-2], val(k).shape[-3:-2]
    if hq != hk and not a.get("enable_gqa", False) and tuple(hk) != (1,):
        # (one key/value head broadcast over the query heads is multi-query attention: it fits)
        t.unsupported(n, "attention with different query and key/value heads without enable_gqa")
    inputs = [t.value(q), t.value(k), t.value(v)] + ([t.value(mask)] if mask is not None else [])
    attrs = {"causal": int(bool(a.get("is_causal", False)))}
    if a.get("scale") is not None:
        attrs["scale"] = float(a["scale"])
    if float(a.get("dropout_p", 0.0) or 0.0) > 0:
        attrs["dropout"] = float(a["dropout_p"])
    return t.emit("Attention", inputs, n_out=3, domain=GT, **attrs)[0]


@op(aten.layer_norm.default)
def _layer_norm(n: torch.fx.Node, t: Translator) -> str:
    x, shape = n.args[0], n.args[1]
    w = n.args[2] if len(n.args) > 2 else None
    b = n.args[3] if len(n.args) > 3 else None
    eps = n.args[4] if len(n.args) > 4 else 1e-5
    if w is None:
        w_name = t.const(np.ones(list(shape), np.float32))
    else:
        w_name = t.value(w)
    inputs = [t.value(x), w_name] + ([t.value(b)] if b is not None else [])
    return t.emit("LayerNormalization", inputs, axis=-len(shape), epsilon=float(eps))


@op(aten.group_norm.default)
def _group_norm(n: torch.fx.Node, t: Translator) -> str:
    """GroupNorm (wav2vec2's feature extractor): LayerNormalization of each (sample, group) row
    of x viewed as [N, groups, -1], then the per-channel affine."""
    x, groups = n.args[0], int(n.args[1])
    w, b = _arg(n, 2, "weight", None), _arg(n, 3, "bias", None)
    eps = float(_arg(n, 4, "eps", 1e-5))
    if rank(x) < 2 or not val(x).dtype.is_floating_point:
        t.unsupported(n, "group_norm of a tensor that is not [N, C, ...] floats")
    xv = t.value(x)
    rows = t.emit("Reshape", [xv, t.ints([0, groups, -1])])
    width = t.emit("Slice", [t.emit("Shape", [rows]), t.ints([2]), t.ints([3])])
    ones = t.emit("ConstantOfShape", [width], value=t.tensor_attr(t.const(np.ones(1, np.float32))))
    y = t.emit("LayerNormalization", [rows, ones], axis=-1, epsilon=eps)
    y = t.emit("Reshape", [y, t.emit("Shape", [xv])])
    per_channel = t.ints([-1] + [1] * (rank(x) - 2))
    if w is not None:
        y = t.emit("Mul", [y, t.emit("Reshape", [t.value(w), per_channel])])
    if b is not None:
        y = t.emit("Add", [y, t.emit("Reshape", [t.value(b), per_channel])])
    return y


@op(aten._weight_norm.default)
def _weight_norm(n: torch.fx.Node, t: Translator) -> str:
    """weight_norm's v * g / ||v||, the norm over every dim but `dim` (all of them for -1)."""
    v, g = n.args[0], n.args[1]
    dim = int(_arg(n, 2, "dim", 0))
    r = rank(v)
    axes = list(range(r)) if dim == -1 else [a for a in range(r) if a != dim % r]
    vv = t.value(v)
    squares = t.emit("ReduceSum", [t.emit("Mul", [vv, vv]), t.ints(axes)], keepdims=1)
    return t.emit("Mul", [vv, t.emit("Div", [t.value(g), t.emit("Sqrt", [squares])])])


# Regression losses: the elementwise formula and a reduction, which fuse_elementwise fuses; autodiff
# differentiates them as torch does (sign(0) = 0 for L1, the quadratic branch below beta / delta).
def _difference_loss(n: torch.fx.Node, t: Translator, pointwise: Callable[[str], str]) -> str:
    """Reduces pointwise(x - y) as aten's `reduction` argument (2) says."""
    x, y = n.args[0], n.args[1]
    if not val(n).dtype.is_floating_point:
        t.unsupported(n, "a regression loss on integer tensors")
    d = t.emit("Sub", t.promoted(x, y, val(n).dtype))
    return _reduced(t, pointwise(d), _arg(n, 2, "reduction", 1))


def _arg(n: torch.fx.Node, index: int, name: str, default: Any) -> Any:
    """Argument `index` of an ATen call, positional or by keyword."""
    return n.args[index] if len(n.args) > index else n.kwargs.get(name, default)


def _reduced(t: Translator, loss: str, reduction: int) -> str:
    """aten's loss `reduction`: 0 none, 1 the mean of every element, 2 their sum."""
    if reduction == 0:
        return loss
    return t.emit("ReduceMean" if reduction == 1 else "ReduceSum", [loss], keepdims=0)


def _quadratic_below(n: torch.fx.Node, t: Translator, limit: float, scale: float) -> Callable:
    """0.5 d^2 / limit where |d| < limit, else |d| - 0.5 limit, both times `scale`."""

    def pointwise(d: str) -> str:
        a = t.emit("Abs", [d])
        if limit == 0:
            return t.emit("Mul", [a, t.scalar(scale, n)]) if scale != 1 else a
        near = t.emit("Mul", [t.emit("Mul", [d, d]), t.scalar(0.5 * scale / limit, n)])
        far = t.emit("Sub", [a, t.scalar(0.5 * limit, n)])
        if scale != 1:
            far = t.emit("Mul", [far, t.scalar(scale, n)])
        return t.emit("Where", [t.emit("Less", [a, t.scalar(limit, n)]), near, far])

    return pointwise


@op(aten.mse_loss.default)
def _mse_loss(n: torch.fx.Node, t: Translator) -> str:
    return _difference_loss(n, t, lambda d: t.emit("Mul", [d, d]))


@op(aten.l1_loss.default)
def _l1_loss(n: torch.fx.Node, t: Translator) -> str:
    return _difference_loss(n, t, lambda d: t.emit("Abs", [d]))


@op(aten.smooth_l1_loss.default)
def _smooth_l1_loss(n: torch.fx.Node, t: Translator) -> str:
    beta = float(_arg(n, 3, "beta", 1.0))
    return _difference_loss(n, t, _quadratic_below(n, t, beta, 1.0))


@op(aten.huber_loss.default)
def _huber_loss(n: torch.fx.Node, t: Translator) -> str:
    # delta (|d| - delta / 2) = delta * smooth_l1 with beta = delta; 0.5 d^2 below delta.
    delta = float(_arg(n, 3, "delta", 1.0))
    return _difference_loss(n, t, _quadratic_below(n, t, delta, delta))


def _kept_targets(
    t: Translator, target: Any, ignore: int, weight: Any, dtype: torch.dtype
) -> tuple[str, str, str]:
    """Class-index targets with ignore_index: (the targets with the ignored ones as 0, so they
    index safely; 1 for a kept item and 0 for an ignored one; that times its target's class weight)
    """
    kept = t.emit("Not", [t.emit("Equal", [t.value(target), t.const(np.array(ignore, np.int64))])])
    safe = t.emit("Where", [kept, t.value(target), t.const(np.array(0, np.int64))])
    kept_f = t.emit("Cast", [kept], to=t.onnx_dtype(dtype))
    if weight is None:
        return safe, kept_f, kept_f
    return safe, kept_f, t.emit("Mul", [kept_f, t.emit("Gather", [t.value(weight), safe])])


@op(aten.nll_loss_nd.default)
def _nll_loss(n: torch.fx.Node, t: Translator) -> str:
    """-logp[item, target] (times the class weight), 0 for ignore_index; the mean divides by the
    summed weights of the items not ignored, as torch does."""
    logp, target, weight = n.args[0], n.args[1], _arg(n, 2, "weight", None)
    if rank(logp) < 2:
        t.unsupported(n, "nll_loss on one item (log-probabilities of rank 1)")
    safe, _, coef = _kept_targets(t, target, _arg(n, 4, "ignore_index", -100), weight, val(n).dtype)
    picked = t.emit(
        "GatherElements", [t.value(logp), t.emit("Unsqueeze", [safe, t.ints([1])])], axis=1
    )
    loss = t.emit("Mul", [t.emit("Neg", [t.emit("Squeeze", [picked, t.ints([1])])]), coef])
    reduction = _arg(n, 3, "reduction", 1)
    if reduction != 1:
        return _reduced(t, loss, reduction)
    total = t.emit("ReduceSum", [loss], keepdims=0)
    return t.emit("Div", [total, t.emit("ReduceSum", [coef], keepdims=0)])


@op(aten.binary_cross_entropy_with_logits.default)
def _bce_with_logits(n: torch.fx.Node, t: Translator) -> str:
    """(1 - y) x + w_pos log(1 + e^-x), the log as m + log(e^-m + e^(-x-m)), m = max(-x, 0): no
    exponential of a positive number, and the gradient is sigmoid(x) - y (m's part cancels)."""
    x, y = t.promoted(n.args[0], n.args[1], val(n).dtype)
    weight, pos_weight = _arg(n, 2, "weight", None), _arg(n, 3, "pos_weight", None)
    one = t.scalar(1.0, n)
    neg_x = t.emit("Neg", [x])
    m = t.emit("Relu", [neg_x])
    exps = t.emit(
        "Add", [t.emit("Exp", [t.emit("Neg", [m])]), t.emit("Exp", [t.emit("Sub", [neg_x, m])])]
    )
    log_term = t.emit("Add", [t.emit("Log", [exps]), m])
    if pos_weight is not None:
        pw = t.emit("Sub", [t.value(pos_weight), one])
        log_term = t.emit("Mul", [t.emit("Add", [t.emit("Mul", [pw, y]), one]), log_term])
    loss = t.emit("Add", [t.emit("Mul", [t.emit("Sub", [one, y]), x]), log_term])
    if weight is not None:
        loss = t.emit("Mul", [loss, t.value(weight)])
    return _reduced(t, loss, _arg(n, 4, "reduction", 1))


@op(aten.binary_cross_entropy.default)
def _bce(n: torch.fx.Node, t: Translator) -> str:
    """-(y log p + (1 - y) log(1 - p)), each log at least -100, as torch clamps them."""
    p, y = t.promoted(n.args[0], n.args[1], val(n).dtype)
    one, floor = t.scalar(1.0, n), t.scalar(-100.0, n)
    log_p = t.emit("Max", [t.emit("Log", [p]), floor])
    log_q = t.emit("Max", [t.emit("Log", [t.emit("Sub", [one, p])]), floor])
    loss = t.emit(
        "Neg",
        [
            t.emit(
                "Add", [t.emit("Mul", [y, log_p]), t.emit("Mul", [t.emit("Sub", [one, y]), log_q])]
            )
        ],
    )
    weight = _arg(n, 2, "weight", None)
    if weight is not None:
        loss = t.emit("Mul", [loss, t.value(weight)])
    return _reduced(t, loss, _arg(n, 3, "reduction", 1))


@op(aten.kl_div.default)
def _kl_div(n: torch.fx.Node, t: Translator) -> str:
    """target (log target - input), 0 where target is 0; log_target: e^target (target - input).
    F.kl_div's batchmean is its sum divided by the batch, outside this op."""
    x, y = t.promoted(n.args[0], n.args[1], val(n).dtype)
    if n.kwargs.get("log_target", False):
        loss = t.emit("Mul", [t.emit("Exp", [y]), t.emit("Sub", [y, x])])
    else:  # log of 1 where target is 0: no -inf to multiply by 0, in the loss or its gradient
        positive = t.emit("Greater", [y, t.scalar(0.0, n)])
        log_y = t.emit("Log", [t.emit("Where", [positive, y, t.scalar(1.0, n)])])
        loss = t.emit("Mul", [y, t.emit("Sub", [log_y, x])])
    return _reduced(t, loss, _arg(n, 2, "reduction", 1))


@op(aten.logsumexp.default)
def _logsumexp(n: torch.fx.Node, t: Translator) -> str:
    """max + log sum exp(x - max) (an infinite max taken as 0, as torch does); the gradient is the
    softmax, the max's part cancelling."""
    x = t.value(n.args[0])
    dims = n.args[1]
    axes = t.ints([dims] if isinstance(dims, int) else list(dims))
    keep = bool(_arg(n, 2, "keepdim", False))
    m = t.emit("ReduceMax", [x, axes], keepdims=1)
    infinite = t.emit("Equal", [t.emit("Abs", [m]), t.scalar(float("inf"), n.args[0])])
    m = t.emit("Where", [infinite, t.scalar(0.0, n.args[0]), m])
    total = t.emit("ReduceSum", [t.emit("Exp", [t.emit("Sub", [x, m])]), axes], keepdims=1)
    out = t.emit("Add", [t.emit("Log", [total]), m])
    return out if keep else t.emit("Squeeze", [out, axes])


def _elu(t: Translator, n: torch.fx.Node, alpha: float, scale: float, input_scale: float) -> str:
    """scale x above 0, scale alpha expm1(input_scale x) at or below it (torch's gradient at 0);
    the exponential of x only where x <= 0, so the branch not taken never overflows (nor its
    gradient)."""
    x = t.value(n.args[0])
    above = t.emit("Greater", [x, t.scalar(0.0, n)])
    below = t.emit("Where", [above, t.scalar(0.0, n), x])
    if input_scale != 1:
        below = t.emit("Mul", [below, t.scalar(input_scale, n)])
    neg = t.emit("Mul", [t.emit("Expm1", [below], domain=GT), t.scalar(scale * alpha, n)])
    pos = t.emit("Mul", [x, t.scalar(scale, n)]) if scale != 1 else x
    return t.emit("Where", [above, pos, neg])


@op(aten.elu.default)
def _elu_op(n: torch.fx.Node, t: Translator) -> str:
    alpha, scale = float(_arg(n, 1, "alpha", 1.0)), float(_arg(n, 2, "scale", 1.0))
    return _elu(t, n, alpha, scale, float(_arg(n, 3, "input_scale", 1.0)))


@op(aten.selu.default)
def _selu(n: torch.fx.Node, t: Translator) -> str:
    return _elu(t, n, 1.6732632423543772, 1.0507009873554805, 1.0)


@op(aten.glu.default)
def _glu(n: torch.fx.Node, t: Translator) -> str:
    x = n.args[0]
    dim = axis(_arg(n, 1, "dim", -1), rank(x))
    size = val(x).shape[dim]
    if not isinstance(size, int):
        t.unsupported(n, "glu along a dimension whose size changes between calls")
    a, b = t.emit("Split", [t.value(x), t.ints([size // 2, size // 2])], n_out=2, axis=dim)
    return t.emit("Mul", [a, t.emit("Sigmoid", [b])])


_STD = (aten.std.dim, aten.std.correction, aten.std_mean.dim, aten.std_mean.correction)


@op(aten.var.dim, aten.var.correction, aten.std.dim, aten.std.correction)
def _var(n: torch.fx.Node, t: Translator) -> str:
    return _variance(n, t)[0]


@op(aten.var_mean.dim, aten.var_mean.correction, aten.std_mean.dim, aten.std_mean.correction)
def _var_mean(n: torch.fx.Node, t: Translator) -> list[str]:
    return list(_variance(n, t))


def _variance(n: torch.fx.Node, t: Translator) -> tuple[str, str]:
    """(sum (x - mean)^2 / (N - correction), its root for std; the mean) over the dims (all when
    none), for the .dim (unbiased) and .correction forms."""
    x = n.args[0]
    dims = _arg(n, 1, "dim", None)
    dims = [] if dims is None else [dims] if isinstance(dims, int) else list(dims)
    dims = [axis(d, rank(x)) for d in dims] or list(range(rank(x)))
    if n.target._overloadname == "correction":
        c = n.kwargs.get("correction")
        correction, keep = (1.0 if c is None else float(c)), bool(n.kwargs.get("keepdim", False))
    else:
        correction = 1.0 if _arg(n, 2, "unbiased", True) else 0.0
        keep = bool(_arg(n, 3, "keepdim", False))
    axes = t.ints(dims)
    sizes = [val(x).shape[d] for d in dims]
    if all(isinstance(s, int) for s in sizes):
        divisor = t.scalar(max(float(np.prod(sizes)) - correction, 0.0), x)
    else:  # the count from the shape at run time
        shape = t.emit("Shape", [t.value(x)])
        count = t.emit("Gather", [shape, t.const(np.array(dims[0], np.int64))])
        for d in dims[1:]:
            count = t.emit(
                "Mul", [count, t.emit("Gather", [shape, t.const(np.array(d, np.int64))])]
            )
        count = t.emit("Cast", [count], to=t.onnx_dtype(val(x).dtype))
        divisor = t.emit("Max", [t.emit("Sub", [count, t.scalar(correction, x)]), t.scalar(0.0, x)])
    mean = t.emit("ReduceMean", [t.value(x), axes], keepdims=1)
    d = t.emit("Sub", [t.value(x), mean])
    total = t.emit("ReduceSum", [t.emit("Mul", [d, d]), axes], keepdims=int(keep))
    var = t.emit("Div", [total, divisor])
    if n.target in _STD:
        var = _root(t, x, var)  # torch masks std's gradient where it is 0, as _root does
    return var, mean if keep else t.emit("Squeeze", [mean, axes])


def _softplus_of(t: Translator, n: torch.fx.Node, x: str, beta: float, threshold: float) -> str:
    """torch's softplus: log(1 + e^(beta x)) / beta, and x itself where beta x > threshold."""
    z = t.emit("Mul", [x, t.scalar(beta, n)]) if beta != 1 else x
    soft = t.emit("Softplus", [z])
    if beta != 1:
        soft = t.emit("Div", [soft, t.scalar(beta, n)])
    return t.emit("Where", [t.emit("Greater", [z, t.scalar(threshold, n)]), x, soft])


@op(aten.softplus.default)
def _softplus(n: torch.fx.Node, t: Translator) -> str:
    beta, threshold = float(_arg(n, 1, "beta", 1.0)), float(_arg(n, 2, "threshold", 20.0))
    return _softplus_of(t, n, t.value(n.args[0]), beta, threshold)


@op(aten.mish.default)
def _mish(n: torch.fx.Node, t: Translator) -> str:
    x = t.value(n.args[0])
    return t.emit("Mul", [x, t.emit("Tanh", [_softplus_of(t, n, x, 1.0, 20.0)])])


def _root(t: Translator, n: torch.fx.Node, squares: str) -> str:
    """sqrt(squares), with a zero gradient where it is 0 (torch's norm masks the 1 / 0 there)."""
    positive = t.emit("Greater", [squares, t.scalar(0.0, n)])
    root = t.emit("Sqrt", [t.emit("Where", [positive, squares, t.scalar(1.0, n)])])
    return t.emit("Where", [positive, root, t.scalar(0.0, n)])


@op(aten.linalg_vector_norm.default)
def _vector_norm(n: torch.fx.Node, t: Translator) -> str:
    x = n.args[0]
    order, dims = _arg(n, 1, "ord", 2), _arg(n, 2, "dim", None)
    keep = bool(_arg(n, 3, "keepdim", False))
    if n.kwargs.get("dtype") is not None:
        t.unsupported(n, "a vector norm with a dtype argument")
    if order not in (1, 2):
        t.unsupported(n, f"a vector norm of order {order} (1 and 2 run natively)")
    inputs = [t.value(x)]  # and the axes, when there are some: none reduces every one
    dims = [] if dims is None else [dims] if isinstance(dims, int) else list(dims)
    if dims:
        inputs.append(t.ints(dims))
    if order == 1:
        return t.emit("ReduceSum", [t.emit("Abs", [inputs[0]]), *inputs[1:]], keepdims=int(keep))
    x2 = t.emit("Mul", [inputs[0], inputs[0]])
    return _root(t, n, t.emit("ReduceSum", [x2, *inputs[1:]], keepdims=int(keep)))


@op(aten.cosine_similarity.default)
def _cosine_similarity(n: torch.fx.Node, t: Translator) -> str:
    """sum(x1 x2) / (max(|x1|, eps) max(|x2|, eps)) along dim (the inputs broadcast)."""
    a, b = t.promoted(n.args[0], n.args[1], val(n).dtype)
    dim, eps = _arg(n, 2, "dim", 1), float(_arg(n, 3, "eps", 1e-8))
    axes = t.ints([dim])

    def norm(v: str) -> str:
        squares = t.emit("ReduceSum", [t.emit("Mul", [v, v]), axes], keepdims=0)
        return t.emit("Max", [_root(t, n, squares), t.scalar(eps, n)])

    dot = t.emit("ReduceSum", [t.emit("Mul", [a, b]), axes], keepdims=0)
    return t.emit("Div", [dot, t.emit("Mul", [norm(a), norm(b)])])


@op(aten.hardtanh.default, aten.relu6.default)
def _hardtanh(n: torch.fx.Node, t: Translator) -> str:
    """x clipped to [lo, hi], its gradient passing only strictly inside (torch's hardtanh, where
    clamp's passes at the bounds too)."""
    x = t.value(n.args[0])
    if n.target == aten.relu6.default:
        lo, hi = 0.0, 6.0
    else:
        lo, hi = float(_arg(n, 1, "min_val", -1.0)), float(_arg(n, 2, "max_val", 1.0))
    lo_c, hi_c = t.scalar(lo, n.args[0]), t.scalar(hi, n.args[0])
    inside = t.emit("And", [t.emit("Greater", [x, lo_c]), t.emit("Less", [x, hi_c])])
    clipped = t.emit("Clip", [t.emit("StopGradient", [x], domain=GT), lo_c, hi_c])
    return t.emit("Where", [inside, x, clipped])


@op(aten.log1p.default, aten.expm1.default)
def _log1p_expm1(n: torch.fx.Node, t: Translator) -> str:
    op_type = "Log1p" if n.target == aten.log1p.default else "Expm1"
    return t.emit(op_type, [t.value(n.args[0])], domain=GT)


@op(aten.log2.default, aten.log10.default)
def _log_base(n: torch.fx.Node, t: Translator) -> str:
    base = 2.0 if n.target == aten.log2.default else 10.0
    return t.emit("Mul", [t.emit("Log", [t.value(n.args[0])]), t.scalar(1.0 / math.log(base), n)])


_ROUNDING = {
    aten.sign.default: "Sign",
    aten.sign_.default: "Sign",
    aten.floor.default: "Floor",
    aten.floor_.default: "Floor",  # drop path: (keep + rand).floor_()
    aten.ceil.default: "Ceil",
    aten.ceil_.default: "Ceil",
    aten.round.default: "Round",
    aten.round_.default: "Round",
}


@op(*_ROUNDING)
def _sign(n: torch.fx.Node, t: Translator) -> str:
    """Sign, Floor, Ceil, Round (halves to even, as torch's): gradient 0, as torch's."""
    x = n.args[0]
    op_type = _ROUNDING[n.target]
    if not val(x).dtype.is_floating_point:  # integers are their own floor, ceil and round
        if op_type == "Sign":
            t.unsupported(n, "sign of an integer tensor")
        return t.value(x)
    return t.emit(op_type, [t.value(x)])


@op(aten.log_sigmoid.default)
def _log_sigmoid(n: torch.fx.Node, t: Translator) -> str:
    return t.emit("Neg", [t.emit("Softplus", [t.emit("Neg", [t.value(n.args[0])])])])


@op(aten.prelu.default)
def _prelu(n: torch.fx.Node, t: Translator) -> str:
    """x above 0, w x at or below it, w one value or one per channel (dim 1)."""
    x, w = n.args[0], n.args[1]
    slope = t.value(w)
    if val(w).numel() != 1 and rank(x) > 2:
        slope = t.emit("Reshape", [slope, t.ints([-1] + [1] * (rank(x) - 2))])
    above = t.emit("Greater", [t.value(x), t.scalar(0.0, x)])
    return t.emit("Where", [above, t.value(x), t.emit("Mul", [t.value(x), slope])])


@op(aten.index_select.default)
def _index_select(n: torch.fx.Node, t: Translator) -> str:
    x, index = n.args[0], t.value(n.args[2])
    if rank(n.args[2]) == 0:  # one index keeps the dim, as a 1-element one
        index = t.emit("Unsqueeze", [index, t.ints([0])])
    return t.emit("Gather", [t.value(x), index], axis=axis(n.args[1], rank(x)))


@op(aten.flip.default)
def _flip(n: torch.fx.Node, t: Translator) -> str:
    x = n.args[0]
    dims = [axis(d, rank(x)) for d in n.args[1]]
    if not dims:
        return t.value(x)
    k = len(dims)
    return t.emit(
        "Slice",
        [
            t.value(x),
            t.ints([-1] * k),
            t.ints([-INT64_MAX - 1] * k),
            t.ints(dims),
            t.ints([-1] * k),
        ],
    )


@op(aten.roll.default)
def _roll(n: torch.fx.Node, t: Translator) -> str:
    x = n.args[0]
    shifts, dims = list(n.args[1]), list(_arg(n, 2, "dims", []))
    if not dims or len(dims) != len(shifts):
        t.unsupported(n, "roll without one dim per shift (over the flattened tensor)")
    out = t.value(x)
    for shift, d in zip(shifts, dims):
        d = axis(d, rank(x))
        size = val(x).shape[d]
        if not isinstance(size, int) or not isinstance(shift, int):
            t.unsupported(n, "roll along a dimension whose size changes between calls")
        cut = size - shift % size if size else 0
        if cut in (0, size):
            continue
        tail = t.emit("Slice", [out, t.ints([cut]), t.ints([size]), t.ints([d])])
        head = t.emit("Slice", [out, t.ints([0]), t.ints([cut]), t.ints([d])])
        out = t.emit("Concat", [tail, head], axis=d)
    return out


@op(aten.repeat_interleave.self_int)
def _repeat_interleave(n: torch.fx.Node, t: Translator) -> str:
    """Each slice along dim `repeats` times: x unsqueezed after dim, expanded there, and the two
    dims merged."""
    x, repeats, dim = n.args[0], n.args[1], _arg(n, 2, "dim", None)
    if dim is None or not isinstance(repeats, int):
        t.unsupported(n, "repeat_interleave without a dim, or by a changing count")
    r, d = rank(x), axis(dim, rank(x))
    ones = [1] * (d + 1) + [repeats] + [1] * (r - d - 1)
    y = t.emit("Expand", [t.emit("Unsqueeze", [t.value(x), t.ints([d + 1])]), t.ints(ones)])
    shape = t.emit("Shape", [t.value(x)])
    parts = [t.emit("Slice", [shape, t.ints([0]), t.ints([d])])] if d > 0 else []
    parts.append(t.ints([-1]))
    if d < r - 1:
        parts.append(t.emit("Slice", [shape, t.ints([d + 1]), t.ints([INT64_MAX])]))
    target = parts[0] if len(parts) == 1 else t.emit("Concat", parts, axis=0)
    return t.emit("Reshape", [y, target])


@op(aten.outer.default)
def _outer(n: torch.fx.Node, t: Translator) -> str:
    a, b = t.promoted(n.args[0], n.args[1], val(n).dtype)
    return t.emit(
        "Mul", [t.emit("Unsqueeze", [a, t.ints([1])]), t.emit("Unsqueeze", [b, t.ints([0])])]
    )


@op(aten.max.dim, aten.min.dim)
def _max_dim(n: torch.fx.Node, t: Translator) -> list[str]:
    """(values, indices) along dim: the index by ArgMax / ArgMin (the first of equals, a NaN
    first), the values gathered at it, so the gradient goes to that element alone, as torch's."""
    x = n.args[0]
    if val(x).dtype != torch.float32:
        t.unsupported(n, f"max / min along a dim of a {val(x).dtype} tensor")
    d = axis(n.args[1], rank(x))
    index = t.emit(
        "ArgMax" if n.target == aten.max.dim else "ArgMin", [t.value(x)], axis=d, keepdims=1
    )
    values = t.emit("GatherElements", [t.value(x), index], axis=d)
    if _arg(n, 2, "keepdim", False):
        return [values, index]
    return [t.emit("Squeeze", [values, t.ints([d])]), t.emit("Squeeze", [index, t.ints([d])])]


@op(aten.topk.default, aten.sort.default, aten.sort.stable)
def _top_k(n: torch.fx.Node, t: Translator) -> list[str]:
    """topk and sort as TopK (equal values in index order: a stable sort, as torch's on CPU);
    the values' gradient goes back to where they came from."""
    x = n.args[0]
    if n.target == aten.topk.default:
        k, d = n.args[1], _arg(n, 2, "dim", -1)
        largest = bool(_arg(n, 3, "largest", True))
    else:  # sort(x, dim, descending) / sort.stable(x, *, stable, dim, descending)
        args = n.args[1:] if n.target == aten.sort.default else []
        d = args[0] if args else n.kwargs.get("dim", -1)
        largest = bool(args[1] if len(args) > 1 else n.kwargs.get("descending", False))
        k = val(x).shape[axis(d, rank(x))]
    d = axis(d, rank(x))
    if isinstance(k, int):
        kv = t.ints([k])
    elif n.target == aten.topk.default:
        kv = t.emit("Unsqueeze", [t.scalar_int(k), t.ints([0])])
    else:
        kv = t.emit("Shape", [t.value(x)], start=d, end=d + 1)
    return t.emit("TopK", [t.value(x), kv], n_out=2, axis=d, largest=int(largest), sorted=1)


@op(aten.floor_divide.default, aten.floor_divide.Scalar)
def _floor_divide(n: torch.fx.Node, t: Translator) -> str:
    """a // b, rounded down: (a - a mod b) / b for integers (ONNX's Mod takes the divisor's
    sign, as Python's %), Floor(a / b) for floats."""
    a, b = t.promoted(n.args[0], n.args[1], val(n).dtype)
    if val(n).dtype.is_floating_point:
        return t.emit("Floor", [t.emit("Div", [a, b])])
    return t.emit("Div", [t.emit("Sub", [a, t.emit("Mod", [a, b])]), b])


@op(aten.histc.default)
def _histc(n: torch.fx.Node, t: Translator) -> str:
    """histc(x, bins, min, max) with a given range (a mixture of experts' tokens per expert):
    each value's bin (the last one holds max), counted by a one-hot sum; values outside the range
    are left out."""
    x = n.args[0]
    bins, lo, hi = int(_arg(n, 1, "bins", 100)), float(_arg(n, 2, "min", 0)), _arg(n, 3, "max", 0)
    hi = float(hi)
    if not hi > lo or not val(x).dtype.is_floating_point:
        t.unsupported(n, "histc over the data's own range (min == max) or of integers")
    xv = t.value(x)
    pos = t.emit(
        "Div",
        [
            t.emit("Mul", [t.emit("Sub", [xv, t.scalar(lo, x)]), t.scalar(bins, x)]),
            t.scalar(hi - lo, x),
        ],
    )
    index = t.emit(
        "Min",
        [
            t.emit("Cast", [t.emit("Floor", [pos])], to=t.onnx_dtype(torch.int64)),
            t.ints([bins - 1]),
        ],
    )
    inside = t.emit(
        "And",
        [
            t.emit("GreaterOrEqual", [xv, t.scalar(lo, x)]),
            t.emit("LessOrEqual", [xv, t.scalar(hi, x)]),
        ],
    )
    index = t.emit("Where", [inside, index, t.ints([-1])])  # outside: no bin matches
    flat = t.emit("Reshape", [index, t.ints([-1, 1])])
    hits = t.emit(
        "Equal",
        [
            flat,
            t.emit(
                "Range",
                [
                    t.scalar_of(0, torch.int64),
                    t.scalar_of(bins, torch.int64),
                    t.scalar_of(1, torch.int64),
                ],
            ),
        ],
    )
    counts = t.emit(
        "ReduceSum",
        [t.emit("Cast", [hits], to=t.onnx_dtype(val(n).dtype)), t.ints([0])],
        keepdims=0,
    )
    return t.emit("StopGradient", [counts], domain=GT)


@op(aten.index_put.default, aten.index_put_.default)
def _index_put(n: torch.fx.Node, t: Translator) -> str:
    """x[idx] = v along the first dim (accumulate: +=) as ScatterND; v broadcast to the rows it
    fills."""
    x, indices, values = n.args[0], n.args[1], n.args[2]
    accumulate = bool(_arg(n, 3, "accumulate", False))
    if len(indices) != 1 or indices[0] is None or val(indices[0]).dtype != torch.int64:
        t.unsupported(n, "index_put other than with one int64 index tensor on the first dim")
    idx = t.value(indices[0])
    rows = t.emit(
        "Concat", [t.emit("Shape", [idx]), t.emit("Shape", [t.value(x)], start=1)], axis=0
    )
    v = t.value(values)
    if val(values).dtype != val(x).dtype:
        v = t.emit("Cast", [v], to=t.onnx_dtype(val(x).dtype))
    return t.emit(
        "ScatterND",
        [t.value(x), t.emit("Unsqueeze", [idx, t.ints([-1])]), t.emit("Expand", [v, rows])],
        reduction="add" if accumulate else "none",
    )


@op(aten.argmax.default, aten.argmin.default)
def _argmax(n: torch.fx.Node, t: Translator) -> str:
    x, dim, keep = n.args[0], _arg(n, 1, "dim", None), bool(_arg(n, 2, "keepdim", False))
    op_type = "ArgMax" if n.target == aten.argmax.default else "ArgMin"
    if val(x).dtype != torch.float32:
        t.unsupported(n, f"{op_type.lower()} of a {val(x).dtype} tensor")
    if dim is None:  # over the flattened tensor
        if keep:
            t.unsupported(n, f"{op_type.lower()} over every dim with keepdim")
        flat = t.emit("Reshape", [t.value(x), t.ints([-1])])
        return t.emit(op_type, [flat], axis=0, keepdims=0)
    return t.emit(op_type, [t.value(x)], axis=axis(dim, rank(x)), keepdims=int(keep))


@op(aten.max.default, aten.min.default)
def _max_all(n: torch.fx.Node, t: Translator) -> str:
    """The largest (smallest) element; its gradient shared among equals, as torch's."""
    op_type = "ReduceMax" if n.target == aten.max.default else "ReduceMin"
    if val(n.args[0]).dtype != torch.float32:
        t.unsupported(n, f"max / min of a {val(n.args[0]).dtype} tensor")
    return t.emit(op_type, [t.value(n.args[0])], keepdims=0)


def _permuted(t: Translator, x: str, labels: list[str], order: list[str]) -> str:
    """x with its dims (named by `labels`) in `order`."""
    if labels == order:
        return x
    return t.emit("Transpose", [x], perm=[labels.index(c) for c in order])


@op(aten.einsum.default)
def _einsum(n: torch.fx.Node, t: Translator) -> str:
    """One or two operands, each label once per operand: a sum over labels only one operand has,
    then a broadcast Mul (nothing contracted) or one batched MatMul (one label contracted, and
    several free labels in at most one operand), and transposes."""
    equation, xs = n.args[0].replace(" ", ""), list(n.args[1])
    if "->" not in equation or "." in equation or len(xs) not in (1, 2):
        t.unsupported(n, f"einsum '{equation}' (one or two operands, an explicit output, no ...)")
    ins, out = equation.split("->")
    specs = [list(s) for s in ins.split(",")]
    out_labels = list(out)
    if any(len(set(s)) != len(s) for s in specs + [out_labels]):
        t.unsupported(n, f"einsum '{equation}' with a label repeated in one operand (a diagonal)")
    values = [t.value(x) for x in xs]
    for i, spec in enumerate(specs):  # labels no other operand and not the output has: summed
        others = set(out_labels).union(*[set(s) for j, s in enumerate(specs) if j != i])
        gone = [c for c in spec if c not in others]
        if gone:
            values[i] = t.emit(
                "ReduceSum", [values[i], t.ints([spec.index(c) for c in gone])], keepdims=0
            )
            specs[i] = [c for c in spec if c not in gone]
    if len(specs) == 1:
        return _permuted(t, values[0], specs[0], out_labels)
    contracted = [c for c in specs[0] if c in specs[1] and c not in out_labels]
    if not contracted:  # a broadcast product, each operand's dims in the output's order
        parts = []
        for v, spec in zip(values, specs):
            v = _permuted(t, v, spec, [c for c in out_labels if c in spec])
            missing = [i for i, c in enumerate(out_labels) if c not in spec]
            parts.append(t.emit("Unsqueeze", [v, t.ints(missing)]) if missing else v)
        return t.emit("Mul", parts)
    if len(contracted) > 1:
        t.unsupported(n, f"einsum '{equation}' contracting several labels")
    free = [[c for c in s if c not in specs[1 - i]] for i, s in enumerate(specs)]
    p = 0 if len(free[1]) <= 1 else 1  # the operand whose free labels lead the MatMul's rows
    q = 1 - p
    if len(free[q]) > 1:
        t.unsupported(n, f"einsum '{equation}' with several free labels in both operands")
    batch = [c for c in out_labels if c in specs[0] and c in specs[1]]
    nb, k = len(batch), contracted
    a = _permuted(t, values[p], specs[p], batch + free[p] + k)
    b = _permuted(t, values[q], specs[q], batch + k + free[q])
    if not free[p]:  # rows of 1
        a = t.emit("Unsqueeze", [a, t.ints([nb])])
    if not free[q]:  # a column of 1
        b = t.emit("Unsqueeze", [b, t.ints([nb + 1])])
    if len(free[p]) > 1:  # b broadcast over p's leading free dims
        b = t.emit("Unsqueeze", [b, t.ints(list(range(nb, nb + len(free[p]) - 1)))])
    y = t.emit("MatMul", [a, b])
    rows = max(len(free[p]), 1)
    dropped = ([nb] if not free[p] else []) + ([nb + rows] if not free[q] else [])
    if dropped:
        y = t.emit("Squeeze", [y, t.ints(dropped)])
    return _permuted(t, y, batch + free[p] + free[q], out_labels)


@op(aten.broadcast_tensors.default)
def _broadcast_tensors(n: torch.fx.Node, t: Translator) -> list[str]:
    xs = list(n.args[0])
    out = []
    for i, (x, v) in enumerate(zip(xs, val(n))):
        name = t.value(x)
        if tuple(val(x).shape) == tuple(v.shape):
            out.append(name)
        elif all(isinstance(s, int) for s in v.shape):
            out.append(t.emit("Expand", [name, t.ints(list(v.shape))]))
        else:  # Expand broadcasts both ways: against every other tensor's shape in turn
            for j, other in enumerate(xs):
                if j != i:
                    name = t.emit("Expand", [name, t.emit("Shape", [t.value(other)])])
            out.append(name)
    return out


@op(aten.cross_entropy_loss.default)
def _cross_entropy(n: torch.fx.Node, t: Translator) -> str:
    scores, target, weight = n.args[0], n.args[1], _arg(n, 2, "weight", None)
    reduction = _arg(n, 3, "reduction", 1)
    reduction = 1 if reduction is None else reduction
    ignore = _arg(n, 4, "ignore_index", -100)
    ignore = -100 if ignore is None else int(ignore)
    smoothing = float(_arg(n, 5, "label_smoothing", 0.0) or 0.0)
    probabilities = val(target).dtype.is_floating_point
    inputs = [t.value(scores), t.value(target)] + ([t.value(weight)] if weight is not None else [])
    if not probabilities:
        nll = t.emit(
            "SoftmaxCrossEntropyLoss",
            inputs,
            reduction=["none", "mean", "sum"][reduction],
            ignore_index=ignore,
        )
        if not smoothing:
            return nll
    # Label smoothing or class probabilities: torch's formulas over log_softmax, class dim 1.
    if rank(scores) < 2 or not isinstance(val(scores).shape[1], int):
        t.unsupported(n, "cross entropy on one item, or over a changing number of classes")
    classes = val(scores).shape[1]
    logp = t.emit("LogSoftmax", [t.value(scores)], axis=1)
    if weight is not None:  # the class weights along dim 1
        shape = [1, classes] + [1] * (rank(scores) - 2)
        logp = t.emit("Mul", [logp, t.emit("Reshape", [t.value(weight), t.ints(shape)])])
    classes_axis = t.ints([1])
    if probabilities:  # -sum_c w_c y_c logp_c per item; the mean over items, whatever the weights
        y = t.promoted(target, 0.0, val(scores).dtype)[0]
        if smoothing:
            y = t.emit("Mul", [y, t.scalar(1.0 - smoothing, n)])
            y = t.emit("Add", [y, t.scalar(smoothing / classes, n)])
        per_item = t.emit("ReduceSum", [t.emit("Mul", [logp, y]), classes_axis], keepdims=0)
        return _reduced(t, t.emit("Neg", [per_item]), reduction)
    # Class indices with smoothing: (1 - e) nll + e / C * (-sum_c w_c logp_c), the second term 0
    # for ignored items and its mean over the weights of the kept targets (torch's)
    _, kept, weights = _kept_targets(t, target, ignore, weight, val(scores).dtype)
    smooth = t.emit("ReduceSum", [logp, classes_axis], keepdims=0)
    smooth = t.emit("Mul", [t.emit("Neg", [smooth]), kept])
    if reduction == 1:
        smooth = t.emit(
            "Div",
            [t.emit("ReduceSum", [smooth], keepdims=0), t.emit("ReduceSum", [weights], keepdims=0)],
        )
    elif reduction == 2:
        smooth = t.emit("ReduceSum", [smooth], keepdims=0)
    return t.emit(
        "Add",
        [
            t.emit("Mul", [nll, t.scalar(1.0 - smoothing, n)]),
            t.emit("Mul", [smooth, t.scalar(smoothing / classes, n)]),
        ],
    )


@op(aten.native_dropout.default)
def _native_dropout(n: torch.fx.Node, t: Translator) -> list[str]:
    """A functionalized graph's dropout: (output, mask)."""
    x, p, train = n.args[0], float(n.args[1]), n.args[2]
    if train is False or p == 0.0:
        out = t.emit("Identity", [t.value(x)])
        ones = t.emit(
            "ConstantOfShape",
            [t.emit("Shape", [out])],
            value=t.tensor_attr(t.const(np.array([True]))),
        )
        return [out, ones]
    ratio = t.const(np.array(p, np.float32))
    return t.emit("Dropout", [t.value(x), ratio, t.const(np.array(True))], n_out=2)


@op(aten.dropout.default, aten.dropout_.default)
def _dropout(n: torch.fx.Node, t: Translator) -> str:
    x, p, train = n.args[0], float(n.args[1]), bool(n.args[2])
    if not train or p == 0.0:
        out = t.emit("Identity", [t.value(x)])
    else:
        out = t.emit(
            "Dropout",
            [t.value(x), t.const(np.array(p, np.float32)), t.const(np.array(True))],
            n_out=2,
        )[0]
    return out


_RANDOM = {
    aten.rand.default: "RandomUniformLike",
    aten.rand_like.default: "RandomUniformLike",
    aten.randn.default: "RandomNormalLike",
    aten.randn_like.default: "RandomNormalLike",
}


@op(*_RANDOM)
def _random(n: torch.fx.Node, t: Translator) -> str:
    """torch.rand / randn (drop path's mask) on graphtrain's generator: like Dropout, the values
    are statistically torch's but not the same draws."""
    dtype = val(n).dtype
    if n.target in (aten.rand.default, aten.randn.default):
        like = _filled(t, dtype, t.shape_vector(n.args[0]), 0)
    else:
        like = t.value(n.args[0])
    return t.emit(_RANDOM[n.target], [like], dtype=t.onnx_dtype(dtype))


@op(aten.bernoulli.p, aten.bernoulli_.float, aten.bernoulli.default)
def _bernoulli(n: torch.fx.Node, t: Translator) -> str:
    """bernoulli(probabilities), and bernoulli.p: `x.new_empty(shape).bernoulli_(p)` (timm's drop
    path), where only x's shape counts."""
    dtype = val(n).dtype
    x = t.value(n.args[0])
    if n.target == aten.bernoulli.default:
        return t.emit("Bernoulli", [x], dtype=t.onnx_dtype(dtype))
    p = n.args[1] if len(n.args) > 1 else n.kwargs.get("p", 0.5)
    u = t.emit("RandomUniformLike", [x], dtype=t.onnx_dtype(dtype))
    return t.emit("Cast", [t.emit("Less", [u, t.scalar(p, n)])], to=t.onnx_dtype(dtype))


_UPSAMPLE = {  # op -> (mode, its ONNX Resize attributes; align_corners added per call)
    aten.upsample_bilinear2d.vec: "linear",
    aten.upsample_bilinear2d.default: "linear",
    aten.upsample_linear1d.vec: "linear",
    aten.upsample_linear1d.default: "linear",
    aten.upsample_nearest2d.vec: "nearest",
    aten.upsample_nearest2d.default: "nearest",
    aten.upsample_nearest1d.vec: "nearest",
    aten.upsample_nearest1d.default: "nearest",
    aten._upsample_nearest_exact2d.vec: "nearest-exact",
    aten._upsample_nearest_exact2d.default: "nearest-exact",
    aten._upsample_nearest_exact1d.vec: "nearest-exact",
    aten._upsample_nearest_exact1d.default: "nearest-exact",
}


@op(*_UPSAMPLE)
def _upsample(n: torch.fx.Node, t: Translator) -> str:
    """F.interpolate (nearest, nearest-exact, linear, bilinear) as ONNX Resize over the spatial
    axes, with torch's source coordinates: ResizeGrad gives its gradient."""
    mode = _UPSAMPLE[n.target]
    x, size, rest = n.args[0], n.args[1], list(n.args[2:])
    spatial = rank(x) - 2
    align = bool(rest.pop(0)) if mode == "linear" else False
    if n.target.name().endswith(".vec"):  # (output_size, [align_corners,] scale_factors)
        scales = rest[0] if rest else None
    else:  # (output_size, [align_corners,] scales per axis, each optional)
        scales = rest[:spatial] if len(rest) >= spatial else None
        if scales is not None and any(s is None for s in scales):
            scales = None
    attrs: dict[str, Any] = {"mode": "linear" if mode == "linear" else "nearest"}
    attrs["axes"] = list(range(2, 2 + spatial))
    if mode == "linear":
        attrs["coordinate_transformation_mode"] = "align_corners" if align else "half_pixel"
    elif mode == "nearest":  # floor(o * in / out), torch's nearest_idx
        attrs.update(coordinate_transformation_mode="asymmetric", nearest_mode="floor")
    else:  # floor((o + 0.5) * in / out)
        attrs.update(coordinate_transformation_mode="half_pixel", nearest_mode="round_prefer_ceil")
    if scales is None:
        return t.emit("Resize", [t.value(x), "", "", t.shape_vector(size)], **attrs)
    factors = np.array(scales, np.float32)
    if mode != "linear" and any(float(f) != s for f, s in zip(factors, scales)):
        t.unsupported(n, f"nearest interpolation by scale factors {scales} (not float32 values)")
    for i, f, o in zip(val(x).shape[2:], factors, val(n).shape[2:]):
        if isinstance(i, int) and isinstance(o, int) and math.floor(i * float(f)) != o:
            t.unsupported(n, f"interpolation by scale factors {scales} to sizes {size}")
    return t.emit("Resize", [t.value(x), "", t.const(factors)], **attrs)


@op(aten.rms_norm.default)
def _rms_norm(n: torch.fx.Node, t: Translator) -> str:
    x, shape = n.args[0], n.args[1]
    weight = n.args[2] if len(n.args) > 2 else None
    eps = n.args[3] if len(n.args) > 3 else None
    if eps is None:
        eps = torch.finfo(val(x).dtype).eps
    axes = list(range(rank(x) - len(shape), rank(x)))
    xv = t.value(x)
    ms = t.emit("ReduceMean", [t.emit("Mul", [xv, xv]), t.ints(axes)], keepdims=1)
    out = t.emit(
        "Mul", [xv, t.emit("Reciprocal", [t.emit("Sqrt", [t.emit("Add", [ms, t.scalar(eps, x)])])])]
    )
    return t.emit("Mul", [out, t.value(weight)]) if weight is not None else out


@op(aten._native_batch_norm_legit_functional.default)
def _batch_norm_functional(n: torch.fx.Node, t: Translator) -> list[str | None]:
    """A functionalized graph's training batch norm: (y, -, -, new running mean, new running var);
    the graph returns the new statistics as buffer updates."""
    x, w, b, mean, var, training, momentum, eps = n.args[:8]
    if not training:
        return [
            _batch_norm_nodes(t, n, x, w, b, mean, var, False, momentum, eps),
            None,
            None,
            None,
            None,
        ]
    y, new_mean, new_var = _batch_norm_nodes(t, n, x, w, b, mean, var, True, momentum, eps)
    return [y, None, None, new_mean, new_var]


@op(aten._native_batch_norm_legit_no_training.default)
def _batch_norm_eval(n: torch.fx.Node, t: Translator) -> list[str | None]:
    x, w, b, mean, var, momentum, eps = n.args[:7]
    return [_batch_norm_nodes(t, n, x, w, b, mean, var, False, momentum, eps), None, None]


def _batch_norm_nodes(
    t: Translator,
    n: torch.fx.Node,
    x: Any,
    w: Any,
    b: Any,
    mean: Any,
    var: Any,
    training: bool,
    momentum: float,
    eps: float,
) -> Any:
    c = val(x).shape[1]
    w_name = t.value(w) if w is not None else t.const(np.ones(c, np.float32))
    b_name = t.value(b) if b is not None else t.const(np.zeros(c, np.float32))
    if mean is None or var is None:
        t.unsupported(n, "batch norm without running statistics")
    inputs = [t.value(x), w_name, b_name, t.value(mean), t.value(var)]
    if not training:
        return t.emit("BatchNormalization", inputs, epsilon=float(eps))
    return t.emit(
        "BatchNormalization",
        inputs,
        n_out=3,
        domain=GT,
        epsilon=float(eps),
        momentum=float(momentum),
    )


@op(aten.batch_norm.default)
def _batch_norm(n: torch.fx.Node, t: Translator) -> str:
    x, w, b, mean, var, training, momentum, eps = n.args[:8]
    if not training:
        return _batch_norm_nodes(t, n, x, w, b, mean, var, False, momentum, eps)
    y, new_mean, new_var = _batch_norm_nodes(t, n, x, w, b, mean, var, True, momentum, eps)
    t.mutated(mean, new_mean)
    t.mutated(var, new_var)
    return y


# ---- convolution and pooling -------------------------------------------------------------------


def _pair(v: Any, spatial: int) -> list[int]:
    v = list(v) if isinstance(v, (list, tuple)) else [v]
    return v * spatial if len(v) == 1 else v


@op(aten.conv2d.default, aten.conv1d.default, aten.conv2d.padding, aten.conv1d.padding)
def _conv(n: torch.fx.Node, t: Translator) -> str:
    args = list(n.args) + [None] * 7
    x, w, b, stride, padding, dilation, groups = args[:7]
    spatial = rank(x) - 2
    attrs: dict[str, Any] = {
        "strides": _pair(stride or 1, spatial),
        "dilations": _pair(dilation or 1, spatial),
        "group": int(groups or 1),
    }
    if isinstance(padding, str):
        if padding == "same":
            attrs["auto_pad"] = "SAME_UPPER"
        elif padding != "valid":
            t.unsupported(n, f"padding '{padding}'")
    else:
        p = _pair(padding or 0, spatial)
        attrs["pads"] = p + p
    inputs = [t.value(x), t.value(w)] + ([t.value(b)] if b is not None else [])
    return t.emit("Conv", inputs, **attrs)


@op(aten.max_pool2d.default)
def _max_pool(n: torch.fx.Node, t: Translator) -> str:
    args = list(n.args) + [None] * 6
    x, kernel, stride, padding, dilation, ceil = args[:6]
    k = _pair(kernel, 2)
    s = _pair(stride, 2) if stride not in (None, []) else k
    p = _pair(padding or 0, 2)
    out = t.emit(
        "MaxPool",
        [t.value(x)],
        n_out=2,
        kernel_shape=k,
        strides=s,
        pads=p + p,
        dilations=_pair(dilation or 1, 2),
        ceil_mode=int(bool(ceil)),
    )
    return out[0]


@op(aten.avg_pool2d.default)
def _avg_pool(n: torch.fx.Node, t: Translator) -> str:
    args = list(n.args) + [None] * 7
    x, kernel, stride, padding, ceil, include_pad, divisor = args[:7]
    if divisor is not None:
        t.unsupported(n, "avg_pool2d with divisor_override")
    k = _pair(kernel, 2)
    s = _pair(stride, 2) if stride not in (None, []) else k
    p = _pair(padding or 0, 2)
    return t.emit(
        "AveragePool",
        [t.value(x)],
        kernel_shape=k,
        strides=s,
        pads=p + p,
        ceil_mode=int(bool(ceil)),
        count_include_pad=int(True if include_pad is None else bool(include_pad)),
    )


@op(aten.adaptive_avg_pool1d.default)
def _adaptive_avg_pool1d(n: torch.fx.Node, t: Translator) -> str:
    if _pair(n.args[1], 1) != [1]:
        t.unsupported(n, "adaptive_avg_pool1d to other than 1")
    return t.emit("ReduceMean", [t.value(n.args[0]), t.ints([-1])], keepdims=1)


@op(aten.adaptive_avg_pool2d.default)
def _adaptive_avg_pool(n: torch.fx.Node, t: Translator) -> str:
    size = _pair(n.args[1], 2)
    if size != [1, 1]:
        t.unsupported(n, f"adaptive_avg_pool2d to {size} (only (1, 1) is supported)")
    return t.emit("GlobalAveragePool", [t.value(n.args[0])])


# ---- symbolic sizes ----------------------------------------------------------------------------


@op(aten.sym_size.int)
def _sym_size(n: torch.fx.Node, t: Translator) -> str:
    d = n.args[1]
    r = rank(n.args[0])
    d = axis(d, r)
    return t.emit("Shape", [t.value(n.args[0])], start=d, end=d + 1)


def _sym_binary(onnx_op: str) -> Callable:
    def translate(n: torch.fx.Node, t: Translator) -> str:
        return t.emit(onnx_op, [t.shape_vector([n.args[0]]), t.shape_vector([n.args[1]])])

    return translate


op(operator.mul)(_sym_binary("Mul"))
op(operator.add)(_sym_binary("Add"))
op(operator.sub)(_sym_binary("Sub"))
op(operator.floordiv)(_sym_binary("Div"))
op(operator.mod)(_sym_binary("Mod"))
op(torch.sym_min)(_sym_binary("Min"))
op(torch.sym_max)(_sym_binary("Max"))

# Checks torch.export inserts; nothing to compute.
SKIPPED = {
    aten._assert_tensor_metadata.default,
    torch.ops.aten._assert_scalar.default,
    torch.ops.aten.sym_constrain_range_for_size.default,
}

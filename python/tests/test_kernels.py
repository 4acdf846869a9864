"""Every CPU kernel against a numpy or torch reference, over shapes with broadcasting, size-1 and
empty dims, odd sizes that defeat vector widths, and strided (non-contiguous) sources."""

import itertools

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from onnx import TensorProto, helper

import graphtrain
import graphtrain.engine as ge
from onnx_util import node_model, run_graphtrain, run_node, run_ort

rng = np.random.default_rng(0)


def randn(*shape, dtype=np.float32):
    return np.asarray(rng.standard_normal(shape), dtype=dtype)


def close(a, b, rtol=1e-5, atol=1e-6):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=rtol, atol=atol)


BROADCAST_SHAPES = [
    ((3, 4), (3, 4)),
    ((2, 3, 4), (4,)),
    ((2, 1, 4), (1, 3, 1)),
    ((5,), ()),
    ((), (2, 3)),
    ((0, 3), (3,)),
    ((7, 13), (7, 1)),
    ((1, 1023), (17, 1)),
    ((2, 3, 1, 5), (3, 4, 1)),
]


@pytest.mark.parametrize(
    "op, fn", [("Add", np.add), ("Sub", np.subtract), ("Mul", np.multiply), ("Div", np.divide)]
)
@pytest.mark.parametrize("sa, sb", BROADCAST_SHAPES)
def test_binary_arithmetic_float(op, fn, sa, sb):
    a, b = randn(*sa), randn(*sb)
    if op == "Div":
        b = np.where(np.abs(b) < 0.1, 0.5, b).astype(np.float32)
    (out,) = run_node(op, {"a": a, "b": b})
    close(out, fn(a, b))


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div"])
def test_binary_arithmetic_int64(op):
    a = rng.integers(-50, 50, (4, 5)).astype(np.int64)
    b = rng.integers(1, 9, (5,)).astype(np.int64)
    (out,) = run_node(op, {"a": a, "b": b}, out_types=[TensorProto.INT64])
    ref = {"Add": a + b, "Sub": a - b, "Mul": a * b, "Div": np.trunc(a / b).astype(np.int64)}[op]
    np.testing.assert_array_equal(out, ref)


@pytest.mark.parametrize("e", [2.0, 0.5, 3.0, -1.5])
def test_pow(e):
    a = np.abs(randn(3, 7)) + 0.1
    (out,) = run_node("Pow", {"a": a, "e": np.array(e, np.float32)})
    close(out, np.power(a, np.float32(e)), rtol=1e-5)


@pytest.mark.parametrize(
    "op, fn",
    [
        ("Equal", np.equal),
        ("Less", np.less),
        ("Greater", np.greater),
        ("LessOrEqual", np.less_equal),
        ("GreaterOrEqual", np.greater_equal),
    ],
)
def test_compare(op, fn):
    a = rng.integers(0, 3, (4, 1, 5)).astype(np.float32)
    b = rng.integers(0, 3, (3, 1)).astype(np.float32)
    (out,) = run_node(op, {"a": a, "b": b}, out_types=[TensorProto.BOOL])
    np.testing.assert_array_equal(out, fn(a, b))


def test_where_and_not():
    c = rng.random((2, 1, 5)) > 0.5
    x, y = randn(3, 5), randn(2, 3, 1)
    (out,) = run_node("Where", {"c": c, "x": x, "y": y})
    close(out, np.where(c, x, y))
    (neg,) = run_node("Not", {"c": c}, out_types=[TensorProto.BOOL])
    np.testing.assert_array_equal(neg, ~c)


@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.float16, np.bool_])
@pytest.mark.parametrize("cs, xs, ys", list(itertools.product([1, 1037], repeat=3)))
def test_where_broadcasts_each_operand(dtype, cs, xs, ys):
    # Every pair of a contiguous and a broadcast last dim among the condition and the two values
    # (the kernel's compiled row loops), rows long enough for vector loops and for a row split
    # between threads, elements of 4, 8, 2 and 1 bytes, and a condition that flips at random.
    c = rng.random((3, cs)) > 0.5
    x = (rng.standard_normal((3, xs)) * 100).astype(dtype)
    y = (rng.standard_normal((1, ys)) * 100).astype(dtype)
    onnx_type = {np.float32: TensorProto.FLOAT, np.int64: TensorProto.INT64}.get(
        dtype, TensorProto.FLOAT16 if dtype == np.float16 else TensorProto.BOOL
    )
    (out,) = run_node("Where", {"c": c, "x": x, "y": y}, out_types=[onnx_type])
    np.testing.assert_array_equal(out, np.where(c, x, y))


def positive(x):
    return (np.abs(x) + 0.1).astype(np.float32)


def torch_fn(fn):
    return lambda x: fn(torch.from_numpy(np.asarray(x))).numpy()


# (op, reference, input domain)
UNARY = [
    ("Sqrt", np.sqrt, positive),
    ("Reciprocal", np.reciprocal, positive),
    ("Exp", np.exp, None),
    ("Log", np.log, positive),
    ("Neg", np.negative, None),
    ("Abs", np.abs, None),
    ("Relu", lambda x: np.maximum(x, 0), None),
    ("Tanh", np.tanh, None),
    ("Sigmoid", torch_fn(torch.sigmoid), None),
    ("Erf", torch_fn(torch.erf), None),
    ("Softplus", torch_fn(F.softplus), lambda x: x * 20),
    ("Floor", np.floor, None),
    ("Ceil", np.ceil, None),
    ("Round", np.rint, None),
]


@pytest.mark.parametrize("op", ["Softplus", "Floor", "Ceil", "Round"])
def test_rounding_and_softplus_match_onnxruntime(op):
    """ONNX's own ops, against onnxruntime: Round takes halves to even; Softplus far from 0."""
    x = np.concatenate([randn(64) * 30, np.array([0.5, 1.5, 2.5, -0.5, -2.5, 0.0], np.float32)])
    model = node_model(op, {"x": x})
    close(run_graphtrain(model, {"x": x})[0], run_ort(model, {"x": x})[0], rtol=2e-6)


@pytest.mark.parametrize("op, ref", [("Log1p", np.log1p), ("Expm1", np.expm1)])
def test_log1p_expm1_are_exact_near_zero(op, ref):
    """graphtrain's Log1p and Expm1 keep their precision where 1 + x and e^x round to 1."""
    x = np.concatenate([randn(100) * 1e-6, np.maximum(randn(100), -0.9)]).astype(np.float32)
    model = node_model(op, {"x": x}, domain="graphtrain")
    model.opset_import.append(helper.make_opsetid("graphtrain", 1))
    close(run_graphtrain(model, {"x": x})[0], ref(x.astype(np.float64)), rtol=1e-6, atol=0)


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("axis, keep, last", [(1, 1, 0), (0, 0, 0), (-1, 0, 1), (2, 1, 1)])
def test_arg_max_min_match_onnxruntime(op, axis, keep, last):
    """Indices along an axis with ties (rounded values: the first of equals, or the last with
    select_last_index), against onnxruntime and numpy."""
    x = np.round(randn(3, 4, 5) * 2).astype(np.float32)
    attrs = {"axis": axis, "keepdims": keep, "select_last_index": last}
    model = node_model(op, {"x": x}, attrs, out_types=[TensorProto.INT64])
    (out,) = run_graphtrain(model, {"x": x})
    np.testing.assert_array_equal(out, run_ort(model, {"x": x})[0])
    if not last:
        ref = (np.argmax if op == "ArgMax" else np.argmin)(x, axis=axis)
        np.testing.assert_array_equal(out, np.expand_dims(ref, axis) if keep else ref)


def test_arg_max_takes_a_nan():
    x = np.array([[1.0, np.nan, 3.0, np.nan], [2.0, 5.0, 5.0, 1.0]], np.float32)
    model = node_model(
        "ArgMax", {"x": x}, {"axis": 1, "keepdims": 0}, out_types=[TensorProto.INT64]
    )
    np.testing.assert_array_equal(run_graphtrain(model, {"x": x})[0], [1, 1])


@pytest.mark.parametrize("op, ref, domain", UNARY)
@pytest.mark.parametrize("shape", [(1023,), (3, 0, 2), (), (4, 33)])
def test_unary(op, ref, domain, shape):
    x = np.asarray(randn(*shape) * 2, np.float32)
    if domain:
        x = domain(x)
    (out,) = run_node(op, {"x": x})
    close(out, ref(x), rtol=2e-6)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_and_leaky_relu(approximate):
    x = randn(5, 131) * 3
    (out,) = run_node("Gelu", {"x": x}, {"approximate": approximate}, opset=20)
    close(out, F.gelu(torch.from_numpy(x), approximate=approximate).numpy(), rtol=1e-5, atol=1e-6)
    (lr,) = run_node("LeakyRelu", {"x": x}, {"alpha": 0.2})
    close(lr, F.leaky_relu(torch.from_numpy(x), 0.2).numpy())


@pytest.mark.parametrize(
    "src, to, npt",
    [
        (np.float32, TensorProto.INT64, np.int64),
        (np.int64, TensorProto.FLOAT, np.float32),
        (np.bool_, TensorProto.FLOAT, np.float32),
        (np.float32, TensorProto.FLOAT16, np.float16),
        (np.float32, TensorProto.BOOL, np.bool_),
        (np.int32, TensorProto.INT64, np.int64),
    ],
)
def test_cast(src, to, npt):
    x = (randn(3, 5) * 10).astype(src)
    (out,) = run_node("Cast", {"x": x}, {"to": to}, out_types=[to])
    np.testing.assert_array_equal(out, x.astype(npt))


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize(
    "shape, axis", [((4, 7), -1), ((2, 3, 5), 1), ((3, 1), 0), ((2, 1000), 1), ((0, 4), 1)]
)
def test_softmax(op, shape, axis):
    x = randn(*shape) * 5
    (out,) = run_node(op, {"x": x}, {"axis": axis})
    fn = torch.softmax if op == "Softmax" else torch.log_softmax
    close(out, fn(torch.from_numpy(x), axis).numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "shape, axis", [((4, 16), -1), ((2, 3, 8), -1), ((2, 3, 8), 1), ((3, 1), -1)]
)
def test_layer_norm(shape, axis):
    x = randn(*shape) * 3 + 1
    norm = shape[axis:] if axis >= 0 else shape[axis:]
    w, b = randn(*norm), randn(*norm)
    y, mean, inv = run_node(
        "LayerNormalization", {"x": x, "w": w, "b": b}, {"axis": axis, "epsilon": 1e-5}, n_outputs=3
    )
    ref = F.layer_norm(torch.from_numpy(x), norm, torch.from_numpy(w), torch.from_numpy(b), 1e-5)
    close(y, ref.numpy(), rtol=1e-5, atol=1e-5)
    dims = tuple(range(len(shape) - len(norm), len(shape)))
    close(mean, x.mean(axis=dims, keepdims=True), rtol=1e-5, atol=1e-6)
    close(inv, 1 / np.sqrt(x.var(axis=dims, keepdims=True) + 1e-5), rtol=1e-4)
    (y2,) = run_node("LayerNormalization", {"x": x, "w": w, "b": None}, {"axis": axis})
    close(
        y2,
        F.layer_norm(torch.from_numpy(x), norm, torch.from_numpy(w), None, 1e-5).numpy(),
        rtol=1e-5,
        atol=1e-5,
    )


@pytest.mark.parametrize(
    "op, fn",
    [("ReduceSum", np.sum), ("ReduceMean", np.mean), ("ReduceMax", np.max), ("ReduceMin", np.min)],
)
@pytest.mark.parametrize("axes, keep", [([1], 1), ([0, 2], 0), ([-1], 1), (None, 0), ([1, 2], 1)])
def test_reduce(op, fn, axes, keep):
    x = randn(3, 4, 5)
    inputs = {"x": x, "axes": None if axes is None else np.array(axes, np.int64)}
    (out,) = run_node(op, inputs, {"keepdims": keep}, constant_inputs=("axes",))
    ref = fn(x, axis=None if axes is None else tuple(axes), keepdims=bool(keep))
    close(out, ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [np.int64, np.int32])
@pytest.mark.parametrize(
    "op, fn", [("ReduceSum", np.sum), ("ReduceMax", np.max), ("ReduceMin", np.min)]
)
@pytest.mark.parametrize("axes, keep", [([1], 1), ([0, 2], 0), ([-1], 0), (None, 1)])
def test_reduce_integers_exactly(dtype, op, fn, axes, keep):
    # Index arithmetic (BEiT's relative position index sums its coordinates over the last axis):
    # exact, in the element type.
    x = rng.integers(-(2**20), 2**20, (3, 4, 5)).astype(dtype)
    inputs = {"x": x, "axes": None if axes is None else np.array(axes, np.int64)}
    out_type = TensorProto.INT64 if dtype == np.int64 else TensorProto.INT32
    (out,) = run_node(
        op, inputs, {"keepdims": keep}, out_types=[out_type], constant_inputs=("axes",)
    )
    ref = fn(x, axis=None if axes is None else tuple(axes), keepdims=bool(keep))
    assert out.dtype == dtype
    np.testing.assert_array_equal(out, ref)


@pytest.mark.parametrize("shape", [(7, 9, 13), (3, 50, 20), (2, 2, 600)])
def test_reduce_sum_over_leading_axes(shape):
    """A bias gradient's sum over the leading axes: rows four at a time, blocks of 64 rows, and
    the rows left over."""
    x = randn(*shape)
    for op, fn in (("ReduceSum", np.sum), ("ReduceMean", np.mean)):
        (out,) = run_node(
            op,
            {"x": x, "axes": np.array([0, 1], np.int64)},
            {"keepdims": 0},
            constant_inputs=("axes",),
        )
        close(out, fn(x.astype(np.float64), axis=(0, 1)), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "shape, axes",
    [((16, 2, 2, 64, 32), [2]), ((3, 70, 5, 9), [1, 2]), ((4, 3, 5), [1]), ((2, 130, 3), [-2])],
)
@pytest.mark.parametrize("keep", [0, 1])
def test_reduce_sum_over_middle_axes(shape, axes, keep):
    """A sum over a block of middle axes (the gradient of grouped-query attention's repeated keys):
    output rows split between threads mid-row, blocks of 64 rows and the rows left over."""
    x = randn(*shape)
    for op, fn in (("ReduceSum", np.sum), ("ReduceMean", np.mean)):
        (out,) = run_node(
            op,
            {"x": x, "axes": np.array(axes, np.int64)},
            {"keepdims": keep},
            constant_inputs=("axes",),
        )
        ref = fn(x.astype(np.float64), axis=tuple(axes), keepdims=bool(keep))
        close(out, ref, rtol=1e-5, atol=1e-5)


def test_reduce_sum_long_row_is_accurate():
    x = (rng.random((2, 100_003)) + 1000).astype(np.float32)
    (out,) = run_node(
        "ReduceSum",
        {"x": x, "axes": np.array([1], np.int64)},
        {"keepdims": 0},
        constant_inputs=("axes",),
    )
    close(out, x.astype(np.float64).sum(axis=1), rtol=1e-6)


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_gather(axis):
    data = randn(5, 6, 7)
    idx = np.array([[0, 4], [-1, 2]], np.int64)
    (out,) = run_node("Gather", {"d": data, "i": idx}, {"axis": axis})
    np.testing.assert_array_equal(
        out, np.take(data, np.where(idx < 0, idx + data.shape[axis], idx), axis=axis)
    )


def test_gather_out_of_range_names_the_index():
    with pytest.raises(Exception, match="index 9 is out of range"):
        run_node("Gather", {"d": randn(5, 3), "i": np.array([9], np.int64)})


@pytest.mark.parametrize(
    "target, expected",
    [([0, -1], (2, 12)), ([4, 6], (4, 6)), ([-1], (24,)), ([2, 3, 0], (2, 3, 4))],
)
def test_reshape(target, expected):
    x = randn(2, 3, 4)
    (out,) = run_node("Reshape", {"x": x, "s": np.array(target, np.int64)}, constant_inputs=("s",))
    assert out.shape == expected
    np.testing.assert_array_equal(out.ravel(), x.ravel())


@pytest.mark.parametrize("perm", [[1, 0, 2], [2, 0, 1], [0, 2, 1], None, [3, 1, 2, 0]])
def test_transpose(perm):
    x = randn(2, 3, 5, 7) if perm and len(perm) == 4 else randn(3, 5, 7)
    (out,) = run_node("Transpose", {"x": x}, {} if perm is None else {"perm": perm})
    np.testing.assert_array_equal(out, np.transpose(x, perm))


@pytest.mark.parametrize(
    "shape, target", [((3, 1), [2, 3, 4]), ((1,), [5]), ((2, 1, 3), [2, 4, 3]), ((4,), [1])]
)
def test_expand(shape, target):
    x = randn(*shape)
    (out,) = run_node("Expand", {"x": x, "s": np.array(target, np.int64)}, constant_inputs=("s",))
    np.testing.assert_array_equal(out, x * np.ones(target, np.float32))


@pytest.mark.parametrize("dtype", [np.bool_, np.int64, np.float16, np.int32])
def test_expand_and_transpose_of_other_element_sizes(dtype):
    """1-, 2-, 4- and 8-byte elements: a mask [b, 1, t, 1] broadcast along its last dim (BERT's
    extended attention mask), and a transpose that reads its rows with a stride."""
    x = (rng.standard_normal((3, 1, 5, 1)) * 9).astype(dtype)
    (out,) = run_node(
        "Expand", {"x": x, "s": np.array([3, 2, 5, 7], np.int64)}, constant_inputs=("s",)
    )
    np.testing.assert_array_equal(out, np.broadcast_to(x, (3, 2, 5, 7)))
    y = (rng.standard_normal((4, 3, 5)) * 9).astype(dtype)
    (out,) = run_node("Transpose", {"x": y}, {"perm": [2, 0, 1]})
    np.testing.assert_array_equal(out, np.transpose(y, (2, 0, 1)))


def test_unsqueeze_squeeze_flatten():
    x = randn(3, 4)
    (u,) = run_node("Unsqueeze", {"x": x, "a": np.array([0, -1], np.int64)}, constant_inputs=("a",))
    assert u.shape == (1, 3, 4, 1)
    (s,) = run_node("Squeeze", {"x": u, "a": np.array([0], np.int64)}, constant_inputs=("a",))
    assert s.shape == (3, 4, 1)
    (s2,) = run_node("Squeeze", {"x": u, "a": None})
    assert s2.shape == (3, 4)
    (f,) = run_node("Flatten", {"x": randn(2, 3, 4, 5)}, {"axis": 2})
    assert f.shape == (6, 20)


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_concat_and_split(axis):
    a, b, c = randn(2, 3, 4), randn(2, 3, 4), randn(2, 3, 4)
    (out,) = run_node("Concat", {"a": a, "b": b, "c": c}, {"axis": axis})
    np.testing.assert_array_equal(out, np.concatenate([a, b, c], axis=axis))
    parts = run_node(
        "Split",
        {"x": out, "s": np.array([1, 2], np.int64) * out.shape[axis] // 3},
        {"axis": axis},
        n_outputs=2,
        constant_inputs=("s",),
    )
    ref = np.split(out, [out.shape[axis] // 3], axis=axis)
    for p, r in zip(parts, ref):
        np.testing.assert_array_equal(p, r)
    even = run_node("Split", {"x": out, "s": None}, {"axis": axis}, n_outputs=3)
    for p, r in zip(even, np.split(out, 3, axis=axis)):
        np.testing.assert_array_equal(p, r)


@pytest.mark.parametrize(
    "starts, ends, axes, steps",
    [
        ([1], [3], [0], [1]),
        ([0, 1], [10, -1], [0, 2], [1, 2]),
        ([-1], [-100], [1], [-1]),
        ([2], [2**62], [2], [1]),
        ([3], [0], [0], [-2]),
        ([0], [0], [1], [1]),
    ],
)
def test_slice(starts, ends, axes, steps):
    x = randn(4, 5, 6)
    inputs = {
        "x": x,
        "s": np.array(starts, np.int64),
        "e": np.array(ends, np.int64),
        "a": np.array(axes, np.int64),
        "t": np.array(steps, np.int64),
    }
    (out,) = run_node("Slice", inputs, constant_inputs=("s", "e", "a", "t"))
    sl = [slice(None)] * 3
    for s, e, a, t in zip(starts, ends, axes, steps):
        sl[a] = slice(s, e if e > -100 else None, t)
    np.testing.assert_array_equal(out, x[tuple(sl)])


def test_constants_shape_range_trilu():
    x = randn(3, 4, 5)
    (sh,) = run_node("Shape", {"x": x}, {"start": 1}, out_types=[TensorProto.INT64], opset=18)
    np.testing.assert_array_equal(sh, [4, 5])
    (cos,) = run_node("ConstantOfShape", {"s": np.array([2, 3], np.int64)}, constant_inputs=("s",))
    np.testing.assert_array_equal(cos, np.zeros((2, 3), np.float32))
    (r,) = run_node(
        "Range",
        {"a": np.array(1, np.int64), "b": np.array(10, np.int64), "d": np.array(3, np.int64)},
        out_types=[TensorProto.INT64],
    )
    np.testing.assert_array_equal(r, np.arange(1, 10, 3))
    (rf,) = run_node(
        "Range",
        {
            "a": np.array(0.5, np.float32),
            "b": np.array(2.0, np.float32),
            "d": np.array(0.5, np.float32),
        },
    )
    close(rf, np.arange(0.5, 2.0, 0.5, dtype=np.float32))
    m = randn(2, 4, 5)
    for upper in (0, 1):
        for k in (-1, 0, 2):
            (t,) = run_node(
                "Trilu",
                {"x": m, "k": np.array(k, np.int64)},
                {"upper": upper},
                constant_inputs=("k",),
            )
            np.testing.assert_array_equal(t, np.triu(m, k) if upper else np.tril(m, k))


MATMUL_SHAPES = [
    ((3, 4), (4, 5)),
    ((2, 3, 4), (4, 5)),
    ((2, 3, 4), (2, 4, 5)),
    ((1, 3, 4), (2, 4, 5)),
    ((4,), (4, 5)),
    ((3, 4), (4,)),
    ((2, 1, 3, 4), (5, 4, 6)),
    ((3, 0), (0, 2)),
    ((0, 3), (3, 2)),
    ((65, 130), (130, 67)),
]


@pytest.mark.parametrize("sa, sb", MATMUL_SHAPES)
def test_matmul(sa, sb):
    a, b = randn(*sa), randn(*sb)
    (out,) = run_node("MatMul", {"a": a, "b": b})
    close(out, np.matmul(a.astype(np.float64), b.astype(np.float64)), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    "ta, tb, c_shape", [(0, 0, (5,)), (1, 0, (3, 5)), (0, 1, (1, 5)), (1, 1, ()), (0, 0, None)]
)
def test_gemm(ta, tb, c_shape):
    a = randn(4, 3) if ta else randn(3, 4)
    b = randn(5, 4) if tb else randn(4, 5)
    c = None if c_shape is None else randn(*c_shape)
    (out,) = run_node(
        "Gemm", {"a": a, "b": b, "c": c}, {"transA": ta, "transB": tb, "alpha": 0.5, "beta": 2.0}
    )
    ref = 0.5 * (a.T if ta else a) @ (b.T if tb else b) + (0 if c is None else 2.0 * c)
    close(out, ref, rtol=1e-5, atol=1e-5)


def test_dropout_is_statistically_right_and_seeded():
    x = np.ones((400, 500), np.float32)
    inputs = {"x": x, "r": np.array(0.3, np.float32), "t": np.array(True)}
    y, mask = run_node(
        "Dropout",
        inputs,
        {"seed": 7},
        n_outputs=2,
        out_types=[TensorProto.FLOAT, TensorProto.BOOL],
        constant_inputs=("r", "t"),
    )
    keep = mask.mean()
    # 200,000 Bernoulli(0.7) draws: standard error 0.001.
    assert abs(keep - 0.7) < 0.005
    close(y[mask], np.full(mask.sum(), 1 / 0.7, np.float32))
    assert (y[~mask] == 0).all()
    # Independent of neighbours: adjacent elements agree as often as independent draws would.
    agree = (mask[:, 1:] == mask[:, :-1]).mean()
    assert abs(agree - (0.7**2 + 0.3**2)) < 0.01
    y2, mask2 = run_node(
        "Dropout",
        inputs,
        {"seed": 7},
        n_outputs=2,
        out_types=[TensorProto.FLOAT, TensorProto.BOOL],
        constant_inputs=("r", "t"),
    )
    np.testing.assert_array_equal(mask, mask2)  # same seed, same first call: same mask
    (ident, m3) = run_node(
        "Dropout",
        {"x": x, "r": None, "t": None},
        n_outputs=2,
        out_types=[TensorProto.FLOAT, TensorProto.BOOL],
    )
    np.testing.assert_array_equal(ident, x)
    assert m3.all()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_random_uniform_and_normal_like_are_statistically_right_and_seeded(dtype):
    # 200,000 draws each: the mean's standard error is ~0.001 of the spread.
    x = np.zeros((400, 500), np.int64)  # only the shape counts
    code = TensorProto.FLOAT if dtype == np.float32 else TensorProto.DOUBLE
    uniform = {"low": -2.0, "high": 3.0, "dtype": code, "seed": 5.0}
    (u,) = run_node("RandomUniformLike", {"x": x}, uniform, out_types=[code])
    assert u.dtype == dtype and u.shape == x.shape
    assert u.min() >= -2.0 and u.max() < 3.0
    assert abs(u.mean() - 0.5) < 0.02 and abs(u.var() - 25 / 12) < 0.03
    counts = np.histogram(u, bins=10, range=(-2, 3))[0]  # flat, 20,000 per bin (std 134)
    assert np.abs(counts - 20000).max() < 700
    (n,) = run_node("RandomNormalLike", {"x": x}, {"mean": 1.0, "scale": 2.0, "dtype": code})
    n = np.asarray(n, np.float64)
    assert abs(n.mean() - 1.0) < 0.02 and abs(n.std() - 2.0) < 0.02
    assert abs(((n - 1.0) / 2.0 > 1.96).mean() - 0.025) < 0.002  # a normal tail, not uniform's
    # Neighbours are independent; the same seed gives the same first draw.
    assert abs(np.corrcoef(n[:, 1:].ravel(), n[:, :-1].ravel())[0, 1]) < 0.01
    (u2,) = run_node("RandomUniformLike", {"x": x}, uniform, out_types=[code])
    np.testing.assert_array_equal(u, u2)
    (u3,) = run_node("RandomUniformLike", {"x": x}, {**uniform, "seed": 6.0}, out_types=[code])
    assert (u3 != u).mean() > 0.99


def test_random_ops_draw_anew_on_every_call_and_take_the_input_dtype():
    model = node_model("RandomUniformLike", {"x": np.zeros((64, 64), np.float32)})
    sess = ge.Session(ge.Model.from_bytes(model.SerializeToString()))
    feeds = {"x": np.zeros((64, 64), np.float32)}
    a, b = (np.asarray(sess.run(feeds)[0]).copy() for _ in range(2))
    assert a.dtype == np.float32 and (a != b).mean() > 0.99


def test_bernoulli_draws_each_element_with_its_probability():
    p = np.tile(np.array([0.0, 0.1, 0.5, 0.9, 1.0], np.float32), (40000, 1))
    (y,) = run_node("Bernoulli", {"p": p})
    assert set(np.unique(y)) <= {0.0, 1.0}
    close(y.mean(axis=0), [0.0, 0.1, 0.5, 0.9, 1.0], atol=0.01)  # standard error <= 0.0025
    with pytest.raises(Exception, match="Bernoulli.*float32 or float64 probabilities, not int64"):
        run_node("Bernoulli", {"p": np.zeros((3,), np.int64)})


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("weighted, ignore", [(False, None), (True, None), (False, 2), (True, 1)])
@pytest.mark.parametrize("spatial", [False, True])
def test_softmax_cross_entropy(reduction, weighted, ignore, spatial):
    n, c = 6, 5
    scores = randn(n, c, 3) if spatial else randn(n, c)
    labels = rng.integers(0, c, (n, 3) if spatial else (n,)).astype(np.int64)
    w = np.abs(randn(c)) + 0.1 if weighted else None
    attrs = {"reduction": reduction}
    if ignore is not None:
        attrs["ignore_index"] = ignore
    loss, logp = run_node(
        "SoftmaxCrossEntropyLoss", {"s": scores, "l": labels, "w": w}, attrs, n_outputs=2
    )
    ref = F.cross_entropy(
        torch.from_numpy(scores),
        torch.from_numpy(labels),
        weight=None if w is None else torch.from_numpy(w),
        ignore_index=-100 if ignore is None else ignore,
        reduction=reduction,
    )
    close(loss, ref.numpy(), rtol=1e-5, atol=1e-6)
    close(logp, torch.log_softmax(torch.from_numpy(scores), 1).numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "stride, pad, dil, group",
    [(1, 0, 1, 1), (2, 1, 1, 1), (1, 2, 2, 1), (2, 1, 1, 2), (1, 1, 1, 4)],
)
def test_conv2d(stride, pad, dil, group):
    x = randn(2, 4, 9, 8)
    w = randn(8, 4 // group, 3, 3)
    b = randn(8)
    (out,) = run_node(
        "Conv",
        {"x": x, "w": w, "b": b},
        {"strides": [stride] * 2, "pads": [pad] * 4, "dilations": [dil] * 2, "group": group},
    )
    ref = F.conv2d(
        torch.from_numpy(x), torch.from_numpy(w), torch.from_numpy(b), stride, pad, dil, group
    )
    close(out, ref.numpy(), rtol=1e-4, atol=1e-4)


def test_conv1d_and_same_padding():
    x, w = randn(3, 2, 11), randn(4, 2, 3)
    (out,) = run_node("Conv", {"x": x, "w": w}, {"pads": [1, 1]})
    close(
        out,
        F.conv1d(torch.from_numpy(x), torch.from_numpy(w), padding=1).numpy(),
        rtol=1e-4,
        atol=1e-4,
    )
    x2, w2 = randn(1, 3, 7, 7), randn(2, 3, 3, 3)
    (same,) = run_node("Conv", {"x": x2, "w": w2}, {"auto_pad": "SAME_UPPER"})
    close(
        same,
        F.conv2d(torch.from_numpy(x2), torch.from_numpy(w2), padding="same").numpy(),
        rtol=1e-4,
        atol=1e-4,
    )
    (pw,) = run_node("Conv", {"x": x2, "w": randn(5, 3, 1, 1)}, {})
    assert pw.shape == (1, 5, 7, 7)


@pytest.mark.parametrize("algorithm", ["AUTO", "ONEDNN", "IM2COL"])
@pytest.mark.parametrize(
    "shape, kernel, stride, pads, dil, group",
    [
        ((3, 4, 9, 8), (3, 3), 1, (1, 1, 1, 1), 1, 1),  # batch 3: uneven parts over two threads
        ((2, 4, 9, 8), (3, 3), 2, (1, 0, 2, 1), 1, 1),  # asymmetric pads
        ((2, 4, 9, 8), (3, 2), 1, (2, 2, 2, 2), 2, 1),  # dilation
        ((2, 8, 6, 6), (3, 3), 1, (1, 1, 1, 1), 1, 4),  # groups
        ((4, 16, 5, 5), (1, 1), 2, (0, 0, 0, 0), 1, 1),  # a strided shortcut
        ((3, 3, 12, 12), (7, 7), 2, (3, 3, 3, 3), 1, 1),  # a stem: three input channels
        ((2, 32, 6, 6), (3, 3), 1, (1, 1, 1, 1), 1, 1),  # wide: 64 output channels
        ((2, 3, 11), (3,), 1, (1, 1), 1, 1),  # 1-D
        # Depthwise (one filter per channel): AUTO runs graphtrain's direct kernels.
        ((2, 6, 9, 8), (3, 3), 1, (1, 1, 1, 1), 1, 6),  # MobileNet's 3x3: rows of one vector
        ((2, 6, 9, 11), (3, 3), 2, (0, 1, 0, 1), 1, 6),  # stride 2, TF's SAME pads: phases
        ((3, 5, 16, 19), (7, 7), 1, (3, 3, 3, 3), 1, 5),  # ConvNeXt's 7x7: 2 vectors and a tail
        ((2, 4, 12, 12), (3, 3), 2, (2, 1, 2, 1), 2, 4),  # stride and dilation
        ((2, 3, 5, 6), (3, 3), 1, (3, 0, 1, 2), 1, 3),  # a pad wider than the kernel's reach
        ((2, 4, 23), (5,), 3, (2, 1), 1, 4),  # 1-D, stride 3
        # rows narrower than a vector: channels last, 4 vectors of channels, one, then the rest
        ((2, 40, 4, 4), (3, 3), 1, (1, 1, 1, 1), 1, 40),
        ((3, 20, 9, 9), (3, 3), 2, (0, 1, 0, 1), 1, 20),
        ((2, 12, 5, 3), (3, 3), 1, (2, 1, 0, 2), 2, 12),  # dilated, uneven pads
    ],
)
def test_conv_forward_and_gradients(algorithm, shape, kernel, stride, pads, dil, group):
    # Conv and graphtrain::ConvGrad against torch, on oneDNN's direct kernels (ONEDNN, where the
    # build has them), on im2col + GEMM, and as AUTO chooses (im2col for these small weights, and
    # for the wide one, 64 output channels, oneDNN; depthwise ones on graphtrain's direct kernels).
    graphtrain.set_option("conv_algorithm", algorithm)
    spatial = len(kernel)
    x = randn(*shape)
    m = shape[1] if group == shape[1] else {16: 16, 32: 64}.get(shape[1], 8)
    w = randn(m, shape[1] // group, *kernel)
    b = randn(w.shape[0])
    attrs = {
        "strides": [stride] * spatial,
        "pads": list(pads),
        "dilations": [dil] * spatial,
        "group": group,
    }
    (y,) = run_node("Conv", {"x": x, "w": w, "b": b}, attrs)
    tx, tw, tb = (torch.from_numpy(a).requires_grad_() for a in (x, w, b))
    xp = F.pad(tx, [p for i in reversed(range(spatial)) for p in (pads[i], pads[i + spatial])])
    conv = F.conv2d if spatial == 2 else F.conv1d
    ref = conv(xp, tw, tb, stride, 0, dil, group)
    close(y, ref.detach().numpy(), rtol=1e-4, atol=1e-4)
    dy = randn(*ref.shape)
    ref.backward(torch.from_numpy(dy))
    model = node_model(
        "ConvGrad", {"dy": dy, "x": x, "w": w}, attrs, n_outputs=3, domain="graphtrain"
    )
    dx, dw, db = run_graphtrain(model, {"dy": dy, "x": x, "w": w})
    close(dx, tx.grad.numpy(), rtol=1e-4, atol=1e-4)
    close(dw, tw.grad.numpy(), rtol=1e-4, atol=1e-4)
    close(db, tb.grad.numpy(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("k, s, p, ceil", [(2, 2, 0, 0), (3, 2, 1, 0), (3, 2, 1, 1), (3, 1, 0, 0)])
def test_pooling(k, s, p, ceil):
    x = randn(2, 3, 9, 10)
    attrs = {"kernel_shape": [k, k], "strides": [s, s], "pads": [p] * 4, "ceil_mode": ceil}
    y, idx = run_node(
        "MaxPool", {"x": x}, attrs, n_outputs=2, out_types=[TensorProto.FLOAT, TensorProto.INT64]
    )
    ref, ref_idx = F.max_pool2d(
        torch.from_numpy(x), k, s, p, ceil_mode=bool(ceil), return_indices=True
    )
    close(y, ref.numpy())
    # torch's indices are per (n, c) plane; ONNX's count over the whole tensor.
    plane = np.arange(2 * 3).reshape(2, 3, 1, 1) * 9 * 10
    np.testing.assert_array_equal(idx, ref_idx.numpy() + plane)
    for include in (0, 1):
        (a,) = run_node("AveragePool", {"x": x}, {**attrs, "count_include_pad": include})
        ra = F.avg_pool2d(
            torch.from_numpy(x), k, s, p, ceil_mode=bool(ceil), count_include_pad=bool(include)
        )
        close(a, ra.numpy(), rtol=1e-5, atol=1e-6)
    (g,) = run_node("GlobalAveragePool", {"x": x})
    close(g, x.mean(axis=(2, 3), keepdims=True), rtol=1e-5, atol=1e-6)


def test_max_pool_stride_two_rows_of_many_windows():
    # Stride 2 over rows of 19 windows (the other pooling tests have rows of 5 or fewer), with ties
    # (a row of equal maxima: the first tap wins) and NaNs (they win).
    x = randn(2, 3, 11, 37)
    x[0, 0, 4, :] = 5.0
    x[1, 2, 6, 20] = np.nan
    x[1, 2, 3, 35] = np.nan
    attrs = {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}
    y, idx = run_node(
        "MaxPool", {"x": x}, attrs, n_outputs=2, out_types=[TensorProto.FLOAT, TensorProto.INT64]
    )
    ref, ref_idx = F.max_pool2d(torch.from_numpy(x), 3, 2, 1, return_indices=True)
    np.testing.assert_array_equal(y, ref.numpy())
    plane = np.arange(2 * 3).reshape(2, 3, 1, 1) * 11 * 37
    np.testing.assert_array_equal(idx, ref_idx.numpy() + plane)


def test_max_pool_dilation_uneven_pads_nan_and_infinities():
    # Windows of one -inf, a NaN (it wins, and its index is given), dilation and pads that differ
    # per side; ONNX's pads are [top, left, bottom, right], torch's F.pad (left, right, top, bottom).
    x = randn(3, 2, 7, 8)
    x[0, 0, 1, 2] = np.nan
    x[1, 1, :3, :3] = -np.inf
    attrs = {"kernel_shape": [3, 2], "strides": [2, 1], "pads": [1, 0, 1, 1], "dilations": [2, 2]}
    y, idx = run_node(
        "MaxPool", {"x": x}, attrs, n_outputs=2, out_types=[TensorProto.FLOAT, TensorProto.INT64]
    )
    padded = F.pad(torch.from_numpy(x), (0, 1, 1, 1), value=-np.inf)
    ref = F.max_pool2d(padded, (3, 2), (2, 1), dilation=2)
    np.testing.assert_array_equal(y, ref.numpy())
    flat = x.reshape(-1)
    np.testing.assert_array_equal(flat[idx], y)  # each index points at its maximum


def test_batch_norm_inference_and_training():
    x = randn(4, 3, 5, 5) * 2 + 1
    scale, bias, mean, var = randn(3), randn(3), randn(3), np.abs(randn(3)) + 0.5
    (y,) = run_node(
        "BatchNormalization",
        {"x": x, "s": scale, "b": bias, "m": mean, "v": var},
        {"epsilon": 1e-5},
    )
    ref = F.batch_norm(
        torch.from_numpy(x),
        torch.from_numpy(mean),
        torch.from_numpy(var),
        torch.from_numpy(scale),
        torch.from_numpy(bias),
        False,
        0.1,
        1e-5,
    )
    close(y, ref.numpy(), rtol=1e-5, atol=1e-5)
    y, rm, rv = run_node(
        "BatchNormalization",
        {"x": x, "s": scale, "b": bias, "m": mean, "v": var},
        {"epsilon": 1e-5, "momentum": 0.9, "training_mode": 1},
        n_outputs=3,
        opset=15,
    )
    rm_t, rv_t = torch.from_numpy(mean.copy()), torch.from_numpy(var.copy())
    ref = F.batch_norm(
        torch.from_numpy(x),
        rm_t,
        rv_t,
        torch.from_numpy(scale),
        torch.from_numpy(bias),
        True,
        0.1,
        1e-5,
    )
    close(y, ref.numpy(), rtol=1e-4, atol=1e-5)
    batch_mean, batch_var = (
        x.mean(axis=(0, 2, 3)),
        x.var(axis=(0, 2, 3)),
    )  # ONNX: population variance
    close(rm, 0.9 * mean + 0.1 * batch_mean, rtol=1e-5, atol=1e-6)
    close(rv, 0.9 * var + 0.1 * batch_var, rtol=1e-5, atol=1e-6)


def test_strided_and_torch_inputs(tmp_path):
    import onnx

    from onnx_util import node_model

    a = torch.randn(6, 4).t()  # non-contiguous source
    b = torch.randn(4, 6)[:, ::1]
    path = tmp_path / "add.onnx"
    onnx.save(node_model("Add", {"a": a.contiguous().numpy(), "b": b.numpy()}), path)
    sess = ge.Session(str(path))
    (out,) = sess.run([a, b])
    assert isinstance(out, torch.Tensor)
    torch.testing.assert_close(out, a + b)
    (out_np,) = sess.run({"a": a.numpy(), "b": b.numpy()})
    np.testing.assert_allclose(out_np, (a + b).numpy())


@pytest.mark.parametrize(
    "op, ref",
    [
        ("Exp", np.exp),
        ("Tanh", np.tanh),
        ("Sigmoid", lambda x: 1 / (1 + np.exp(-x))),
        ("Erf", lambda x: torch.erf(torch.from_numpy(x)).numpy()),
    ],
)
def test_vectorized_math_accuracy_over_a_dense_range(op, ref):
    """The kernels' own exp/erf/tanh (8 lanes at a time) against float64 references."""
    x = np.concatenate(
        [np.linspace(-30, 30, 200_001), [0.0, -0.0, 1e-8, -1e-8, 88.0, -87.0, 100.0, -100.0]]
    )
    x = x.astype(np.float32)
    (out,) = run_node(op, {"x": x})
    with np.errstate(over="ignore"):
        expected = ref(x.astype(np.float64)).astype(np.float32)  # overflow to inf as float32 does
    np.testing.assert_allclose(out, expected, rtol=3e-7 * 8, atol=1e-37)
    (nan,) = run_node(op, {"x": np.array([np.nan], np.float32)})
    assert np.isnan(nan).all()


def test_graph_runs_flush_denormals_and_give_the_thread_its_mode_back():
    """A softmax's tail and an optimizer's running averages make denormal floats, each one an
    order of magnitude slower on Intel CPUs: graph runs flush them to zero (flush_denormals)."""
    tiny = np.full((4, 64), 2.0**-70, np.float32)  # normal; its square (2^-140) is denormal
    model = node_model("Mul", {"a": tiny, "b": tiny})
    assert (run_graphtrain(model, {"a": tiny, "b": tiny})[0] == 0).all()
    # The calling thread's own mode is back after the run: numpy keeps denormals.
    assert tiny[0, 0] * tiny[0, 0] == np.float32(2.0**-140)
    graphtrain.set_option("flush_denormals", False)
    assert (run_graphtrain(model, {"a": tiny, "b": tiny})[0] == np.float32(2.0**-140)).all()


@pytest.mark.parametrize("shape, axis", [((2, 5, 64), -1), ((3, 4, 7), 1)])
def test_onnx_rms_normalization_matches_onnxruntime(shape, axis):
    # ONNX opset 23's RMSNormalization (Y alone) runs on graphtrain's kernel; onnxruntime is the
    # oracle.
    x = randn(*shape) * 3 + 1
    w = randn(*shape[axis:])
    model = node_model(
        "RMSNormalization", {"x": x, "w": w}, {"axis": axis, "epsilon": 1e-5}, opset=23
    )
    (ours,) = run_graphtrain(model, {"x": x, "w": w})
    (ref,) = run_ort(model, {"x": x, "w": w})
    close(ours, ref, rtol=1e-5, atol=1e-5)


RESIZES = [  # (input shape, attributes, scales, sizes): torch's modes, then ONNX's others
    ((2, 3, 5, 7), dict(mode="linear", axes=[2, 3]), None, [9, 13]),  # bilinear up
    ((1, 2, 9, 8), dict(mode="linear", axes=[2, 3]), None, [4, 3]),  # down: coordinates < 0
    ((1, 2, 5, 8), dict(mode="linear", axes=[2, 3]), None, [1, 1]),
    ((1, 2, 5, 8), dict(mode="linear", axes=[2, 3]), [1.5, 0.75], None),
    (
        (2, 3, 5, 7),
        dict(mode="linear", coordinate_transformation_mode="align_corners"),
        [1, 1, 2, 3],
        None,
    ),
    ((2, 3, 7), dict(mode="linear", axes=[2]), None, [12]),  # 1-D
    (
        (2, 3, 7, 9),
        dict(
            mode="nearest",
            coordinate_transformation_mode="asymmetric",
            nearest_mode="floor",
            axes=[2, 3],
        ),
        None,
        [4, 5],
    ),
    (
        (2, 3, 7, 9),
        dict(mode="nearest", nearest_mode="round_prefer_ceil", axes=[2, 3]),
        None,
        [6, 11],
    ),
    ((1, 2, 9, 8), dict(mode="nearest"), [1, 1, 1.5, 0.5], None),  # round_prefer_floor
    (
        (1, 2, 5, 8),
        dict(mode="nearest", coordinate_transformation_mode="asymmetric", nearest_mode="ceil"),
        [1, 1, 2.5, 0.5],
        None,
    ),
    (
        (1, 2, 5, 8),
        dict(mode="nearest", coordinate_transformation_mode="align_corners"),
        None,
        [1, 2, 9, 3],
    ),
    (
        (1, 2, 9, 8),
        dict(mode="linear", coordinate_transformation_mode="half_pixel_symmetric"),
        [1, 1, 1.5, 0.7],
        None,
    ),
    (
        (1, 2, 5, 8),
        dict(mode="linear", coordinate_transformation_mode="pytorch_half_pixel", axes=[2, 3]),
        None,
        [1, 3],
    ),
    (
        (1, 2, 5, 8),
        dict(mode="linear", coordinate_transformation_mode="asymmetric"),
        [1, 1, 2, 2],
        None,
    ),
    ((2, 3, 8, 6), dict(mode="linear", axes=[2, 3]), [1.1, 1.1], None),  # the same size: a copy
    ((2, 3, 8, 6), dict(mode="linear", axes=[2, 3]), [1.1, 1.2], None),  # one axis the same
]


@pytest.mark.parametrize("shape, attrs, scales, sizes", RESIZES)
def test_resize_matches_onnxruntime(shape, attrs, scales, sizes):
    x = randn(*shape)
    inputs = {
        "x": x,
        "roi": None,
        "scales": None if scales is None else np.array(scales, np.float32),
        "sizes": None if sizes is None else np.array(sizes, np.int64),
    }
    model = node_model("Resize", inputs, attrs, constant_inputs=("scales", "sizes"), opset=19)
    (ours,) = run_graphtrain(model, {"x": x})
    (ref,) = run_ort(model, {"x": x})
    assert ours.shape == ref.shape
    close(ours, ref, rtol=1e-5, atol=1e-5)


def test_resize_refuses_what_it_cannot_do_by_name():
    x = randn(2, 3, 4, 4)
    cases = [
        (dict(mode="cubic"), [1, 1, 2, 2], "mode 'cubic' is not supported"),
        (dict(mode="linear", antialias=1), [1, 1, 0.5, 0.5], "antialias=1"),
        (dict(mode="linear"), [1, 2, 2, 2], "resizes axis 1 .3 -> 6.; graphtrain resizes only"),
        (dict(mode="linear", axes=[2, 3]), [1, 2, 2], "scales must have 2 elements"),
    ]
    for attrs, scales, message in cases:
        inputs = {"x": x, "roi": None, "scales": np.array(scales, np.float32)}
        model = node_model("Resize", inputs, attrs, constant_inputs=("scales",), opset=19)
        with pytest.raises(Exception, match=f"Resize.*{message}"):
            run_graphtrain(model, {"x": x})


@pytest.mark.parametrize("trans_b", [0, 1])
@pytest.mark.parametrize("ends", [[3, 3, 9, 11], [0, 5, 12, 12], [4, 4, 4, 4]])
def test_grouped_matmul_multiplies_each_experts_rows(trans_b, ends):
    # Rows past the last offset (a mixture of experts' dropped tokens) come out zero; an expert
    # with no rows is skipped.
    x, w = randn(12, 5), randn(4, 7, 5) if trans_b else randn(4, 5, 7)
    offs = np.array(ends, np.int32)
    (y,) = run_node(
        "GroupedMatMul", {"x": x, "w": w, "offs": offs}, {"transB": trans_b}, domain="graphtrain"
    )
    ref = np.zeros((12, 7), np.float32)
    start = 0
    for e, end in enumerate(ends):
        ref[start:end] = x[start:end] @ (w[e].T if trans_b else w[e])
        start = end
    close(y, ref, rtol=1e-5, atol=1e-5)


def test_grouped_matmul_refuses_bad_offsets_by_name():
    x, w = randn(6, 5), randn(2, 5, 3)
    for ends, message in [
        (np.array([4, 2]), "expert 1 ends at 2 after 4"),
        (np.array([3, 7]), "at most the 6 rows"),
        (np.array([3.0, 6.0], np.float32), "offsets must be int32 or int64, got float32"),
    ]:
        with pytest.raises(Exception, match=f"GroupedMatMul.*{message}"):
            run_node("GroupedMatMul", {"x": x, "w": w, "o": ends}, domain="graphtrain")


@pytest.mark.parametrize(
    "x, k, attrs",
    [
        (np.array([[3, 1, 3, 2, 1, 3]], np.float32), 4, {}),  # ties in index order
        (np.array([[3, 1, 3, 2, 1, 3]], np.float32), 3, {"largest": 0}),
        (rng.integers(0, 4, (5, 9)).astype(np.int64), 9, {"largest": 0}),  # a stable sort
        (randn(3, 6, 4), 2, {"axis": 1}),
    ],
)
def test_top_k_matches_onnxruntime(x, k, attrs):
    inputs = {"x": x, "k": np.array([k], np.int64)}
    types = [TensorProto.FLOAT if x.dtype == np.float32 else TensorProto.INT64, TensorProto.INT64]
    model = node_model("TopK", inputs, attrs, 2, types, constant_inputs=("k",))
    ours = run_graphtrain(model, {"x": x})
    ref = run_ort(model, {"x": x})
    for a, b in zip(ours, ref):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("reduction", ["none", "add"])
def test_scatter_nd_matches_onnxruntime(reduction):
    data = randn(6, 3, 2)
    indices = np.array([[4], [0], [2], [0]], np.int64)  # a repeat: added (add) or the later one
    updates = randn(4, 3, 2)
    if reduction == "none":
        indices, updates = indices[:3], updates[:3]  # onnxruntime leaves repeats undefined
    inputs = {"data": data, "indices": indices, "updates": updates}
    model = node_model("ScatterND", inputs, {"reduction": reduction}, opset=18)
    (ours,) = run_graphtrain(model, inputs)
    (ref,) = run_ort(model, inputs)
    close(ours, ref)
    deep = {"data": data, "indices": np.array([[1, 2], [5, 0]], np.int64), "updates": randn(2, 2)}
    model = node_model("ScatterND", deep, {"reduction": reduction}, opset=18)
    close(run_graphtrain(model, deep)[0], run_ort(model, deep)[0])

"""Per-op gradients of the builder's rules: against torch autograd (rtol 1e-4) and by central
finite differences of graphtrain's own forward kernels (float32 kernels, so a directional
derivative with eps = 1e-2 and a stated tolerance of 2e-2 relative)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from onnx import TensorProto

import graphtrain.engine as ge
from onnx_util import node_model

rng = np.random.default_rng(1)


def randn(*shape):
    return np.asarray(rng.standard_normal(shape), np.float32)


def away_from_zero(*shape):
    x = randn(*shape)
    return np.where(np.abs(x) < 0.2, np.sign(x + 1e-9) * 0.5, x).astype(np.float32)


def _rotary(x: torch.Tensor, c: torch.Tensor, s: torch.Tensor, inverse: int) -> torch.Tensor:
    """transformers' apply_rotary_pos_emb (rotate_half); inverse: the transposed rotation."""
    h = x.shape[-1] // 2
    if inverse:
        xs = x * s
        return x * c + torch.cat((xs[..., h:], -xs[..., :h]), -1)
    return x * c + torch.cat((-x[..., h:], x[..., :h]), -1) * s


class Case:
    def __init__(
        self,
        op,
        inputs,
        wrt,
        ref,
        attrs=None,
        n_out=1,
        out_types=None,
        const=(),
        opset=18,
        smooth=True,
        domain="",
    ):
        self.op, self.inputs, self.wrt, self.ref, self.domain = op, inputs, wrt, ref, domain
        self.attrs, self.n_out, self.out_types, self.const = attrs or {}, n_out, out_types, const
        self.opset, self.smooth = opset, smooth

    def __repr__(self):
        return self.op


def graphtrain_grad(case: Case, g_seed: int = 0):
    model = ge.Model.from_bytes(
        node_model(
            case.op,
            case.inputs,
            case.attrs,
            case.n_out,
            case.out_types,
            case.const,
            case.opset,
            case.domain,
        ).SerializeToString()
    )
    fwd, bwd, info = model.gradient_graphs(["out0"], case.wrt, False)
    feeds = {k: v for k, v in case.inputs.items() if v is not None and k not in case.const}
    outs = ge.Session(fwd).run(feeds)
    y = outs[0]
    g = np.asarray(np.random.default_rng(g_seed).standard_normal(y.shape), np.float32)
    grads = ge.Session(bwd).run([g] + outs[case.n_out :])
    by_name = dict(zip([n for n in info["grads"] if n], grads))
    return y, g, [by_name.get(f"{w}_grad") for w in case.wrt], fwd, feeds


def torch_grads(case: Case, g):
    tensors = {
        k: torch.tensor(v, requires_grad=(k in case.wrt))
        for k, v in case.inputs.items()
        if v is not None
    }
    y = case.ref(**tensors)
    y.backward(torch.tensor(g))
    return y.detach().numpy(), [tensors[w].grad.numpy() for w in case.wrt]


CASES = [
    Case("Add", {"a": randn(2, 3, 4), "b": randn(4)}, ["a", "b"], lambda a, b: a + b),
    Case("Sub", {"a": randn(2, 1, 4), "b": randn(3, 1)}, ["a", "b"], lambda a, b: a - b),
    Case("Mul", {"a": randn(2, 3, 4), "b": randn(3, 1)}, ["a", "b"], lambda a, b: a * b),
    Case("Div", {"a": randn(5, 4), "b": away_from_zero(4)}, ["a", "b"], lambda a, b: a / b),
    Case(
        "Pow",
        {"a": np.abs(randn(3, 4)) + 0.5, "e": np.array(3.0, np.float32)},
        ["a", "e"],
        lambda a, e: a**e,
    ),
    Case("MatMul", {"a": randn(3, 4), "b": randn(4, 5)}, ["a", "b"], lambda a, b: a @ b),
    Case("MatMul", {"a": randn(2, 3, 4), "b": randn(4, 5)}, ["a", "b"], lambda a, b: a @ b),
    Case("MatMul", {"a": randn(1, 3, 4), "b": randn(2, 4, 5)}, ["a", "b"], lambda a, b: a @ b),
    Case("MatMul", {"a": randn(4), "b": randn(2, 4, 5)}, ["a", "b"], lambda a, b: a @ b),
    Case("MatMul", {"a": randn(2, 3, 4), "b": randn(4)}, ["a", "b"], lambda a, b: a @ b),
    Case(
        "Gemm",
        {"a": randn(4, 3), "b": randn(5, 4), "c": randn(5)},
        ["a", "b", "c"],
        lambda a, b, c: 0.5 * a.T @ b.T + 2 * c,
        {"transA": 1, "transB": 1, "alpha": 0.5, "beta": 2.0},
    ),
    Case(
        "Gemm",
        {"a": randn(3, 4), "b": randn(4, 5), "c": randn(3, 5)},
        ["a", "b", "c"],
        lambda a, b, c: a @ b + c,
    ),
    Case("Sqrt", {"x": np.abs(randn(3, 5)) + 0.5}, ["x"], torch.sqrt),
    Case("Reciprocal", {"x": away_from_zero(3, 5)}, ["x"], torch.reciprocal),
    Case("Exp", {"x": randn(3, 5)}, ["x"], torch.exp),
    Case("Log", {"x": np.abs(randn(3, 5)) + 0.5}, ["x"], torch.log),
    Case("Neg", {"x": randn(3, 5)}, ["x"], torch.neg),
    Case("Abs", {"x": away_from_zero(3, 5)}, ["x"], torch.abs),
    Case("Relu", {"x": away_from_zero(3, 5)}, ["x"], torch.relu),
    Case(
        "LeakyRelu",
        {"x": away_from_zero(3, 5)},
        ["x"],
        lambda x: F.leaky_relu(x, 0.1),
        {"alpha": 0.1},
    ),
    Case("Sigmoid", {"x": randn(3, 5)}, ["x"], torch.sigmoid),
    # far below 0 too, where log(1 + e^x) needs log1p's precision
    Case("Softplus", {"x": randn(3, 5) * 12}, ["x"], lambda x: F.softplus(x, threshold=100.0)),
    Case("Tanh", {"x": randn(3, 5)}, ["x"], torch.tanh),
    Case("Erf", {"x": randn(3, 5)}, ["x"], torch.erf),
    Case("Gelu", {"x": randn(3, 5)}, ["x"], F.gelu, opset=20),
    Case(
        "Gelu",
        {"x": randn(3, 5)},
        ["x"],
        lambda x: F.gelu(x, approximate="tanh"),
        {"approximate": "tanh"},
        opset=20,
    ),
    Case("Cos", {"x": randn(3, 5)}, ["x"], torch.cos),
    Case("Sin", {"x": randn(3, 5)}, ["x"], torch.sin),
    Case(
        "Max",
        {"a": randn(3, 4), "b": randn(4)},
        ["a", "b"],
        lambda a, b: torch.maximum(a, b),
        smooth=False,
    ),
    Case(
        "Min",
        {"a": randn(2, 3, 4), "b": randn(3, 1)},
        ["a", "b"],
        lambda a, b: torch.minimum(a, b),
        smooth=False,
    ),
    Case(
        "Max",
        {"a": np.array([1.0, 2.0, 3.0], np.float32), "b": np.array([1.0, 0.0, 3.0], np.float32)},
        ["a", "b"],
        lambda a, b: torch.maximum(a, b),
        smooth=False,
    ),  # ties: half the gradient to each side, as torch
    Case(
        "Clip",
        {"x": randn(4, 5), "lo": np.array(-0.5, np.float32), "hi": np.array(0.7, np.float32)},
        ["x", "lo", "hi"],
        lambda x, lo, hi: torch.clamp(x, lo, hi),
        smooth=False,
    ),
    Case(
        "Clip",
        {"x": randn(4, 5), "lo": np.array(-0.5, np.float32)},
        ["x"],
        lambda x, lo: torch.clamp(x, min=lo),
        const=("lo",),
        smooth=False,
    ),
    Case(
        "Pad",
        {"x": randn(2, 3, 4), "p": np.array([0, 1, -1, 0, 2, 2], np.int64)},
        ["x"],
        lambda x, p: F.pad(x, (-1, 2, 1, 2)),
        const=("p",),
    ),
    Case(
        "GatherElements",
        {"x": randn(3, 5), "i": np.array([[0, 4, 4], [1, 1, 0], [2, 3, -1]], np.int64)},
        ["x"],
        lambda x, i: torch.gather(x, 1, i % 5),
        {"axis": 1},
        const=("i",),
    ),
    Case(
        "Attention",
        {"q": randn(2, 4, 9, 8), "k": randn(2, 2, 9, 8), "v": randn(2, 2, 9, 6)},
        ["q", "k", "v"],
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True),
        {"causal": 1},
        n_out=3,
        out_types=[TensorProto.FLOAT, TensorProto.FLOAT, TensorProto.INT64],
        domain="graphtrain",
    ),
    Case(
        "Attention",
        {
            "q": randn(1, 2, 70, 8),
            "k": randn(1, 2, 150, 8),
            "v": randn(1, 2, 150, 8),
            "m": randn(1, 1, 70, 150),
        },
        ["q", "k", "v"],
        lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m, scale=0.2),
        {"scale": 0.2},
        n_out=3,
        out_types=[TensorProto.FLOAT, TensorProto.FLOAT, TensorProto.INT64],
        domain="graphtrain",
        const=("m",),
    ),
    # a learned bias added to the scores (T5's relative positions) gets its gradient too
    Case(
        "Attention",
        {
            "q": randn(2, 2, 12, 8),
            "k": randn(2, 2, 12, 8),
            "v": randn(2, 2, 12, 8),
            "m": randn(1, 2, 12, 12),
        },
        ["q", "k", "v", "m"],
        lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m),
        n_out=3,
        out_types=[TensorProto.FLOAT, TensorProto.FLOAT, TensorProto.INT64],
        domain="graphtrain",
    ),
    Case(
        "CumSum",
        {"x": randn(3, 5, 2), "a": np.array(1, np.int64)},
        ["x"],
        lambda x, a: x.cumsum(1),
        const=("a",),
    ),
    Case(
        "CumSum",
        {"x": randn(4, 5), "a": np.array(-1, np.int64)},
        ["x"],
        lambda x, a: x.flip(-1).cumsum(-1).flip(-1) - x,
        {"exclusive": 1, "reverse": 1},
        const=("a",),
    ),
    Case("Softmax", {"x": randn(3, 5)}, ["x"], lambda x: torch.softmax(x, -1), {"axis": -1}),
    Case("Softmax", {"x": randn(3, 5, 2)}, ["x"], lambda x: torch.softmax(x, 1), {"axis": 1}),
    Case("LogSoftmax", {"x": randn(3, 5)}, ["x"], lambda x: torch.log_softmax(x, -1), {"axis": -1}),
    Case(
        "LayerNormalization",
        {"x": randn(4, 6), "w": randn(6), "b": randn(6)},
        ["x", "w", "b"],
        lambda x, w, b: F.layer_norm(x, (6,), w, b),
        {"axis": -1},
        n_out=3,
    ),
    Case(
        "LayerNormalization",
        {"x": randn(2, 3, 4), "w": randn(3, 4), "b": None},
        ["x", "w"],
        lambda x, w: F.layer_norm(x, (3, 4), w),
        {"axis": 1},
        n_out=1,
    ),
    # the rotary embedding: heads of 32 (eight lanes) and 6 (the plain loop), Cos and Sin
    # broadcast over batch and heads; the transposed rotation too (the gradient's)
    *[
        Case(
            "Rotary",
            {"x": randn(2, 3, 5, d), "c": randn(1, 1, 5, d), "s": randn(5, d)},
            ["x", "c", "s"],
            lambda x, c, s, inverse=inverse: _rotary(x, c, s, inverse),
            {"inverse": inverse},
            domain="graphtrain",
        )
        for d in (32, 6)
        for inverse in (0, 1)
    ],
    # a SwiGLU's silu(g) * u: 16- and 8-lane loops and the elements left over
    Case(
        "SiluMul",
        {"g": randn(3, 37) * 3, "u": randn(3, 37)},
        ["g", "u"],
        lambda g, u: F.silu(g) * u,
        domain="graphtrain",
    ),
    Case(
        "SiluMul", {"g": randn(5, 23) * 3}, ["g"], lambda g: F.silu(g), domain="graphtrain"
    ),  # SiLU
    # RMSNorm rows of 64 (in registers: 4 or 8 vectors), 37 and 300 (the plain loops)
    *[
        Case(
            "RMSNormalization",
            {"x": randn(*shape) * 2 + 0.5, "w": randn(shape[-1])},
            ["x", "w"],
            lambda x, w: F.rms_norm(x, (w.shape[0],), w, 1e-5),
            {"axis": -1, "epsilon": 1e-5},
            domain="graphtrain",
        )
        for shape in [(5, 64), (3, 2, 37), (4, 300)]
    ],
    # ONNX's own RMSNormalization (opset 23): Y alone, over the dims from `axis` on
    Case(
        "RMSNormalization",
        {"x": randn(3, 4, 16) * 2 + 0.5, "w": randn(4, 16)},
        ["x", "w"],
        lambda x, w: F.rms_norm(x, (4, 16), w, 1e-6),
        {"axis": 1, "epsilon": 1e-6},
        opset=23,
    ),
    # A mixture of experts' grouped product: an expert with no rows, rows past the last offset
    *[
        Case(
            "GroupedMatMul",
            {"x": randn(9, 5), "w": randn(3, *wshape), "offs": np.array([2, 2, 7], np.int64)},
            ["x", "w"],
            lambda x, w, offs, t=t: torch.cat(
                [x[:2] @ (w[0].T if t else w[0]), x[2:7] @ (w[2].T if t else w[2]), 0 * x[7:, :3]]
            ),
            {"transB": t},
            const=("offs",),
            domain="graphtrain",
        )
        for t, wshape in [(0, (5, 3)), (1, (3, 5))]
    ],
    # TopK (torch.topk, torch.sort): the values' gradient where they came from
    Case(
        "TopK",
        {"x": randn(4, 7), "k": np.array([3], np.int64)},
        ["x"],
        lambda x, k: torch.topk(x, 3, dim=-1).values,
        n_out=2,
        out_types=[TensorProto.FLOAT, TensorProto.INT64],
        const=("k",),
        smooth=False,
    ),
    Case(
        "TopK",
        {"x": randn(5, 3, 2), "k": np.array([5], np.int64)},
        ["x"],
        lambda x, k: torch.sort(x, dim=0).values,
        {"axis": 0, "largest": 0},
        n_out=2,
        out_types=[TensorProto.FLOAT, TensorProto.INT64],
        const=("k",),
        smooth=False,
    ),
    # ScatterND (index_put): data's gradient where nothing landed, the updates' at their rows
    *[
        Case(
            "ScatterND",
            {
                "data": randn(6, 4),
                "indices": np.array([[4], [1], [3]], np.int64),
                "updates": randn(3, 4),
            },
            ["data", "updates"],
            lambda data, indices, updates, r=r: data.index_put(
                (indices[:, 0],), updates, accumulate=r == "add"
            ),
            {"reduction": r},
            const=("indices",),
        )
        for r in ["none", "add"]
    ],
    # Resize as torch's interpolate: bilinear up and down, align_corners by scales, 1-D linear,
    # nearest (a downsample: inputs skipped) and nearest-exact
    *[
        Case(
            "Resize",
            {"x": randn(*shape), "roi": None, "scales": scales, "sizes": sizes},
            ["x"],
            ref,
            attrs,
            const=("scales", "sizes"),
            opset=19,
        )
        for shape, attrs, scales, sizes, ref in [
            (
                (2, 3, 5, 7),
                dict(mode="linear", axes=[2, 3]),
                None,
                np.array([9, 13], np.int64),
                lambda x, sizes: F.interpolate(x, size=(9, 13), mode="bilinear"),
            ),
            (
                (1, 2, 9, 8),
                dict(mode="linear", axes=[2, 3]),
                None,
                np.array([4, 3], np.int64),
                lambda x, sizes: F.interpolate(x, size=(4, 3), mode="bilinear"),
            ),
            (
                (2, 3, 5, 7),
                dict(mode="linear", coordinate_transformation_mode="align_corners"),
                np.array([1, 1, 2, 3], np.float32),
                None,
                lambda x, scales: F.interpolate(
                    x, scale_factor=(2, 3), mode="bilinear", align_corners=True
                ),
            ),
            (
                (2, 3, 7),
                dict(mode="linear", axes=[2]),
                None,
                np.array([12], np.int64),
                lambda x, sizes: F.interpolate(x, size=12, mode="linear"),
            ),
            (
                (2, 3, 7, 9),
                dict(
                    mode="nearest",
                    coordinate_transformation_mode="asymmetric",
                    nearest_mode="floor",
                    axes=[2, 3],
                ),
                None,
                np.array([4, 5], np.int64),
                lambda x, sizes: F.interpolate(x, size=(4, 5), mode="nearest"),
            ),
            (
                (2, 3, 7, 9),
                dict(mode="nearest", nearest_mode="round_prefer_ceil", axes=[2, 3]),
                None,
                np.array([13, 11], np.int64),
                lambda x, sizes: F.interpolate(x, size=(13, 11), mode="nearest-exact"),
            ),
        ]
    ],
    Case(
        "ReduceSum",
        {"x": randn(3, 4, 5), "axes": np.array([1], np.int64)},
        ["x"],
        lambda x, axes: x.sum(1, keepdim=True),
        const=("axes",),
    ),
    Case(
        "ReduceMean",
        {"x": randn(3, 4, 5), "axes": np.array([0, 2], np.int64)},
        ["x"],
        lambda x, axes: x.mean((0, 2)),
        {"keepdims": 0},
        const=("axes",),
    ),
    # ReduceGrad's fast paths: reduced axes trailing (each dY element fills a run), all of them (a
    # mean loss), leading or in the middle (a mean over a sequence: dY's rows repeat)
    Case(
        "ReduceMean",
        {"x": randn(3, 4, 5), "axes": np.array([1, 2], np.int64)},
        ["x"],
        lambda x, axes: x.mean((1, 2)),
        {"keepdims": 0},
        const=("axes",),
    ),
    Case("ReduceMean", {"x": randn(3, 4, 5)}, ["x"], lambda x: x.mean(), {"keepdims": 0}),
    Case(
        "ReduceMean",
        {"x": randn(3, 4, 5, 6), "axes": np.array([1, 2], np.int64)},
        ["x"],
        lambda x, axes: x.mean((1, 2)),
        {"keepdims": 0},
        const=("axes",),
    ),
    Case(
        "ReduceSum",
        {"x": randn(3, 4, 5), "axes": np.array([0, -2], np.int64)},
        ["x"],
        lambda x, axes: x.sum((0, 1), keepdim=True),
        const=("axes",),
    ),
    Case(
        "ReduceMax",
        {"x": randn(3, 4, 5), "axes": np.array([2], np.int64)},
        ["x"],
        lambda x, axes: x.amax(2),
        {"keepdims": 0},
        const=("axes",),
        smooth=False,
    ),
    Case(
        "Reshape",
        {"x": randn(2, 3, 4), "s": np.array([6, -1], np.int64)},
        ["x"],
        lambda x, s: x.reshape(6, -1),
        const=("s",),
    ),
    Case(
        "Transpose", {"x": randn(2, 3, 4)}, ["x"], lambda x: x.permute(2, 0, 1), {"perm": [2, 0, 1]}
    ),
    Case(
        "Expand",
        {"x": randn(3, 1), "s": np.array([2, 3, 4], np.int64)},
        ["x"],
        lambda x, s: x.expand(2, 3, 4),
        const=("s",),
    ),
    Case(
        "Unsqueeze",
        {"x": randn(3, 4), "a": np.array([1], np.int64)},
        ["x"],
        lambda x, a: x.unsqueeze(1),
        const=("a",),
    ),
    Case(
        "Squeeze",
        {"x": randn(3, 1, 4), "a": np.array([1], np.int64)},
        ["x"],
        lambda x, a: x.squeeze(1),
        const=("a",),
    ),
    Case("Flatten", {"x": randn(2, 3, 4)}, ["x"], lambda x: x.reshape(2, 12), {"axis": 1}),
    Case(
        "Concat",
        {"a": randn(2, 3), "b": randn(2, 5)},
        ["a", "b"],
        lambda a, b: torch.cat([a, b], 1),
        {"axis": 1},
    ),
    Case(
        "Concat",
        {"a": randn(2, 3), "b": randn(4, 3)},
        ["a", "b"],
        lambda a, b: torch.cat([a, b], -2),
        {"axis": -2},
    ),
    Case(
        "Split",
        {"x": randn(6, 4), "s": np.array([2, 4], np.int64)},
        ["x"],
        lambda x, s: x[:2],
        {"axis": 0},
        n_out=2,
        const=("s",),
    ),
    Case(
        "Slice",
        {
            "x": randn(5, 6),
            "st": np.array([1, 4], np.int64),
            "en": np.array([4, 0], np.int64),
            "ax": np.array([0, 1], np.int64),
            "sp": np.array([1, -2], np.int64),
        },
        ["x"],
        lambda x, st, en, ax, sp: x[1:4][:, [4, 2]],
        const=("st", "en", "ax", "sp"),
    ),
    Case(  # GPT-2's q/k/v split: rows of the last axis, many of them (parallel copies)
        "Slice",
        {
            "x": randn(6, 40, 96),
            "st": np.array([32], np.int64),
            "en": np.array([64], np.int64),
            "ax": np.array([2], np.int64),
        },
        ["x"],
        lambda x, st, en, ax: x[:, :, 32:64],
        const=("st", "en", "ax"),
    ),
    Case(
        "Gather",
        {"d": randn(7, 3), "i": np.array([[1, 4], [1, 6]], np.int64)},
        ["d"],
        lambda d, i: d[i],
        const=("i",),
    ),
    Case(
        "Where",
        {"c": rng.random((3, 4)) > 0.5, "x": randn(3, 4), "y": randn(4)},
        ["x", "y"],
        lambda c, x, y: torch.where(c, x, y),
    ),
    Case("Trilu", {"x": randn(4, 4)}, ["x"], lambda x: torch.triu(x), {"upper": 1}),
    Case(
        "Conv",
        {"x": randn(2, 4, 7, 6), "w": randn(6, 2, 3, 3), "b": randn(6)},
        ["x", "w", "b"],
        lambda x, w, b: F.conv2d(x, w, b, 2, 1, 1, 2),
        {"strides": [2, 2], "pads": [1, 1, 1, 1], "group": 2},
    ),
    # Enough images on small maps that the kernels put several images' columns in one GEMM
    # (conv.cc's chunks): grouped and padded, pointwise, strided with dilation and uneven pads.
    Case(
        "Conv",
        {"x": randn(12, 4, 3, 3), "w": randn(6, 2, 3, 3), "b": randn(6)},
        ["x", "w", "b"],
        lambda x, w, b: F.conv2d(x, w, b, 1, 1, 1, 2),
        {"pads": [1, 1, 1, 1], "group": 2},
    ),
    Case(
        "Conv",
        {"x": randn(10, 3, 2, 2), "w": randn(5, 3, 1, 1)},
        ["x", "w"],
        lambda x, w: F.conv2d(x, w),
    ),
    Case(
        "Conv",
        {"x": randn(9, 2, 5, 5), "w": randn(3, 2, 3, 3)},
        ["x", "w"],
        lambda x, w: F.conv2d(F.pad(x, (0, 1, 1, 2)), w, None, 2, 0, 2),
        {"strides": [2, 2], "pads": [1, 0, 2, 1], "dilations": [2, 2]},
    ),
    Case(
        "Conv",
        {"x": randn(2, 3, 9), "w": randn(4, 3, 3)},
        ["x", "w"],
        lambda x, w: F.conv1d(x, w, None, 1, 2, 2),
        {"pads": [2, 2], "dilations": [2]},
    ),
    Case(
        "MaxPool",
        {"x": randn(2, 3, 6, 6)},
        ["x"],
        lambda x: F.max_pool2d(x, 2, 2),
        {"kernel_shape": [2, 2], "strides": [2, 2]},
        smooth=False,
    ),
    Case(
        "AveragePool",
        {"x": randn(2, 3, 7, 7)},
        ["x"],
        lambda x: F.avg_pool2d(x, 3, 2, 1, count_include_pad=False),
        {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},
    ),
    Case(
        "GlobalAveragePool", {"x": randn(2, 3, 4, 5)}, ["x"], lambda x: x.mean((2, 3), keepdim=True)
    ),
    Case(
        "BatchNormalization",
        {
            "x": randn(4, 3, 5),
            "s": randn(3),
            "b": randn(3),
            "m": randn(3),
            "v": np.abs(randn(3)) + 0.5,
        },
        ["x", "s", "b"],
        lambda x, s, b, m, v: F.batch_norm(x, m, v, s, b, True, 0.1, 1e-5),
        {"training_mode": 1},
        n_out=3,
        opset=15,
    ),
    Case(
        "BatchNormalization",
        {
            "x": randn(4, 3, 5),
            "s": randn(3),
            "b": randn(3),
            "m": randn(3),
            "v": np.abs(randn(3)) + 0.5,
        },
        ["x", "s", "b"],
        lambda x, s, b, m, v: F.batch_norm(x, m, v, s, b, False, 0.1, 1e-5),
        opset=15,
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[f"{c.op}-{i}" for i, c in enumerate(CASES)])
def test_gradient_matches_torch_autograd(case):
    y, g, grads, _, _ = graphtrain_grad(case)
    ref_y, ref_grads = torch_grads(case, g)
    np.testing.assert_allclose(y, ref_y, rtol=1e-4, atol=1e-5)
    for name, ours, ref in zip(case.wrt, grads, ref_grads):
        assert ours is not None, f"no gradient for {name}"
        np.testing.assert_allclose(
            ours,
            ref,
            rtol=1e-4,
            atol=1e-4 * max(1.0, float(np.abs(ref).max())),
            err_msg=f"gradient of {name}",
        )


@pytest.mark.parametrize("case", [c for c in CASES if c.smooth], ids=lambda c: c.op)
def test_gradient_matches_finite_differences(case):
    """<grad, v> against (f(x + eps v) - f(x - eps v)) . g / (2 eps) for a random direction v."""
    y, g, grads, fwd, feeds = graphtrain_grad(case, g_seed=3)
    sess = ge.Session(fwd)
    eps = 1e-2
    for name, grad in zip(case.wrt, grads):
        v = np.asarray(np.random.default_rng(7).standard_normal(feeds[name].shape), np.float32)
        plus = dict(feeds, **{name: (feeds[name].astype(np.float64) + eps * v).astype(np.float32)})
        minus = dict(feeds, **{name: (feeds[name].astype(np.float64) - eps * v).astype(np.float32)})
        fd = (
            np.sum(sess.run(plus)[0].astype(np.float64) * g)
            - np.sum(sess.run(minus)[0].astype(np.float64) * g)
        ) / (2 * eps)
        analytic = float(np.sum(grad.astype(np.float64) * v))
        assert abs(fd - analytic) <= 2e-2 * max(1.0, abs(analytic)), (
            f"{name}: fd {fd} vs analytic {analytic}"
        )


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("weighted, ignore", [(False, None), (True, 1)])
@pytest.mark.parametrize("spatial", [(2,), ()])  # classes strided, or contiguous (vectorized)
def test_softmax_cross_entropy_gradient(reduction, weighted, ignore, spatial):
    scores = randn(6, 5, *spatial)
    labels = rng.integers(0, 5, (6, *spatial)).astype(np.int64)
    w = np.abs(randn(5)) + 0.1 if weighted else None
    attrs = {"reduction": reduction}
    if ignore is not None:
        attrs["ignore_index"] = ignore
    case = Case(
        "SoftmaxCrossEntropyLoss",
        {"s": scores, "l": labels, "w": w},
        ["s"],
        lambda s, l, w=None: F.cross_entropy(  # noqa: E741 (the input names of the node)
            s, l, weight=w, reduction=reduction, ignore_index=-100 if ignore is None else ignore
        ),
        attrs,
        n_out=1,
        const=("l",) + (("w",) if weighted else ()),
    )
    case.inputs = {k: v for k, v in case.inputs.items()}
    y, g, grads, _, _ = graphtrain_grad(case)
    s = torch.tensor(scores, requires_grad=True)
    ref = F.cross_entropy(
        s,
        torch.tensor(labels),
        weight=None if w is None else torch.tensor(w),
        reduction=reduction,
        ignore_index=-100 if ignore is None else ignore,
    )
    ref.backward(torch.tensor(g))
    np.testing.assert_allclose(grads[0], s.grad.numpy(), rtol=1e-4, atol=1e-6)


def test_dropout_gradient_uses_the_forward_mask():
    x = randn(50, 40)
    case = Case(
        "Dropout",
        {"x": x, "r": np.array(0.25, np.float32), "t": np.array(True)},
        ["x"],
        None,
        {"seed": 3},
        n_out=2,
        out_types=[TensorProto.FLOAT, TensorProto.BOOL],
        const=("r", "t"),
    )
    y, g, grads, _, _ = graphtrain_grad(case)
    kept = y != 0
    np.testing.assert_allclose(grads[0][kept], g[kept] / 0.75, rtol=1e-6)
    assert (grads[0][~kept] == 0).all()


def test_missing_rule_names_op_and_input():
    case = Case(
        "Range",
        {
            "a": np.array(0.0, np.float32),
            "b": np.array(5.0, np.float32),
            "d": np.array(1.0, np.float32),
        },
        ["b"],
        None,
    )
    with pytest.raises(
        Exception,
        match=r"op Range has no gradient rule; node .* needs gradients for input\(s\) 1 'b'",
    ):
        graphtrain_grad(case)


def test_integer_paths_are_not_differentiated():
    model = ge.Model.from_bytes(
        node_model(
            "Gather", {"d": randn(5, 3), "i": np.array([0, 2], np.int64)}
        ).SerializeToString()
    )
    with pytest.raises(Exception, match="cannot differentiate with respect to 'i': it is int64"):
        model.gradient_graphs(["out0"], ["i"])

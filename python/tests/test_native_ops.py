"""ATen ops that real models use run natively in the engine (no ATen fallback), with the values and
gradients of eager PyTorch. The engine-level kernels and gradient rules of the ONNX ops they become
are checked against torch and finite differences in test_gradients.py."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import graphtrain
from graphtrain import GraphModule


class Op(nn.Module):
    def __init__(self, fn: Callable) -> None:
        super().__init__()
        self.fn = fn
        self.w = nn.Parameter(torch.linspace(-1.0, 1.5, 6))

    def forward(self, x: torch.Tensor, *rest: torch.Tensor) -> torch.Tensor:
        return self.fn(x * self.w, *rest)


def _inplace_relu(x: torch.Tensor) -> torch.Tensor:
    y = x * 1.0
    z = y.relu_()
    return y + z  # reads the written tensor again


def _fill(x: torch.Tensor) -> torch.Tensor:
    y = x.clone()
    y[:, 0:2].fill_(0.5)  # in place through views: the base sees the writes
    y[1] = 2.0
    y[:, -1] = x[:, 0] * 3
    return y * x


def _copy(x: torch.Tensor) -> torch.Tensor:
    y = torch.zeros_like(x)
    y.copy_(x * 2)
    return y + x.new_ones(x.shape) + torch.full_like(x, 3.0) + x.new_zeros(x.shape[0], 6)


def _unbind(x: torch.Tensor) -> torch.Tensor:
    a, b, c = x.reshape(-1, 3, 2).unbind(1)
    return a * b - c


def _index2(x: torch.Tensor, i: torch.Tensor, j: torch.Tensor) -> torch.Tensor:
    return x.reshape(-1, 2, 3)[i[:, None], j[:2]] * 2


def _embedding(x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    table = x.reshape(-1, 6)
    return F.embedding(ids, table, padding_idx=1)


def _and(x: torch.Tensor) -> torch.Tensor:
    keep = (x > -0.5) & (x < 0.8) | (x > 1.2)
    return torch.where(keep, x, x * 0.1)


def _routing(x: torch.Tensor) -> torch.Tensor:
    """A mixture of experts' routing (transformers' grouped experts): top-2 of 6 experts per row,
    tokens sorted by expert, tokens per expert by histc, the inverse permutation by index_put_."""
    top = torch.topk(x, 2, dim=1)
    weights = top.values.softmax(-1) * 1.0
    weights /= weights.sum(-1, keepdim=True)
    ids, perm = torch.sort(top.indices.reshape(-1))
    rows = x[perm // 2]
    counts = torch.histc(ids.float(), bins=6, min=0, max=5)
    inverse = torch.empty_like(perm)
    inverse[perm] = torch.arange(perm.numel())
    back = (rows * counts[ids][:, None])[inverse].reshape(-1, 2, 6)
    return (back * weights[..., None]).sum(1)


def _index_put(x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    y = x * 1.0
    y[torch.tensor([2, 0])] = x[1:3] * 3  # distinct rows: set
    return y.index_put((rows,), x[:3] * x[:3], accumulate=True)  # repeated rows: added


CASES = {
    "cos_sin": (lambda x: torch.cos(x) * torch.sin(2 * x), ()),
    "cumsum": (lambda x: torch.cumsum(x, 1) + torch.cumsum((x > 0).long(), 0), ()),
    "relu_": (_inplace_relu, ()),
    "fill_": (_fill, ()),
    "copy_new_like": (_copy, ()),
    "min_max": (lambda x: torch.min(x, x * 0.5 - 0.2) + torch.maximum(x, torch.tensor(0.3)), ()),
    "unbind": (_unbind, ()),
    "hardswish": (lambda x: F.hardswish(x * 4) + F.hardsigmoid(x * 4), ()),
    "hardswish_": (lambda x: F.hardswish((x * 4).clone(), inplace=True), ()),
    "dropout_p0": (lambda x: F.dropout(x.clone(), 0.0, training=True, inplace=True), ()),
    "diff": (lambda x: torch.diff(x, dim=-1) + torch.diff(x, n=2, dim=0).sum(), ()),
    "clamp": (lambda x: x.clamp(-0.5, 0.7) + x.clamp(min=0.1) + x.clamp(max=torch.tensor(0.2)), ()),
    "rms_norm": (lambda x: F.rms_norm(x, (6,), torch.ones(6) * 1.5, eps=1e-6), ()),
    "pad": (lambda x: F.pad(x, (1, 2, 0, 1), value=0.25) * 2, ()),
    "gather": (lambda x, i: torch.gather(x, 1, i), ("gather_index",)),
    "index1": (lambda x, i: x[:, i] * 3, ("index",)),
    "index2": (_index2, ("rows", "cols")),
    "embedding_padding_idx": (_embedding, ("ids",)),
    "and_or": (_and, ()),
    "mse_loss": (lambda x, y: F.mse_loss(x, y, reduction="none") + F.mse_loss(x, y), ("target",)),
    "l1_smooth_l1_huber": (
        lambda x, y: (
            F.l1_loss(x, y, reduction="sum")
            + F.smooth_l1_loss(x, y, beta=0.5, reduction="none")
            + F.smooth_l1_loss(x, y, beta=0.0)
            + F.huber_loss(x, y, delta=0.7)
        ),
        ("target",),
    ),
    "nll_loss": (
        lambda x, t: (
            F.nll_loss(F.log_softmax(x, -1), t)
            + F.nll_loss(
                F.log_softmax(x, -1),
                t,
                weight=torch.tensor([0.5, 0.8, 1.1, 1.4, 1.7, 2.0]),
                ignore_index=2,
            )
            + F.nll_loss(F.log_softmax(x, -1), t, reduction="none").sum() * 0.5
        ),
        ("classes",),
    ),
    "cross_entropy_label_smoothing": (
        lambda x, t: (
            F.cross_entropy(x, t, label_smoothing=0.1)
            + F.cross_entropy(
                x,
                t,
                weight=torch.tensor([0.5, 0.8, 1.1, 1.4, 1.7, 2.0]),
                ignore_index=2,
                label_smoothing=0.2,
            )
            + F.cross_entropy(x, t, ignore_index=2, label_smoothing=0.3, reduction="sum")
            + F.cross_entropy(x, t, label_smoothing=0.05, reduction="none").sum() * 0.5
        ),
        ("classes",),
    ),
    "cross_entropy_probabilities": (
        lambda x, y: (
            F.cross_entropy(x, F.softmax(y, -1))
            + F.cross_entropy(
                x,
                F.softmax(y, -1),
                weight=torch.tensor([0.5, 0.8, 1.1, 1.4, 1.7, 2.0]),
                label_smoothing=0.1,
                reduction="sum",
            )
            + F.cross_entropy(x, F.softmax(y * 2, -1), reduction="none")[:, None]
        ),
        ("target",),
    ),
    "bce_with_logits": (
        lambda x, y: (
            F.binary_cross_entropy_with_logits(x * 3, y.sigmoid())
            + F.binary_cross_entropy_with_logits(
                x * 3,
                y.sigmoid(),
                pos_weight=torch.tensor([0.5, 1.0, 1.5, 2.0, 2.5, 3.0]),
                reduction="sum",
            )
            + F.binary_cross_entropy_with_logits(x, y.sigmoid(), weight=y.abs(), reduction="none")
        ),
        ("target",),
    ),
    "binary_cross_entropy": (
        lambda x, y: (
            F.binary_cross_entropy(x.sigmoid(), y.sigmoid())
            + F.binary_cross_entropy(x.sigmoid(), (y > 0).float(), reduction="none")
        ),
        ("target",),
    ),
    "kl_div": (
        lambda x, y: (
            F.kl_div(F.log_softmax(x, -1), F.softmax(y, -1), reduction="batchmean")
            + F.kl_div(F.log_softmax(x, -1), F.relu(y), reduction="none")
            + F.kl_div(F.log_softmax(x, 0), F.log_softmax(y, 0), reduction="sum", log_target=True)
        ),
        ("target",),
    ),
    "logsumexp": (lambda x: torch.logsumexp(x, -1, keepdim=True) + torch.logsumexp(x, (0, 1)), ()),
    "elu_selu_glu": (
        lambda x: F.elu(x * 3) + F.elu(x, alpha=0.5) + F.selu(x * 2) + F.glu(x, -1).sum(),
        (),
    ),
    "var_std": (
        lambda x: (
            x.var(-1, keepdim=True)
            + x.std(0)
            + x.var(correction=0)
            + torch.std(x, (0, 1), unbiased=False)
        ),
        (),
    ),
    "softplus_mish": (
        lambda x: F.softplus(x * 30) + F.softplus(x, beta=2.0, threshold=1.5) + F.mish(x * 3),
        (),
    ),
    "norm_normalize_cosine": (
        lambda x, y: (
            x.norm(dim=-1, keepdim=True)
            + torch.linalg.vector_norm(x, ord=1, dim=0)
            + torch.linalg.vector_norm(x)
            + F.normalize(x, dim=0)
            + F.cosine_similarity(x, y, dim=-1)[:, None]
        ),
        ("target",),
    ),
    "log1p_expm1_log2_log10": (
        lambda x: (
            torch.log1p(x.abs() * 1e-4)
            + torch.expm1(x * 1e-3)
            + torch.log2(x.abs() + 1)
            + torch.log10(x.abs() + 1)
        ),
        (),
    ),
    "hardtanh_relu6": (
        lambda x: F.hardtanh(x * 2) + F.relu6(x * 8) + F.hardtanh(x, -0.5, 0.5),
        (),
    ),  # the zero column sits on relu6's lower bound: torch's gradient there is 0
    "sign_log_sigmoid_prelu": (
        lambda x: (
            torch.sign(x) * x
            + F.logsigmoid(x * 20)
            + F.prelu(x, torch.tensor([0.25]))
            + F.prelu(x.reshape(-1, 2, 3), torch.tensor([0.1, 0.3])).reshape(-1, 6)
        ),
        (),
    ),
    "index_select_flip_roll": (
        lambda x: (
            x.index_select(1, torch.tensor([4, 0, 0, 2, 1, 5]))
            + x.flip(-1)
            + x.flip(0, 1)
            + x.roll(2, -1)
            + x.roll((-1, 7), (1, 1))
        ),
        (),
    ),
    "repeat_interleave_outer": (
        lambda x: (
            x.repeat_interleave(2, dim=1)[:, :6]
            + torch.outer(x[0], x[1])[:1]
            + x.repeat_interleave(3, dim=-1).reshape(-1, 6, 3).sum(-1)
        ),
        (),
    ),
    "var_mean_std_mean": (
        lambda x: (
            torch.var_mean(x, -1, keepdim=True)[0]
            + torch.var_mean(x, 0)[1]
            + torch.std_mean(x, -1, correction=0, keepdim=True)[0] * torch.std_mean(x)[1]
        ),
        (),
    ),
    "max_min_argmax": (
        lambda x: (
            x.max(dim=-1, keepdim=True).values
            + x.min(dim=0).values
            + x.max(-1).indices[:, None] * x
            + torch.argmin(x, 1, keepdim=True) * 0.5
            + torch.argmax(x) * 0.25
            + x.max()
            + x.clamp(min=-0.3).min()  # ties at the bound share the gradient, as torch's
            + (x * 4).floor() * (x * 4).ceil() * x  # floor, ceil, round: no gradient of their own
            + (x * 3).round()
            + torch.tensor([0.5, 1.5, 2.5, -0.5, -2.5, 3.5]).round()  # halves to even
        ),
        (),
    ),
    "einsum": (
        lambda x: (
            torch.einsum("bi,bj->bij", x, x).sum(-1)  # outer products per row
            + torch.einsum("bi,ij->bj", x, torch.tensor([[0.1, -0.2, 0.3]] * 12).reshape(6, 6))
            + torch.einsum("bi,bi->b", x, x)[:, None]  # dot products per row
            + torch.einsum("ij->ji", x).t()
            + torch.einsum("bi,j->bij", x, x[0]).sum(1)  # a label only one operand has
            + torch.einsum("bhqd,bhkd->bhqk", x.reshape(-1, 2, 1, 3), x.reshape(-1, 2, 1, 3))
            .reshape(-1, 2)
            .sum(-1, keepdim=True)
            + torch.einsum(
                "bsi,ij->bsj",
                x.reshape(-1, 2, 3),
                torch.tensor([[0.5, -1.0], [0.25, 2.0], [1.0, 0.0]]),
            )
            .reshape(-1, 4)
            .sum(-1, keepdim=True)  # free labels before the contracted one: a linear layer
            + torch.einsum("jk,bk->bj", torch.arange(36.0).reshape(6, 6) * 0.01, x)
        ),
        (),
    ),
    "topk_sort": (
        lambda x: (
            torch.topk(x, 3, dim=1).values * torch.topk(x, 2, dim=1, largest=False).indices.sum()
            + torch.sort(x, dim=1, descending=True).values[:, 1:4]
            + torch.sort(x, dim=0).values[:1, :3] * torch.sort(x, dim=1).indices[:, :3]
        ),
        (),
    ),
    "moe_routing": (_routing, ()),
    "index_put": (_index_put, ("rows",)),
    "floor_divide": (
        lambda x: x * (torch.arange(-7, 5)[: x.shape[0]] // 3)[:, None] + x * (x.detach() // 0.75),
        (),
    ),
    "broadcast_tensors": (
        lambda x, r: (lambda a, b, c: a * b + c)(*torch.broadcast_tensors(x, r, x[:, :1])),
        ("row",),
    ),
}

EXTRA = {
    "gather_index": lambda b: torch.tensor([[0, 5, 5, 1]] * b),
    "index": lambda b: torch.tensor([4, 0, 0, 2]),
    "rows": lambda b: torch.tensor([0, 1, 1]),
    "cols": lambda b: torch.tensor([1, 0, 1]),
    "ids": lambda b: torch.tensor([[0, 1, 2], [1, 1, 0]]),
    # |x - target| on both sides of smooth_l1's beta and huber's delta
    "target": lambda b: torch.linspace(-2.0, 2.0, b * 6).reshape(b, 6),
    "row": lambda b: torch.tensor([[0.5, -1.0, 2.0, 0.1, 0.3, -0.7]]),
    "classes": lambda b: torch.tensor([0, 2, 5, 2, 1, 3, 4, 2])[:b],  # 2 is ignored in one case
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_op_is_native_and_matches_eager(name):
    fn, extra = CASES[name]
    torch.manual_seed(0)
    model = Op(fn)
    gm = GraphModule(model)
    for batch in (4, 5, 3):  # sizes specialized, then symbolic for the second and the third
        x = torch.randn(batch, 6, requires_grad=True)
        rest = [EXTRA[e](batch) for e in extra]
        ref = model(x, *rest)
        g = torch.randn_like(ref)
        (gx_ref, gw_ref) = torch.autograd.grad(ref, (x, model.w), g)
        out = gm(x, *rest)
        (gx, gw) = torch.autograd.grad(out, (x, model.w), g)
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(gx, gx_ref, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(gw, gw_ref, rtol=1e-5, atol=1e-5)
    assert gm.captures == 2
    report = graphtrain.explain(model, torch.randn(4, 6), *[EXTRA[e](4) for e in extra])
    assert report.captured and report.fallback_ops == [], str(report)


class Attention(nn.Module):
    def __init__(self, **kw: object) -> None:
        super().__init__()
        self.kw = kw
        self.q = nn.Linear(8, 8)

    def forward(
        self, x: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None
    ):
        q = self.q(x)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, **self.kw)


@pytest.mark.parametrize(
    "kw, mask, heads",
    [
        ({}, None, (4, 4)),
        ({"is_causal": True}, None, (4, 4)),
        ({}, "bool", (4, 4)),
        ({}, "padding", (4, 4)),
        ({"scale": 0.3}, "float", (4, 4)),
        ({"is_causal": True, "enable_gqa": True}, None, (4, 2)),
    ],
)
def test_attention_is_one_native_op(kw, mask, heads):
    torch.manual_seed(0)
    model = Attention(**kw)
    gm = GraphModule(model)
    hq, hk = heads
    # 3 x 2 (batch x key heads) backward tasks: at 2 threads a chunk ends inside a batch, whose
    # gradient block its tasks then zero slice by slice, not whole.
    batch = 3 if hq != hk else 2
    for length in (150, 70, 9):  # several key tiles (128 keys each), several query tiles (64), one
        x = torch.randn(batch, hq, length, 8, requires_grad=True)
        k = torch.randn(batch, hk, length, 8, requires_grad=True)
        v = torch.randn(batch, hk, length, 8, requires_grad=True)
        args = [x, k, v]
        if mask == "bool":
            m = torch.rand(batch, 1, length, length) > 0.3
            m[0, 0, 3] = False  # a fully masked row gives zeros, as in torch
            args.append(m)
        elif mask == "padding":  # one flag per key, as a tokenizer's attention mask
            m = torch.rand(batch, 1, 1, length) > 0.3
            m[..., 0] = True
            args.append(m)
        elif mask == "float":
            args.append(torch.randn(1, hq, length, length))
        ref = model(*args)
        g = torch.randn_like(ref)
        grads_ref = torch.autograd.grad(ref, (x, k, v, model.q.weight), g)
        out = gm(*args)
        grads = torch.autograd.grad(out, (x, k, v, model.q.weight), g)
        torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)
        for a, b in zip(grads, grads_ref):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    # rank-4 float inputs keep only their batch dim symbolic (as images): one graph per length
    assert gm.captures == 3
    assert graphtrain.explain(model, *args).fallback_ops == []


def test_attention_dropout_is_statistically_right():
    """Dropout inside attention: over many calls, outputs and gradients average to those of the
    undropped attention (every element within 5 standard errors), and each backward uses its
    forward's mask."""
    torch.manual_seed(0)
    q, k = torch.randn(1, 1, 32, 8), torch.randn(1, 1, 32, 8)
    v = torch.randn(1, 1, 32, 8, requires_grad=True)
    gm = GraphModule(Attention(dropout_p=0.3))
    gm.module.q = nn.Identity()
    outs, grads = [], []
    for _ in range(400):
        out = gm(q, k, v)
        (g,) = torch.autograd.grad(out.sum(), v)
        # out = P_dropped @ v is linear in v, so sum(out) = <d sum(out) / dv, v> exactly when the
        # backward used this call's mask.
        torch.testing.assert_close((g * v).sum(), out.sum(), rtol=1e-5, atol=1e-5)
        outs.append(out.detach())
        grads.append(g)
    full = F.scaled_dot_product_attention(q, k, v)
    (g_full,) = torch.autograd.grad(full.sum(), v)
    for samples, expected in ((torch.stack(outs), full.detach()), (torch.stack(grads), g_full)):
        mean, std = samples.mean(0), samples.std(0)
        z = (mean - expected).abs() / (std / len(samples) ** 0.5 + 1e-6)
        assert z.max() < 5, z.max()
        assert std.mean() > 0.01  # dropout did act


class NanoGPTAttention(nn.Module):
    """nanoGPT's CausalSelfAttention without flash attention: a fused qkv projection split into
    heads, masked_fill of a registered causal buffer, softmax, the heads merged back."""

    def __init__(self, dim: int = 16, heads: int = 2, max_len: int = 32) -> None:
        super().__init__()
        self.heads = heads
        self.c_attn = nn.Linear(dim, 3 * dim)
        self.c_proj = nn.Linear(dim, dim)
        tril = torch.tril(torch.ones(max_len, max_len)).view(1, 1, max_len, max_len)
        self.register_buffer("bias", tril)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :t, :t] == 0, float("-inf"))
        y = F.softmax(att, dim=-1) @ v
        return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c))


def test_written_out_attention_becomes_one_packed_attention(tmp_path):
    """The pass recognize_attention on a model as users write it: the optimized graphs hold one
    Attention reading the qkv projection's output in place (no Softmax, Split, Transpose or
    Concat in either graph) and adding the projection's bias as it reads, and outputs and
    gradients (the bias's among them) match torch's."""
    torch.manual_seed(0)
    model = NanoGPTAttention()
    debug = graphtrain.DebugOptions(save_onnx=True, onnx_prefix="att", save_path=str(tmp_path))
    gm = GraphModule(model, debug)
    x = torch.randn(3, 20, 16, requires_grad=True)
    ref = model(x)
    g = torch.randn_like(ref)
    grads_ref = torch.autograd.grad(ref, (x, *model.parameters()), g)
    out = gm(x)
    grads = torch.autograd.grad(out, (x, *model.parameters()), g)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)
    for a, b in zip(grads, grads_ref):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    onnx = pytest.importorskip("onnx")
    for name, op in (("forward", "Attention"), ("backward", "AttentionGrad")):
        graph = onnx.load(tmp_path / f"att_train_training_{name}.onnx").graph
        ops = [n.op_type for n in graph.node]
        att = [n for n in graph.node if n.op_type == op]
        assert len(att) == 1, ops
        assert {a.name: onnx.helper.get_attribute_value(a) for a in att[0].attribute}["packed"] == 1
        assert not {"Softmax", "Split", "Transpose", "Concat", "SoftmaxGrad"} & set(ops), ops
        bias = att[0].input[4 if op == "Attention" else 8]
        assert bias == "c_attn.bias" or "c_attn.bias" in bias, list(att[0].input)
        if op == "Attention":  # c_proj's bias Add is the only one left
            assert ops.count("Add") == 1, ops


def _trained_at_parity(model: torch.nn.Module, x: torch.Tensor, folder: Path) -> tuple[list, list]:
    """One forward and backward of `model` in GraphModule: the output and every gradient (x's and
    the parameters') match torch's; returns the nodes of the training forward and backward
    graphs."""
    onnx = pytest.importorskip("onnx")
    debug = graphtrain.DebugOptions(save_onnx=True, onnx_prefix="m", save_path=str(folder))
    gm = GraphModule(copy.deepcopy(model), debug)
    x.requires_grad_()
    ref = model(x)
    g = torch.randn_like(ref)
    grads_ref = torch.autograd.grad(ref, (x, *model.parameters()), g)
    out = gm(x)
    grads = torch.autograd.grad(out, (x, *gm.module.parameters()), g)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    for a, b in zip(grads, grads_ref):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    return tuple(
        list(onnx.load(folder / f"m_train_training_{kind}.onnx").graph.node)
        for kind in ("forward", "backward")
    )


class _RMSNorms(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(16, 32)
        self.norm = torch.nn.RMSNorm(32, eps=1e-6)
        self.bare = torch.nn.RMSNorm(32, elementwise_affine=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bare(self.norm(self.lin(x)))


def test_torch_rms_norm_becomes_one_op(tmp_path):
    """torch.nn.RMSNorm, with and without its weight, as graphtrain translates it (x * rsqrt(mean
    of x^2 + eps) * w): one RMSNormalization each in the forward (recognize_rms_norm), one
    RMSNormalizationGrad each backward, and outputs and gradients match torch's."""
    torch.manual_seed(0)
    forward, backward = _trained_at_parity(_RMSNorms(), torch.randn(4, 8, 16), tmp_path)
    for ops, op in ((forward, "RMSNormalization"), (backward, "RMSNormalizationGrad")):
        assert [n.op_type for n in ops].count(op) == 2, ops
        assert "ReduceMean" not in [n.op_type for n in ops]


class _SamePadded(torch.nn.Module):
    """TensorFlow's SAME padding spelled out before each convolution, as transformers' MobileNets
    write it: F.pad by amounts computed from the input's size, then an unpadded Conv2d."""

    def __init__(self) -> None:
        super().__init__()
        self.down = torch.nn.Conv2d(4, 8, 3, stride=2)
        self.depthwise = torch.nn.Conv2d(8, 8, 3, groups=8, bias=False)
        self.pointwise = torch.nn.Conv2d(8, 6, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.nn.functional.pad(x, (0, 1, 0, 1))  # stride 2 on an even size: after only
        x = torch.nn.functional.pad(self.down(x), (1, 1, 1, 1))
        return self.pointwise(torch.nn.functional.pad(self.depthwise(x), (0, 0, 0, 0)))


def test_zero_pads_before_convolutions_become_conv_pads(tmp_path):
    """Each F.pad before a Conv2d (asymmetric, symmetric, and all zero) is folded into the
    convolution's own pads before autodiff (fold_pad_into_conv): no Pad forward, no cropping Pad
    backward, and outputs and gradients match torch's, through the depthwise kernels too."""
    torch.manual_seed(0)
    forward, backward = _trained_at_parity(_SamePadded(), torch.randn(2, 4, 10, 12), tmp_path)
    for ops in (forward, backward):
        assert "Pad" not in [n.op_type for n in ops]
    pads = [
        list(a.ints)
        for n in forward
        if n.op_type == "Conv"
        for a in n.attribute
        if a.name == "pads"
    ]
    assert pads == [[0, 0, 1, 1], [1, 1, 1, 1], [0, 0, 0, 0]], pads


def test_packed_attention_adds_the_qkv_bias_as_it_reads():
    """Attention(X, bias) and its gradient give what Attention(X + bias) gives within float
    rounding, with a causal mask, a row that sees nothing (zeros, bias or not) and dropout off,
    though neither pass copies the keys or values with their bias: the keys' bias shifts each
    row's scores by a constant the softmax cancels (so the folded log-sum-exp leaves it out, and
    the backward reads that one), the values' is added to the output rows. A bias of the wrong
    size is refused by name."""
    import numpy as np
    from onnx import helper

    from onnx_util import graph_session

    heads, e, t = 2, 4, 7
    width = 3 * heads * e

    def attention(ins, **kw):
        return helper.make_node(
            "Attention", ins, ["y", "lse"], domain="graphtrain", packed=1, heads=heads, **kw
        )

    def grad(ins):
        return helper.make_node(
            "AttentionGrad", ins, ["dx"], domain="graphtrain", packed=1, heads=heads
        )

    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, t, width), np.float32)
    b = rng.standard_normal(width, np.float32)
    dy = rng.standard_normal((2, t, heads, e), np.float32)
    mask = np.triu(np.full((t, t), -np.inf, np.float32), 1)
    mask[4] = -np.inf  # row 4 sees nothing
    io = [("x", [2, t, width]), ("b", [width]), ("mask", [t, t])]
    added = graph_session(
        [helper.make_node("Add", ["x", "b"], ["xb"]), attention(["xb", "", "", "mask"])],
        io,
        ["y", "lse"],
    )
    folded = graph_session([attention(["x", "", "", "mask", "b"])], io, ["y", "lse"])
    feeds = {"x": x, "b": b, "mask": mask}
    y, lse = added.run(feeds)
    y2, lse2 = folded.run(feeds)
    np.testing.assert_allclose(y2, y, rtol=1e-5, atol=1e-6)
    assert not y2[:, 4].any() and not y[:, 4].any()
    q, k = (x + b).reshape(2, t, 3, heads, e).transpose(2, 0, 3, 1, 4)[:2]
    shift = np.einsum("bhte,he->bht", q, b.reshape(3, heads, e)[1]) / np.sqrt(e)
    np.testing.assert_allclose(lse2 + shift, lse, rtol=1e-5, atol=1e-5)
    gio = [("dy", dy.shape), ("x", x.shape), ("y", y.shape), ("lse", lse.shape), ("mask", [t, t])]
    (dx,) = graph_session([grad(["dy", "x", "", "", "y", "lse", "mask"])], gio, ["dx"]).run(
        {"dy": dy, "x": x + b, "y": y, "lse": lse, "mask": mask}
    )
    (dx2,) = graph_session(
        [grad(["dy", "x", "", "", "y", "lse", "mask", "", "b"])], gio + [("b", [width])], ["dx"]
    ).run({"dy": dy, "x": x, "y": y2, "lse": lse2, "mask": mask, "b": b})
    np.testing.assert_allclose(dx2, dx, rtol=1e-4, atol=1e-5)
    with pytest.raises(Exception, match="qkv bias must be"):
        graph_session(
            [attention(["x", "", "", "mask", "b"])],
            io[:1] + [("b", [width - 1])] + io[2:],
            ["y", "lse"],
        )


class Classifier(nn.Module):
    def __init__(self, reduction: str, weighted: bool, classes: int = 11) -> None:
        super().__init__()
        self.fc = nn.Linear(8, classes)
        self.reduction = reduction
        self.register_buffer("w", torch.rand(classes) + 0.5 if weighted else None)

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(
            self.fc(x), labels, weight=self.w, reduction=self.reduction, ignore_index=4
        )


@pytest.mark.parametrize(
    "reduction, weighted, classes",
    [("mean", False, 11), ("sum", True, 11), ("mean", True, 11), ("mean", True, 37)],
)
def test_cross_entropy_writes_its_gradient_in_the_forward(tmp_path, reduction, weighted, classes):
    """fuse_loss_gradient: the loss is graphtrain::SoftmaxCrossEntropyLoss, whose forward writes
    the scores' gradient for dloss = 1; the backward scales it by dloss (its unit=1 gradient op).
    Gradients match torch's for loss.backward() (dloss 1: the gradient handed on as it is) and for
    a scaled loss, with ignored labels and class weights. Rows of 11 classes are all tail to the
    kernel's vectors; 37 are whole vectors and a tail."""
    torch.manual_seed(0)
    model = Classifier(reduction, weighted, classes)
    debug = graphtrain.DebugOptions(save_onnx=True, onnx_prefix="ce", save_path=str(tmp_path))
    gm = GraphModule(model, debug)
    x = torch.randn(9, 8)
    labels = torch.tensor([1, 4, 10, 0, 4, 3, 3, 7, 2])
    for scale in (1.0, 0.3):
        ref = model(x, labels) * scale
        grads_ref = torch.autograd.grad(ref, list(model.parameters()))
        out = gm(x, labels) * scale
        grads = torch.autograd.grad(out, list(model.parameters()))
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)
        for a, b in zip(grads, grads_ref):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    onnx = pytest.importorskip("onnx")
    fwd = onnx.load(tmp_path / "ce_train_training_forward.onnx").graph
    bwd = onnx.load(tmp_path / "ce_train_training_backward.onnx").graph
    (loss,) = [n for n in fwd.node if n.op_type == "SoftmaxCrossEntropyLoss"]
    assert loss.domain == "graphtrain" and len(loss.output) == 2
    (grad,) = [n for n in bwd.node if n.op_type == "SoftmaxCrossEntropyLossGrad"]
    assert {a.name: onnx.helper.get_attribute_value(a) for a in grad.attribute}["unit"] == 1


class _Grids(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Parameter(torch.randn(3))
        self.b = torch.nn.Parameter(torch.randn(4))
        self.c = torch.nn.Parameter(torch.randn(2))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        ij = torch.meshgrid(self.a * x[0], self.b, indexing="ij")
        xy = torch.meshgrid(self.a, self.b, self.c, indexing="xy")
        return (*ij, *xy, torch.stack(torch.meshgrid(self.b, self.c, indexing="xy")))


def test_meshgrid_runs_natively_with_both_indexings():
    """torch.meshgrid (BEiT's and Swin's relative position coordinates) as Unsqueeze + Expand
    of each input, 'ij' and 'xy' (the first two axes swapped): every grid and the gradients as
    torch's, and no ATen fallback."""
    torch.manual_seed(0)
    model = _Grids()
    x = torch.randn(2)
    gm = GraphModule(copy.deepcopy(model))
    refs, outs = model(x), gm(x)
    weights = [torch.randn_like(r) for r in refs]
    sum(((r * w).sum() for r, w in zip(refs, weights)), torch.zeros(())).backward()
    sum(((o * w).sum() for o, w in zip(outs, weights)), torch.zeros(())).backward()
    for o, r in zip(outs, refs):
        torch.testing.assert_close(o, r)
    for p, q in zip(gm.module.parameters(), model.parameters()):
        torch.testing.assert_close(p.grad, q.grad)
    assert graphtrain.explain(model, x).fallback_ops == []


class _DropPaths(torch.nn.Module):
    """Stochastic depth as transformers writes it (rand + floor_) and as timm does (bernoulli_)."""

    def __init__(self, keep: float) -> None:
        super().__init__()
        self.keep = keep
        self.w = torch.nn.Parameter(torch.linspace(0.5, 1.5, 8))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = x * self.w
        shape = (h.shape[0],) + (1,) * (h.ndim - 1)
        mask = (self.keep + torch.rand(shape, dtype=h.dtype, device=h.device)).floor_()
        timm = h.new_empty(shape).bernoulli_(self.keep)
        return h / self.keep * mask, h / self.keep * timm


def test_drop_path_draws_natively_per_sample_and_its_gradient_follows_the_mask():
    """Drop path's random masks run on graphtrain's generator (no ATen fallback): each sample is
    kept whole (scaled by 1/keep) or zeroed, with probability keep over many samples, new masks
    every call, and each backward uses its own forward's mask."""
    torch.manual_seed(0)
    keep = 0.7
    model = _DropPaths(keep)
    x = torch.randn(4000, 3, 8)
    assert graphtrain.explain(model, x).fallback_ops == []
    gm = GraphModule(copy.deepcopy(model))
    kept = []
    for _ in range(2):
        gm.module.w.grad = None
        a, b = gm(x)
        (a.sum() + 2 * b.sum()).backward()
        scaled = x * gm.module.w.detach() / keep
        masks = []
        for out in (a, b):
            m = (out != 0).flatten(1)
            assert (m.all(1) | ~m.any(1)).all()  # whole samples kept or dropped
            m = m.all(1)
            torch.testing.assert_close(out[m], scaled[m])
            masks.append(m)
        expected = ((x * (masks[0] + 2 * masks[1])[:, None, None]).sum((0, 1))) / keep
        torch.testing.assert_close(gm.module.w.grad, expected, rtol=1e-4, atol=1e-3)
        kept.append(torch.stack(masks))
    for m in kept[0].float().mean(1):  # 4000 draws: standard error 0.007
        assert abs(m.item() - keep) < 0.04
    assert (kept[0] != kept[1]).any()  # new masks every call
    assert (kept[0][0] != kept[0][1]).any()  # the two drop paths draw independently
    with torch.no_grad():  # a smaller batch: the masks' shape follows it
        a, b = gm(x[:10])
    assert a.shape == (10, 3, 8)


class _Interpolations(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.conv1d = torch.nn.Conv1d(3, 4, 3)

    def forward(self, x: torch.Tensor, z: torch.Tensor) -> list[torch.Tensor]:
        h, s = self.conv(x), self.conv1d(z)
        return [
            F.interpolate(h, scale_factor=2, mode="bilinear"),
            F.interpolate(h, size=(7, 9), mode="bilinear", align_corners=True),
            F.interpolate(h, size=(5, 3), mode="bilinear"),  # down
            F.interpolate(h, scale_factor=1.1, mode="bilinear"),  # the same size: a copy
            F.interpolate(h, scale_factor=(1.5, 0.5), mode="nearest"),
            F.interpolate(h, size=(11, 13), mode="nearest-exact"),
            F.interpolate(s, size=17, mode="linear"),
            F.interpolate(s, scale_factor=3, mode="nearest"),
            F.interpolate(h, scale_factor=1.3, mode="nearest"),  # not a float32: ATen fallback
            F.interpolate(h, size=(6, 7), mode="bicubic"),  # ATen fallback
        ]


def test_interpolate_runs_natively_with_torchs_coordinates():
    """F.interpolate's nearest, nearest-exact, linear and bilinear (SegFormer's decode head,
    BEiT's position bias) run as Resize and ResizeGrad: outputs and gradients as torch's, at two
    batch sizes. Bicubic, and nearest by a scale factor float32 cannot hold, use the fallback."""
    torch.manual_seed(0)
    model = _Interpolations()
    gm = GraphModule(copy.deepcopy(model))
    for batch in (2, 3):
        x, z = torch.randn(batch, 3, 8, 6), torch.randn(batch, 3, 10)
        refs, outs = model(x, z), gm(x, z)
        weights = [torch.randn_like(r) for r in refs]
        sum(((r * w).sum() for r, w in zip(refs, weights)), torch.zeros(())).backward()
        sum(((o * w).sum() for o, w in zip(outs, weights)), torch.zeros(())).backward()
        for i, (o, r) in enumerate(zip(outs, refs)):
            torch.testing.assert_close(o, r, rtol=1e-5, atol=1e-5, msg=lambda m, i=i: f"{i}: {m}")
        for p, q in zip(gm.module.parameters(), model.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-4)
            p.grad = q.grad = None
    fallback = graphtrain.explain(model, x, z).fallback_ops
    assert sorted(fallback) == ["aten.upsample_bicubic2d.vec", "aten.upsample_nearest2d.vec"]


class _Norms(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.groups = torch.nn.GroupNorm(2, 4)
        self.instance = torch.nn.GroupNorm(4, 4, affine=False)  # wav2vec2's: a group per channel
        self.image = torch.nn.GroupNorm(3, 6)
        pw = torch.nn.utils.parametrizations.weight_norm
        self.conv = pw(torch.nn.Conv1d(4, 4, 3), dim=2)  # wav2vec2's positional convolution
        self.linear = pw(torch.nn.Linear(4, 6))  # dim 0
        self.whole = torch.nn.utils.weight_norm(torch.nn.Linear(6, 6), dim=None)  # the old API

    def forward(self, x: torch.Tensor, image: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.conv(self.instance(self.groups(x)))
        return self.whole(self.linear(h.relu().transpose(1, 2))), self.image(image)


def test_group_norm_and_weight_norm_run_natively():
    """GroupNorm (as LayerNormalization of [N, groups, -1] rows and a per-channel affine) and
    weight norm (v * g / ||v|| over every dim but one, or all), both APIs: outputs and gradients
    as torch's at two sequence lengths, and no ATen fallback."""
    models = []
    for _ in range(2):  # the old weight_norm API's module cannot be deep-copied
        torch.manual_seed(0)
        models.append(_Norms())
    model, gm = models[0], GraphModule(models[1])
    for batch, length in ((2, 12), (3, 15)):
        x, image = torch.randn(batch, 4, length), torch.randn(batch, 6, 3, 5)
        refs, outs = model(x, image), gm(x, image)
        weights = [torch.randn_like(r) for r in refs]
        sum(((r * w).sum() for r, w in zip(refs, weights)), torch.zeros(())).backward()
        sum(((o * w).sum() for o, w in zip(outs, weights)), torch.zeros(())).backward()
        for o, r in zip(outs, refs):
            torch.testing.assert_close(o, r, rtol=1e-5, atol=1e-5)
        scale = max(p.grad.abs().max().item() for p in model.parameters())
        for (name, p), q in zip(gm.module.named_parameters(), model.parameters()):
            torch.testing.assert_close(
                p.grad, q.grad, rtol=1e-4, atol=1e-6 * scale, msg=lambda m, n=name: f"{n}: {m}"
            )
            p.grad = q.grad = None
    assert graphtrain.explain(model, x, image).fallback_ops == []

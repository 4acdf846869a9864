"""Real Hugging Face transformers models (small random-init configs, default settings) train in
GraphModule at parity with eager PyTorch."""

from __future__ import annotations

import copy
import logging
import re
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
import transformers as tf

import graphtrain
from graphtrain import (
    GraphModule,
    UnsupportedModelError,
    _aten,  # noqa: F401  (registers the ATen translators the tests remove)
    _translate,
)
from real_models import MODELS, MORE, build, inputs

NAMES = sorted(MODELS)


def _grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("name", NAMES + sorted(MORE))
def test_step0_loss_and_every_gradient_match_eager(name):
    """Loss and every parameter gradient within rtol 1e-4. Gradients that are identically zero in
    exact arithmetic (an attention key bias: softmax ignores a constant added to every score) are
    rounding noise on both sides; the absolute tolerance, 1e-6 of the model's largest gradient,
    covers them and nothing else."""
    ref = build(name)
    gm = GraphModule(copy.deepcopy(ref))
    batch = inputs(name, 3, seed=1)
    ref_loss = ref(**batch).loss
    ref_loss.backward()
    loss = gm(**batch).loss
    loss.backward()
    np.testing.assert_allclose(loss.item(), ref_loss.item(), rtol=1e-4)
    ref_grads, grads = _grads(ref), _grads(gm.module)
    assert ref_grads.keys() == grads.keys()
    scale = max(g.abs().max().item() for g in ref_grads.values())
    for n, g in ref_grads.items():
        torch.testing.assert_close(
            grads[n], g, rtol=1e-4, atol=1e-6 * scale, msg=lambda m, n=n: f"{n}: {m}"
        )
    fallback = graphtrain.explain(ref, **batch).fallback_ops
    assert fallback == [], fallback  # every op runs natively


def _train(model: torch.nn.Module, name: str, steps: int) -> list[float]:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    losses = []
    for step in range(steps):
        batch = inputs(name, 2 if step % 2 else 3, seed=100 + step)  # two batch sizes
        opt.zero_grad()
        loss = model(**batch).loss
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def _nudged(model: torch.nn.Module) -> torch.nn.Module:
    """A copy whose parameters differ by one ulp: what rounding alone does to a run."""
    other = copy.deepcopy(model)
    with torch.no_grad():
        for p in other.parameters():
            p.copy_(torch.nextafter(p, torch.full_like(p, float("inf"))))
    return other


@pytest.mark.parametrize("name", NAMES)
def test_six_adamw_steps_match_eager(name):
    """Every loss within rtol 1e-4 of eager; two batch sizes capture twice (the first graph
    specializes the sizes, the second keeps them symbolic and serves both after). The ResNet's
    BatchNorm at batch 2-3 makes eager itself chaotic: there the bound is 10x the noise floor (two
    eager runs whose parameters differ by one ulp), when that is larger."""
    ref = build(name)
    gm = GraphModule(copy.deepcopy(ref))
    floor_model = _nudged(ref)
    theirs = _train(ref, name, 6)
    ours = _train(gm, name, 6)
    assert gm.captures == 2
    rel = np.abs(np.array(ours) - theirs) / np.abs(theirs)
    tolerance = 1e-4
    if name == "resnet":
        floor = float(
            np.max(np.abs(np.array(_train(floor_model, name, 6)) - theirs) / np.abs(theirs))
        )
        print(f"resnet noise floor (1 ulp of the parameters): {floor:.2e}")
        tolerance = max(tolerance, 10 * floor)
    assert rel.max() <= tolerance, f"losses {ours} vs eager {theirs}"


def test_forced_fallback_trains_at_parity_and_warns_once(monkeypatch, caplog):
    """An op graphtrain runs natively (LayerNorm), forced through the ATen fallback."""
    monkeypatch.delitem(_translate.TRANSLATORS, torch.ops.aten.layer_norm.default)
    ref = build("gpt2")
    gm = GraphModule(copy.deepcopy(ref))
    with caplog.at_level(logging.WARNING, logger="graphtrain"):
        ours = _train(gm, "gpt2", 6)
    theirs = _train(ref, "gpt2", 6)
    np.testing.assert_allclose(ours, theirs, rtol=1e-4)
    warnings = [r.getMessage() for r in caplog.records if "run through PyTorch" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert "aten.layer_norm.default" in warnings[0] and "transformer.h.0.ln_1" in warnings[0]
    assert "graphtrain.explain" in warnings[0]


def test_fallback_policy_off_names_op_and_module(monkeypatch):
    graphtrain.set_option("fallback_policy", "off")
    monkeypatch.delitem(_translate.TRANSLATORS, torch.ops.aten.layer_norm.default)
    gm = GraphModule(build("gpt2"))
    with pytest.raises(
        UnsupportedModelError, match=r"aten.layer_norm.default.*module 'transformer.h.0.ln_1'"
    ):
        gm(**inputs("gpt2", 2, seed=0))


def test_explain_reports_every_op_of_gpt2(monkeypatch):
    model = build("gpt2")
    batch = inputs("gpt2", 2, seed=0)
    report = graphtrain.explain(model, **batch)
    assert report.captured and report.fallback_ops == []
    counts = report.counts()
    assert counts["native"] > 100 and set(counts) == {"native"}
    attention = [r for r in report.ops if r.op == "aten.scaled_dot_product_attention.default"]
    assert attention[0].count == 2 and attention[0].modules == [
        "transformer.h.0.attn",
        "transformer.h.1.attn",
    ]
    text = str(report)
    assert (
        text.startswith("GPT2LMHeadModel:") and "aten.scaled_dot_product_attention.default" in text
    )
    # with an op forced through the fallback, the report says so and names the module
    monkeypatch.delitem(_translate.TRANSLATORS, torch.ops.aten.layer_norm.default)
    report = graphtrain.explain(GraphModule(model), **batch)
    assert report.fallback_ops == ["aten.layer_norm.default"]
    (norm,) = [r for r in report.ops if r.runs_as == "ATen fallback"]
    assert norm.count == 5 and "transformer.ln_f" in norm.modules
    assert re.search(
        r"aten.layer_norm.default +ATen fallback +5  transformer.h.0.ln_1", str(report)
    )


def test_explain_gives_the_reason_a_model_cannot_be_captured():
    class DataDependent(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if x.sum() > 0:  # control flow on a value: torch.export cannot trace it
                return x * 2
            return x

    report = graphtrain.explain(DataDependent(), torch.randn(3))
    assert not report.captured
    assert "cannot be captured" in str(report) and report.reason


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_returned_cache_holds_this_calls_tensors(name):
    """The DynamicCache a causal LM returns is rebuilt around each call's tensors, equal to eager's
    (never the object built while tracing)."""
    ref = build(name)
    gm = GraphModule(copy.deepcopy(ref))
    for seed in (1, 2):
        batch = inputs(name, 2, seed=seed)
        theirs = ref(**batch).past_key_values
        ours = gm(**batch).past_key_values
        assert type(ours) is type(theirs) and len(ours.layers) == len(theirs.layers)
        for a, b in zip(ours.layers, theirs.layers):
            assert type(a.keys) is torch.Tensor and not isinstance(
                a.keys, torch._subclasses.FakeTensor
            )
            torch.testing.assert_close(a.keys, b.keys, rtol=1e-4, atol=1e-5)
            torch.testing.assert_close(a.values, b.values, rtol=1e-4, atol=1e-5)
        assert ours.get_seq_length() == theirs.get_seq_length() == 16
    # Training never differentiates the cache: the backward built for that drops the zero
    # gradients of the keys and values (2 layers) as well as the logits', with the Transposes and
    # Splits that carried them.
    loss = gm(**inputs(name, 2, seed=3)).loss
    loss.backward()
    runner = next(iter(gm._runners.values()))
    ((missing, _),) = runner._backwards.items()
    zero = [g for g, m in zip(runner._grad_inputs, missing) if m]
    assert len(zero) == 5  # logits, 2 x (keys, values)
    assert runner._backward_source.copy().drop_zero_gradients(zero) == 5


def test_autocast_region_is_named_in_a_clear_error():
    class Mixed(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = torch.nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                y = self.proj(x)
            return y.float().sum()

    with pytest.raises(
        UnsupportedModelError, match=r"torch.autocast region \(cpu, torch.bfloat16\).*float32"
    ):
        GraphModule(Mixed())(torch.randn(2, 4))


def test_forced_batch_norm_fallback_trains_and_updates_running_stats(monkeypatch):
    """A fallback op with inputs that take no gradient (BatchNorm's running statistics): only the
    inputs the gradient builder asks for are differentiated, and the statistics still update."""
    monkeypatch.delitem(_translate.TRANSLATORS, torch.ops.aten.batch_norm.default)
    ref = build("resnet")
    gm = GraphModule(copy.deepcopy(ref))
    ours, theirs = _train(gm, "resnet", 2), _train(ref, "resnet", 2)
    np.testing.assert_allclose(ours, theirs, rtol=1e-4)
    for (name, a), b in zip(gm.module.named_buffers(), ref.buffers()):
        torch.testing.assert_close(
            a, b, rtol=1e-4, atol=1e-6, msg=lambda m, name=name: f"{name}: {m}"
        )


def test_gpt2_gelu_runs_as_one_op(tmp_path):
    """transformers' NewGELUActivation, 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))) in
    elementary ops, becomes one Gelu before autodiff (recognize_gelu): no Tanh in the graphs, and
    the gradients still match eager (test above). The forward's Gelu also writes its derivative
    (stash_gelu_derivative), so the backward has no GeluGrad; with that pass off, one GeluGrad per
    layer reads the GELU's output (gelu_grad_from_output) through the view Conv1D stashes for
    c_proj's weight gradient."""
    layers = build("gpt2").config.n_layer

    def graphs(folder: str) -> tuple[onnx.GraphProto, onnx.GraphProto]:
        gm = GraphModule(
            build("gpt2"),
            graphtrain.DebugOptions(save_onnx=True, onnx_prefix="g", save_path=str(folder)),
        )
        gm(**inputs("gpt2", 2, seed=0)).loss.backward()
        return tuple(
            onnx.load(folder / f"g_train_training_{kind}.onnx").graph
            for kind in ("forward", "backward")
        )

    def ops(graph: onnx.GraphProto) -> list[str]:
        names = [n.op_type for n in graph.node]
        for n in graph.node:  # the ops inside fused elementwise programs
            names += [s.decode() for a in n.attribute if a.name == "ops" for s in a.strings]
        return names

    forward, backward = graphs(tmp_path / "stash")
    assert "Tanh" not in ops(forward) and "TanhGrad" not in ops(backward)
    gelus = [n for n in forward.node if n.op_type == "Gelu"]
    assert len(gelus) == layers and all(len(n.output) == 2 for n in gelus)  # Y and Y'
    assert not {"GeluGrad", "GeluTanhGrad"} & set(ops(backward))

    graphtrain.set_option("disable_passes", "stash_gelu_derivative")
    try:
        forward, backward = graphs(tmp_path / "from_output")
    finally:
        graphtrain.reload_options()
    assert ops(forward).count("Gelu") + ops(forward).count("GeluTanh") == layers
    grads = [n for n in backward.node if n.op_type == "GeluGrad"]
    assert len(grads) == layers and all(len(n.input) == 3 for n in grads)


def _trained_ops(name: str, folder: Path) -> tuple[list[str], list[str]]:
    """The ops of the training forward and backward graphs of one step of real model `name`, the
    ops inside fused elementwise programs included."""
    gm = GraphModule(
        build(name), graphtrain.DebugOptions(save_onnx=True, onnx_prefix="m", save_path=str(folder))
    )
    gm(**inputs(name, 2, seed=0)).loss.backward()
    ops = []
    for kind in ("forward", "backward"):
        nodes = onnx.load(folder / f"m_train_training_{kind}.onnx").graph.node
        names = [n.op_type for n in nodes]
        names += [
            s.decode() for n in nodes for a in n.attribute if a.name == "ops" for s in a.strings
        ]
        ops.append(names)
    return ops[0], ops[1]


@pytest.mark.parametrize("name", ["llama", "mistral", "t5"])
def test_rms_norms_run_as_one_op(name, tmp_path):
    """Llama's, Mistral's and T5's RMSNorm (x * rsqrt(mean(x^2) + eps) * w in elementary ops)
    becomes one RMSNormalization before autodiff (recognize_rms_norm), each norm its own, and the
    backward one RMSNormalizationGrad each; the gradients still match eager (tests above)."""
    norms = sum(
        type(m).__name__.endswith(("RMSNorm", "T5LayerNorm")) for m in build(name).modules()
    )
    forward, backward = _trained_ops(name, tmp_path)
    assert norms >= 5
    # the residual add before a norm runs in its pass (fuse_layer_norm): Llama's four in-block norms
    assert forward.count("RMSNormalization") + forward.count("AddRMSNormalization") == norms
    assert forward.count("AddRMSNormalization") >= 4
    assert "ReduceMean" not in forward
    assert backward.count("RMSNormalizationGrad") == norms


@pytest.mark.parametrize("name", ["llama", "mistral"])
def test_rotary_embedding_runs_as_one_op(name, tmp_path):
    """The rotary embedding of the queries and keys (q * cos + rotate_half(q) * sin) becomes one
    Rotary each before autodiff (recognize_rotary), and its gradient one Rotary of the transposed
    rotation: no Slice, Neg and Concat forward, no SliceGrad backward. Grouped key/value heads
    reach Attention unrepeated. The rotation runs on the projections' [b, t, h, d] and Attention
    reads that layout (heads_inside): the heads are transposed only for the returned key/value
    cache. The causal mask, materialized from constants, becomes Attention's causal=1. Gradients
    match eager (tests above)."""
    layers = build(name).config.num_hidden_layers
    forward, backward = _trained_ops(name, tmp_path)
    assert forward.count("Rotary") == backward.count("Rotary") == 2 * layers
    assert "Neg" not in forward
    nodes = onnx.load(tmp_path / "m_train_training_forward.onnx").graph.node
    attention = [n for n in nodes if n.op_type == "Attention"]
    assert len(attention) == layers
    for n in attention:
        attrs = {a.name: a.i for a in n.attribute if a.type == onnx.AttributeProto.INT}
        assert attrs.get("heads_inside") == 1
        if name == "llama":  # (Mistral's sliding window keeps its mask)
            assert attrs.get("causal") == 1 and (len(n.input) < 4 or not n.input[3])
    assert forward.count("Transpose") <= 2 * layers  # the cache's keys and values
    # the keys and values go to attention as their grouped heads, not repeat_kv's copies
    # (recognize_attention): no Expand of them forward, no ReduceSum of their gradients backward
    assert "ReduceSum" not in backward
    # (Mistral's backward slices the gradients of its sliding-window cache, which training leaves
    # without gradient: that backward drops them)
    assert "SliceGrad" not in backward or name == "mistral"


@pytest.mark.parametrize("name", ["llama", "mistral"])
def test_swiglu_runs_as_one_op(name, tmp_path):
    """silu(gate_proj(x)) * up_proj(x) becomes one SiluMul before autodiff (recognize_silu_mul)
    and its gradient one SiluMulGrad: no Sigmoid forward, so no sigmoid or silu stashed.
    Gradients match eager (tests above)."""
    layers = build(name).config.num_hidden_layers
    forward, backward = _trained_ops(name, tmp_path)
    assert forward.count("SiluMul") == layers and "Sigmoid" not in forward
    assert backward.count("SiluMulGrad") == layers


def test_mobilenet_v2_gradients_as_accurate_as_eagers():
    """transformers' MobileNetV2: TensorFlow's SAME padding spelled out as F.pad before each of its
    52 convolutions (folded into them: fold_pad_into_conv), ReLU6, and depthwise convolutions,
    strided ones among them (graphtrain's direct kernels). Its batch norms over a batch of 3 make
    the gradients ill-conditioned: eager's own float32 gradients differ from float64's by ~2% of
    the largest, so an elementwise tolerance cannot hold. What holds: each parameter's gradient is
    as close to float64 eager's as float32 eager's is (within 10%), and every op runs natively."""
    torch.manual_seed(0)
    ref = tf.MobileNetV2ForImageClassification(
        tf.MobileNetV2Config(
            image_size=64, depth_multiplier=0.35, num_labels=3, classifier_dropout_prob=0.0
        )
    ).train()
    exact = copy.deepcopy(ref).double()
    gm = GraphModule(copy.deepcopy(ref))
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(3, 3, 64, 64, generator=gen)
    labels = torch.randint(0, 3, (3,), generator=gen)
    ref_loss = ref(pixel_values=x, labels=labels).loss
    ref_loss.backward()
    loss = gm(pixel_values=x, labels=labels).loss
    loss.backward()
    exact(pixel_values=x.double(), labels=labels).loss.backward()
    np.testing.assert_allclose(loss.item(), ref_loss.item(), rtol=1e-5)
    scale = max(p.grad.abs().max().item() for p in exact.parameters())
    for (name, e), r, g in zip(exact.named_parameters(), ref.parameters(), gm.module.parameters()):
        eager_error = (r.grad.double() - e.grad).abs().max().item()
        error = (g.grad.double() - e.grad).abs().max().item()
        assert error <= 1.1 * eager_error + 1e-6 * scale, (name, error, eager_error)
    fallback = graphtrain.explain(ref, pixel_values=x, labels=labels).fallback_ops
    assert fallback == [], fallback


def test_bloom_gelu_function_runs_natively(tmp_path):
    """BLOOM applies its GELU through a torch.autograd.Function (GeLUFunction) in training, which
    graphtrain would keep opaque and call back twice a step (a PythonOp each way: as slow as
    eager); its built-in decomposition (the tanh GELU, whose exact derivative is the Function's
    backward) makes it one Gelu per layer, differentiated natively. Gradients match eager (tests
    above)."""
    layers = build("bloom").config.n_layer
    forward, backward = _trained_ops("bloom", tmp_path)
    assert "PythonOp" not in forward and "PythonOpGrad" not in backward
    assert forward.count("GeluTanh") == layers, forward  # in the bias + GELU loop


def test_a_mask_that_hides_nothing_is_dropped(tmp_path):
    """Without padding, transformers' bidirectional mask hides nothing, but under torch.export it
    is materialized ([b, 1, t, t] bools from a comparison over a range). wav2vec2's Attention
    takes no mask: its kernels read none and the backward gets none stashed (parity: above)."""
    _trained_ops("wav2vec2", tmp_path)
    for kind in ("forward", "backward"):
        nodes = onnx.load(tmp_path / f"m_train_training_{kind}.onnx").graph.node
        attention = [n for n in nodes if n.op_type.startswith("Attention")]
        assert len(attention) == 2
        mask_at = 3 if kind == "forward" else 6
        assert all(len(n.input) <= mask_at or not n.input[mask_at] for n in attention)

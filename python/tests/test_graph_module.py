"""GraphModule against eager PyTorch: parity over training, inputs and outputs of every kind,
modes, buffers, fallback and errors."""

import copy
import dataclasses
import logging

import numpy as np
import onnx
import pytest
import torch
from torch import nn

import graphtrain
from graphtrain import DebugOptions, GraphModule, UnsupportedModelError
from models import training_inputs, training_model

MODELS = ["mlp", "encoder", "gpt", "cnn"]


@pytest.mark.parametrize("name", MODELS)
def test_twenty_adamw_steps_match_eager(name):
    """Losses within rtol 1e-4 per step; two batch sizes alternating over 20 steps, two captures
    (sizes specialized, then symbolic); parameters at the end."""
    ref = training_model(name)
    gm = GraphModule(copy.deepcopy(ref))
    opt_ref = torch.optim.AdamW(ref.parameters(), lr=1e-3, weight_decay=0.01)
    opt_gm = torch.optim.AdamW(gm.parameters(), lr=1e-3, weight_decay=0.01)
    ours, theirs = [], []
    grad_max = {n: torch.zeros_like(p) for n, p in ref.named_parameters()}
    for step in range(20):
        inputs = training_inputs(name, seed=step, batch=4 if step % 2 else 6)
        for model, opt, out in ((ref, opt_ref, theirs), (gm, opt_gm, ours)):
            opt.zero_grad()
            loss = model(*inputs)
            loss.backward()
            opt.step()
            out.append(loss.item())
        for n, p in ref.named_parameters():
            grad_max[n] = torch.maximum(grad_max[n], p.grad.abs())
    np.testing.assert_allclose(ours, theirs, rtol=1e-4)
    assert gm.captures == 2
    scale = max(float(g.max()) for g in grad_max.values())
    for (pname, p), q in zip(ref.named_parameters(), gm.module.parameters()):
        # Elements whose true gradient is zero (a key projection's bias: softmax ignores a shift;
        # a conv bias before BatchNorm) see only rounding noise, which Adam scales to full-size
        # steps on both sides alike; every other element is compared.
        live = (grad_max[pname] > 1e-6 * scale).numpy()
        np.testing.assert_allclose(
            q.detach().numpy()[live], p.detach().numpy()[live], rtol=1e-4, atol=1e-6, err_msg=pname
        )
    assert sum(int((grad_max[n] > 1e-6 * scale).sum()) for n in grad_max) > 0.9 * sum(
        p.numel() for p in ref.parameters()
    )


def test_batchnorm_buffers_are_written_back():
    ref = training_model("cnn")
    gm = GraphModule(copy.deepcopy(ref))
    for step in range(3):
        inputs = training_inputs("cnn", seed=step)
        ref(*inputs).backward()
        gm(*inputs).backward()
    for (bname, b), c in zip(ref.named_buffers(), gm.module.buffers()):
        np.testing.assert_allclose(c.numpy(), b.numpy(), rtol=1e-5, atol=1e-6, err_msg=bname)


def test_parameters_and_buffers_replaced_after_the_capture_are_the_ones_trained():
    """A parameter or buffer object replaced after the first call (attribute assignment,
    load_state_dict(assign=True), as meta-device initialization does) is what the graph reads and
    what gets the gradient, with no new capture."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3))
    gm = GraphModule(net)
    x = torch.randn(5, 4)
    gm(x).sum().backward()
    net[0].weight = nn.Parameter(torch.ones(3, 4))
    y = gm(x)
    y.sum().backward()
    np.testing.assert_allclose(y.detach().numpy(), net(x).detach().numpy(), rtol=1e-5, atol=1e-6)
    assert net[0].weight.grad is not None
    new = {k: v.clone() + 1 for k, v in net.state_dict().items()}
    net.load_state_dict(new, assign=True)
    net.eval()  # reads the running statistics: the new buffers
    np.testing.assert_allclose(
        gm(x).detach().numpy(), net(x).detach().numpy(), rtol=1e-5, atol=1e-6
    )
    net.train()
    gm(x).sum().backward()
    assert all(p.grad is not None for p in net.parameters())
    assert gm.captures == 2  # train and eval, each once


class Nested(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 3)
        self.b = nn.Linear(4, 3)

    def forward(
        self, inputs: dict, scale: float, *, shift: torch.Tensor, flag: bool = True
    ) -> dict:
        x, y = inputs["x"], inputs["pair"][1]
        h = self.a(x) * scale + shift
        out = {"h": h, "sum": (self.b(y) + h).sum(dim=1), "note": "constant", "nothing": None}
        if flag:
            out["twice"] = [h * 2, torch.relu(h)]
        return out


def test_nested_inputs_kwargs_and_outputs():
    torch.manual_seed(0)
    ref = Nested()
    gm = GraphModule(copy.deepcopy(ref))
    x, y, shift = torch.randn(5, 4), torch.randn(5, 4), torch.randn(3)
    args = ({"x": x, "pair": (None, y)}, 0.5)
    out_ref = ref(*args, shift=shift)
    out_gm = gm(*args, shift=shift)
    assert out_gm["note"] == "constant" and out_gm["nothing"] is None
    torch.testing.assert_close(out_gm["h"], out_ref["h"])
    torch.testing.assert_close(out_gm["twice"][1], out_ref["twice"][1])
    (out_ref["sum"].sum() + out_ref["twice"][0].mean()).backward()
    (out_gm["sum"].sum() + out_gm["twice"][0].mean()).backward()
    for p, q in zip(ref.parameters(), gm.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-5, atol=1e-6)
    # A changed batch size captures once more, with the sizes symbolic: no capture after that.
    for batch in (7, 2):
        gm({"x": torch.randn(batch, 4), "pair": (None, torch.randn(batch, 4))}, 0.5, shift=shift)
    assert gm.captures == 2
    # A changed non-tensor argument captures anew.
    out2 = gm(*args, shift=shift, flag=False)
    assert "twice" not in out2 and gm.captures == 3
    gm(({"x": x, "pair": (None, y)}), 0.25, shift=shift)
    assert gm.captures == 4


class Asymmetric(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, a, b=None, c=None):
        out = self.lin(a) - 2 * b
        return out if c is None else out * c


def test_tensor_arguments_keep_their_places_across_call_forms():
    """Calls of plain tensors reuse the first such call's flattening (GraphModule._flatten):
    positional and keyword forms, keywords in either order, and mixed calls each reach the
    right graph inputs."""
    torch.manual_seed(0)
    ref = Asymmetric()
    gm = GraphModule(copy.deepcopy(ref))
    x, y, z = torch.randn(3, 4), torch.randn(3, 4), torch.randn(3, 4)
    calls = [
        ((x, y), {}),
        ((x,), {"b": y}),
        ((), {"b": y, "a": x}),
        ((), {"a": x, "b": y}),
        ((x, y), {}),
        ((x,), {"b": y, "c": z}),
        ((x,), {"c": z, "b": y}),
        ((x, y, z), {}),
        ((y, x), {}),
        ((x,), {"b": y, "c": None}),
    ]
    for args, kwargs in calls * 2:
        torch.testing.assert_close(gm(*args, **kwargs), ref(*args, **kwargs))


def test_inputs_that_require_grad_and_loss_outside_the_module():
    torch.manual_seed(1)
    ref = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 2))
    gm = GraphModule(copy.deepcopy(ref))
    x1 = torch.randn(4, 6, requires_grad=True)
    x2 = x1.detach().clone().requires_grad_(True)
    target = torch.randn(4, 2)
    nn.functional.mse_loss(ref(x1), target).backward()
    nn.functional.mse_loss(gm(x2), target).backward()
    torch.testing.assert_close(x2.grad, x1.grad, rtol=1e-5, atol=1e-7)
    for p, q in zip(ref.parameters(), gm.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-5, atol=1e-7)


def test_gradients_accumulate_without_zero_grad():
    torch.manual_seed(2)
    ref = nn.Linear(3, 3)
    gm = GraphModule(copy.deepcopy(ref))
    for _ in range(3):
        x = torch.randn(2, 3)
        ref(x).pow(2).sum().backward()
        gm(x).pow(2).sum().backward()
    for p, q in zip(ref.parameters(), gm.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-5, atol=1e-6)


class _LossLogitsAndScale(nn.Module):
    """Returns a loss, its logits and a view of a parameter the loss does not read."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(5, 4)
        self.scale = nn.Parameter(torch.ones(2, 2))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        logits = self.lin(x)
        return logits.pow(2).mean(), logits, self.scale.view(-1)


def test_outputs_left_without_gradient_get_zeros_no_gradient_aliases():
    # Outputs nobody differentiates get a zero gradient filled once; `scale`'s gradient is then
    # a reshape of that zero tensor, and torch accumulating into .grad over steps must not write
    # into it (later steps would read it as the "zero" gradient).
    torch.manual_seed(4)
    ref = _LossLogitsAndScale()
    gm = GraphModule(copy.deepcopy(ref))
    steps = [0, 2, 0, 1, 0]  # which output each step differentiates; gradients accumulate
    for which in steps:
        x = torch.randn(3, 5)
        out_ref, out_gm = ref(x)[which], gm(x)[which]
        (out_ref if which == 0 else out_ref.sum()).backward()
        (out_gm if which == 0 else out_gm.sum()).backward()
        for name, p in ref.named_parameters():
            q = dict(gm.module.named_parameters())[name]
            if p.grad is None:
                assert q.grad is None or not q.grad.any(), name
            else:
                torch.testing.assert_close(q.grad, p.grad, rtol=1e-5, atol=1e-6, msg=name)
    # One backward graph per pattern of outputs without a gradient; in each, the zero gradient of
    # the logits is not added to the loss's gradient of them.
    runner = next(iter(gm._runners.values()))
    assert len(runner._backwards) == 3
    logits_grad = runner._grad_inputs[1]
    assert runner._backward_source.copy().drop_zero_gradients([logits_grad]) == 1


def test_no_grad_and_eval_use_separate_graphs():
    torch.manual_seed(3)
    ref = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Dropout(0.5), nn.Linear(4, 1))
    gm = GraphModule(copy.deepcopy(ref))
    x = torch.randn(8, 4)
    gm.eval()
    ref.eval()
    with torch.no_grad():
        out = gm(x)
    assert not out.requires_grad
    torch.testing.assert_close(out, ref(x).detach(), rtol=1e-5, atol=1e-6)
    gm.train()
    assert gm(x).requires_grad
    assert gm.captures == 2


class Cumulative(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.logcumsumexp(self.proj(x), dim=1).sum()


def test_unsupported_op_names_op_module_and_line():
    graphtrain.set_option("fallback_policy", "off")
    gm = GraphModule(nn.Sequential(Cumulative()))
    with pytest.raises(UnsupportedModelError) as info:
        gm(torch.randn(2, 4))
    msg = str(info.value)
    assert "aten.logcumsumexp" in msg and "module '0'" in msg
    assert "test_graph_module.py" in msg and "torch.logcumsumexp(self.proj(x), dim=1)" in msg
    assert "GRAPHTRAIN_FALLBACK_POLICY=eager" in msg


class BranchOnValues(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        kept = (labels >= 0).nonzero()
        if kept.size(0) > 0:  # DeBERTa's classification loss branches like this
            return self.proj(x)[kept.view(-1)].sum()
        return self.proj(x).sum() * 0


def test_a_branch_on_tensor_values_is_named_with_its_line():
    """torch.export cannot capture Python control flow on a tensor's values; the error names the
    model's line (not torch's), says what kind of code it is and what to do."""
    gm = GraphModule(BranchOnValues())
    with pytest.raises(UnsupportedModelError) as info:
        gm(torch.randn(3, 4), torch.tensor([0, -1, 2]))
    msg = str(info.value)
    assert "could not capture BranchOnValues" in msg
    assert "test_graph_module.py:" in msg and "(`if kept.size(0) > 0:" in msg, msg
    assert "depends on a tensor's values" in msg and "GRAPHTRAIN_FALLBACK_POLICY=eager" in msg


def test_eager_fallback_warns_once_in_ten_steps(caplog):
    graphtrain.set_option("fallback_policy", "eager")
    ref = Cumulative()
    gm = GraphModule(copy.deepcopy(ref))
    opt = torch.optim.SGD(gm.parameters(), lr=0.1)
    with caplog.at_level(logging.WARNING, logger="graphtrain"):
        for _ in range(10):
            x = torch.randn(3, 4)
            opt.zero_grad()
            loss = gm(x)
            loss.backward()
            opt.step()
    warnings = [r for r in caplog.records if "plain PyTorch" in r.getMessage()]
    assert len(warnings) == 1
    assert "aten.logcumsumexp" in warnings[0].getMessage()


def test_debug_options_save_the_graphs(tmp_path):
    gm = GraphModule(
        nn.Linear(3, 2), DebugOptions(save_onnx=True, onnx_prefix="lin", save_path=str(tmp_path))
    )
    gm(torch.randn(4, 3)).sum().backward()
    saved = sorted(p.name for p in tmp_path.iterdir())
    assert saved == [
        "lin_train_forward.onnx",
        "lin_train_training_backward.onnx",
        "lin_train_training_forward.onnx",
    ]
    onnx.checker.check_model(onnx.load(tmp_path / "lin_train_forward.onnx"))


def test_module_scopes_stay_on_the_nodes(tmp_path):
    ref = training_model("mlp")
    gm = GraphModule(ref, DebugOptions(save_onnx=True, onnx_prefix="mlp", save_path=str(tmp_path)))
    gm(*training_inputs("mlp")).backward()
    model = onnx.load(tmp_path / "mlp_train_forward.onnx")
    scopes = {
        p.value for n in model.graph.node for p in n.metadata_props if p.key == "graphtrain.scope"
    }
    assert {"model.fc1", "model.norm", "model.fc2", "model.head"} <= scopes


class Scaled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, scale: float) -> torch.Tensor:
        return (self.proj(x) * scale).sum()


def test_a_number_argument_that_changes_every_call_is_named_once_and_graphs_stay_bounded(caplog):
    gm = GraphModule(Scaled())
    with caplog.at_level(logging.WARNING, logger="graphtrain"):
        for step in range(20):
            gm(torch.randn(2, 4), scale=0.1 * step).backward()
    warnings = [r.getMessage() for r in caplog.records if "has captured" in r.getMessage()]
    assert len(warnings) == 1
    assert (
        "argument kwargs['scale'] changes between calls" in warnings[0]
        and "torch.tensor" in warnings[0]
    )
    assert gm.captures == 20 and len(gm._runners) == graphtrain.graph_module.MAX_GRAPHS
    # the most recently used graphs are the ones kept: the last value runs without a capture
    gm(torch.randn(2, 4), scale=0.1 * 19)
    assert gm.captures == 20


def test_threads_each_training_their_own_graph_module():
    """torch.export is not thread-safe; captures take one lock, runs stay concurrent."""
    import threading

    results: dict[int, list[float]] = {}
    errors: list[BaseException] = []

    def train(k: int) -> None:
        try:
            torch.manual_seed(k)
            ref = training_model("mlp")
            gm = GraphModule(copy.deepcopy(ref))
            losses = []
            for step in range(3):
                inputs = training_inputs("mlp", seed=step)
                ours = gm(*inputs)
                ours.backward()
                theirs = ref(*inputs)
                losses.append(abs(ours.item() - theirs.item()))
            results[k] = losses
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=train, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert len(results) == 3 and max(max(v) for v in results.values()) < 1e-5


class WithFallbacks(nn.Module):
    """Ops graphtrain has no native kernel for: one out of place, one in place (on a copy)."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.proj(x)
        z = y.clone()
        z.cumprod_(1)  # in place: later readers of z see the product
        return (torch.logcumsumexp(y, dim=1) + z * 0.1).sum()


def test_aten_fallback_trains_at_parity_with_one_warning(caplog):
    ref = WithFallbacks()
    gm = GraphModule(copy.deepcopy(ref))
    opt_ref = torch.optim.SGD(ref.parameters(), lr=0.05)
    opt_gm = torch.optim.SGD(gm.parameters(), lr=0.05)
    with caplog.at_level(logging.WARNING, logger="graphtrain"):
        for step in range(6):
            x = torch.randn(3 if step % 2 else 5, 4, generator=torch.Generator().manual_seed(step))
            for model, opt in ((ref, opt_ref), (gm, opt_gm)):
                opt.zero_grad()
                loss = model(x)
                loss.backward()
                opt.step()
            torch.testing.assert_close(gm(x), ref(x), rtol=1e-5, atol=1e-6)
    assert gm.captures == 2  # sizes specialized, then symbolic
    for p, q in zip(gm.parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
    warnings = [r.getMessage() for r in caplog.records if "run through PyTorch" in r.getMessage()]
    assert len(warnings) == 1
    assert (
        "aten.cumprod_.default (in 'proj')" not in warnings[0]
    )  # named at the top level, not 'proj'
    assert "aten.cumprod_.default" in warnings[0] and "aten.logcumsumexp.default" in warnings[0]


@dataclasses.dataclass
class Result:  # not registered with pytree: rebuilt as an object around each call's tensors
    loss: torch.Tensor
    parts: dict
    note: str = "ok"


class ReturnsObjects(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> Result:
        y = self.proj(x)
        return Result(loss=y.sum(), parts={"y": y, "n": y.shape[0]})


class Slotted:
    __slots__ = ("t",)

    def __init__(self, t: torch.Tensor) -> None:
        self.t = t


def test_returned_objects_hold_this_calls_tensors():
    model = ReturnsObjects()
    gm = GraphModule(model)
    for batch in (2, 5):
        x = torch.randn(batch, 4)
        ours, theirs = gm(x), model(x)
        assert type(ours) is Result and ours.note == "ok"
        assert type(ours.parts["y"]) is torch.Tensor and ours.parts["n"] == batch
        torch.testing.assert_close(ours.parts["y"], theirs.parts["y"])
        ours.loss.backward()
    assert gm.captures == 2  # sizes specialized, then symbolic


def test_an_object_graphtrain_cannot_rebuild_is_named():
    class ReturnsSlotted(nn.Module):
        def forward(self, x: torch.Tensor) -> Slotted:
            return Slotted(x * 2)

    with pytest.raises(
        UnsupportedModelError, match=r"returns a test_graph_module.Slotted .*cannot rebuild"
    ):
        GraphModule(ReturnsSlotted())(torch.randn(2, 3))


class WithIdentities(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.proj(x)
        return (nn.functional.dropout(y, 0.0, True) + y.detach() * 0.5).sum()


def test_graph_passes_and_their_switches(tmp_path):
    """The passes run on the graphs after autodiff (save_onnx writes them as they run); with the
    compute optimizer off, or a pass disabled, results are the same and the graphs keep what the
    pass would remove."""

    def run(folder: str, **opts: object) -> tuple[float, int]:
        graphtrain.reload_options()
        for k, v in opts.items():
            graphtrain.set_option(k, v)
        torch.manual_seed(0)
        model = WithIdentities()
        gm = GraphModule(
            model, DebugOptions(save_onnx=True, onnx_prefix="g", save_path=str(tmp_path / folder))
        )
        loss = gm(torch.randn(3, 4, generator=torch.Generator().manual_seed(1)))
        loss.backward()
        graph = onnx.load(tmp_path / folder / "g_train_training_forward.onnx").graph
        return loss.item(), sum(n.op_type in ("Identity", "StopGradient") for n in graph.node)

    on, with_identities_removed = run("on")
    off, all_kept = run("off", enable_compute_optimizer=False)
    partial, kept = run("partial", disable_passes="identities")
    assert on == off == partial
    assert with_identities_removed < all_kept == kept
    graphtrain.set_option("disable_passes", "no_such_pass")
    with pytest.raises(
        graphtrain.OptionError,
        match="names 'no_such_pass'.*the passes are: recognize_gelu, recognize_rms_norm, "
        "recognize_rotary, recognize_silu_mul, fold_pad_into_conv, recognize_attention, "
        "fuse_loss_gradient, stash_gelu_derivative, identities, constant_folding, dead_code, "
        "fold_transposes, fuse_softmax, fuse_layer_norm, gelu_grad_from_output, fuse_elementwise, "
        "memory_plan",
    ):
        GraphModule(nn.Linear(2, 2))(torch.randn(1, 2)).sum().backward()


def test_split_into_one_part():
    class OnePart(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.randn(12))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            (whole,) = self.w.split([12])
            return (x * whole.view(3, 4)).sum()

    torch.manual_seed(0)
    model, x = OnePart(), torch.randn(3, 4)
    gm = GraphModule(copy.deepcopy(model))
    torch.testing.assert_close(gm(x), model(x))
    gm(x).backward()
    torch.testing.assert_close(gm.module.w.grad, x.reshape(-1))


def test_backward_with_retain_graph_runs_again_through_one_call():
    """retain_graph=True keeps what the forward stashed (LayerNorm's statistics, GELU's
    derivative, the activations GEMMs read), so several backwards through one call (two losses,
    autograd.grad then backward) accumulate eager's gradients; the last one, without it, frees
    them, and a backward after it is refused by name instead of failing inside the engine."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.LayerNorm(16), nn.GELU(), nn.Linear(16, 3))
    gm = GraphModule(copy.deepcopy(model))
    x = torch.randn(5, 6)
    grads = []
    for net in (model, gm):
        params = list(net.parameters())
        y = net(x)
        (first,) = torch.autograd.grad(y.pow(2).sum(), params[0], retain_graph=True)
        y.sum().backward(retain_graph=True)
        (y * y.detach()).mean().backward()
        grads.append([first] + [p.grad for p in params])
    for ours, ref in zip(*grads):
        torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-6)
    loss = gm(x).sum()
    loss.backward()
    with pytest.raises(RuntimeError, match="after a backward without retain_graph=True"):
        loss.backward()

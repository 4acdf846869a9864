"""torch.autograd.Function kept opaque in GraphModule graphs as PythonOp nodes: the user's own
forward and backward run with a real autograd context; shape inferers; the cache; the option."""

import copy
import logging
import textwrap

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

import graphtrain
from conftest import run_python
from graphtrain.custom_function import register_shape_inferer
from graphtrain.errors import GraphError, UnsupportedModelError


class ScaledSTE(torch.autograd.Function):
    """Rounds in forward; backward passes the gradient straight through where |x| <= 1, scaled by 3
    (not the derivative of anything: only the custom backward gives it)."""

    @staticmethod
    def forward(ctx, x, levels):
        ctx.save_for_backward(x)
        ctx.levels = levels
        return torch.round(x * levels) / levels

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        assert ctx.levels == 4.0 and ctx.needs_input_grad == (True, False)
        return g * (x.abs() <= 1).to(g.dtype) * 3.0, None


class Mix(torch.autograd.Function):
    """Two tensor inputs (the second needs no gradient), non-tensor arguments, three outputs of
    which one is marked non-differentiable."""

    @staticmethod
    def forward(ctx, a, b, k, mode, shift):
        assert mode == "mul" and shift == (1, 2.5) and isinstance(k, int)
        ctx.save_for_backward(a, b)
        ctx.k = k
        mask = (a > 0).to(a.dtype)
        ctx.mark_non_differentiable(mask)
        return a * b * k, a.sum(-1, keepdim=True) + shift[1], mask

    @staticmethod
    def backward(ctx, g_prod, g_sum, g_mask):
        a, b = ctx.saved_tensors
        assert ctx.needs_input_grad[:2] == (True, False)
        return g_prod * b * ctx.k + g_sum.expand_as(a), None, None, None, None


class Flatten(torch.autograd.Function):
    """Returns a view of its input."""

    @staticmethod
    def forward(ctx, x):
        ctx.shape = x.shape
        return x.view(x.shape[0], -1)

    @staticmethod
    def backward(ctx, g):
        return g.reshape(ctx.shape) * 2  # custom: doubles the gradient


class AddOneInPlace(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        x.add_(1)
        ctx.mark_dirty(x)
        return x

    @staticmethod
    def backward(ctx, g):
        return g * 0.5


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(6, 8)
        self.b = nn.Linear(8, 8)
        self.c = nn.Linear(16, 3)
        self.register_buffer("weights", torch.linspace(0.5, 1.5, 8))

    def forward(self, x):
        h = torch.tanh(self.a(x))
        q = ScaledSTE.apply(h, 4.0)
        prod, total, mask = Mix.apply(q, self.weights.expand_as(q), 3, "mul", (1, 2.5))
        h2 = self.b(prod * mask) + total
        h3 = h2.exp().tanh()
        grown = AddOneInPlace.apply(h3 * 1.0)
        flat = Flatten.apply(torch.stack([grown, h2], dim=1))
        return self.c(flat).square().mean()


def python_ops(gm: graphtrain.GraphModule) -> list[str]:
    (runner,) = gm._runners.values()
    return [
        next(a.s.decode() for a in n.attribute if a.name == "func_name")
        for n in runner.captured.proto().graph.node
        if n.op_type == "PythonOp"
    ]


def batches(step):
    return torch.randn(5, 6, generator=torch.Generator().manual_seed(step))


def test_custom_backwards_train_like_eager_over_10_adamw_steps():
    """Lockstep: each step both models start from eager's parameters, so the gradients compared are
    those of one step (rounding in ScaledSTE would turn a 1e-7 difference in a free run into a
    different trajectory, which says nothing about the backward)."""
    torch.manual_seed(0)
    eager = Net()
    model = copy.deepcopy(eager)
    gm = graphtrain.GraphModule(model)
    opt = torch.optim.AdamW(eager.parameters(), lr=1e-2)
    for step in range(10):
        with torch.no_grad():
            for p, e in zip(model.parameters(), eager.parameters()):
                p.copy_(e)
        opt.zero_grad()
        model.zero_grad()
        x = batches(step)
        expected = eager(x)
        expected.backward()
        loss = gm(x)
        loss.backward()
        torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-7)
        for (name, p), e in zip(model.named_parameters(), eager.parameters()):
            torch.testing.assert_close(
                p.grad, e.grad, rtol=1e-4, atol=2e-5, msg=f"step {step}, {name}"
            )
        opt.step()
    assert python_ops(gm) == [
        f"{__name__}.{c}" for c in ("ScaledSTE", "Mix", "AddOneInPlace", "Flatten")
    ]
    assert gm.captures == 1


def test_gradients_are_the_custom_ones_not_autodiff_of_the_forward():
    torch.manual_seed(1)
    lin = nn.Linear(4, 4)

    class One(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = lin

        def forward(self, x):
            return ScaledSTE.apply(self.lin(x), 4.0).sum()

    x = torch.randn(3, 4)
    graphtrain.GraphModule(One())(x).backward()
    h = lin(x).detach()
    expected = 3.0 * (h.abs() <= 1).float()  # d loss / d h, as the custom backward defines it
    torch.testing.assert_close(lin.bias.grad, expected.sum(0))


class Checkpointed(nn.Module):
    def __init__(self, reentrant):
        super().__init__()
        self.inner = nn.Sequential(nn.Linear(6, 12), nn.GELU(), nn.Linear(12, 6))
        self.head = nn.Linear(6, 1)
        self.reentrant = reentrant

    def forward(self, x):
        h = checkpoint(self.inner, x, use_reentrant=self.reentrant)
        return self.head(torch.relu(h)).sum()


@pytest.mark.parametrize("reentrant", [True, False])
def test_torch_utils_checkpoint_inside_the_model(reentrant):
    torch.manual_seed(2)
    base = Checkpointed(reentrant)
    x = torch.randn(
        4, 6, requires_grad=reentrant
    )  # the reentrant variant needs an input that requires grad
    grads = []
    for wrap in (False, True):
        model = copy.deepcopy(base)
        run = graphtrain.GraphModule(model) if wrap else model
        run(x).backward()
        grads.append([p.grad.clone() for p in model.parameters()])
    for a, b in zip(*grads):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)
    if reentrant:  # kept opaque: the checkpointed block recomputes in backward, as in eager
        assert python_ops(run) == ["torch.utils.checkpoint.CheckpointFunction"]


def infer_same(node, shapes, dtypes):
    return [shapes[0]], [dtypes[0]]


class Double(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * 2


class DoubleWithInferer(Double):
    @staticmethod
    def infer_shape(node, input_shapes, input_dtypes):
        assert node["func_name"].endswith("DoubleWithInferer")
        return [input_shapes[0]], [input_dtypes[0]]


class DoubleRegistered(Double):
    pass


class DoubleBadInferer(Double):
    pass


class Wrap(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn
        self.lin = nn.Linear(3, 3)

    def forward(self, x):
        return self.lin(self.fn.apply(x)).relu()


def inferred_types(fn):
    gm = graphtrain.GraphModule(Wrap(fn))
    gm(torch.randn(2, 5, 3))  # the first graph specializes the sizes
    out = gm(torch.randn(3, 4, 3))  # another size: the graph with batch dims symbolic
    assert out.shape == (3, 4, 3)
    (runner,) = gm._runners.values()
    proto = runner.captured.proto()
    node = next(n for n in proto.graph.node if n.op_type == "PythonOp")
    model = graphtrain._C.Model.from_bytes(proto.SerializeToString())
    model.infer_shapes()
    types = model.value_types()
    return types[node.input[0]], types[node.output[0]], types[proto.graph.output[0].name]


def test_symbolic_dims_flow_through_an_inferer_and_fresh_dims_without(caplog):
    register_shape_inferer(DoubleRegistered, infer_same)
    for fn in (DoubleWithInferer, DoubleRegistered):
        x_type, y_type, out_type = inferred_types(fn)
        assert y_type == x_type and out_type == x_type, fn
        assert all(isinstance(d, str) for d in x_type[1][:2])  # symbolic batch dims
    graphtrain.set_log_level("DEVINFO")
    with caplog.at_level(logging.DEBUG, logger="graphtrain"):
        x_type, y_type, _ = inferred_types(Double)
        inferred_types(Double)
    assert len(y_type[1]) == 3 and not set(y_type[1]) & set(
        x_type[1]
    )  # fresh dims of the declared rank
    lines = [r.getMessage() for r in caplog.records if "has no shape inferer" in r.getMessage()]
    assert (
        len(lines) == 1
        and f"'{__name__}.Double'" in lines[0]
        and "register_shape_inferer" in lines[0]
    )


def test_a_bad_inferer_is_named():
    register_shape_inferer(f"{__name__}.DoubleBadInferer", lambda node, shapes, dtypes: ([], []))
    with pytest.raises(
        GraphError, match=r"shape inferer of PythonOp '.*DoubleBadInferer' returned 0 shapes"
    ):
        inferred_types(DoubleBadInferer)
    register_shape_inferer(DoubleBadInferer, lambda node, shapes, dtypes: 1 / 0)
    with pytest.raises(
        GraphError, match=r"shape inferer of PythonOp '.*DoubleBadInferer' raised.*division by zero"
    ):
        inferred_types(DoubleBadInferer)
    with pytest.raises(TypeError, match="not a torch.autograd.Function"):
        register_shape_inferer(nn.Linear, infer_same)


class NumpyInside(torch.autograd.Function):
    """Cannot run on fake tensors: its infer_shape gives the outputs at capture."""

    @staticmethod
    def forward(ctx, x):
        return torch.from_numpy(x.detach().numpy() * 2)

    @staticmethod
    def backward(ctx, g):
        return g * 2

    @staticmethod
    def infer_shape(node, input_shapes, input_dtypes):
        return [input_shapes[0]], [input_dtypes[0]]


class NumpyNoInferer(NumpyInside):
    infer_shape = None


def test_custom_autograd_off_traces_through_or_names_the_function():
    graphtrain.set_option("enable_custom_autograd", False)
    torch.manual_seed(3)
    gm = graphtrain.GraphModule(Wrap(Double))
    x = torch.randn(2, 5, 3)
    torch.testing.assert_close(gm(x), gm.module(x))
    assert python_ops(gm) == []  # traced through: plain ops
    with pytest.raises(
        UnsupportedModelError,
        match=r"torch.autograd.Function '.*NumpyInside'.*"
        r"GRAPHTRAIN_ENABLE_CUSTOM_AUTOGRAD=0",
    ):
        graphtrain.GraphModule(Wrap(NumpyInside))(x)
    graphtrain.set_option("enable_custom_autograd", True)
    gm = graphtrain.GraphModule(Wrap(NumpyInside))  # opaque: the Function runs as it is
    torch.testing.assert_close(gm(x), gm.module(x))
    gm(x).sum().backward()
    with pytest.raises(
        UnsupportedModelError,
        match=r"'.*NumpyNoInferer' cannot run on torch.export's fake "
        r"tensors.*static infer_shape",
    ):
        graphtrain.GraphModule(Wrap(NumpyNoInferer))(x)


SCRIPT = textwrap.dedent("""
    import sys, torch
    sys.path.insert(0, {tests!r})
    import graphtrain
    from test_custom_function import Net, batches

    {local}
    torch.manual_seed(0)
    model = Net()
    gm = graphtrain.GraphModule(model)
    loss = gm(batches(0))
    loss.backward()
    print(gm.captures, loss.item(), float(model.a.weight.grad.abs().sum()))
""")


def test_a_cached_graph_with_python_ops_runs_in_a_new_process(tmp_path):
    import pathlib

    env = {"GRAPHTRAIN_CACHE_DIR": str(tmp_path / "cache")}
    script = SCRIPT.format(tests=str(pathlib.Path(__file__).parent), local="")
    first = run_python(script, env)
    assert first.returncode == 0, first.stderr
    second = run_python(script, env)
    assert second.returncode == 0, second.stderr
    a, b = first.stdout.split(), second.stdout.split()
    assert a[0] == "1" and b[0] == "0"  # the second process loaded the cached graph
    assert a[1:] == b[1:]


def test_an_unimportable_function_in_a_cached_graph_is_named(tmp_path):
    env = {"GRAPHTRAIN_CACHE_DIR": str(tmp_path / "cache")}
    script = textwrap.dedent("""
        import torch, graphtrain
        def build():
            class Local(torch.autograd.Function):
                @staticmethod
                def forward(ctx, x):
                    return x + 1
                @staticmethod
                def backward(ctx, g):
                    return g
            class M(torch.nn.Module):
                def forward(self, x):
                    return Local.apply(x * 2)
            return M()
        gm = graphtrain.GraphModule(build())
        print(gm(torch.ones(3)).tolist(), gm.captures)
    """)
    first = run_python(script, env)
    assert first.returncode == 0 and first.stdout.split() == ["[3.0,", "3.0,", "3.0]", "1"], (
        first.stderr
    )
    second = run_python(script, env)
    assert second.returncode != 0
    assert "torch.autograd.Function '__main__.build.<locals>.Local'" in second.stderr
    assert "cannot be imported" in second.stderr and "GRAPHTRAIN_CACHE_DIR" in second.stderr


class JustFlatten(nn.Module):
    def forward(self, x):
        return Flatten.apply(x)


def test_a_view_returned_by_a_function_keeps_sharing_memory():
    x = torch.randn(2, 3, 4)
    gm = graphtrain.GraphModule(JustFlatten())
    with torch.no_grad():
        y = gm(x)
    assert y.shape == (2, 12) and y.data_ptr() == x.data_ptr()  # no copy on the way in or out
    x.requires_grad_()
    out = gm(x)
    out.backward(torch.ones_like(out))
    torch.testing.assert_close(x.grad, torch.full_like(x, 2.0))  # Flatten's custom backward doubles


def test_other_threads_apply_functions_normally_during_a_capture():
    import threading

    seen = []
    started, release = threading.Event(), threading.Event()

    class Waits(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            started.set()
            release.wait(10)  # another thread applies a Function while this capture runs
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return g * 2

    def other():
        started.wait(10)
        x = torch.ones(3, requires_grad=True)
        y = ScaledSTE.apply(x * 0.5, 4.0)
        seen.append(type(y.grad_fn).__name__)
        release.set()

    t = threading.Thread(target=other)
    t.start()
    gm = graphtrain.GraphModule(Wrap(Waits))
    gm(torch.randn(2, 5, 3))
    t.join()
    assert seen == ["ScaledSTEBackward"]  # a real autograd node, not graphtrain's capture op


class SiluNoBackward(torch.autograd.Function):
    """x * sigmoid(x) with a backward that must never run: a registered decomposition replaces
    the Function, so autodiff of the decomposition gives the gradient."""

    @staticmethod
    def forward(ctx, x):
        return x * torch.sigmoid(x)

    @staticmethod
    def backward(ctx, g):
        raise AssertionError("the Function's backward ran, not the decomposition's gradient")


class SiluModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(6, 6)

    def forward(self, x):
        return SiluNoBackward.apply(self.lin(x)).sum(-1)


def test_a_registered_decomposition_runs_natively_in_place_of_the_function(tmp_path):
    """register_decomposition(Function, fn): the graph traces fn where the model applies the
    Function (no PythonOp forward or backward), graphtrain builds its gradient (the Function's own
    backward, which raises, never runs), and values match fn's in eager. The registration is part
    of the graph cache key. Bad registrations are refused by name."""
    from graphtrain import custom_function
    from graphtrain._cache import cache_key

    model = SiluModel()
    key_before = cache_key(model, "schema", True)
    custom_function.register_decomposition(SiluNoBackward, torch.nn.functional.silu)
    try:
        assert cache_key(model, "schema", True) != key_before
        debug = graphtrain.DebugOptions(save_onnx=True, onnx_prefix="d", save_path=str(tmp_path))
        gm = graphtrain.GraphModule(copy.deepcopy(model), debug)
        x = torch.randn(4, 6)
        out = gm(x)
        out.sum().backward()
        ref = torch.nn.functional.silu(model.lin(x)).sum(-1)
        ref.sum().backward()
        torch.testing.assert_close(out, ref)
        for p, q in zip(gm.module.parameters(), model.parameters()):
            torch.testing.assert_close(p.grad, q.grad)
        import onnx

        for kind in ("forward", "backward"):
            ops = [
                n.op_type for n in onnx.load(tmp_path / f"d_train_training_{kind}.onnx").graph.node
            ]
            assert not any(op.startswith("PythonOp") for op in ops), (kind, ops)
    finally:
        custom_function._decompositions.pop(custom_function.func_name(SiluNoBackward))
    with pytest.raises(TypeError, match="SiluModel is not a torch.autograd.Function"):
        custom_function.register_decomposition(SiluModel, torch.nn.functional.silu)
    with pytest.raises(TypeError, match="decomposition of 'x.Y' must be callable"):
        custom_function.register_decomposition("x.Y", 3)

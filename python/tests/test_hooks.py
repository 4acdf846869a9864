"""Subscribers and StatisticsSubscriber on eager models: layout, values, steps, errors."""

import numpy as np
import pytest
import torch
from torch import nn

from graphtrain.hooks import (
    StatisticsSubscriber,
    SubscriberBase,
    SubscriberManager,
    inspect_activation,
    read_sidecar,
)


class TwoOut(nn.Module):
    def forward(self, x):
        return x * 2, x - 1


class Net(nn.Module):
    """`shared` is called twice; `split` returns two outputs."""

    def __init__(self):
        super().__init__()
        self.shared = nn.Linear(4, 4)
        self.split = TwoOut()
        self.head = nn.Linear(4, 1)

    def forward(self, x):
        h = torch.relu(self.shared(x))
        h = self.shared(h)
        a, b = self.split(h)
        return self.head(a + b).sum()


def test_layout_with_a_module_called_twice_and_two_outputs(tmp_path):
    torch.manual_seed(0)
    model = Net()
    manager = SubscriberManager()
    manager.subscribe(model, [StatisticsSubscriber(str(tmp_path / "out"))])
    for _ in range(2):
        model(torch.randn(3, 4)).backward()
    assert manager.step == 2
    step0 = tmp_path / "out" / "step_0"
    order = (step0 / "order.txt").read_text().split()
    # Pre-order indices: Net 0, shared 1, split 2, head 3.
    assert order[:6] == [
        "Linear_1_0th_output_forward",
        "Linear_1_0th_output_forward",
        "TwoOut_2_0th_output_forward",
        "TwoOut_2_1th_output_forward",
        "Linear_3_0th_output_forward",
        "Net_0_0th_output_forward",
    ]
    assert "Net_0_0th_output_backward" in order[6:] and "TwoOut_2_1th_output_backward" in order[6:]
    assert (tmp_path / "out" / "step_1" / "order.txt").exists()
    text = (step0 / "TwoOut_2_1th_output_forward").read_text()
    assert text.startswith(
        "module: split\nname: TwoOut_2_1th_output_forward\nshape: [3, 4]\ndtype: float32\n"
        "elements: 12\n"
    )


def test_values_match_numpy(tmp_path):
    seen = {}

    class Keep(SubscriberBase):
        def post_forward_tensor_apply_impl(self, ctx, module, index, tensor):
            seen[f"{type(module).__name__}_{ctx.module_index}_{index}th_output_forward"] = (
                tensor.detach().numpy().copy()
            )
            return tensor

    torch.manual_seed(1)
    model = Net()
    SubscriberManager().subscribe(model, [StatisticsSubscriber(str(tmp_path / "o")), Keep()])
    model(torch.randn(5, 4))
    records = read_sidecar(str(tmp_path / "o" / "step_0" / "statistics.bin"))
    for name, array in seen.items():
        r = records[name]
        x = array.astype(np.float64)
        assert r["count"] == x.size
        assert r["mean"] == pytest.approx(x.mean(), rel=1e-12, abs=1e-15)
        if x.size > 1:
            assert r["std"] == pytest.approx(x.std(ddof=1), rel=1e-12)
        assert r["min"] == x.min() and r["max"] == x.max()


def test_steps_window_and_backward_in_its_forward_step(tmp_path):
    model = Net()
    manager = SubscriberManager()
    manager.subscribe(model, [StatisticsSubscriber(str(tmp_path / "w"), start_step=1, end_step=3)])
    losses = [model(torch.randn(2, 4)) for _ in range(4)]  # forwards of steps 0-3, backwards later
    for loss in losses:
        loss.backward()
    folders = sorted(p.name for p in (tmp_path / "w").iterdir())
    assert folders == ["step_1", "step_2"]
    order = (tmp_path / "w" / "step_1" / "order.txt").read_text().split()
    assert "Net_0_0th_output_backward" in order


def test_tensor_hook_can_change_the_computation():
    class Zero(SubscriberBase):
        def post_forward_tensor_apply_impl(self, ctx, module, index, tensor):
            return torch.zeros_like(tensor) if isinstance(module, TwoOut) and index == 1 else tensor

    torch.manual_seed(2)
    model = Net()
    x = torch.randn(3, 4)
    with torch.no_grad():
        h = model.shared(torch.relu(model.shared(x)))
        expected = model.head(h * 2).sum()
    SubscriberManager().subscribe(model, [Zero()])
    torch.testing.assert_close(model(x), expected)


def test_bad_arguments_and_folders(tmp_path):
    m = SubscriberManager()
    with pytest.raises(TypeError, match="needs an nn.Module"):
        m.subscribe("model", [SubscriberBase()])
    with pytest.raises(ValueError, match="non-empty list"):
        m.subscribe(nn.Linear(1, 1), [])
    with pytest.raises(TypeError, match="is not a SubscriberBase"):
        m.subscribe(nn.Linear(1, 1), [object()])
    with pytest.raises(ValueError, match="end_step"):
        SubscriberBase(5, 3)
    (tmp_path / "exists").mkdir()
    with pytest.raises(FileExistsError, match="override_output_dir=True"):
        StatisticsSubscriber(str(tmp_path / "exists"))
    StatisticsSubscriber(str(tmp_path / "exists"), override_output_dir=True)
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(PermissionError, match="cannot write statistics"):
        StatisticsSubscriber(str(blocker / "sub"))


def test_inspect_activation(tmp_path):
    import graphtrain.hooks._statistics as st

    saved = list(st._active)
    st._active.clear()
    try:
        with pytest.raises(RuntimeError, match="no StatisticsSubscriber is subscribed"):
            inspect_activation("mid", torch.ones(2))
        StatisticsSubscriber(str(tmp_path / "i"))
        x = torch.randn(4, requires_grad=True)
        y = inspect_activation("mid", x * 3)
        y.sum().backward()
        order = (tmp_path / "i" / "step_0" / "order.txt").read_text().split()
    finally:
        st._active[:] = saved
    assert order == ["mid_forward", "mid_backward"]

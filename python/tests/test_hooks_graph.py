"""Subscribers inside GraphModule graphs: the same modules, order, tensors and steps as eager, from
Hook nodes placed at capture; and the eager-vs-GraphModule convergence check end to end."""

import copy
import logging
import subprocess
import sys

import pytest
import torch

import graphtrain
from graphtrain.hooks import (
    StatisticsSubscriber,
    SubscriberBase,
    SubscriberManager,
    inspect_activation,
    read_sidecar,
)
from graphtrain.stats import main as stats_main
from models import build, training_inputs
from test_hooks import Net, TwoOut
from test_stats_tool import Perturb


def train(model, out, steps=3, extra=(), inputs=None):
    manager = SubscriberManager()
    manager.subscribe(model, [*extra, StatisticsSubscriber(str(out))])
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    losses = []
    for step in range(steps):
        opt.zero_grad()
        loss = model(*inputs(step))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return manager, losses


def net_inputs(step):
    return (torch.randn(3, 4, generator=torch.Generator().manual_seed(step)),)


def test_same_files_order_and_values_as_eager(tmp_path):
    torch.manual_seed(0)
    base = Net()
    m_eager, l_eager = train(copy.deepcopy(base), tmp_path / "pt", inputs=net_inputs)
    gm = graphtrain.GraphModule(copy.deepcopy(base))
    m_graph, l_graph = train(gm, tmp_path / "gt", inputs=net_inputs)
    assert gm.captures == 1
    assert m_eager.step == m_graph.step == 3  # capture counted no step
    torch.testing.assert_close(l_graph, l_eager, rtol=1e-5, atol=1e-6)
    for step in range(3):
        folder = f"step_{step}"
        pt = (tmp_path / "pt" / folder / "order.txt").read_text().split()
        gt = (tmp_path / "gt" / folder / "order.txt").read_text().split()
        # Forward dumps in the same order; backward ones in the order each autograd engine visits
        # them (torch's own engine orders a node's tensor hooks by creation), so compared as sets.
        forward = [n for n in pt if n.endswith("_forward")]
        assert gt[: len(forward)] == forward and sorted(gt) == sorted(pt)
        a = read_sidecar(str(tmp_path / "pt" / folder / "statistics.bin"))
        b = read_sidecar(str(tmp_path / "gt" / folder / "statistics.bin"))
        assert sorted(a) == sorted(b) and "TwoOut_2_1th_output_backward" in b
        for name in a:
            assert a[name]["module"] == b[name]["module"]
            for stat in ("mean", "std", "min", "max"):
                expected = pytest.approx(a[name][stat], rel=1e-4, abs=1e-6, nan_ok=True)
                assert b[name][stat] == expected, (step, name, stat)


class Zero(SubscriberBase):
    """Replaces TwoOut's second output by zeros (forward) and so cuts its gradient."""

    def post_forward_tensor_apply_impl(self, ctx, module, index, tensor):
        return torch.zeros_like(tensor) if isinstance(module, TwoOut) and index == 1 else tensor


class DoubleInput(SubscriberBase):
    def pre_forward_tensor_apply_impl(self, ctx, module, index, tensor):
        return tensor * 2 if ctx.module_name == "head" else tensor


def test_a_replaced_tensor_changes_forward_and_backward_alike():
    torch.manual_seed(1)
    base = Net()
    x = torch.randn(3, 4)
    results = []
    for wrap in (False, True):
        model = copy.deepcopy(base)
        SubscriberManager().subscribe(model, [Zero(), DoubleInput()])
        run = graphtrain.GraphModule(model) if wrap else model
        loss = run(x)
        loss.backward()
        results.append((loss.detach(), [p.grad.clone() for p in model.parameters()]))
    (la, ga), (lb, gb) = results
    torch.testing.assert_close(lb, la)
    for a, b in zip(ga, gb):
        torch.testing.assert_close(b, a)
    with torch.no_grad():  # and the subscribers did change the value
        h = base.shared(torch.relu(base.shared(x)))
        assert not torch.allclose(la, base.head(h * 2 + h - 1).sum())


def test_subscribing_after_wrapping_recaptures_and_eval_counts_steps(tmp_path):
    torch.manual_seed(2)
    gm = graphtrain.GraphModule(Net())
    x = torch.randn(3, 4)
    gm(x).backward()
    assert gm.captures == 1
    manager = SubscriberManager()
    manager.subscribe(gm, [StatisticsSubscriber(str(tmp_path / "s"))])
    gm(x).backward()
    assert gm.captures == 2 and manager.step == 1
    gm.eval()
    with torch.no_grad():
        gm(x)  # a new capture for eval mode; its forward is step 1
    assert gm.captures == 3 and manager.step == 2
    order = (tmp_path / "s" / "step_1" / "order.txt").read_text().split()
    assert order[-1] == "Net_0_0th_output_forward" and not any(
        n.endswith("_backward") for n in order
    )


class Mid(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(4, 6)
        self.b = torch.nn.Linear(6, 1)

    def forward(self, x):
        return self.b(inspect_activation("mid", torch.tanh(self.a(x)))).sum()


def test_inspect_activation_inside_a_graph(tmp_path):
    torch.manual_seed(3)
    base = Mid()
    x = torch.randn(5, 4)
    for name, wrap in (("pt", False), ("gt", True)):
        model = copy.deepcopy(base)
        SubscriberManager().subscribe(model.b, [StatisticsSubscriber(str(tmp_path / name))])
        (graphtrain.GraphModule(model) if wrap else model)(x).backward()
    pt = read_sidecar(str(tmp_path / "pt" / "step_0" / "statistics.bin"))
    gt = read_sidecar(str(tmp_path / "gt" / "step_0" / "statistics.bin"))
    assert list(pt) == list(gt) and {"mid_forward", "mid_backward"} <= set(gt)
    for name in pt:
        assert gt[name]["std"] == pytest.approx(pt[name]["std"], rel=1e-5)


class WithExtra(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)

    def forward(self, x):
        return self.lin(x), "label"


@pytest.mark.parametrize("wrap", [False, True])
def test_non_tensor_outputs_are_skipped_with_one_devinfo_line(tmp_path, caplog, wrap):
    model = WithExtra()
    SubscriberManager().subscribe(model, [StatisticsSubscriber(str(tmp_path / "n"))])
    run = graphtrain.GraphModule(model) if wrap else model
    graphtrain.set_log_level("DEVINFO")
    with caplog.at_level(logging.DEBUG, logger="graphtrain"):
        for _ in range(2):
            out, label = run(torch.randn(2, 3))
    lines = [r.getMessage() for r in caplog.records if "not a tensor; skipped" in r.getMessage()]
    assert len(lines) == 1 and "output 1 of module 'WithExtra' is a str" in lines[0]
    assert label == "label" and out.shape == (2, 3)
    assert (tmp_path / "n" / "step_1" / "order.txt").read_text().split() == [
        "Linear_1_0th_output_forward",
        "WithExtra_0_0th_output_forward",
    ]


def test_gpt_eager_and_graphmodule_dumps_agree_and_a_perturbation_is_found(tmp_path, capsys):
    base = build("gpt").train()

    def gpt_inputs(step):
        return training_inputs("gpt", seed=step)

    _, eager_losses = train(copy.deepcopy(base), tmp_path / "pt", steps=5, inputs=gpt_inputs)
    gm = graphtrain.GraphModule(copy.deepcopy(base))
    _, graph_losses = train(gm, tmp_path / "gt", steps=5, inputs=gpt_inputs)
    torch.testing.assert_close(graph_losses, eager_losses, rtol=1e-5, atol=1e-6)
    assert (
        stats_main(
            ["compare", "--baseline", str(tmp_path / "pt"), "--candidate", str(tmp_path / "gt")]
        )
        == 0
    )
    assert "no divergence" in capsys.readouterr().out

    gm = graphtrain.GraphModule(copy.deepcopy(base))
    train(
        gm,
        tmp_path / "gt_bad",
        steps=5,
        extra=[Perturb("blocks.1.attn.proj", 3)],
        inputs=gpt_inputs,
    )
    code = stats_main(
        ["compare", "--baseline", str(tmp_path / "pt"), "--candidate", str(tmp_path / "gt_bad")]
    )
    out = capsys.readouterr().out
    assert code == 1
    assert "first divergence: step 3, module 'blocks.1.attn.proj'" in out and ", forward, " in out


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_each_rank_writes_its_own_folder_and_compare_pairs_them(tmp_path):
    """Two real gloo ranks on loopback, gradients averaged with all_reduce; eager and GraphModule
    runs dump under rank_0/ and rank_1/, and compare pairs the ranks."""
    from conftest import run_python

    code = f"""
import sys
sys.path.insert(0, {str(__import__("pathlib").Path(__file__).parent)!r})
import torch, torch.distributed as dist, torch.multiprocessing as mp
import graphtrain
from graphtrain.hooks import StatisticsSubscriber, SubscriberManager
from test_hooks import Net

def work(rank):
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:{_free_port()}", rank=rank, world_size=2)
    for name, wrap in (("pt", False), ("gt", True)):
        torch.manual_seed(0)
        model = Net()
        SubscriberManager().subscribe(model, [StatisticsSubscriber({str(tmp_path)!r} + "/" + name)])
        run = graphtrain.GraphModule(model) if wrap else model
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(2):
            x = torch.randn(3, 4, generator=torch.Generator().manual_seed(10 * rank + step))
            opt.zero_grad()
            run(x).backward()
            for p in model.parameters():
                dist.all_reduce(p.grad)
                p.grad /= 2
            opt.step()
    dist.destroy_process_group()

if __name__ == "__main__":
    mp.start_processes(work, nprocs=2, start_method="fork")
"""
    r = run_python(code, timeout=300)
    assert r.returncode == 0, r.stderr
    for name in ("pt", "gt"):
        assert sorted(p.name for p in (tmp_path / name).iterdir()) == ["rank_0", "rank_1"]
        assert (tmp_path / name / "rank_1" / "step_1" / "statistics.bin").exists()
    a = read_sidecar(str(tmp_path / "pt" / "rank_0" / "step_0" / "statistics.bin"))
    b = read_sidecar(str(tmp_path / "pt" / "rank_1" / "step_0" / "statistics.bin"))
    assert (
        a["Linear_1_0th_output_forward"]["mean"] != b["Linear_1_0th_output_forward"]["mean"]
    )  # rank data
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "graphtrain.stats",
            "compare",
            "--baseline",
            str(tmp_path / "pt"),
            "--candidate",
            str(tmp_path / "gt"),
        ],
        capture_output=True,
        text=True,
    )
    assert (
        out.returncode == 0
        and "rank_1/step 1: 0 of 10" in out.stdout
        and "no divergence" in out.stdout
    ), out.stdout


def test_a_cached_graph_keeps_its_hooks(tmp_path):
    graphtrain.set_option("cache_dir", str(tmp_path / "cache"))
    torch.manual_seed(4)
    base = Net()
    x = torch.randn(3, 4)
    dumps = []
    for run in range(2):
        model = copy.deepcopy(base)
        SubscriberManager().subscribe(model, [StatisticsSubscriber(str(tmp_path / f"d{run}"))])
        gm = graphtrain.GraphModule(model)
        gm(x).backward()
        assert gm.captures == (1 if run == 0 else 0)  # the second run loads the cached graph
        dumps.append(read_sidecar(str(tmp_path / f"d{run}" / "step_0" / "statistics.bin")))
    assert str(dumps[0]) == str(dumps[1]) and "TwoOut_2_1th_output_backward" in dumps[1]
    # Without subscribers the model has another graph (no hooks): a separate cache entry.
    gm = graphtrain.GraphModule(copy.deepcopy(base))
    gm(x)
    assert gm.captures == 1

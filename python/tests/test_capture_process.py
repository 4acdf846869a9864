"""Capture in a forked child (GRAPHTRAIN_CAPTURE_PROCESS): the training process never loads
torch.export, trains exactly as with an in-process capture, and hears everything the child said;
a child that dies or cannot hand its graph over leaves the capture to the parent."""

import json
import logging
import os
import warnings
from pathlib import Path

import pytest
import torch

import graphtrain
from conftest import run_python
from graphtrain.errors import UnsupportedModelError

TRAIN = r"""
import json, os, sys, torch
sys.path.insert(0, {tests!r})
import graphtrain
from models import training_model, training_inputs
torch.manual_seed(0)
model = training_model("gpt")
creator = os.getpid()
if {crash!r}:  # the forward kills the process it runs in, unless that is the one that made it
    inner = model.forward
    def forward(*a, **k):
        if os.getpid() != creator:
            os._exit(3)
        return inner(*a, **k)
    model.forward = forward
gm = graphtrain.GraphModule(model)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
losses = []
for step in range(3):
    loss = gm(*training_inputs("gpt", seed=step))
    loss.backward()
    opt.step()
    opt.zero_grad()
    losses.append(loss.item())
# (torch._dynamo is no measure: torch.optim imports it when an optimizer is made.)
heavy = ("onnx", "graphtrain._capture", "graphtrain._aten")
import resource
print("RESULT", json.dumps(dict(
    captures=gm.captures, losses=losses,
    peak_mib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    params=[p.detach().flatten()[:64].tolist() for p in model.parameters()],
    loaded=[m for m in heavy if m in sys.modules])))
"""


def train(child: bool, crash: bool = False) -> tuple[dict, str]:
    code = TRAIN.format(tests=str(Path(__file__).parent), crash=crash)
    env = {"GRAPHTRAIN_CAPTURE_PROCESS": "1" if child else "0", "GRAPHTRAIN_LOG_LEVEL": "INFO"}
    r = run_python(code, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    line = [x for x in r.stdout.splitlines() if x.startswith("RESULT ")][0]
    return json.loads(line[len("RESULT ") :]), r.stderr


def test_child_capture_keeps_export_out_and_trains_identically():
    got, log = train(child=True)
    want, log0 = train(child=False)
    assert "capturing GPT (train) in child process" in log
    assert "child process" not in log0
    # The training process never imported the capture machinery (~45 MiB of its peak memory).
    assert got["loaded"] == [], got["loaded"]
    assert "graphtrain._capture" in want["loaded"]
    # Capture writes its graph without the onnx package (whose import took 0.7 s of a first step).
    assert "onnx" not in want["loaded"]
    print("training process peak:", got["peak_mib"], "MiB, capturing in it:", want["peak_mib"])
    assert got["captures"] == want["captures"] == 1
    assert got["losses"] == want["losses"]  # bit for bit: the same graph runs
    assert got["params"] == want["params"]


def test_a_child_that_dies_is_named_and_the_parent_captures():
    got, log = train(child=True, crash=True)
    want, _ = train(child=False)
    warnings = [x for x in log.splitlines() if "the capture process" in x]
    assert len(warnings) == 1, log
    assert "WARNING" in warnings[0] and "GPT (train)" in warnings[0]
    assert "exited with status 3" in warnings[0] and "capturing in this process" in warnings[0]
    assert got["captures"] == 1 and got["losses"] == want["losses"]


class LogCumSumExp(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        print("forward prints")  # while torch.export traces: in the child
        warnings.warn("forward warns", stacklevel=1)
        return torch.logcumsumexp(self.proj(x), dim=1).sum()


def test_the_childs_errors_and_log_records_reach_the_parent(caplog):
    pid = os.getpid()
    graphtrain.set_option("log_level", "INFO")
    graphtrain.set_option("fallback_policy", "off")
    gm = graphtrain.GraphModule(LogCumSumExp())
    with caplog.at_level(logging.INFO, logger="graphtrain"), pytest.warns(UserWarning):
        with pytest.raises(UnsupportedModelError) as e:
            gm(torch.randn(4, 8))
    # The error raised in the child is raised here, with its message whole.
    assert "aten.logcumsumexp" in str(e.value) and "torch.logcumsumexp(self.proj(x)" in str(e.value)
    started = [r for r in caplog.records if "in child process" in r.getMessage()]
    assert len(started) == 1 and started[0].process == pid

    caplog.clear()
    graphtrain.set_option("fallback_policy", "aten")
    gm = graphtrain.GraphModule(LogCumSumExp())
    with caplog.at_level(logging.WARNING, logger="graphtrain"), pytest.warns(UserWarning) as w:
        for _ in range(3):
            gm(torch.randn(4, 8)).backward()
    assert gm.captures == 1 and gm.module.proj.weight.grad is not None
    # What the child printed while tracing is logged here, as the child's record (its process id);
    # its Python warnings are warned here.
    printed = [r for r in caplog.records if "forward prints" in r.getMessage()]
    assert len(printed) == 1 and printed[0].process != pid
    assert "graph capture (torch.export)" in printed[0].getMessage()
    assert [str(x.message) for x in w if "forward warns" in str(x.message)] == ["forward warns"]


def test_a_function_defined_in_a_function_is_captured_in_this_process(caplog):
    class Local(torch.autograd.Function):  # the child's graph could not name it to the parent
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return g * 2

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, x):
            return Local.apply(self.lin(x)).sum()

    graphtrain.set_option("log_level", "INFO")
    net = Net()
    gm = graphtrain.GraphModule(net)
    with caplog.at_level(logging.INFO, logger="graphtrain"):
        loss = gm(torch.ones(2, 4))
    loss.backward()
    msgs = [r.getMessage() for r in caplog.records]
    assert any("capturing Net (train) in this process" in m and "Local" in m for m in msgs), msgs
    expected = torch.ones(2, 4).sum(0) * 2
    torch.testing.assert_close(net.lin.weight.grad, expected.expand(4, 4))

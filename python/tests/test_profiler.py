"""The kernel profiler: GRAPHTRAIN_PROFILE writes a Chrome trace at exit, profile_summary() tells
where the time went by op and by module."""

import json

import pytest
import torch

import graphtrain
from conftest import run_python
from graphtrain import profiler

TRAIN = """
import torch, graphtrain
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
gm = graphtrain.GraphModule(net)
for _ in range(2):
    gm(torch.randn(5, 8)).sum().backward()
"""


def test_env_option_writes_a_chrome_trace_at_exit(tmp_path):
    path = tmp_path / "trace.json"
    r = run_python(TRAIN, env={"GRAPHTRAIN_PROFILE": str(path)})
    assert r.returncode == 0, r.stderr
    trace = json.loads(path.read_text())
    events = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    kernels = [e for e in events if e["cat"] == "kernel"]
    runs = [e for e in events if e["cat"] == "graph"]
    assert len(runs) == 4  # forward and backward, two steps
    assert {r["args"]["graph"] for r in runs} == {"Sequential_train", "Sequential_train_backward"}
    gemm = next(e for e in kernels if e["name"] in ("Gemm", "MatMul", "graphtrain::FusedMatMul"))
    assert gemm["args"]["module"] in ("0", "2")
    assert gemm["args"]["input_shapes"].startswith("[5, ")
    assert gemm["args"]["node"]
    # Kernels sit inside their graph's run, and every duration is a time.
    for k in kernels:
        assert k["dur"] >= 0
        assert any(
            r["ts"] <= k["ts"] and k["ts"] + k["dur"] <= r["ts"] + r["dur"] + 1e-3 for r in runs
        )


def test_no_trace_without_the_option(tmp_path):
    r = run_python(TRAIN + "\nassert not graphtrain.profiler.rows()\n", env={})
    assert r.returncode == 0, r.stderr
    assert not list(tmp_path.iterdir())


def test_summary_by_op_and_module(capsys):
    net = torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.Softmax(dim=-1), torch.nn.Linear(16, 4)
    )
    gm = graphtrain.GraphModule(net)
    gm(torch.randn(5, 8)).sum().backward()  # captured before recording: capture is not a kernel
    profiler.clear()
    profiler.start()
    try:
        gm(torch.randn(5, 8)).sum().backward()
    finally:
        profiler.stop()
    text = graphtrain.profile_summary()
    assert capsys.readouterr().out.strip() == text
    by_op = dict((k, (ms, n)) for k, ms, n in profiler.rows("op"))
    by_module = dict((k, (ms, n)) for k, ms, n in profiler.rows("module"))
    # fuse_softmax takes the first Linear's bias add into the softmax
    assert "graphtrain::FusedSoftmax" in by_op and "graphtrain::SoftmaxGrad" in by_op
    assert by_op["graphtrain::FusedSoftmax"][1] == 1
    assert {"0", "1", "2"} <= set(by_module)
    assert sum(n for _, n in by_op.values()) == sum(n for _, n in by_module.values())
    assert "Softmax" in text and "module" in text
    profiler.clear()
    assert "nothing recorded" in graphtrain.profile_summary(print_it=False)
    with pytest.raises(graphtrain.GraphtrainError, match="by 'op' or by 'module'"):
        profiler.rows("kernel")


def test_write_is_atomic_and_valid(tmp_path):
    profiler.clear()
    profiler.start()
    try:
        gm = graphtrain.GraphModule(torch.nn.Linear(3, 2))
        gm(torch.randn(4, 3))
    finally:
        profiler.stop()
    path = tmp_path / "t.json"
    profiler.write(str(path))
    assert json.loads(path.read_text())["traceEvents"]
    assert [p.name for p in tmp_path.iterdir()] == ["t.json"]
    profiler.clear()


def test_print_memory_stats_reports_each_graph_once(tmp_path):
    r = run_python(
        TRAIN,
        env={"GRAPHTRAIN_PRINT_MEMORY_STATS": "1", "GRAPHTRAIN_LOG_LEVEL": "INFO"},
    )
    assert r.returncode == 0, r.stderr
    lines = [line for line in r.stderr.splitlines() if "held at most" in line]
    graphs = sorted(line.split("graph '")[1].split("'")[0] for line in lines)
    assert graphs == ["Sequential_train", "Sequential_train_backward"], r.stderr
    for line in lines:
        held = int(line.split("held at most ")[1].split()[0])
        assert held > 0 and "cached for reuse" in line

"""Eager islands: submodules named in GraphModule(eager_modules=...) or GRAPHTRAIN_EAGER_MODULES run
in PyTorch inside the graph (a PythonOp calling the submodule; backward through torch autograd)."""

import copy
import os
import subprocess
import sys

import pytest
import torch

import graphtrain
import models
import real_models
from graphtrain.errors import UnsupportedModelError


def train(model, fn, batch, steps=3):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for step in range(steps):
        opt.zero_grad()
        out = fn(**batch(step)) if isinstance(batch(step), dict) else fn(*batch(step))
        loss = out if isinstance(out, torch.Tensor) else out.loss
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def captured_differently(module):
    """Makes `module` scale its output by 1.01 only while torch.export captures it."""
    original = module.forward

    def forward(*a, **k):
        out = original(*a, **k)
        return out * 1.01 if torch.compiler.is_exporting() else out

    module.forward = forward


def test_an_island_runs_eagerly_inside_the_graph_and_trains_like_eager():
    base = models.build("gpt").train()
    captured_differently(base.blocks[1].attn)

    def batch(step):
        return models.training_inputs("gpt", seed=step)

    eager = copy.deepcopy(base)
    expected = train(eager, eager, batch)
    whole = copy.deepcopy(base)
    assert train(whole, graphtrain.GraphModule(whole), batch)[0] != pytest.approx(expected[0])
    island = copy.deepcopy(base)
    gm = graphtrain.GraphModule(island, eager_modules=["blocks.1.attn", "blocks.0.fc"])
    assert gm.eager_modules == ("blocks.0.fc", "blocks.1.attn")
    assert train(island, gm, batch) == pytest.approx(expected, rel=1e-5)
    # the island's parameters accumulate their gradients in torch, as in eager mode
    for (name, p), q in zip(island.named_parameters(), eager.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-3, atol=2e-3, msg=name)


class Branchy(torch.nn.Module):
    """Data-dependent Python control flow: torch.export cannot capture it, nor run it on fake
    tensors (the island's output shapes then come from an example run)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(8, 8)

    def forward(self, x):
        if x.sum() > 0:
            return self.a(x).relu()
        return self.a(x)


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = torch.nn.Linear(4, 8)
        self.branchy = Branchy()
        self.norm = torch.nn.BatchNorm1d(8)
        self.out = torch.nn.Linear(8, 1)

    def forward(self, x):
        return self.out(self.norm(self.branchy(self.inp(x)))).pow(2).mean()


def test_a_module_export_cannot_capture_runs_as_an_island():
    torch.manual_seed(0)
    base = Net()
    with pytest.raises(UnsupportedModelError):
        graphtrain.GraphModule(copy.deepcopy(base))(torch.randn(16, 4))
    eager, island = copy.deepcopy(base), copy.deepcopy(base)
    gm = graphtrain.GraphModule(island, eager_modules=["branchy"])
    for step in range(3):  # batch sizes change: the island's output keeps the symbolic batch
        x = torch.randn(16 + 4 * step, 4) * (1 if step % 2 else -1)
        expected, got = eager(x), gm(x)
        expected.backward()
        got.backward()
        torch.testing.assert_close(got, expected)
        for p, q in zip(island.parameters(), eager.parameters()):
            torch.testing.assert_close(p.grad, q.grad)
    # the example run that gave the shapes left no trace: BatchNorm saw each batch once
    assert int(island.norm.num_batches_tracked) == int(eager.norm.num_batches_tracked) == 3
    torch.testing.assert_close(island.norm.running_mean, eager.norm.running_mean)


def test_transformers_submodules_as_islands():
    for name, paths in (
        ("bert", ["bert.encoder.layer.0.attention"]),
        ("gpt2", ["transformer.h.1.mlp"]),
    ):
        base = real_models.build(name).train()

        def batch(step, name=name):
            return real_models.inputs(name, 4, step)

        eager = copy.deepcopy(base)
        expected = train(eager, eager, batch)
        island = copy.deepcopy(base)
        got = train(island, graphtrain.GraphModule(island, eager_modules=paths), batch)
        assert got == pytest.approx(expected, rel=1e-5), name


def test_bad_island_paths_and_arguments_say_what_to_do():
    with pytest.raises(ValueError, match=r"eager module 'blocks.7.fc' is not a submodule of GPT"):
        graphtrain.GraphModule(models.build("gpt"), eager_modules=["blocks.7.fc"])
    gpt2 = real_models.build("gpt2").train()
    gm = graphtrain.GraphModule(gpt2, eager_modules=["transformer.h.0.attn"])
    with pytest.raises(UnsupportedModelError, match="DynamicCache argument"):
        gm(**real_models.inputs("gpt2", 2, 0))


def test_the_environment_variable_names_islands():
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "train_gpt.py")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRAPHTRAIN_")}

    def run(*args, **extra):
        r = subprocess.run(
            [sys.executable, script, "--steps", "2", *args],
            env={**env, **extra},
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert r.returncode == 0, r.stderr
        return [float(line.split()[-1]) for line in r.stdout.splitlines()]

    plain = run("--no-wrap")
    bug = ("--captured-bug", "blocks.1.attn")
    assert run(*bug)[0] != pytest.approx(plain[0], rel=1e-5)
    islands = run(*bug, GRAPHTRAIN_EAGER_MODULES="blocks.1.attn, blocks.0.ln1")
    assert islands == pytest.approx(plain, rel=1e-5)


def test_islands_whose_inputs_need_no_gradient_still_train_their_parameters():
    # An Embedding reads integer ids only: its weight must still get its gradient, and a weight
    # tied to another module (the GPT head) gets both parts.
    base = models.build("gpt").train()
    x = models.training_inputs("gpt", seed=0)
    eager = copy.deepcopy(base)
    eager(*x).backward()
    for islands in (["tok"], ["pos"], ["tok", "head"]):
        m = copy.deepcopy(base)
        graphtrain.GraphModule(m, eager_modules=islands)(*x).backward()
        for (name, p), q in zip(m.named_parameters(), eager.parameters()):
            assert p.grad is not None, (islands, name)
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6, msg=name)
    with pytest.raises(ValueError, match="'blocks' is a ModuleList"):
        graphtrain.GraphModule(copy.deepcopy(base), eager_modules=["blocks"])

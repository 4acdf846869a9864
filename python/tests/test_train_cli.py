"""graphtrain-train: trains an ONNX model on an .npz from the command line."""

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch

from models import export_training

CLI = shutil.which("graphtrain-train", path=str(Path(sys.executable).parent))


def run(*args, check=True):
    r = subprocess.run([CLI, *map(str, args)], capture_output=True, text=True, timeout=300)
    if check:
        assert r.returncode == 0, r.stderr
    return r


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli")
    model = d / "mlp.onnx"
    export_training("mlp", str(model))
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 32, generator=g)
    y = (x @ torch.randn(32, 10, generator=g)).argmax(1)
    np.savez(d / "data.npz", x=x.numpy(), labels=y.numpy())
    np.savez_compressed(d / "dataz.npz", x=x.numpy(), labels=y.numpy())
    return d, model


def final_loss(r):
    return float(r.stdout.split("final loss")[1].split()[0])


def test_trains_and_exports(setup):
    d, model = setup
    r = run(
        model, "--data", d / "dataz.npz", "--steps", 150, "--lr", 3e-3, "--out", d / "trained.onnx"
    )
    losses = [
        float(line.split("loss")[1].split()[0])
        for line in r.stderr.splitlines()
        if line.startswith("step")
    ]
    assert losses[-1] < losses[0] / 5, r.stderr
    assert "steps/s" in r.stderr
    data = np.load(d / "data.npz")
    (loss,) = ort.InferenceSession(str(d / "trained.onnx"), providers=["CPUExecutionProvider"]).run(
        None, {"x": data["x"][:64], "labels": data["labels"][:64]}
    )
    assert loss < 0.5


def test_resume_from_checkpoint_matches_a_straight_run(setup):
    d, model = setup
    straight = final_loss(run(model, "--data", d / "data.npz", "--steps", 20, "--batch-size", 48))
    ck = d / "ck.onnx"
    ck.unlink(missing_ok=True)
    run(model, "--data", d / "data.npz", "--steps", 11, "--batch-size", 48, "--checkpoint", ck)
    r = run(model, "--data", d / "data.npz", "--steps", 20, "--batch-size", 48, "--checkpoint", ck)
    assert "resumed from" in r.stderr and "at step 11" in r.stderr
    assert final_loss(r) == straight


def test_clear_errors(setup, tmp_path):
    d, model = setup
    np.savez(tmp_path / "nolabels.npz", x=np.zeros((8, 32), np.float32))
    r = run(model, "--data", tmp_path / "nolabels.npz", check=False)
    assert r.returncode == 1
    assert "model input 'labels' has no array in" in r.stderr and "(its arrays: x)" in r.stderr
    np.savez(tmp_path / "wide.npz", x=np.zeros((8, 31), np.float32), labels=np.zeros(8, np.int64))
    r = run(model, "--data", tmp_path / "wide.npz", check=False)
    assert "input 'x' dim 1 must be 32" in r.stderr
    r = run(model, "--data", d / "data.npz", "--loss", "logits", check=False)
    assert "no value named 'logits' for the loss" in r.stderr
    r = run(model, "--data", d / "data.npz", "--steps", "many", check=False)
    assert r.returncode == 2 and "--steps needs a number, got 'many'" in r.stderr

    # A non-scalar loss: the per-example losses of a reduction="none" model.
    class PerExample(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(32, 10)

        def forward(self, x, labels):
            return torch.nn.functional.cross_entropy(self.fc(x), labels, reduction="none")

    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            PerExample(),
            (torch.randn(4, 32), torch.zeros(4, dtype=torch.int64)),
            str(tmp_path / "vec.onnx"),
            dynamo=False,
            input_names=["x", "labels"],
            dynamic_axes={"x": {0: "b"}, "labels": {0: "b"}},
            opset_version=18,
        )
    r = run(tmp_path / "vec.onnx", "--data", d / "data.npz", check=False)
    assert "training needs a scalar loss" in r.stderr

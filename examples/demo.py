"""The main demo: a small model trained by graphtrain's engine and by plain PyTorch, side by side.

Today the engine trains an ONNX export of the model (TrainingSession: the gradient graph is built by
graphtrain, forward, backward and AdamW run in C++). Once GraphModule lands, this wraps the PyTorch
module directly.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
import warnings

import numpy as np
import torch
from torch import nn

import graphtrain
import graphtrain.engine as ge

STEPS = 100


class Classifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.LayerNorm(256), nn.Linear(256, 256),
                                 nn.ReLU(), nn.Linear(256, 10))

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(self.net(x), labels)


def batches(n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    teacher = torch.randn(64, 10, generator=g)
    out = []
    for _ in range(n):
        x = torch.randn(128, 64, generator=g)
        out.append((x, (x @ teacher).argmax(1)))
    return out


def bar(step: int, total: int, loss: float, rate: float) -> None:
    """A progress bar in place on a terminal; every 20 steps in a log."""
    tty = sys.stdout.isatty()
    if not tty and step % 20 and step != total:
        return
    filled = step * 30 // total
    text = f"  step {step:3d}/{total} [{'#' * filled}{'.' * (30 - filled)}] loss {loss:.4f} {rate:6.1f} steps/s"
    print(("\r" + text) if tty else text, end="" if tty and step < total else "\n", flush=True)


def main() -> None:
    print(f"graphtrain {graphtrain.__version__}: training a classifier for {STEPS} AdamW steps\n")
    torch.manual_seed(0)
    model = Classifier()
    data = batches(STEPS)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "classifier.onnx")
        state = {k: v.clone() for k, v in model.state_dict().items()}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(model, data[0], path, dynamo=False, opset_version=18, input_names=["x", "labels"],
                              output_names=["loss"], dynamic_axes={"x": {0: "batch"}, "labels": {0: "batch"}},
                              training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False)
        model.load_state_dict(state)

        print("graphtrain (TrainingSession):")
        ts = ge.TrainingSession(path, optimizer="adamw", lr=1e-3, weight_decay=0.01)
        ours, t0 = [], time.perf_counter()
        for i, (x, y) in enumerate(data, 1):
            ts.zero_grad()
            ours.append(ts.train_step({"x": x.numpy(), "labels": y.numpy()}))
            ts.optimizer_step()
            bar(i, STEPS, ours[-1], i / (time.perf_counter() - t0))
        gt_time = (time.perf_counter() - t0) / STEPS

    print("PyTorch eager:")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    theirs, t0 = [], time.perf_counter()
    for i, (x, y) in enumerate(data, 1):
        opt.zero_grad()
        loss = model(x, y)
        loss.backward()
        opt.step()
        theirs.append(loss.item())
        bar(i, STEPS, theirs[-1], i / (time.perf_counter() - t0))
    pt_time = (time.perf_counter() - t0) / STEPS

    rel = np.abs(np.array(ours) - np.array(theirs)) / np.abs(np.array(theirs))
    print(f"\nloss: first {ours[0]:.4f} -> last {ours[-1]:.4f} (graphtrain), {theirs[0]:.4f} -> {theirs[-1]:.4f} (PyTorch)")
    print(f"parity: largest relative loss difference over {STEPS} steps {rel.max():.2e} "
          f"({'within' if rel.max() < 1e-4 else 'OUTSIDE'} the 1e-4 promise)")
    print(f"speed: graphtrain {gt_time * 1e3:.2f} ms/step, PyTorch {pt_time * 1e3:.2f} ms/step, "
          f"ratio {pt_time / gt_time:.2f}x ({torch.get_num_threads()} threads)")


if __name__ == "__main__":
    main()

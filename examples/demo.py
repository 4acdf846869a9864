"""The main demo: a GPT-style model trained on text from Python's standard library, once in plain
PyTorch and once wrapped in graphtrain.GraphModule, from the same initial weights and batches.
Prints both loss curves' agreement, each step time and the ratio, and plots both curves to a PNG.

    make demo            (or: .venv/bin/python examples/demo.py [--steps N] [--plot PATH])
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "python" / "tests"))  # the test suite's GPT-style model

import graphtrain  # noqa: E402
import graphtrain.optim  # noqa: E402
from models import GPT  # noqa: E402

SEQ, BATCH = 64, 16


def corpus(limit: int = 400_000) -> str:
    """Text from the standard library's own modules (always there, no download)."""
    lib = Path(os.__file__).parent
    parts, size = [], 0
    for path in sorted(lib.glob("*.py")):
        text = path.read_text(errors="replace")
        parts.append(text)
        size += len(text)
        if size >= limit:
            break
    return "".join(parts)[:limit]


def batches(text: str, steps: int) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], int]:
    chars = sorted(set(text))
    index = {c: i for i, c in enumerate(chars)}
    data = torch.tensor([index[c] for c in text], dtype=torch.int64)
    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(steps):
        starts = torch.randint(0, len(data) - SEQ - 1, (BATCH,), generator=g)
        ids = torch.stack([data[s : s + SEQ] for s in starts])
        out.append((ids, torch.stack([data[s + 1 : s + SEQ + 1] for s in starts])))
    return out, len(chars)


def train(
    model: torch.nn.Module, data: list, label: str, optimizer: type
) -> tuple[list[float], list[float]]:
    opt = optimizer(model.parameters(), lr=3e-3, weight_decay=0.01)
    losses, times = [], []
    tty = sys.stdout.isatty()
    start = time.perf_counter()
    for i, (ids, targets) in enumerate(data, 1):
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = model(ids, targets)
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t0)
        losses.append(loss.item())
        if tty or i % 50 == 0 or i == len(data):
            filled = i * 30 // len(data)
            line = (
                f"  {label:11s} step {i:4d}/{len(data)} [{'#' * filled}{'.' * (30 - filled)}] "
                f"loss {losses[-1]:.4f}  {i / (time.perf_counter() - start):6.1f} steps/s"
            )
            print(
                ("\r" + line) if tty else line,
                end="" if tty and i < len(data) else "\n",
                flush=True,
            )
    return losses, times


def plot(path: str, eager: list[float], graph: list[float]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=110)
    steps = np.arange(1, len(eager) + 1)
    ax.plot(steps, eager, label="PyTorch eager", linewidth=2.5, color="#1f77b4")
    ax.plot(
        steps, graph, label="graphtrain GraphModule", linewidth=1.2, color="#ff7f0e", linestyle="--"
    )
    ax.set_xlabel("step")
    ax.set_ylabel("training loss")
    ax.set_title("GPT-style model on Python's standard library text")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--plot", default=str(ROOT / "build" / "demo_loss.png"))
    args = parser.parse_args()

    text = corpus()
    data, vocab = batches(text, args.steps)
    torch.manual_seed(0)
    eager = GPT(vocab=vocab, dim=64, heads=4, layers=2, max_len=SEQ)
    wrapped = graphtrain.GraphModule(copy.deepcopy(eager))
    params = sum(p.numel() for p in eager.parameters())
    print(
        f"graphtrain {graphtrain.__version__}: a GPT-style model ({params:,} parameters, vocabulary {vocab}) on "
        f"{len(text):,} characters of the standard library, {args.steps} AdamW steps, batch {BATCH} x {SEQ}, "
        f"{torch.get_num_threads()} threads\n"
        "  PyTorch:    the model as it is, torch.optim.AdamW (its default)\n"
        "  graphtrain: graphtrain.GraphModule(model), graphtrain.optim.AdamW (fused, drop-in)\n"
    )
    eager_losses, eager_times = train(eager, data, "PyTorch", torch.optim.AdamW)
    graph_losses, graph_times = train(wrapped, data, "graphtrain", graphtrain.optim.AdamW)

    e, g = np.array(eager_losses), np.array(graph_losses)
    rel = np.abs(g - e) / np.abs(e)
    first = 20
    print(f"\nloss: {e[0]:.4f} -> {e[-1]:.4f} (PyTorch), {g[0]:.4f} -> {g[-1]:.4f} (graphtrain)")
    print(
        f"parity: largest relative difference over the first {first} steps {rel[:first].max():.1e} "
        f"(the promise: 1e-4); over all {args.steps} steps {rel.max():.1e}"
    )
    te, tg = np.median(eager_times[1:]) * 1e3, np.median(graph_times[1:]) * 1e3
    print(
        f"speed: PyTorch {te:.2f} ms/step, graphtrain {tg:.2f} ms/step (median): graphtrain is {te / tg:.2f}x "
        f"PyTorch's speed; its first step, with capture and graph building, took {graph_times[0]:.2f} s"
    )
    Path(args.plot).parent.mkdir(parents=True, exist_ok=True)
    plot(args.plot, eager_losses, graph_losses)
    print(f"plot of both loss curves: {args.plot}")


if __name__ == "__main__":
    main()

"""Convolution on the conv layers of the bench's conv nets (bench/configs.py "hf-resnet" and
"cnn", their batch), forward and backward (dX where the layer's input needs it, dW), with each
implementation this machine has:

- graphtrain on oneDNN's direct kernels (GRAPHTRAIN_CONV_ALGORITHM=ONEDNN; Debian's libdnnl
  2.6, the batch split over graphtrain's pool, oneDNN on one thread in each part);
- graphtrain's im2col + GEMM (GRAPHTRAIN_CONV_ALGORITHM=IM2COL; OpenBLAS, or oneDNN's sgemm for
  GEMMs of 2^20 multiply-adds and more);
- torch (eager's F.conv2d and its autograd backward: PyTorch's bundled oneDNN).

MKL has no convolution of its own (its deep-learning primitives became oneDNN). Each runner and
thread count runs in its own process. Prints ms per layer and writes bench/results/conv.md.
Nothing is asserted.

    .venv/bin/python bench/bench_conv.py
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "python" / "tests"))

from machine import describe, median_ms, run_worker, write_results  # noqa: E402

RUNNERS = ["graphtrain oneDNN", "graphtrain im2col", "torch"]


def layers() -> list[dict]:
    """Every Conv2d of the conv bench models, with its input shape (found by running them)."""
    import torch

    from configs import CONFIGS, example_kwargs, hf_inputs, hf_model
    from models import training_inputs, training_model

    out = []
    for model in ("hf-resnet", "cnn"):
        if CONFIGS[model].get("hf"):
            net, kwargs, args = hf_model(model), hf_inputs(model, seed=0), ()
        else:
            net, kwargs = training_model(model, **CONFIGS[model]["sizes"]), {}
            args = training_inputs(model, seed=0, **example_kwargs(model))
        seen = []

        def hook(mod, args, _out, seen=seen):  # noqa: ANN001, ANN202
            seen.append((mod, tuple(args[0].shape)))

        handles = [
            m.register_forward_hook(hook) for m in net.modules() if isinstance(m, torch.nn.Conv2d)
        ]
        with torch.no_grad():
            net(*args, **kwargs)
        for h in handles:
            h.remove()
        for k, (m, shape) in enumerate(seen):
            out.append(
                dict(
                    name=f"{model} {k}",
                    x=list(shape),
                    w=list(m.weight.shape),
                    stride=list(m.stride),
                    pad=list(m.padding),
                    dil=list(m.dilation),
                    group=m.groups,
                    bias=m.bias is not None,
                    dx=k > 0,  # the first layer reads the images: no input gradient
                )
            )
    return out


def _graphtrain(layer: dict, backward: bool):  # noqa: ANN202 - a Session
    from onnx import TensorProto, helper

    import graphtrain.engine as ge

    x, w = layer["x"], layer["w"]
    attrs = dict(
        strides=layer["stride"], pads=layer["pad"] * 2, dilations=layer["dil"], group=layer["group"]
    )
    oh = [
        (x[2 + i] + 2 * layer["pad"][i] - layer["dil"][i] * (w[2 + i] - 1) - 1)
        // layer["stride"][i]
        + 1
        for i in range(2)
    ]
    y = [x[0], w[0], *oh]
    f = TensorProto.FLOAT
    if backward:
        outs = ["dx" if layer["dx"] else "", "dw"]
        node = helper.make_node("ConvGrad", ["dy", "x", "w"], outs, domain="graphtrain", **attrs)
        ins = [("dy", y), ("x", x), ("w", w)]
    else:
        outs = ["y"]
        ins = [("x", x), ("w", w)] + ([("b", [w[0]])] if layer["bias"] else [])
        node = helper.make_node("Conv", [n for n, _ in ins], outs, **attrs)
    graph = helper.make_graph(
        [node],
        "conv",
        [helper.make_tensor_value_info(n, f, s) for n, s in ins],
        [helper.make_tensor_value_info(o, f, None) for o in outs if o],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    return ge.Session(ge.Model.from_bytes(model.SerializeToString())), dict(ins)


def _torch_runs(layer: dict) -> dict:
    """eager's forward (no autograd) and backward (dX where wanted, dW) of one layer."""
    import torch
    import torch.nn.functional as F

    x = torch.randn(layer["x"], requires_grad=layer["dx"])
    w = torch.randn(layer["w"], requires_grad=True)
    b = torch.randn(layer["w"][0]) if layer["bias"] else None
    geometry = (layer["stride"], layer["pad"], layer["dil"], layer["group"])
    y = F.conv2d(x, w, b, *geometry)
    dy = torch.randn(y.shape)
    wrt = [x, w] if layer["dx"] else [w]

    def forward(i: int) -> torch.Tensor:
        with torch.no_grad():
            return F.conv2d(x, w, b, *geometry)

    def backward(i: int) -> tuple:
        return torch.autograd.grad(y, wrt, dy, retain_graph=True)

    return {"forward": forward, "backward": backward}


def worker(runner: str, threads: int, iters: int) -> list[dict]:
    import numpy as np
    import torch

    torch.set_num_threads(threads)
    rng = np.random.default_rng(0)
    rows = []
    for layer in layers():
        times = {}
        if runner == "torch":
            runs = _torch_runs(layer)
        else:
            runs = {}
            for kind in ("forward", "backward"):
                session, shapes = _graphtrain(layer, kind == "backward")
                feeds = {n: rng.standard_normal(s, np.float32) for n, s in shapes.items()}
                runs[kind] = lambda i, s=session, f=feeds: s.run(f)
        for kind, run in runs.items():
            for i in range(3):
                run(i)
            times[kind] = median_ms(run, iters)
        rows.append(dict(name=layer["name"], **times))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        runner, threads = args.worker
        print(json.dumps(worker(runner, int(threads), args.iters)))
        return
    results = {}
    for runner in RUNNERS:
        for threads in (1, 2):
            env = dict(
                os.environ,
                OMP_NUM_THREADS=str(threads),
                GRAPHTRAIN_NUM_THREADS=str(threads),
                GRAPHTRAIN_CONV_ALGORITHM="IM2COL" if runner.endswith("im2col") else "ONEDNN",
            )
            rows = run_worker(__file__, [runner, str(threads), "--iters", str(args.iters)], env)
            results[(runner, threads)] = rows
            total = sum(r["forward"] + r["backward"] for r in rows)
            print(f"{runner:18s} {threads} thread(s): {total:6.2f} ms, all layers", flush=True)
    write(results)


def write(results: dict[tuple[str, int], list[dict]]) -> None:
    cols = list(results)
    lines = [
        "# Convolution on the conv bench models' layers: graphtrain (oneDNN direct, im2col + "
        "GEMM) and torch",
        "",
        f"Machine: {describe()}",
        "",
        "Each runner and thread count in its own process; ms, median of 50 calls on the same "
        "operands after 3 warm-up calls. fwd: the forward; bwd: the input gradient (not for a "
        "model's first layer, whose input is the images) and the weight gradient. Layers: every "
        "Conv2d of bench/configs.py's hf-resnet (batch 32, 32 x 32 images) and cnn, in order.",
        "",
        "| layer | X | W | stride, pad | "
        + " | ".join(f"{r} {t}t fwd | {r} {t}t bwd" for r, t in cols)
        + " |",
        "|---|---|---|---|" + "---|---|" * len(cols),
    ]
    for k, layer in enumerate(layers()):
        cells = []
        for col in cols:
            row = results[col][k]
            cells += [f"{row['forward']:.3f}", f"{row['backward']:.3f}"]
        lines.append(
            f"| {layer['name']} | {layer['x']} | {layer['w']} | {layer['stride'][0]}, "
            f"{layer['pad'][0]} | " + " | ".join(cells) + " |"
        )
    totals = []
    for col in cols:
        totals += [
            f"**{sum(r['forward'] for r in results[col]):.2f}**",
            f"**{sum(r['backward'] for r in results[col]):.2f}**",
        ]
    lines.append("| **all layers** | | | | " + " | ".join(totals) + " |")

    def total(runner: str, threads: int) -> float:
        rows = results.get((runner, threads), [])
        return sum(r["forward"] + r["backward"] for r in rows)

    lines += [
        "",
        "What it decides: graphtrain runs convolutions on oneDNN's direct kernels where oneDNN "
        "has one (GRAPHTRAIN_CONV_ALGORITHM=AUTO), im2col + GEMM elsewhere and for layers of at "
        "most 2048 weights (cnn's two: there oneDNN gains at most ~0.15 ms a layer, and a model "
        "that never touches oneDNN has ~7 MiB less peak memory). All layers, forward "
        "and backward, 1 thread: oneDNN "
        f"{total('graphtrain oneDNN', 1):.2f} ms, im2col {total('graphtrain im2col', 1):.2f}, "
        f"torch {total('torch', 1):.2f}; 2 threads: {total('graphtrain oneDNN', 2):.2f}, "
        f"{total('graphtrain im2col', 2):.2f}, {total('torch', 2):.2f}.",
        "",
    ]
    write_results("conv.md", lines)


if __name__ == "__main__":
    main()

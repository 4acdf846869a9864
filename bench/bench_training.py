"""Training step speed and memory, same model, same data, same threads:
- graphtrain.GraphModule (the PyTorch module wrapped; graphtrain.optim.AdamW, the fused drop-in
  for torch.optim.AdamW), first step cold and with the export cache warm;
- graphtrain's TrainingSession on the model's ONNX export (forward, backward, AdamW all in C++);
- PyTorch eager and torch.compile (forward, backward, torch.optim.AdamW).
Each (runner, model, threads) runs in its own process; peak memory is the RSS high-water mark minus
RSS before the model was built (with --repeats, the median over the runs; the time, the fastest).

    .venv/bin/python bench/bench_training.py [--quick] [--no-compile]

Prints ratios and writes bench/results/training_step.md. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "python" / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

from configs import CONFIGS, describe_models, example_kwargs, hf_inputs, hf_model  # noqa: E402
from machine import median_ms, rss_kib  # noqa: E402


def worker(runner: str, model: str, path: str, threads: int, iters: int) -> dict:
    import torch

    from models import TRAINING_INPUT_NAMES, training_inputs, training_model

    torch.set_num_threads(threads)
    hf = CONFIGS[model].get("hf", False)
    if hf:
        batches = [hf_inputs(model, seed=s) for s in range(4)]
    else:
        batches = [training_inputs(model, seed=s, **example_kwargs(model)) for s in range(4)]
    base = rss_kib("VmRSS")
    if runner == "TrainingSession":
        import graphtrain.engine as ge

        ts = ge.TrainingSession(path, optimizer="adamw", lr=1e-3, weight_decay=0.01)
        feeds = [{n: t.numpy() for n, t in zip(TRAINING_INPUT_NAMES[model], b)} for b in batches]

        def step(i: int) -> float:
            ts.zero_grad()
            loss = ts.train_step(feeds[i % len(feeds)])
            ts.optimizer_step()
            return loss
    elif runner == "GEMM-bound limit":
        return gemm_limit(model, batches[0], hf)
    else:
        net = hf_model(model) if hf else training_model(model, **CONFIGS[model]["sizes"])
        if runner.startswith("GraphModule"):
            import graphtrain.optim

            opt = graphtrain.optim.AdamW(net.parameters(), lr=1e-3, weight_decay=0.01)
        else:
            opt = torch.optim.AdamW(net.parameters(), lr=1e-3, weight_decay=0.01)
        if runner == "torch.compile":
            fn = torch.compile(net)
        elif runner.startswith("GraphModule"):
            import graphtrain

            fn = graphtrain.GraphModule(net)
        else:
            fn = net

        def step(i: int) -> float:
            opt.zero_grad()
            batch = batches[i % len(batches)]
            loss = fn(**batch).loss if hf else fn(*batch)
            loss.backward()
            opt.step()
            return loss.item()

    t0 = time.perf_counter()
    step(0)
    first = time.perf_counter() - t0
    for i in range(1, 10):  # a fresh model's first steps can be slower (denormal floats)
        step(i)
    result = {
        "first_s": first,
        "ten_s": time.perf_counter() - t0,
        "median_ms": median_ms(step, iters),
        "peak_mib": (rss_kib("VmHWM") - base) / 1024,
        # The capture's child process (GRAPHTRAIN_CAPTURE_PROCESS): its high-water mark, the pages
        # it shares with this process included.
        "child_mib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
    }
    if runner == "GraphModule":  # where the time goes, from graphtrain's kernel profiler
        import graphtrain.profiler

        graphtrain.profiler.clear()
        graphtrain.profiler.start()
        profiled = 5
        t0 = time.perf_counter()
        for i in range(profiled):
            step(i)
        result["profiled_ms"] = (time.perf_counter() - t0) / profiled * 1e3
        graphtrain.profiler.stop()
        result["profile"] = [
            (op, ms / profiled, n // profiled) for op, ms, n in graphtrain.profiler.rows("op")
        ]
    return result


def sgemm_gflops(m: int = 1024, k: int = 512, n: int = 512, iters: int = 30) -> float:
    """graphtrain's measured float32 GEMM rate (GFLOP/s) on its own pool, on a bench-like shape."""
    import numpy as np
    from onnx import TensorProto, helper

    import graphtrain.engine as ge

    graph = helper.make_graph(
        [helper.make_node("MatMul", ["a", "b"], ["c"])],
        "sgemm",
        [
            helper.make_tensor_value_info("a", TensorProto.FLOAT, [m, k]),
            helper.make_tensor_value_info("b", TensorProto.FLOAT, [k, n]),
        ],
        [helper.make_tensor_value_info("c", TensorProto.FLOAT, [m, n])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    session = ge.Session(ge.Model.from_bytes(model.SerializeToString()))
    rng = np.random.default_rng(0)
    a = rng.standard_normal((m, k), np.float32)
    feeds = {"a": a, "b": rng.standard_normal((k, n), np.float32)}
    for _ in range(3):
        session.run(feeds)
    ms = median_ms(lambda i: session.run(feeds), iters)
    return 2.0 * m * k * n / (ms * 1e-3) / 1e9


def gemm_limit(model: str, batch, hf: bool) -> dict:
    """The step's GEMM FLOPs (forward and backward, counted by torch's FlopCounterMode on the
    eager model) over graphtrain's measured GEMM rate: no training step can be faster."""
    from torch.utils.flop_counter import FlopCounterMode

    from models import training_model

    net = hf_model(model) if hf else training_model(model, **CONFIGS[model]["sizes"])
    counter = FlopCounterMode(display=False)
    with counter:
        loss = net(**batch).loss if hf else net(*batch)
        loss.backward()
    flops = counter.get_total_flops()
    rate = sgemm_gflops()
    return {
        "median_ms": flops / (rate * 1e9) * 1e3,
        "first_s": 0.0,
        "ten_s": 0.0,
        "peak_mib": 0.0,
        "gflop": flops / 1e9,
        "gflops_rate": rate,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer iterations")
    parser.add_argument(
        "--no-compile", action="store_true", help="skip torch.compile (slow to compile)"
    )
    parser.add_argument(
        "--models", nargs="*", default=list(CONFIGS), help="models to run (default: all)"
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=2,
        help="runs of each runner's process, alternating with the others; the faster is kept "
        "(a shared machine's speed drifts between runs)",
    )
    parser.add_argument("--worker", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        runner, model, path, threads, iters = args.worker
        print(json.dumps(worker(runner, model, path, int(threads), int(iters))))
        return 0

    from machine import describe, write_results
    from models import export_training

    iters = 10 if args.quick else 30
    runners = (
        ["GraphModule", "GraphModule (cache)", "TrainingSession", "eager"]
        + ([] if args.no_compile else ["torch.compile"])
        + ["GEMM-bound limit"]
    )
    rows = []
    with tempfile.TemporaryDirectory() as d:
        cache = os.path.join(d, "cache")
        for model in args.models:
            cfg = CONFIGS[model]
            path = os.path.join(d, f"{model}.onnx")
            if not cfg.get("hf"):  # TrainingSession trains the model's ONNX export
                export_training(model, path, example=example_kwargs(model), **cfg["sizes"])
            for threads in (1, 2):
                result = {}
                peaks: dict[str, list[float]] = {}
                for repeat, runner in [(k, r) for k in range(args.repeats) for r in runners]:
                    if runner == "TrainingSession" and cfg.get("hf"):
                        continue
                    env = dict(
                        os.environ,
                        GRAPHTRAIN_NUM_THREADS=str(threads),
                        OMP_NUM_THREADS=str(threads),
                    )
                    if runner.startswith("GraphModule"):  # the cold run fills what "(cache)" reads
                        env["GRAPHTRAIN_CACHE_DIR"] = os.path.join(
                            cache, f"{model}-{threads}-{repeat}"
                        )
                    out = subprocess.run(
                        [
                            sys.executable,
                            __file__,
                            "--worker",
                            runner,
                            model,
                            path,
                            str(threads),
                            str(iters),
                        ],
                        capture_output=True,
                        text=True,
                        env=env,
                    )
                    if out.returncode != 0:
                        result.setdefault(runner, None)
                        print(
                            f"{model} {runner} threads={threads} failed: {out.stderr.strip().splitlines()[-1:]}"
                        )
                        continue
                    got = json.loads(out.stdout.strip().splitlines()[-1])
                    peaks.setdefault(runner, []).append(got["peak_mib"])
                    kept = result.get(runner)
                    if kept is None or got["median_ms"] < kept["median_ms"]:
                        result[runner] = got
                for runner, values in peaks.items():  # every runner's by the same rule
                    if result.get(runner):
                        result[runner]["peak_mib"] = statistics.median(values)
                rows.append((model, threads, result))
                g = result["GraphModule"]
                line = f"{model:8s} threads={threads}: GraphModule {g['median_ms']:8.2f} ms"
                for r in runners[1:]:
                    if result.get(r):
                        ms = result[r]["median_ms"]
                        line += f" | {r} {ms:8.2f} ms (x{ms / g['median_ms']:.2f})"
                print(line, flush=True)
    lines = [
        "# Training step: graphtrain (GraphModule, TrainingSession) vs PyTorch eager and torch.compile",
        "",
        f"Machine: {describe()}",
        "",
        f"One step = forward, backward and AdamW (lr 1e-3, weight decay 0.01). Median of {iters} steps after 10 "
        "warm-up steps; each runner and thread count in its own process, run "
        f"{args.repeats} time(s) in turn with the other runners, the run with the lower median "
        "kept (this machine's speed drifts between runs; for the GEMM-bound limit, the run whose "
        "sgemm probe read the highest rate). Ratio = the runner's step time / "
        "GraphModule's (> 1: GraphModule is faster). First step: seconds for the first step, capture, graph "
        "building or compilation included; first 10 steps: seconds for the first ten (a fresh model's early "
        "steps make denormal floats). 'GraphModule (cache)' starts with the export cache the cold run "
        "filled. Peak: RSS high-water mark minus RSS before building the model, the median over the runs "
        "(a runner's high-water mark moves by a few MiB from run to run); GraphModule captures in "
        "a forked child (GRAPHTRAIN_CAPTURE_PROCESS), whose whole high-water mark, pages shared with the "
        "training process included, is given in parentheses.",
        "",
        "| model | threads | runner | step ms | ratio | first step s | first 10 steps s | peak MiB |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for model, threads, result in rows:
        g = result["GraphModule"]
        for r in runners:
            if r not in result:
                continue
            res = result.get(r)
            if not res:
                lines.append(f"| {model} | {threads} | {r} | failed | | | | |")
                continue
            ratio = res["median_ms"] / g["median_ms"]
            if r == "GEMM-bound limit":
                lines.append(
                    f"| {model} | {threads} | {r}: {res['gflop']:.2f} GFLOP at "
                    f"{res['gflops_rate']:.0f} GFLOP/s | {res['median_ms']:.2f} | {ratio:.2f} | | | |"
                )
                continue
            child = (
                f" (capture child {res['child_mib']:.0f})"
                if r == "GraphModule" and res.get("child_mib")
                else ""
            )
            lines.append(
                f"| {model} | {threads} | {r} | {res['median_ms']:.2f} | {ratio:.2f} | {res['first_s']:.2f} | "
                f"{res['ten_s']:.2f} | {res['peak_mib']:.1f}{child} |"
            )
    lines += ["", describe_models(args.models), ""]
    lines += [
        "## Where GraphModule's step goes",
        "",
        "Kernel time per step by op (graphtrain's profiler, GRAPHTRAIN_PROFILE), the largest eight; "
        "'other' is the profiled steps' time outside kernels (Python, autograd, optimizer).",
        "",
        "| model | threads | op | ms | calls |",
        "|---|---|---|---|---|",
    ]
    for model, threads, result in rows:
        g = result.get("GraphModule") or {}
        prof = g.get("profile") or []
        for op, ms, n in prof[:8]:
            lines.append(f"| {model} | {threads} | {op} | {ms:.2f} | {n} |")
        if prof:
            kernels = sum(ms for _, ms, _ in prof)
            lines.append(f"| {model} | {threads} | all kernels | {kernels:.2f} | |")
            other = g["profiled_ms"] - kernels
            lines.append(f"| {model} | {threads} | other | {other:.2f} | |")
    lines.append("")
    write_results("training_step.md", lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What StatisticsSubscriber costs: training step time with and without it, in PyTorch eager and
in graphtrain.GraphModule (whose graph then runs the subscribers from Hook nodes), torch.compile
without it as the reference competitor. Every step is dumped (forward outputs and gradients of
every module, text files and the binary sidecar).

    .venv/bin/python bench/bench_statistics.py [--quick] [--no-compile]

Prints ratios and writes bench/results/statistics_overhead.md. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "python" / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

from configs import CONFIGS, describe_models, example_kwargs  # noqa: E402
from machine import median_ms  # noqa: E402

RUNNERS = [
    "eager",
    "eager + stats",
    "eager + stats text=False",
    "GraphModule",
    "GraphModule + stats",
    "GraphModule + stats text=False",
    "torch.compile",
]
WITH_STATS = [r for r in RUNNERS if "+ stats" in r]
MODELS = ["mlp", "gpt"]


def worker(runner: str, model: str, out_dir: str, iters: int) -> dict:
    import torch

    from models import training_inputs, training_model

    torch.set_num_threads(1)
    kw = example_kwargs(model)
    batches = [training_inputs(model, seed=s, **kw) for s in range(4)]
    net = training_model(model, **CONFIGS[model]["sizes"])
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3, weight_decay=0.01)
    modules = sum(1 for _ in net.modules())
    if "+ stats" in runner:
        from graphtrain.hooks import StatisticsSubscriber, SubscriberManager

        sub = StatisticsSubscriber(
            out_dir, override_output_dir=True, text=not runner.endswith("text=False")
        )
        SubscriberManager().subscribe(net, [sub])
    if runner.startswith("GraphModule"):
        import graphtrain

        fn = graphtrain.GraphModule(net)
    elif runner == "torch.compile":
        fn = torch.compile(net)
    else:
        fn = net

    def step(i: int) -> None:
        opt.zero_grad()
        fn(*batches[i % len(batches)]).backward()
        opt.step()

    for i in range(3):
        step(i)
    return {"median_ms": median_ms(step, iters), "modules": modules}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer iterations")
    parser.add_argument("--rounds", type=int, default=3, help="processes per runner, in turn")
    parser.add_argument(
        "--no-compile", action="store_true", help="skip torch.compile (slow to compile)"
    )
    parser.add_argument("--worker", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        runner, model, out_dir, iters = args.worker
        print(json.dumps(worker(runner, model, out_dir, int(iters))))
        return 0

    from machine import describe, write_results

    iters = 8 if args.quick else 20
    runners = [r for r in RUNNERS if not (args.no_compile and r == "torch.compile")]
    rows = []
    # Dumps go to memory (tmpfs) when there is one, so the numbers are the subscriber's CPU cost,
    # not the disk's mood.
    shm = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    with tempfile.TemporaryDirectory(dir=shm) as d:
        for model in MODELS:
            result: dict = {}
            samples: dict[str, list[float]] = {r: [] for r in runners}
            # Rounds of every runner, one process each, in turn: the machine's drift over minutes
            # reaches every runner alike; each runner's figure is the median of its rounds.
            for runner in [r for _ in range(args.rounds) for r in runners]:
                if runner in result and result[runner] is None:
                    continue
                env = dict(os.environ, GRAPHTRAIN_NUM_THREADS="1", OMP_NUM_THREADS="1")
                out = subprocess.run(
                    [
                        sys.executable,
                        __file__,
                        "--worker",
                        runner,
                        model,
                        os.path.join(d, "dump"),
                        str(iters),
                    ],
                    capture_output=True,
                    text=True,
                    env=env,
                )
                if out.returncode != 0:
                    print(f"{model} {runner} failed: {out.stderr.strip().splitlines()[-1:]}")
                    result[runner] = None
                    continue
                got = json.loads(out.stdout.strip().splitlines()[-1])
                samples[runner].append(got["median_ms"])
                result[runner] = {**got, "median_ms": statistics.median(samples[runner])}
            rows.append((model, result))
            line = f"{model:5s}"
            for r in runners:
                if result.get(r):
                    line += f" | {r} {result[r]['median_ms']:.1f} ms"
            print(line, flush=True)

    def ratio(result: dict, a: str, b: str) -> str:
        return (
            f"{result[a]['median_ms'] / result[b]['median_ms']:.2f}"
            if result.get(a) and result.get(b)
            else "-"
        )

    lines = [
        "# StatisticsSubscriber overhead: step time with and without it, eager and GraphModule",
        "",
        f"Machine: {describe()}",
        "",
        f"One step = forward, backward and AdamW; median of {iters} steps after 3 warm-up steps, one thread, "
        f"each runner in its own process, {args.rounds} rounds of all runners in turn (the median "
        "of the rounds). '+ stats': a StatisticsSubscriber on every module dumps every step "
        "(statistics of each module's outputs in forward and of their gradients in backward: text files and "
        "the binary sidecar; with text=False the binary sidecar only, `graphtrain-stats text` renders the "
        "text files later). torch.compile runs without subscribers, as the reference. The cost per dumped "
        "tensor (42 per GPT step): its statistics, its records (and one text file); "
        f"dumps went to {shm or 'a temporary folder'}, and a slower file system adds to it.",
        "",
        "| model | modules | "
        + " | ".join(f"{r} ms" for r in runners)
        + "".join(f" | {r} / {r.split(' +')[0]}" for r in WITH_STATS)
        + " |",
        "|---|---|" + "---|" * (len(runners) + len(WITH_STATS)),
    ]
    for model, result in rows:
        cells = [f"{result[r]['median_ms']:.1f}" if result.get(r) else "failed" for r in runners]
        modules = next((v["modules"] for v in result.values() if v), "-")
        ratios = " | ".join(ratio(result, r, r.split(" +")[0]) for r in WITH_STATS)
        lines.append(f"| {model} | {modules} | " + " | ".join(cells) + f" | {ratios} |")
    lines += ["", describe_models(MODELS), ""]
    write_results("statistics_overhead.md", lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())

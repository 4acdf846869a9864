"""ZeRO stage 3 (graphtrain.distributed.zero3, and DeepSpeed's) against DistributedDataParallel:
per-rank memory (peak RSS, and the bytes of parameters, gradients and optimizer state) and step
time, at world sizes 1, 2 and 4, in eager PyTorch and inside GraphModule, on a GPT-style model of
~48M parameters.
Ranks are processes over gloo on loopback, one thread each.

    .venv/bin/python bench/bench_zero3.py [--quick]

Prints ratios and writes bench/results/zero3.md. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "python" / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

from machine import describe, rss_kib  # noqa: E402
from ranks import run_ranks  # noqa: E402

SIZES = {"vocab": 8192, "dim": 512, "heads": 8, "layers": 14, "max_len": 128}
QUICK = {"vocab": 2048, "dim": 256, "heads": 4, "layers": 4, "max_len": 128}
GLOBAL_BATCH, SEQ = 4, 64
# zero3: unit=Block (each transformer block one unit, as FSDP users wrap them); "per module":
# zero3's default, every module owning parameters one unit (more, smaller collectives).
# DeepSpeed: its stage 3 with its defaults (parameters under 100000 elements stay whole), eager
# and inside GraphModule (ZeROOffloadSubscriber).
RUNNERS = [
    "DDP",
    "zero3",
    "zero3 per module",
    "DeepSpeed",
    "DDP + GraphModule",
    "zero3 + GraphModule",
    "DeepSpeed + GraphModule",
]


def _size(tensors) -> int:  # noqa: ANN001
    return sum(t.numel() * t.element_size() for t in tensors)


def _optimizer_state(opt) -> list:  # noqa: ANN001
    return [v for s in opt.state.values() for v in s.values() if hasattr(v, "numel")]


def _state_bytes(model, opt) -> dict[str, int]:  # noqa: ANN001
    params = list(model.parameters())
    grads = [p.grad for p in params if p.grad is not None]
    return {
        "parameters": _size(params),
        "gradients": _size(grads),
        "optimizer": _size(_optimizer_state(opt)),
    }


def _deepspeed_state_bytes(model, engine) -> dict[str, int]:  # noqa: ANN001
    """What DeepSpeed's stage 3 holds on this rank: parameter partitions (and the parameters it
    keeps whole), its fp32 master partitions and AdamW state, and its gradient partitions."""
    params = list(model.parameters())
    zero = engine.optimizer
    inner = zero.optimizer
    masters = [p for g in inner.param_groups for p in g["params"]]
    grads = [p.grad for p in masters if p.grad is not None]
    flat = getattr(zero, "grad_partitions_flat_buffer", None)
    return {
        "parameters": _size(p.ds_tensor for p in params) + _size(p for p in params if p.numel()),
        "gradients": _size(grads) + (_size([flat]) if flat is not None else 0),
        "optimizer": _size(masters) + _size(_optimizer_state(inner)),
    }


def _deepspeed(net, per_rank: int):  # noqa: ANN001, ANN202
    import logging

    import deepspeed
    import torch
    from deepspeed.utils import logger

    logger.setLevel(logging.WARNING)
    config = {
        "train_micro_batch_size_per_gpu": per_rank,
        "gradient_clipping": 0.0,
        "zero_optimization": {"stage": 3},
        "zero_allow_untested_optimizer": True,
    }
    opt = torch.optim.AdamW(net.parameters(), lr=1e-4)
    engine, *_ = deepspeed.initialize(model=net, optimizer=opt, config=config)
    return engine


def rank_main(rank: int, world: int, runner: str, sizes: dict, steps: int) -> dict:
    import torch
    import torch.distributed as dist

    import graphtrain
    from graphtrain.distributed import zero3
    from models import GPT, Block

    torch.manual_seed(0)
    model = GPT(**sizes).train()
    full = sum(p.numel() for p in model.parameters())
    if runner.startswith("zero3"):
        zero3(model, unit=None if "per module" in runner else Block)
    net = graphtrain.GraphModule(model) if runner.endswith("GraphModule") else model
    per_rank = GLOBAL_BATCH // world
    engine = None
    if runner.startswith("DDP"):
        net = torch.nn.parallel.DistributedDataParallel(net)
    if runner.startswith("DeepSpeed"):
        engine = _deepspeed(net, per_rank)
    else:
        opt = torch.optim.AdamW(net.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(rank)
    times = []
    for step in range(steps + 1):  # the first step (capture, first gathers) is not timed
        ids = torch.randint(0, sizes["vocab"], (per_rank, SEQ), generator=g)
        dist.barrier()
        t0 = time.perf_counter()
        if engine is not None:
            loss = engine(ids, ids)
            engine.backward(loss)
            engine.step()
        else:
            opt.zero_grad()
            net(ids, ids).backward()
            opt.step()
        if step:
            times.append(time.perf_counter() - t0)
    return {
        "ms": 1e3 * statistics.median(times),
        "peak_rss_mib": rss_kib("VmHWM") / 1024,
        "full_parameters": full,
        **(_deepspeed_state_bytes(model, engine) if engine else _state_bytes(model, opt)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a small model, for a smoke run")
    args = parser.parse_args()
    sizes = QUICK if args.quick else SIZES
    steps = 2 if args.quick else 3
    rows = []
    for world in (1, 2, 4):
        for runner in RUNNERS:
            results = run_ranks(
                world, rank_main, runner, sizes, steps, timeout=1800, env={"DS_ACCELERATOR": "cpu"}
            )
            r0 = results[0]
            state = r0["parameters"] + r0["gradients"] + r0["optimizer"]
            row = {
                "world": world,
                "runner": runner,
                "ms": max(r["ms"] for r in results),
                "rss": max(r["peak_rss_mib"] for r in results),
                "state_mib": state / 2**20,
                "full_state_mib": 16 * r0["full_parameters"] / 2**20,  # p, g, exp_avg, exp_avg_sq
            }
            rows.append(row)
            print(
                f"world {world} | {runner:20s} | step {row['ms']:8.1f} ms | peak RSS "
                f"{row['rss']:7.1f} MiB | model state {row['state_mib']:7.1f} MiB "
                f"({row['state_mib'] / row['full_state_mib']:.3f} of full)",
                flush=True,
            )
    write(rows, sizes, args.quick)


def write(rows: list[dict], sizes: dict, quick: bool) -> None:
    by = {(r["world"], r["runner"]): r for r in rows}
    lines = [
        "# ZeRO stage 3 against DDP: per-rank memory and step time",
        "",
        f"Machine: {describe()}",
        "",
        f"Model: GPT test model {sizes} ({rows[0]['full_state_mib'] / 16:.1f} MiB of float32 "
        f"parameters), global batch {GLOBAL_BATCH} x {SEQ} tokens split over the ranks; AdamW. "
        "Ranks are processes over gloo on loopback, one thread each, on this machine's cores (4 "
        "ranks share 2 cores). Step: forward, backward, optimizer step; the median of "
        f"{2 if quick else 3} steps after one untimed step, the slowest rank. Model state: "
        "parameters, gradients and AdamW state held by rank 0 between steps (full = 16 bytes per "
        "parameter). Peak RSS: the largest rank's.",
        "",
        "| world | runner | step ms | vs DDP | peak RSS MiB | model state MiB | of full | x 1/N |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        base = "DDP + GraphModule" if r["runner"].endswith("GraphModule") else "DDP"
        ddp = by[(r["world"], base)]
        frac = r["state_mib"] / r["full_state_mib"]
        lines.append(
            f"| {r['world']} | {r['runner']} | {r['ms']:.0f} | {r['ms'] / ddp['ms']:.2f} | "
            f"{r['rss']:.0f} | {r['state_mib']:.1f} | {frac:.3f} | {frac * r['world']:.3f} |"
        )
    lines += [
        "",
        "zero3: each transformer block one unit (`unit=Block`), the rest in the root's unit; per "
        "module: zero3's default unit, every module that owns parameters. DeepSpeed: its stage 3 "
        "with its defaults (parameters under 100000 elements whole on every rank), its model state "
        "as it holds it (fp32 master partitions and a flat gradient buffer included). "
        "'vs DDP': step time over DDP's at the same world size (GraphModule runners against DDP "
        "around a GraphModule). 'x 1/N': the model-state fraction times the world size (1.000: "
        "exactly 1/N; the target is within 10%).",
    ]
    out = ROOT / "bench" / "results" / ("zero3_quick.md" if quick else "zero3.md")
    out.write_text("\n".join(lines) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()

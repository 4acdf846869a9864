"""Describes the machine a benchmark ran on, for bench/results/."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path


def rss_kib(field: str) -> int:
    """A memory figure of this process from /proc/self/status: VmRSS (now) or VmHWM (peak)."""
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1])
    return 0


def median_ms(run: Callable[[int], object], iters: int) -> float:
    """Median wall time of run(i) for i in range(iters), in milliseconds."""
    times = []
    for i in range(iters):
        t0 = time.perf_counter()
        run(i)
        times.append(time.perf_counter() - t0)
    times.sort()
    return 1e3 * times[len(times) // 2]


def run_worker(script: str, args: list[str], env: dict[str, str]) -> object:
    """Runs `script --worker ARGS` in a fresh process and returns the JSON of its last line."""
    out = subprocess.run(
        [sys.executable, script, "--worker", *args],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def describe() -> str:
    cpu = "unknown CPU"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    flags = ""
    try:
        text = open("/proc/cpuinfo").read()
        flags = " ".join(f for f in ("avx2", "fma", "avx512f") if f" {f}" in text)
    except OSError:
        pass
    mem = ""
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemTotal"):
                mem = f"{int(line.split()[1]) / 2**20:.0f} GiB"
    except OSError:
        pass
    import numpy
    import torch

    versions = (
        f"Python {platform.python_version()}, torch {torch.__version__}, numpy {numpy.__version__}"
    )
    try:
        import onnxruntime

        versions += f", onnxruntime {onnxruntime.__version__}"
    except ImportError:
        pass
    return f"{cpu} ({flags}), {os.cpu_count()} cores, {mem}; {platform.system()} {platform.release()}; {versions}"


def write_results(name: str, lines: list[str]) -> None:
    """Writes bench/results/<name> and says where."""
    out = Path(__file__).resolve().parent / "results" / name
    out.write_text("\n".join(lines))
    print(f"wrote {out}")

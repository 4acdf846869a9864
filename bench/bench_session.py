"""Forward (inference) speed and memory: graphtrain's Session against onnxruntime, same models,
same threads, same process kind. Each (runtime, model, threads) runs in its own process so peak
memory is measured cleanly: RSS high-water mark minus RSS after loading the libraries.

    .venv/bin/python bench/bench_session.py [--quick]

Prints a table of ratios and writes bench/results/session_forward.md. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "python" / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

from configs import CONFIGS, describe_models  # noqa: E402
from machine import median_ms, rss_kib  # noqa: E402


def worker(runtime: str, model: str, path: str, threads: int, iters: int) -> dict:
    from models import example_inputs

    cfg = CONFIGS[model]
    inputs = example_inputs(
        model,
        cfg["batch"],
        cfg["seq"],
        width=cfg["sizes"].get("d_in", 32),
        image=cfg.get("image", 16),
    )
    if runtime == "graphtrain":
        import graphtrain.engine as ge

        names = ge.Model(path).input_names
        feeds = {n: t.numpy() for n, t in zip(names, inputs)}
        base = rss_kib("VmRSS")
        sess = ge.Session(path, num_threads=threads)
        run = lambda: sess.run(feeds)  # noqa: E731
    else:
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        base = rss_kib("VmRSS")
        sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        names = [i.name for i in sess.get_inputs()]
        feeds = {n: t.numpy() for n, t in zip(names, inputs)}
        run = lambda: sess.run(None, feeds)  # noqa: E731
    for _ in range(3):
        run()
    return {
        "median_ms": median_ms(lambda i: run(), iters),
        "peak_mib": (rss_kib("VmHWM") - base) / 1024,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer iterations")
    parser.add_argument("--worker", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        runtime, model, path, threads, iters = args.worker
        print(json.dumps(worker(runtime, model, path, int(threads), int(iters))))
        return 0

    from machine import describe, write_results
    from models import export

    iters = 10 if args.quick else 50
    rows = []
    with tempfile.TemporaryDirectory() as d:
        for model, cfg in CONFIGS.items():
            path = os.path.join(d, f"{model}.onnx")
            export(
                model,
                path,
                example=dict(width=cfg["sizes"].get("d_in", 32), image=cfg.get("image", 16)),
                **cfg["sizes"],
            )
            for threads in (1, 2):
                result = {}
                for runtime in ("graphtrain", "onnxruntime"):
                    out = subprocess.run(
                        [
                            sys.executable,
                            __file__,
                            "--worker",
                            runtime,
                            model,
                            path,
                            str(threads),
                            str(iters),
                        ],
                        capture_output=True,
                        text=True,
                        check=True,
                    )
                    result[runtime] = json.loads(out.stdout.strip().splitlines()[-1])
                g, o = result["graphtrain"], result["onnxruntime"]
                rows.append(
                    (
                        model,
                        threads,
                        g["median_ms"],
                        o["median_ms"],
                        o["median_ms"] / g["median_ms"],
                        g["peak_mib"],
                        o["peak_mib"],
                    )
                )
                print(
                    f"{model:8s} threads={threads}: graphtrain {g['median_ms']:8.2f} ms  onnxruntime "
                    f"{o['median_ms']:8.2f} ms  speed ratio (ort/gt) {rows[-1][4]:5.2f}  peak MiB gt "
                    f"{g['peak_mib']:6.1f} ort {o['peak_mib']:6.1f}",
                    flush=True,
                )
    lines = [
        "# Forward pass: graphtrain Session vs onnxruntime",
        "",
        f"Machine: {describe()}",
        "",
        f"Median of {iters} runs after 3 warm-up runs; each runtime and thread count in its own process. "
        "Ratio > 1: graphtrain is faster. Peak: RSS high-water mark minus RSS before creating the session.",
        "",
        "| model | threads | graphtrain ms | onnxruntime ms | ratio ort/gt | gt peak MiB | ort peak MiB |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r[0]} | {r[1]} | {r[2]:.2f} | {r[3]:.2f} | {r[4]:.2f} | {r[5]:.1f} | {r[6]:.1f} |"
        )
    lines += ["", describe_models(), ""]
    write_results("session_forward.md", lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())

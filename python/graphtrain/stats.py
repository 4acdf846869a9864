"""graphtrain-stats: merge and compare statistics dumps of two runs (StatisticsSubscriber).

    graphtrain-stats merge   --baseline A --candidate B --output C [--overwrite]
    graphtrain-stats compare --baseline A --candidate B [--rtol R] [--atol A] [--html report.html]

Also `python -m graphtrain.stats ...`. compare exits 0 when the runs agree, 1 at a divergence,
2 on bad input.
"""

from __future__ import annotations

import argparse
import html
import math
import os
import re
import shutil
import sys
from typing import Any

from .hooks._statistics import read_sidecar

COMPARED = ("mean", "std", "min", "max", "nan", "inf", "negative", "positive", "zero", "count")


class BadInput(Exception):
    pass


def _runs(root: str) -> dict[str, str]:
    """rank label -> folder holding step_N folders ('' without ranks)."""
    if not os.path.isdir(root):
        raise BadInput(f"'{root}' is not a folder of statistics dumps")
    ranks = sorted(d for d in os.listdir(root) if re.fullmatch(r"rank_\d+", d))
    return {r: os.path.join(root, r) for r in ranks} if ranks else {"": root}


def _steps(folder: str) -> list[int]:
    return sorted(
        int(m.group(1)) for d in os.listdir(folder) if (m := re.fullmatch(r"step_(\d+)", d))
    )


def _order(step_dir: str) -> list[str]:
    path = os.path.join(step_dir, "order.txt")
    if not os.path.exists(path):
        return []
    seen: dict[str, None] = {}
    for line in open(path).read().split():
        seen.setdefault(line, None)
    return list(seen)


def _pairs(baseline: str, candidate: str) -> list[tuple[str, str, str]]:
    a, b = _runs(baseline), _runs(candidate)
    if set(a) != set(b):
        raise BadInput(f"the runs have different ranks: {sorted(a)} and {sorted(b)}")
    return [(rank, a[rank], b[rank]) for rank in sorted(a)]


def merge(baseline: str, candidate: str, output: str, overwrite: bool) -> int:
    if os.path.exists(output):
        if not overwrite:
            raise BadInput(f"output folder '{output}' exists; pass --overwrite to replace it")
        shutil.rmtree(output)
    for rank, a, b in _pairs(baseline, candidate):
        for step in _steps(a):
            sa, sb = os.path.join(a, f"step_{step}"), os.path.join(b, f"step_{step}")
            out = os.path.join(output, rank, f"step_{step}")
            os.makedirs(out)
            names = _order(sa)
            for label, src in (("baseline", sa), ("candidate", sb)):
                with open(os.path.join(out, f"{label}.txt"), "w") as f:
                    for name in names:
                        path = os.path.join(src, name)
                        f.write(f"== {name} ==\n")
                        if os.path.exists(path):
                            f.write(open(path).read())
                        else:
                            f.write(f"(missing in the {label} run)\n")
                            print(
                                f"{rank + '/' if rank else ''}step {step}: '{name}' is missing in the {label} run"
                            )
            extra = [n for n in _order(sb) if n not in names]
            for name in extra:
                print(
                    f"{rank + '/' if rank else ''}step {step}: '{name}' is only in the candidate run"
                )
    print(f"merged files written to {output}")
    return 0


def _differs(a: float, b: float, rtol: float, atol: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) != math.isnan(b)
    if math.isinf(a) or math.isinf(b):
        return a != b
    return abs(a - b) > atol + rtol * abs(a)


def _load(folder: str, step: int) -> dict[str, dict[str, Any]]:
    path = os.path.join(folder, f"step_{step}", "statistics.bin")
    return read_sidecar(path) if os.path.exists(path) else {}


def compare(baseline: str, candidate: str, rtol: float, atol: float, report: str | None) -> int:
    first: dict[str, Any] | None = None
    history: dict[str, dict[str, list[tuple[int, float, float]]]] = {}
    summary = []
    for rank, a, b in _pairs(baseline, candidate):
        steps = _steps(a)
        if not steps:
            raise BadInput(f"'{a}' holds no step_N folders")
        for step in steps:
            ra, rb = _load(a, step), _load(b, step)
            diverging = 0
            for name in _order(os.path.join(a, f"step_{step}")):
                if name not in ra:
                    continue
                if name not in rb:
                    print(
                        f"{rank + '/' if rank else ''}step {step}: '{name}' is missing in the candidate run"
                    )
                    continue
                key = f"{rank}/{name}" if rank else name
                for stat in ("mean", "std", "min", "max"):
                    history.setdefault(key, {}).setdefault(stat, []).append(
                        (step, ra[name][stat], rb[name][stat])
                    )
                bad = [s for s in COMPARED if _differs(ra[name][s], rb[name][s], rtol, atol)]
                if bad:
                    diverging += 1
                    if first is None:
                        s = bad[0]
                        first = {
                            "rank": rank,
                            "step": step,
                            "module": ra[name]["module"],
                            "tensor": name,
                            "direction": "backward" if name.endswith("_backward") else "forward",
                            "statistic": s,
                            "baseline": ra[name][s],
                            "candidate": rb[name][s],
                            "key": key,
                        }
            summary.append((rank, step, diverging, len(ra)))
    for rank, step, diverging, total in summary:
        print(f"{rank + '/' if rank else ''}step {step}: {diverging} of {total} tensors differ")
    if first is None:
        print(f"no divergence (rtol {rtol}, atol {atol})")
    else:
        rel = abs(first["baseline"] - first["candidate"]) / max(abs(first["baseline"]), 1e-30)
        where = f"{first['rank']}, " if first["rank"] else ""
        print(
            f"first divergence: {where}step {first['step']}, module '{first['module']}', tensor "
            f"{first['tensor'].rsplit('_', 1)[0]}, {first['direction']}, {first['statistic']}: baseline "
            f"{first['baseline']:.9g}, candidate {first['candidate']:.9g} (relative difference {rel:.3g})"
        )
    if report:
        _html(report, history, first, baseline, candidate, rtol, atol)
        print(f"report written to {report}")
    return 0 if first is None else 1


def _svg(points: list[tuple[int, float, float]], highlight: int | None) -> str:
    w, h, pad = 220, 90, 6
    values = [v for _, x, y in points for v in (x, y) if math.isfinite(v)]
    if not values:
        return "<svg width='220' height='90'></svg>"
    lo, hi = min(values), max(values)
    span = hi - lo or 1.0
    steps = [s for s, _, _ in points]
    s0, s1 = min(steps), max(steps)
    sx = lambda s: pad + (w - 2 * pad) * ((s - s0) / (s1 - s0) if s1 > s0 else 0.5)  # noqa: E731
    sy = lambda v: h - pad - (h - 2 * pad) * ((v - lo) / span)  # noqa: E731

    def line(idx: int, color: str, dash: str) -> str:
        pts = " ".join(f"{sx(p[0]):.1f},{sy(p[idx]):.1f}" for p in points if math.isfinite(p[idx]))
        return f"<polyline fill='none' stroke='{color}' stroke-width='2' {dash} points='{pts}'/>"

    mark = ""
    if highlight is not None:
        mark = f"<line x1='{sx(highlight):.1f}' x2='{sx(highlight):.1f}' y1='0' y2='{h}' stroke='#d62728'/>"
    dashed = "stroke-dasharray='4 3'"
    return (
        f"<svg width='{w}' height='{h}' style='background:#fafafa'>{mark}{line(1, '#1f77b4', '')}"
        f"{line(2, '#ff7f0e', dashed)}</svg>"
    )


def _html(
    path: str,
    history: dict,
    first: dict | None,
    baseline: str,
    candidate: str,
    rtol: float,
    atol: float,
) -> None:
    rows = []
    for key, stats in history.items():
        is_first = first is not None and key == first["key"]
        style = " style='outline:3px solid #d62728'" if is_first else ""
        anchor = " id='first'" if is_first else ""
        cells = "".join(
            f"<td>{stat}<br>{_svg(points, first['step'] if is_first else None)}</td>"
            for stat, points in stats.items()
        )
        rows.append(f"<tr{style}{anchor}><th>{html.escape(key)}</th>{cells}</tr>")
    headline = (
        "No divergence."
        if first is None
        else (
            f"<a href='#first'>First divergence</a>: step {first['step']}, "
            f"module <b>{html.escape(first['module'])}</b>, "
            f"{html.escape(first['tensor'])}, {first['statistic']}: baseline {first['baseline']:.9g}, candidate "
            f"{first['candidate']:.9g}."
        )
    )
    doc = f"""<!doctype html><html><head><meta charset='utf-8'><title>graphtrain-stats compare</title>
<style>body{{font-family:sans-serif;margin:20px}} td,th{{padding:4px;vertical-align:top;font-size:12px}}
th{{text-align:left;max-width:260px;word-break:break-all}}</style></head><body>
<h2>graphtrain-stats compare</h2><p>baseline <code>{html.escape(baseline)}</code> (blue, solid) vs candidate
<code>{html.escape(candidate)}</code> (orange, dashed); rtol {rtol}, atol {atol}.</p><p>{headline}</p>
<table>{"".join(rows)}</table></body></html>"""
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(doc)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="graphtrain-stats",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    m = sub.add_parser("merge", help="per-step merged files of both runs, in the baseline's order")
    m.add_argument("--baseline", "--pt_dir", required=True)
    m.add_argument("--candidate", "--ort_dir", required=True)
    m.add_argument("--output", "--output_dir", required=True)
    m.add_argument("--overwrite", action="store_true")
    c = sub.add_parser("compare", help="find the first divergence between two runs")
    c.add_argument("--baseline", "--pt_dir", required=True)
    c.add_argument("--candidate", "--ort_dir", required=True)
    c.add_argument("--rtol", type=float, default=1e-4)
    c.add_argument("--atol", type=float, default=1e-6)
    c.add_argument("--html", help="write a self-contained HTML report here")
    args = parser.parse_args(argv)
    try:
        if args.command == "merge":
            return merge(args.baseline, args.candidate, args.output, args.overwrite)
        return compare(args.baseline, args.candidate, args.rtol, args.atol, args.html)
    except (BadInput, OSError) as e:
        print(f"graphtrain-stats: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

"""graphtrain-stats: merge, compare and render statistics dumps (StatisticsSubscriber).

    graphtrain-stats compare --baseline A --candidate B [--html report.html]
                             [--tolerance 1e-4] [--cosine-tolerance 1e-6] [--count-tolerance 1e-4]
                             [--floor 1e-4]
    graphtrain-stats merge   --baseline A --candidate B --output C [--overwrite]
    graphtrain-stats text    DIR
    graphtrain-stats bisect  [--steps N] [--max-runs R] [--out DIR] -- COMMAND ...

Also `python -m graphtrain.stats ...`. compare exits 0 when the runs agree, 1 at a divergence,
2 on bad input; bisect 0 (no divergence), 1 (cause named), 3 (not isolated), 2 (bad
input). The tolerance model: graphtrain/_divergence.py; bisect: graphtrain/_bisect.py.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
from typing import Any

from . import _bisect, _report
from ._divergence import Tolerance, direction, judge
from .hooks._statistics import read_sidecar, render_text


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
            for label, src, run in (("baseline", sa, a), ("candidate", sb, b)):
                records = _load(run, step)
                with open(os.path.join(out, f"{label}.txt"), "w") as f:
                    for name in names:
                        path = os.path.join(src, name)
                        f.write(f"== {name} ==\n")
                        if os.path.exists(path):
                            f.write(open(path).read())
                        elif records.get(name, {}).get("dtype"):  # dumped with text=False
                            f.write(render_text(records[name], name))
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


def _load(folder: str, step: int) -> dict[str, dict[str, Any]]:
    path = os.path.join(folder, f"step_{step}", "statistics.bin")
    return read_sidecar(path) if os.path.exists(path) else {}


def _label(name: str) -> str:
    """The tensor's name without its direction suffix."""
    return name.rsplit("_", 1)[0]


def text(folder: str) -> int:
    """Writes the text file of every record of every statistics.bin under `folder`, as
    StatisticsSubscriber(text=True) would have (each file atomically)."""
    written = 0
    for run in _runs(folder).values():
        steps = _steps(run)
        if not steps:
            raise BadInput(f"'{run}' holds no step_N folders")
        for step in steps:
            step_dir = os.path.join(run, f"step_{step}")
            records = _load(run, step)
            for name, record in records.items():
                try:
                    content = render_text(record, name)
                except ValueError as e:
                    raise BadInput(f"{os.path.join(step_dir, 'statistics.bin')}: {e}") from None
                path = os.path.join(step_dir, name)
                with open(path + ".tmp", "w") as f:
                    f.write(content)
                os.replace(path + ".tmp", path)
                written += 1
    print(f"{written} text files written under {folder}")
    return 0


def _analyse(baseline: str, candidate: str, tol: Tolerance, say: Any = print) -> dict[str, Any]:
    """Scores every tensor of every step: the report's rows, the steps, the first divergence
    (None when there is none), the largest jump and a summary line per step."""
    first: dict[str, Any] | None = None
    jump: tuple[float, dict[str, Any]] | None = None
    rows: dict[str, dict[str, Any]] = {}  # key -> report row, in dump order
    all_steps: list[int] = []
    summary = []
    for rank, a, b in _pairs(baseline, candidate):
        steps = _steps(a)
        if not steps:
            raise BadInput(f"'{a}' holds no step_N folders")
        all_steps = sorted(set(all_steps) | set(steps))
        for step in steps:
            ra, rb = _load(a, step), _load(b, step)
            where = f"{rank + '/' if rank else ''}step {step}"
            diverging, largest = 0, 0.0
            # direction -> the verdict of the last tensor (not a scalar) of that direction
            previous: dict[str, Any] = {}
            names = [n for n in _order(os.path.join(a, f"step_{step}")) if n in ra]
            for name in names:
                if name not in rb:
                    say(f"{where}: '{name}' is missing in the candidate run")
            for name, verdict in judge([n for n in names if n in rb], ra, rb, tol):
                key = f"{rank}/{name}" if rank else name
                row = rows.setdefault(
                    key,
                    {
                        "tensor": key,
                        "module": ra[name]["module"],
                        "direction": direction(name),
                        "label": _label(name),
                        "cells": {},
                    },
                )
                row["cells"][step] = (verdict, ra[name], rb[name])
                largest = max(largest, verdict.score)
                found = {
                    "rank": rank,
                    "step": step,
                    "module": ra[name]["module"],
                    "tensor": name,
                    "key": key,
                    "verdict": verdict,
                }
                if verdict.diverges:
                    diverging += 1
                    if first is None:
                        first = found
                    before = previous.get(direction(name))
                    if before is not None:
                        rise = verdict.score / max(before.score, 1e-3)
                        if jump is None or rise > jump[0]:
                            jump = (rise, {**found, "from": before.score})
                if ra[name]["count"] > 1:
                    previous[direction(name)] = verdict
            summary.append((where, diverging, len(ra), largest))
    return {"rows": rows, "steps": all_steps, "first": first, "jump": jump, "summary": summary}


def _headline(first: dict[str, Any] | None, tolerance: str) -> str:
    if first is None:
        return f"no divergence ({tolerance})"
    v = first["verdict"]
    rank = f"{first['rank']}, " if first["rank"] else ""
    return (
        f"first divergence: {rank}step {first['step']}, module '{first['module']}', tensor "
        f"{_label(first['tensor'])}, {direction(first['tensor'])}, {v.statistic}: baseline "
        f"{v.baseline:.9g}, candidate {v.candidate:.9g} (score {v.score:.3g}, 1 is the tolerance)"
    )


def compare(baseline: str, candidate: str, tol: Tolerance, report: str | None) -> int:
    found = _analyse(baseline, candidate, tol)
    first, jump = found["first"], found["jump"]
    for where, diverging, total, largest in found["summary"]:
        print(f"{where}: {diverging} of {total} tensors differ (largest score {largest:.3g})")
    tolerance = (
        f"tolerance: value {tol.value:g} of the tensor's scale, cosine {tol.cosine:g}, "
        f"counts {tol.count:g} of the elements, floor {tol.floor:g}"
    )
    headline = _headline(first, tolerance)
    print(headline)
    if jump is not None:
        j = jump[1]
        print(
            f"largest jump: step {j['step']}, module '{j['module']}', tensor {_label(j['tensor'])}, "
            f"{direction(j['tensor'])}: score {j['from']:.3g} -> {j['verdict'].score:.3g} over "
            "the tensor of its direction dumped before it"
        )
    if report:
        _report.write(
            report, found["rows"], found["steps"], first, headline, baseline, candidate, tolerance
        )
        print(f"report written to {report}")
    return 0 if first is None else 1


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
    defaults = Tolerance()
    c.add_argument(
        "--tolerance",
        type=float,
        default=defaults.value,
        help="differences of mean, std, min, max and sampled values, relative to the tensor's "
        "scale (RMS or max-abs)",
    )
    c.add_argument(
        "--cosine-tolerance",
        type=float,
        default=defaults.cosine,
        help="1 - cosine similarity of the sampled values",
    )
    c.add_argument(
        "--count-tolerance",
        type=float,
        default=defaults.count,
        help="sign and zero count differences, as a fraction of the elements (at least one)",
    )
    c.add_argument(
        "--floor",
        type=float,
        default=defaults.floor,
        help="least scale of a tensor, relative to the largest RMS of the step's tensors of its "
        "direction (below it: rounding residue)",
    )
    c.add_argument("--html", help="write a self-contained HTML report here")
    t = sub.add_parser("text", help="render the text files of dumps written with text=False")
    t.add_argument("folder")
    b = sub.add_parser(
        "bisect",
        help="run a training command as baseline and candidate and name the pass or module "
        "that makes them diverge",
        description=_bisect.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    b.add_argument("--steps", type=int, default=5, help="steps dumped per run (default 5)")
    b.add_argument("--max-runs", type=int, default=24, help="most runs of the command")
    b.add_argument("--out", default="bisect_out", help="a new folder for every run's output")
    b.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- COMMAND ...")
    args = parser.parse_args(argv)
    try:
        if args.command == "merge":
            return merge(args.baseline, args.candidate, args.output, args.overwrite)
        if args.command == "text":
            return text(args.folder)
        if args.command == "bisect":
            cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
            return _bisect.main(cmd, args.steps, args.max_runs, args.out, Tolerance())
        tol = Tolerance(args.tolerance, args.cosine_tolerance, args.count_tolerance, args.floor)
        return compare(args.baseline, args.candidate, tol, args.html)
    except (BadInput, OSError) as e:
        print(f"graphtrain-stats: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

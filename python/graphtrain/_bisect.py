"""graphtrain-stats bisect: runs a training command (whose model is wrapped in GraphModule) as a
baseline (GRAPHTRAIN_DISABLE=1) and as a candidate, with statistics dumps
(GRAPHTRAIN_STATS_DIR / _STEPS), compares them, and on a divergence finds its cause:

1. the candidate with the compute optimizer off (GRAPHTRAIN_ENABLE_COMPUTE_OPTIMIZER=0);
2. if that agrees, bisects the passes (GRAPHTRAIN_DISABLE_PASSES) and names the pass;
3. if not, bisects the module tree top-down with eager islands (GRAPHTRAIN_EAGER_MODULES), halving
   the children of each module, and names the smallest module whose graph execution causes it,
   with the ops of that module in the candidate's graphs.

Every run's output and dumps stay under --out. Exit codes: 0 no divergence, 1 cause named,
3 divergence not isolated (with why), 2 bad input.
"""

from __future__ import annotations

import collections
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

from ._divergence import Tolerance

# A module output's forward dump: {Class}_{pre-order index}_{k}th_output_forward.
_FORWARD = re.compile(r"_(\d+)_\d+th_output_forward$")


# The options bisect sets per run; the user's other GRAPHTRAIN_ settings pass through.
CONTROLLED = {
    f"GRAPHTRAIN_{name}"
    for name in (
        "DISABLE",
        "STATS_DIR",
        "STATS_STEPS",
        "SAVE_ONNX_PATH",
        "ENABLE_COMPUTE_OPTIMIZER",
        "DISABLE_PASSES",
        "EAGER_MODULES",
    )
}


class BadCommand(Exception):
    pass


@dataclass
class Run:
    label: str
    code: int
    folder: str

    @property
    def dumps(self) -> str:
        return os.path.join(self.folder, "dumps")

    @property
    def output(self) -> str:
        return os.path.join(self.folder, "output.txt")

    def last_line(self) -> str:
        lines = [x for x in open(self.output).read().splitlines() if x.strip()]
        return lines[-1] if lines else "(no output)"


class Bisector:
    def __init__(
        self, command: list[str], steps: int, max_runs: int, out: str, tol: Tolerance
    ) -> None:
        self.command = command
        self.steps = steps
        self.max_runs = max_runs
        self.out = out
        self.tol = tol
        self.runs = 0
        self.known: dict[tuple[str, ...], bool] = {}  # islands -> whether the runs agreed

    def run(self, label: str, **env: str) -> Run:
        """One run of the command with the options in `env`, in its own folder under --out."""
        self.runs += 1
        folder = os.path.join(self.out, f"{self.runs:02d}-{label}")
        os.makedirs(folder)
        base = {k: v for k, v in os.environ.items() if k not in CONTROLLED}
        base.update(
            GRAPHTRAIN_STATS_DIR=os.path.join(folder, "dumps"),
            GRAPHTRAIN_STATS_STEPS=str(self.steps),
            GRAPHTRAIN_SAVE_ONNX_PATH=os.path.join(folder, "graphs"),
            **{f"GRAPHTRAIN_{k.upper()}": v for k, v in env.items()},
        )
        with open(os.path.join(folder, "output.txt"), "w") as f:
            code = subprocess.run(
                self.command, env=base, stdout=f, stderr=subprocess.STDOUT
            ).returncode
        return Run(label, code, folder)

    def first(self, baseline: Run, other: Run) -> dict[str, Any] | None:
        from .stats import _analyse

        return _analyse(baseline.dumps, other.dumps, self.tol, say=lambda _: None)["first"]

    def progress(self, what: str, run: Run, first: dict[str, Any] | None) -> None:
        if run.code != 0:
            verdict = f"failed (exit {run.code}): {run.last_line()}"
        elif first is None:
            verdict = "agrees with the baseline"
        else:
            verdict = (
                f"diverges at step {first['step']}, module '{first['module']}' "
                f"(score {first['verdict'].score:.3g})"
            )
        print(f"run {self.runs}: {what}: {verdict}", flush=True)

    def agrees(self, what: str, label: str, **env: str) -> bool:
        """Runs the candidate with `env` (one progress line); whether it agrees with the
        baseline."""
        if self.runs >= self.max_runs:
            raise Unresolved(f"--max-runs {self.max_runs} reached while {what}")
        run = self.run(label, **env)
        first = self.first(self.baseline, run) if run.code == 0 else None
        self.progress(what, run, first)
        if run.code != 0:
            raise Unresolved(f"the run {what} failed (exit {run.code}): {run.last_line()}")
        return first is None

    def bisect(self) -> int:
        self.baseline = self.run("baseline", disable="1")
        if self.baseline.code != 0:
            raise BadCommand(
                f"the command fails in the baseline run (exit {self.baseline.code}): "
                f"{self.baseline.last_line()} (output: {self.baseline.output})"
            )
        if not os.path.isdir(self.baseline.dumps):
            raise BadCommand(
                "the command wraps no GraphModule: its baseline run wrote no statistics "
                "(bisect sets GRAPHTRAIN_STATS_DIR, which every GraphModule reads)"
            )
        if not any(d.startswith(("step_", "rank_")) for d in os.listdir(self.baseline.dumps)):
            raise BadCommand(
                "the command writes no dumps: its GraphModule ran no step in the baseline run"
            )
        print(f"run 1: baseline (GRAPHTRAIN_DISABLE=1): ok, dumps in {self.baseline.dumps}")
        candidate = self.run("candidate")
        if candidate.code != 0:
            self.progress("candidate", candidate, None)
            raise Unresolved(
                f"the candidate run fails where the baseline runs (exit {candidate.code}): "
                f"{candidate.last_line()}"
            )
        first = self.first(self.baseline, candidate)
        self.progress("candidate", candidate, first)
        if first is None:
            print(f"verdict: no divergence over {self.steps} steps")
            return 0
        self.candidate = candidate
        if self.agrees(
            "candidate, compute optimizer off", "no-optimizer", enable_compute_optimizer="0"
        ):
            return self.passes()
        return self.modules()

    def passes(self) -> int:
        from . import _C

        suspects = list(_C.pass_names())
        while len(suspects) > 1:
            half = suspects[: len(suspects) // 2]
            off = self.agrees(
                f"passes off: {','.join(half)}", "passes-off", disable_passes=",".join(half)
            )
            suspects = half if off else suspects[len(suspects) // 2 :]
        name = suspects[0]
        if not self.agrees(f"pass off: {name}", "pass-off", disable_passes=name):
            raise Unresolved(
                "the runs agree with the compute optimizer off, but with no single pass off: "
                "several passes take part (GRAPHTRAIN_DISABLE_PASSES takes a list)"
            )
        print(
            f"verdict: cause: graph pass '{name}' (the runs agree with "
            f"GRAPHTRAIN_DISABLE_PASSES={name})"
        )
        return 1

    def _tree(self) -> dict[str, list[str]]:
        """module path -> its children that dumped an output, from the baseline's first step."""
        from .stats import _load, _runs, _steps

        run = next(iter(_runs(self.baseline.dumps).values()))
        paths = {
            r["module"]
            for n, r in _load(run, _steps(run)[0]).items()
            if (m := _FORWARD.search(n)) and m.group(1) != "0"  # index 0: the model itself
        }
        children: dict[str, list[str]] = collections.defaultdict(list)
        for p in sorted(paths):
            parent = max((q for q in paths if p.startswith(q + ".")), key=len, default="")
            children[parent].append(p)
        return children

    def modules(self) -> int:
        children = self._tree()
        current = ""
        while True:
            kids = children.get(current, [])
            if not kids:
                break
            if current == "":
                if not self._agrees_with(kids, "islands: every top-level module"):
                    raise Unresolved(
                        "with every top-level module as an eager island the runs still differ: "
                        "the cause is outside the submodules (the model's own ops, or data)"
                    )
            elif not self._agrees_with(kids, f"islands: the submodules of {current}"):
                break  # the module's own ops, outside its children
            suspects = kids
            while len(suspects) > 1:
                half = suspects[: len(suspects) // 2]
                if self._agrees_with(half, f"islands: {','.join(half)}"):
                    suspects = half
                else:
                    suspects = suspects[len(suspects) // 2 :]
            if not self._agrees_with(suspects, f"island: {suspects[0]}"):
                raise Unresolved(
                    f"no single submodule of '{current or 'the model'}' makes the runs agree "
                    "as an eager island: several take part"
                )
            current = suspects[0]
        ops = self._ops(current)
        print(
            f"verdict: cause: module '{current}' (the runs agree with it as an eager island, "
            f"GRAPHTRAIN_EAGER_MODULES={current}); ops in its graph: {ops}"
        )
        return 1

    def _agrees_with(self, islands: list[str], what: str) -> bool:
        key = tuple(sorted(islands))
        if key not in self.known:
            self.known[key] = self.agrees(what, "islands", eager_modules=",".join(islands))
        return self.known[key]

    def _ops(self, module: str) -> str:
        """The op types of the candidate's graphs whose scope is `module` or inside it."""
        import onnx

        counts: collections.Counter[str] = collections.Counter()
        folder = os.path.join(self.candidate.folder, "graphs")
        for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
            if "training" not in name:
                continue
            for node in onnx.load(os.path.join(folder, name)).graph.node:
                scope = next(
                    (p.value for p in node.metadata_props if p.key == "graphtrain.scope"), ""
                )
                inside = scope == module or scope.startswith(module + ".")
                if inside and node.op_type not in ("Hook", "HookGrad"):  # bisect's own dumps
                    counts[node.op_type] += 1
        return ", ".join(f"{op} x{n}" for op, n in counts.most_common()) or "(none recorded)"


class Unresolved(Exception):
    pass


def main(command: list[str], steps: int, max_runs: int, out: str, tol: Tolerance) -> int:
    if not command:
        print("graphtrain-stats bisect: error: no command after --", file=sys.stderr)
        return 2
    if os.path.exists(out) and os.listdir(out):
        print(
            f"graphtrain-stats bisect: error: --out folder '{out}' is not empty; choose a new one",
            file=sys.stderr,
        )
        return 2
    os.makedirs(out, exist_ok=True)
    b = Bisector(command, steps, max_runs, out, tol)
    try:
        return b.bisect()
    except BadCommand as e:
        print(f"verdict: bad input: {e}")
        return 2
    except Unresolved as e:
        print(f"verdict: divergence not isolated: {e}")
        return 3

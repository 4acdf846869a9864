"""graphtrain.explain: how a model's graph would run, op by op, without training it."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils import _pytree as pytree

from ._capture import capture, export_reason
from .errors import UnsupportedModelError

NATIVE, FALLBACK, PYTHON_OP, HOOK = "native", "ATen fallback", "PythonOp", "hook"


@dataclass
class OpReport:
    """One ATen op of the captured graph: how it runs, how often, and in which modules."""

    op: str
    runs_as: str
    count: int
    modules: list[str]


@dataclass
class Explanation:
    """What `explain` found. `str()` gives a readable report."""

    model: str
    captured: bool
    reason: str = ""  # why the model cannot be captured, when it cannot
    ops: list[OpReport] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        """Op calls by how they run: {"native": 120, "ATen fallback": 2, ...}."""
        total: Counter[str] = Counter()
        for r in self.ops:
            total[r.runs_as] += r.count
        return dict(total)

    @property
    def fallback_ops(self) -> list[str]:
        """The ATen ops that run through PyTorch's kernels inside the graph."""
        return [r.op for r in self.ops if r.runs_as == FALLBACK]

    def __str__(self) -> str:
        if not self.captured:
            return f"{self.model} cannot be captured into a graph: {self.reason}"
        counts = self.counts()
        summary = ", ".join(
            f"{counts[k]} {k}" for k in (NATIVE, FALLBACK, PYTHON_OP, HOOK) if k in counts
        )
        lines = [f"{self.model}: {sum(counts.values())} op calls ({summary})"]
        order = {FALLBACK: 0, PYTHON_OP: 1, HOOK: 2, NATIVE: 3}
        rows = sorted(self.ops, key=lambda r: (order.get(r.runs_as, 4), -r.count, r.op))
        width = max([len(r.op) for r in rows] + [2])
        lines.append(f"  {'op':<{width}}  {'runs as':<13}  {'count':>5}  modules")
        for r in rows:
            shown = ", ".join(m or "(top level)" for m in r.modules[:3])
            more = f", +{len(r.modules) - 3} more" if len(r.modules) > 3 else ""
            lines.append(f"  {r.op:<{width}}  {r.runs_as:<13}  {r.count:>5}  {shown}{more}")
        if self.fallback_ops:
            lines.append(
                "ATen fallback ops run PyTorch's own kernel inside the graph (correct, but each call "
                "crosses into Python); GRAPHTRAIN_FALLBACK_POLICY=off makes them an error."
            )
        return "\n".join(lines)


def explain(model: torch.nn.Module, *args: Any, **kwargs: Any) -> Explanation:
    """Captures `model` on these arguments, as GraphModule would, without training it, and
    reports per ATen op whether it runs natively in graphtrain's engine, through the ATen
    fallback (PyTorch's kernel inside the graph) or as a PythonOp. A model that cannot be
    captured gets torch.export's reason instead."""
    from .graph_module import CAPTURE_CONTEXTS, GraphModule

    module = model.module if isinstance(model, GraphModule) else model
    name = type(module).__name__
    flat, spec = pytree.tree_flatten((args, kwargs))
    try:
        captured = capture(module, flat, spec, f"{name}_explain", contexts=CAPTURE_CONTEXTS)
    except UnsupportedModelError as e:
        cause = e.__cause__
        reason = export_reason(cause) if isinstance(cause, Exception) else str(e)
        return Explanation(model=name, captured=False, reason=reason)
    grouped: dict[tuple[str, str], OpReport] = {}
    for op, module_path, how in captured.routes:
        report = grouped.setdefault((op, how), OpReport(op, how, 0, []))
        report.count += 1
        if module_path not in report.modules:
            report.modules.append(module_path)
    return Explanation(model=name, captured=True, ops=list(grouped.values()))

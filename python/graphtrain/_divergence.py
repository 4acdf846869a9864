"""The tolerance model of `graphtrain-stats compare`: one divergence score per dumped tensor.

float32 runs that compute the same thing in a different order (another thread count, fused
kernels, another GEMM blocking) differ by rounding, and rounding is relative to the size of the
values a tensor holds, not to the size of one statistic: a mean of 1e-9 over values of size 1 is
zero up to noise. So every float difference is measured against the tensor's own scale:

- mean and std: |difference| over the larger RMS of the two runs;
- min, max and the sampled values (element by element, the same positions in both runs):
  |difference| over the larger max-abs of the two runs;
- the direction of the sampled values: 1 - their cosine similarity;
- negative, positive and zero counts: values within the value tolerance of zero may change sign or
  become 0.0 by rounding (a bias gradient that is zero in exact arithmetic is noise of either
  sign), so a difference of 1 + elements * (count_tolerance + the fraction of such values in the
  sample) elements is allowed;
- NaN and inf: a run that has them where the other has none diverges, whatever the counts; element
  counts (shapes) must be equal.

A tensor can be rounding residue as a whole: the gradient of an attention key bias is zero in
exact arithmetic and 1e-13 to 1e-11 in float32 (BERT, ViT), next to gradients of 1e-1, and its
two runs are unrelated noise. So the scale has a floor: `floor` (1e-4) times the largest RMS among
the step's tensors of the same direction (forward outputs, their gradients, parameter gradients;
single values such as the loss left out).

Each part is divided by its tolerance and the score is the largest: a score above 1 is a
divergence, and the part that gave it is named, unless the difference is absorbed: a module's
forward output that differs while the output of the nearest enclosing module does not changed
nothing downstream. That is how parity runs differ in attention: the key projection's bias has a
gradient that is zero in exact arithmetic (softmax ignores a shift along its axis), so AdamW
turns rounding noise into steps of +-lr on it, and the qkv output drifts apart over the steps
while the attention output agrees to 1e-7. Defaults (value 1e-4, cosine 1e-6, count 1e-4, floor 1e-4):
eager against GraphModule and eager at 1 against 2 threads stay below 1 over 20 AdamW steps of the
test models (python/tests/test_convergence.py), while a relative change of 1e-3 in one module's
output or gradient scores about 10 at that module.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Tolerance:
    value: float = 1e-4  # float statistics and sampled values, relative to the tensor's scale
    cosine: float = 1e-6  # 1 - cosine similarity of the sampled values
    count: float = 1e-4  # sign and zero counts, as a fraction of the elements (at least one)
    floor: float = 1e-4  # least scale, relative to the step's largest tensor of the direction


@dataclass(frozen=True)
class Verdict:
    score: float  # the largest part over its tolerance; > 1 is a divergence
    statistic: str  # the part that gave the score
    baseline: float  # its value in each run
    candidate: float
    absorbed: bool = False  # above 1, but the enclosing module's output agrees

    @property
    def diverges(self) -> bool:
        return self.score > 1.0 and not self.absorbed


def _rms(r: dict[str, Any]) -> float:
    n, mean, std = r["finite"], r["mean"], r["std"]
    if n < 1 or math.isnan(mean):
        return 0.0
    var = std * std * (n - 1) / n if n > 1 and math.isfinite(std) else 0.0
    return math.sqrt(mean * mean + var)


def _max_abs(r: dict[str, Any]) -> float:
    if r["finite"] < 1:
        return 0.0
    return max(abs(r["min"]), abs(r["max"]))


def _ratio(diff: float, scale: float) -> float:
    if diff == 0.0:
        return 0.0
    return diff / scale if scale > 0 else math.inf


def direction(name: str) -> str:
    """forward, backward or parameter gradient, from a dumped tensor's name."""
    if name.endswith("_gradient"):
        return "parameter gradient"
    return "backward" if name.endswith("_backward") else "forward"


def score(
    a: dict[str, Any], b: dict[str, Any], tol: Tolerance = Tolerance(), floor: float = 0.0
) -> Verdict:
    """The divergence score of one tensor, from its statistics.bin records in two runs; `floor`
    is the least scale its differences are measured against."""
    if a["count"] != b["count"]:
        return Verdict(math.inf, "elements", a["count"], b["count"])
    for stat in ("nan", "inf"):
        if (a[stat] > 0) != (b[stat] > 0):
            return Verdict(math.inf, stat, a[stat], b[stat])
    parts: list[tuple[float, str, float, float]] = []
    own = max(_rms(a), _rms(b))
    rms = max(own, floor)
    extent = max(_max_abs(a), _max_abs(b), floor)
    if a["finite"] > 0 and b["finite"] > 0:
        for stat, scale in (("mean", rms), ("std", rms), ("min", extent), ("max", extent)):
            x, y = a[stat], b[stat]
            if math.isfinite(x) and math.isfinite(y):
                parts.append((_ratio(abs(x - y), scale) / tol.value, stat, x, y))
    elif a["finite"] != b["finite"]:
        return Verdict(math.inf, "finite", a["finite"], b["finite"])
    sa, sb = a.get("sample") or [], b.get("sample") or []
    near_zero = 0.0
    if sa and len(sa) == len(sb):
        small = tol.value * extent
        near_zero = sum(abs(x) <= small or abs(y) <= small for x, y in zip(sa, sb)) / len(sa)
        pairs = [(x, y) for x, y in zip(sa, sb) if math.isfinite(x) and math.isfinite(y)]
        if pairs:
            k, (x, y) = max(enumerate(pairs), key=lambda p: abs(p[1][0] - p[1][1]))
            parts.append((_ratio(abs(x - y), extent) / tol.value, f"sample[{k}]", x, y))
            dot = sum(x * y for x, y in pairs)
            na = math.sqrt(sum(x * x for x, _ in pairs))
            nb = math.sqrt(sum(y * y for _, y in pairs))
            if na > 0 and nb > 0:
                cos = min(1.0, dot / (na * nb))
                # 1 - cos is the squared angle over 2: against the floored scale, (own / rms)^2
                parts.append(((1.0 - cos) * (own / rms) ** 2 / tol.cosine, "cosine", 1.0, cos))
            elif na != nb:
                parts.append((math.inf, "cosine", na, nb))
    allowed = 1.0 + a["count"] * (tol.count + near_zero)
    for stat in ("negative", "positive", "zero", "nan", "inf"):
        parts.append((abs(a[stat] - b[stat]) / allowed, stat, a[stat], b[stat]))
    if not parts:
        return Verdict(0.0, "", 0.0, 0.0)
    worst = max(parts, key=lambda p: p[0])
    return Verdict(*worst)


# A module output's forward dump: {Class}_{pre-order index}_{k}th_output_forward (index 0: the root).
_FORWARD = re.compile(r"_(\d+)_\d+th_output_forward$")


def _encloses(name: str, path: str, inner: str) -> bool:
    """Whether the module that dumped `name` (at `path`) encloses the module at `inner`."""
    m = _FORWARD.search(name)
    return m is not None and (m.group(1) == "0" or inner.startswith(path + "."))


def judge(
    names: list[str],
    a: dict[str, dict[str, Any]],
    b: dict[str, dict[str, Any]],
    tol: Tolerance = Tolerance(),
) -> list[tuple[str, Verdict]]:
    """The verdicts of one step's tensors (in dump order, present in both runs), with forward
    differences that the enclosing module's output does not show marked absorbed."""
    floors: dict[str, float] = {}
    for n in names:
        if a[n]["count"] > 1:
            d = direction(n)
            floors[d] = max(floors.get(d, 0.0), _rms(a[n]) * tol.floor)
    verdicts = [(n, score(a[n], b[n], tol, floors.get(direction(n), 0.0))) for n in names]
    for i, (name, v) in enumerate(verdicts):
        m = _FORWARD.search(name)
        if v.score <= 1.0 or m is None or m.group(1) == "0":
            continue
        inner = a[name]["module"]
        # Children are dumped before their parent: the first enclosing output after this one.
        for later, w in verdicts[i + 1 :]:
            if _encloses(later, a[later]["module"], inner):
                if w.score <= 1.0:
                    verdicts[i] = (name, dataclasses.replace(v, absorbed=True))
                break
    return verdicts

"""The kernel profiler's Python side.

GRAPHTRAIN_PROFILE=trace.json records every kernel graphtrain runs (op, node, module, input
shapes) and writes a Chrome trace there when the process exits; open it in ui.perfetto.dev or
chrome://tracing. `profile_summary()` prints where the time went, by op and by module.
"""

from __future__ import annotations

from . import _C


def start() -> None:
    """Starts recording kernels (as GRAPHTRAIN_PROFILE does, without naming a file)."""
    _C.profile_start()


def stop() -> None:
    _C.profile_stop()


def clear() -> None:
    """Forgets what was recorded."""
    _C.profile_clear()


def write(path: str) -> None:
    """Writes the Chrome trace of everything recorded so far to `path` (atomically)."""
    _C.profile_write(str(path))


def rows(by: str = "op") -> list[tuple[str, float, int]]:
    """Kernel time totals [(op or module, milliseconds, calls)], largest first."""
    return _C.profile_rows(by)


def profile_summary(top: int = 15, print_it: bool = True) -> str:
    """Time by op and by module over everything recorded, as two tables; printed and returned."""
    lines: list[str] = []
    ops = rows("op")
    total = sum(ms for _, ms, _ in ops)
    if not ops:
        text = (
            "graphtrain profile: nothing recorded (set GRAPHTRAIN_PROFILE=trace.json, or call "
            "graphtrain.profiler.start(), before running a GraphModule)"
        )
        if print_it:
            print(text)
        return text
    calls = sum(n for _, _, n in ops)
    lines.append(f"graphtrain profile: {total:.1f} ms in {calls} kernel runs")
    for by, title in (("op", "op"), ("module", "module")):
        table = rows(by)
        width = max(len(title), *(len(k) for k, _, _ in table[:top]))
        lines.append(f"  {title:<{width}}  {'ms':>9}  {'%':>5}  {'calls':>6}")
        for key, ms, n in table[:top]:
            lines.append(f"  {key:<{width}}  {ms:9.2f}  {100 * ms / total:5.1f}  {n:6d}")
        if len(table) > top:
            rest = sum(ms for _, ms, _ in table[top:])
            lines.append(f"  {f'({len(table) - top} more)':<{width}}  {rest:9.2f}")
    text = "\n".join(lines)
    if print_it:
        print(text)
    return text

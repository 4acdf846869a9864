"""The package's structure holds: no import cycle between graphtrain's modules, and every op a
translator emits has a kernel in the engine."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import graphtrain.engine as ge

PACKAGE = Path(__file__).resolve().parents[1] / "graphtrain"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """graphtrain modules imported at module level (imports inside functions are deferred on
    purpose and do not make a cycle at import time; TYPE_CHECKING blocks never run)."""
    tree = ast.parse(path.read_text())
    package = (
        _module_name(path) if path.name == "__init__.py" else _module_name(path).rsplit(".", 1)[0]
    )
    found: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            continue
        for sub in (
            ast.walk(node)
            if isinstance(node, (ast.Import, ast.ImportFrom, ast.If, ast.Try))
            else []
        ):
            if isinstance(sub, ast.ImportFrom) and sub.level:
                base = package.split(".")
                base = base[: len(base) - (sub.level - 1)]
                target = ".".join(base + ([sub.module] if sub.module else []))
                if sub.module:
                    found.add(target)
                else:
                    found.update(f"{target}.{a.name}" for a in sub.names)
            elif isinstance(sub, ast.ImportFrom) and (sub.module or "").startswith("graphtrain"):
                found.add(sub.module)
    return found


def test_no_import_cycle():
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = {m: {i for i in _imports(p) if i in modules and i != m} for m, p in modules.items()}
    # A package's __init__ importing its own submodules is how packages work, not a cycle.
    for m in graph:
        graph[m] = {
            i for i in graph[m] if not (modules[m].name == "__init__.py" and i.startswith(m + "."))
        }
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                cycle = stack[stack.index(n) :] + [n]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if n not in state:
                visit(n)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)
    assert len(graph) > 15  # the scan found the package


def test_every_op_a_translator_emits_has_a_kernel():
    supported = set(ge.supported_ops())
    emitted: set[str] = set()
    for path in PACKAGE.rglob("*.py"):
        for match in re.finditer(r'\.emit\(\s*"([A-Z][A-Za-z]*)"', path.read_text()):
            emitted.add(match.group(1))
    assert len(emitted) > 40
    missing = sorted(
        op for op in emitted if op not in supported and f"graphtrain::{op}" not in supported
    )
    assert not missing, f"translators emit ops without a kernel: {missing}"


def test_capture_does_not_need_torch_distributed():
    """Capture and the ATen table stand without torch.distributed and graphtrain.distributed
    (zero3's capture side, _gather, is part of them; its run time side is not)."""
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    for name in ("graphtrain._capture", "graphtrain._aten", "graphtrain._gather"):
        imported = set()
        for node in ast.walk(ast.parse(modules[name].read_text())):
            if isinstance(node, ast.Import):
                imported.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                imported.add(node.module or "")
        assert not any(i.startswith("torch.distributed") for i in imported), name
        assert not any(i.startswith("graphtrain.distributed") for i in _imports(modules[name]))

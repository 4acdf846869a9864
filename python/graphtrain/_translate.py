"""The registry of ATen-op translators and the helpers every translator uses. Light on purpose:
modules that add translators (hooks, PythonOps, ShardGather) import this at run time too, while the
table of ATen translators (_aten, ~4 MiB of resolved torch.ops) is imported only to capture."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from ._capture import Translator

TRANSLATORS: dict[Any, Callable[[torch.fx.Node, Translator], Any]] = {}


def register_translator(target: Any, fn: Callable[[torch.fx.Node, Translator], Any]) -> None:
    """Translates FX nodes calling `target` with `fn(node, translator) -> IR value name(s)`.
    `target` is an op, or the qualified name of one that a library registers when it is imported
    ("transformers.grouped_mm_fallback.default"), so graphtrain need not import that library."""
    TRANSLATORS[target] = fn


def op(*targets: Any) -> Callable:
    def register(fn: Callable) -> Callable:
        for t in targets:
            register_translator(t, fn)
        return fn

    return register


def val(node: Any) -> Any:
    return node.meta.get("val") if isinstance(node, torch.fx.Node) else node


def rank(node: Any) -> int:
    return val(node).dim()


def writes_first_argument(node: torch.fx.Node) -> bool:
    """An in-place ATen op (relu_, fill_, copy_, ...): it writes its first argument."""
    if not isinstance(node.target, torch._ops.OpOverload) or not node.args:
        return False
    args = node.target._schema.arguments
    info = args[0].alias_info if args else None
    return bool(info is not None and info.is_write and isinstance(node.args[0], torch.fx.Node))

"""The capture side of ZeRO stage 3 inside a GraphModule, for graphtrain.distributed.zero3 and for
DeepSpeed's stage 3 (graphtrain.hooks.ZeROOffloadSubscriber): while torch.export traces a sharded
module, each gather of sharded parameters is a `graphtrain::gather` custom op, translated into a
`ShardGather` callback node (cpp/include/graphtrain/callback.h); its gradient is a
`ShardGatherGrad` node. At run time both call the *layout* of the running model: the object that
the sharding framework set as its `LAYOUT_ATTR` attribute, with methods `gather(attrs)` -> the
full flat tensor, and `gradient(attrs, grad)` -> the shard's gradient for the graph. This module
never imports torch.distributed, so capture does not either."""

from __future__ import annotations

import weakref
from collections import Counter
from typing import Any

import torch
from torch.utils import _pytree as pytree

from . import _callbacks
from ._onnx_writer import Attribute, Node
from ._translate import register_translator

LAYOUT_ATTR = "_graphtrain_sharding"


@torch.library.custom_op("graphtrain::gather", mutates_args=())
def _gather_op(
    anchors: list[torch.Tensor], shard: torch.Tensor, group: int, padded: int, unit: int
) -> torch.Tensor:
    raise RuntimeError("graphtrain::gather runs only inside a captured graph (a ShardGather node)")


@_gather_op.register_fake
def _(
    anchors: list[torch.Tensor], shard: torch.Tensor, group: int, padded: int, unit: int
) -> torch.Tensor:
    return shard.new_empty(padded)


def _no_backward(ctx: Any, grad: torch.Tensor) -> tuple:
    # Never called: graphtrain's gradient builder differentiates the ShardGather node.
    raise RuntimeError("graphtrain::gather is differentiated by graphtrain's gradient builder")


torch.library.register_autograd("graphtrain::gather", _no_backward)

GATHER_OP = torch.ops.graphtrain.gather.default


def gather(
    anchors: list[torch.Tensor], shard: torch.Tensor, group: int, padded: int, unit: int = -1
) -> torch.Tensor:
    """At capture: the `padded` full flat elements of sharding group `group` (read by module
    `unit`, for the layouts that need it), as a ShardGather node placed after `anchors` (the
    module's inputs: its boundary)."""
    return _gather_op(anchors, shard, group, padded, unit)


def anchors(args: Any, kwargs: Any) -> list[torch.Tensor]:
    """What a module's gathers are placed after: its first input tensor (none: no anchor)."""
    first = next(
        (x for x in pytree.tree_leaves((args, kwargs)) if isinstance(x, torch.Tensor)), None
    )
    return [first] if first is not None else []


def _translate(n: torch.fx.Node, t: Any) -> str:
    anchors, shard, group, padded, unit = n.args
    return t.emit(
        "ShardGather",
        [t.value(a) for a in anchors] + [t.value(shard)],
        domain="graphtrain",
        num_passive=len(anchors),
        group=group,
        padded=padded,
        unit=unit,
        shard_size=int(shard.meta["val"].numel()),
    )


register_translator(GATHER_OP, _translate)


def count_uses(graph_nodes: list[Node]) -> None:
    """Sets `uses` on each ShardGather of a captured graph: how many gathers of its group the graph
    has (a tied parameter read by two modules has two), so that the layout knows when a group's
    gradient is whole."""
    nodes = [n for n in graph_nodes if n.op_type == "ShardGather"]
    if not nodes:
        return

    def attr(n: Node, name: str) -> Attribute | None:
        return next((a for a in n.attribute if a.name == name), None)

    uses = Counter(attr(n, "group").i for n in nodes)  # type: ignore[union-attr]
    for n in nodes:
        count = uses[attr(n, "group").i]  # type: ignore[union-attr]
        existing = attr(n, "uses")
        if existing is not None:
            existing.i = count
        else:
            n.attribute.append(Attribute("uses", count))


# ---- run time: the ShardGather / ShardGatherGrad handlers -----------------------------------------

_layouts: weakref.WeakKeyDictionary[torch.nn.Module, Any] = weakref.WeakKeyDictionary()


def layout_of(module: torch.nn.Module) -> Any:
    """The sharding layout of the model a GraphModule wraps (set on it, or on one submodule)."""
    layout = _layouts.get(module)
    if layout is None:
        found = [m for m in module.modules() if hasattr(m, LAYOUT_ATTR)]
        if len(found) != 1:
            raise RuntimeError(
                f"a ShardGather node ran in a GraphModule of {type(module).__name__}, which holds "
                f"{len(found)} sharded models; it needs exactly one (shard the model you wrap, once)"
            )
        layout = _layouts[module] = getattr(found[0], LAYOUT_ATTR)
    return layout


def _gather_handler(attrs: dict, inputs: list[Any]) -> list[Any]:
    return [layout_of(_callbacks.current_run().module).gather(attrs)]


def _gather_grad_handler(attrs: dict, inputs: list[Any]) -> list[Any]:
    return [layout_of(_callbacks.current_run().module).gradient(attrs, inputs[-1])]


_callbacks.register_handler("ShardGather", _gather_handler)
_callbacks.register_handler("ShardGatherGrad", _gather_grad_handler)

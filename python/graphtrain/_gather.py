"""The capture side of ZeRO stage 3 (graphtrain.distributed.zero3) inside a GraphModule: while
torch.export traces a sharded module, each gather of a sharding group is a `graphtrain::gather`
custom op, translated into a `ShardGather` callback node (cpp/include/graphtrain/callback.h). Its run
time handlers live in graphtrain.distributed; this module never imports torch.distributed, so
capture does not either."""

from __future__ import annotations

from typing import Any

import torch

from . import _aten


@torch.library.custom_op("graphtrain::gather", mutates_args=())
def _gather_op(
    anchors: list[torch.Tensor], shard: torch.Tensor, group: int, padded: int
) -> torch.Tensor:
    raise RuntimeError(
        "graphtrain::gather runs only inside a captured graph (a ShardShardGather node)"
    )


@_gather_op.register_fake
def _(anchors: list[torch.Tensor], shard: torch.Tensor, group: int, padded: int) -> torch.Tensor:
    return shard.new_empty(padded)


def _no_backward(ctx: Any, grad: torch.Tensor) -> tuple:
    # Never called: graphtrain's gradient builder differentiates the ShardGather node (GatherGrad).
    raise RuntimeError("graphtrain::gather is differentiated by graphtrain's gradient builder")


torch.library.register_autograd("graphtrain::gather", _no_backward)

GATHER_OP = torch.ops.graphtrain.gather.default


def gather(
    anchors: list[torch.Tensor], shard: torch.Tensor, group: int, padded: int
) -> torch.Tensor:
    """At capture: the full flat parameters of sharding group `group`, as a ShardShardGather node placed
    after `anchors` (the module's inputs: its boundary)."""
    return _gather_op(anchors, shard, group, padded)


def _translate(n: torch.fx.Node, t: Any) -> str:
    anchors, shard, group, padded = n.args
    return t.emit(
        "ShardGather",
        [t.value(a) for a in anchors] + [t.value(shard)],
        domain="graphtrain",
        num_passive=len(anchors),
        group=group,
        padded=padded,
        shard_size=int(shard.meta["val"].numel()),
    )


_aten.register_translator(GATHER_OP, _translate)

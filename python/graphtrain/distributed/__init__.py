"""graphtrain.distributed: ZeRO stage 3 (parameters, gradients and optimizer state sharded
across ranks) for eager PyTorch. See docs/distributed.md."""

from ._state import full_state_dict, load_full_state_dict, load_sharded, memory_report, save_sharded
from ._zero3 import ShardedParameterStandIn, ShardingError, zero3

__all__ = [
    "ShardedParameterStandIn",
    "ShardingError",
    "full_state_dict",
    "load_full_state_dict",
    "load_sharded",
    "memory_report",
    "save_sharded",
    "zero3",
]

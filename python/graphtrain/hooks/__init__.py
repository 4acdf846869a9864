"""Module hooks ("subscribers") and activation statistics for convergence debugging.

from graphtrain.hooks import GlobalSubscriberManager, StatisticsSubscriber
GlobalSubscriberManager.subscribe(model, [StatisticsSubscriber("pt_out", override_output_dir=True)])
"""

from ._statistics import StatisticsSubscriber, inspect_activation, read_sidecar
from ._subscriber import GlobalSubscriberManager, RunContext, SubscriberBase, SubscriberManager

__all__ = [
    "GlobalSubscriberManager",
    "RunContext",
    "StatisticsSubscriber",
    "SubscriberBase",
    "SubscriberManager",
    "ZeROOffloadSubscriber",
    "inspect_activation",
    "read_sidecar",
]


def __getattr__(name: str) -> object:
    # Lazily: it imports torch.distributed, which graphtrain's capture never does.
    if name == "ZeROOffloadSubscriber":
        from ..distributed._deepspeed import ZeROOffloadSubscriber

        return ZeROOffloadSubscriber
    raise AttributeError(f"module 'graphtrain.hooks' has no attribute {name!r}")

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
    "inspect_activation",
    "read_sidecar",
]

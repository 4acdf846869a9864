"""graphtrain: PyTorch training in a C++ graph engine, and tools to find convergence problems."""

from __future__ import annotations

__version__ = "0.1.0"

from . import _C  # noqa: E402, F401  (a bad GRAPHTRAIN_* variable raises OptionError here, early)
from ._options import Option, RuntimeOptions, options, reload_options, set_option  # noqa: E402
from .debug_options import DebugOptions  # noqa: E402
from .errors import GraphtrainError, OptionError, UnsupportedModelError  # noqa: E402
from .log import LogLevel, capture_output, get_logger, log, log_once, set_log_level  # noqa: E402
from .profiler import profile_summary  # noqa: E402


def __getattr__(name: str) -> object:
    # GraphModule and explain import torch: loaded on first use, so `import graphtrain` stays light.
    if name == "GraphModule":
        from .graph_module import GraphModule

        return GraphModule
    if name == "explain":
        from ._explain import explain

        return explain
    raise AttributeError(f"module 'graphtrain' has no attribute {name!r}")


__all__ = [
    "DebugOptions",
    "GraphModule",
    "UnsupportedModelError",
    "GraphtrainError",
    "LogLevel",
    "Option",
    "OptionError",
    "RuntimeOptions",
    "capture_output",
    "explain",
    "get_logger",
    "log",
    "log_once",
    "options",
    "profile_summary",
    "reload_options",
    "set_log_level",
    "set_option",
]

"""graphtrain: PyTorch training in a C++ graph engine, and tools to find convergence problems."""

from __future__ import annotations

__version__ = "0.1.0"

from . import _C  # noqa: E402  (a bad GRAPHTRAIN_* variable raises OptionError here, early)
from ._options import Option, RuntimeOptions, options, reload_options, set_option  # noqa: E402
from .debug_options import DebugOptions  # noqa: E402
from .errors import GraphtrainError, OptionError  # noqa: E402
from .log import LogLevel, capture_output, get_logger, log, log_once, set_log_level  # noqa: E402

__all__ = [
    "DebugOptions",
    "GraphtrainError",
    "LogLevel",
    "Option",
    "OptionError",
    "RuntimeOptions",
    "capture_output",
    "get_logger",
    "log",
    "log_once",
    "options",
    "reload_options",
    "set_log_level",
    "set_option",
]

"""DebugOptions: what a GraphModule logs and saves."""

from __future__ import annotations

import os

from .errors import GraphtrainError
from .log import LogLevel, _level, set_log_level


class DebugOptions:
    """Debugging settings of a GraphModule.

    Args:
        log_level: the level for C++ and Python logging. ``None`` keeps the level in force
            (``GRAPHTRAIN_LOG_LEVEL``, WARNING by default); a level given here overrides the
            environment, as every setting made from code does.
        save_onnx: write the captured forward graph and the optimized training graphs as .onnx.
        onnx_prefix: file name prefix of those files; required with ``save_onnx``.
        save_path: folder for those files; defaults to the current folder.
    """

    def __init__(
        self,
        log_level: LogLevel | str | None = None,
        save_onnx: bool = False,
        onnx_prefix: str = "",
        save_path: str = "",
    ) -> None:
        self.log_level = None if log_level is None else _level(log_level)
        self.save_onnx = bool(save_onnx)
        self.onnx_prefix = onnx_prefix
        self.save_path = save_path
        if self.save_onnx and not onnx_prefix:
            raise GraphtrainError(
                "DebugOptions(save_onnx=True) needs onnx_prefix, the file name prefix of the saved "
                "graphs, e.g. DebugOptions(save_onnx=True, onnx_prefix='my_model')."
            )
        if save_path and os.path.exists(save_path) and not os.path.isdir(save_path):
            raise GraphtrainError(
                f"DebugOptions(save_path={save_path!r}): that path exists and is not a folder."
            )

    def apply(self) -> None:
        """Puts the settings into force (GraphModule calls this when it is created)."""
        if self.log_level is not None:
            set_log_level(self.log_level)

    def __repr__(self) -> str:
        level = None if self.log_level is None else self.log_level.name
        return (
            f"DebugOptions(log_level={level}, save_onnx={self.save_onnx}, "
            f"onnx_prefix={self.onnx_prefix!r}, save_path={self.save_path!r})"
        )

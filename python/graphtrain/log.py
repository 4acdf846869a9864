"""graphtrain's logger, shared by C++ and Python.

Records go through the standard ``logging`` module under the logger name ``graphtrain``, so a
user's logging configuration applies. Level and rank filtering happen once, in C++, for records
from both languages: at WARNING and above only rank 0 logs (errors excepted), at INFO and below
every rank logs and each line says ``[rank N]``.
"""

from __future__ import annotations

import atexit
import contextlib
import enum
import logging
import sys
import threading
from collections.abc import Iterator

from . import _C
from ._options import set_option

LOGGER_NAME = "graphtrain"


class LogLevel(enum.IntEnum):
    """Severity levels, lowest first; the value is the C++ engine's."""

    VERBOSE = 0
    DEVINFO = 1
    INFO = 2
    WARNING = 3
    ERROR = 4
    FATAL = 5


# Where each level sits among the standard logging module's levels.
_PY_LEVEL = {
    LogLevel.VERBOSE: 5,
    LogLevel.DEVINFO: 15,
    LogLevel.INFO: logging.INFO,
    LogLevel.WARNING: logging.WARNING,
    LogLevel.ERROR: logging.ERROR,
    LogLevel.FATAL: logging.CRITICAL,
}
logging.addLevelName(5, "VERBOSE")
logging.addLevelName(15, "DEVINFO")


def _level(level: LogLevel | str | int) -> LogLevel:
    if isinstance(level, str):
        try:
            return LogLevel[level.upper()]
        except KeyError:
            from .errors import OptionError

            raise OptionError(
                f"{level!r} is not a log level; accepted: " + ", ".join(m.name for m in LogLevel)
            ) from None
    return LogLevel(level)


class _Formatter(logging.Formatter):
    """``graphtrain WARNING [rank 1]: message``"""

    def format(self, record: logging.LogRecord) -> str:
        name = getattr(record, "gt_level", record.levelname)
        rank = getattr(record, "gt_rank", None)
        head = f"graphtrain {name}" + (f" [rank {rank}]" if rank is not None else "")
        text = f"{head}: {record.getMessage()}"
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return text


class _DefaultHandler(logging.Handler):
    """Writes to the current sys.stderr, but only while the user has configured no root handler:
    once they have, records propagate to their handlers instead and are not printed twice."""

    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(_Formatter())

    def emit(self, record: logging.LogRecord) -> None:
        if logging.getLogger().handlers:
            return
        try:
            stream = sys.stderr
            if stream is None:
                return
            stream.write(self.format(record) + "\n")
            stream.flush()
        except Exception:  # noqa: BLE001 - the logging module's own policy
            self.handleError(record)


def get_logger() -> logging.Logger:
    """The ``graphtrain`` logger of the standard logging module."""
    return logging.getLogger(LOGGER_NAME)


def _emit(level: int, rank: int, show_rank: bool, message: str, file: str, line: int) -> None:
    """Hands one already-filtered record to the logging module (C++ calls this too)."""
    logger = get_logger()
    lvl = LogLevel(level)
    py_level = _PY_LEVEL[lvl]
    if logger.disabled or (logger.level and py_level < logger.level):
        return
    record = logger.makeRecord(
        LOGGER_NAME,
        py_level,
        file,
        line,
        message,
        None,
        None,
        extra={"gt_level": lvl.name, "gt_rank": rank if show_rank else None},
    )
    logger.handle(record)


def refresh_rank() -> int:
    """Takes the rank from torch.distributed when it is initialized (else keeps RANK or 0)."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        rank = dist.get_rank()
        if rank != _C.log_rank():
            _C.set_log_rank(rank)
        return rank
    return _C.log_rank()


def log(level: LogLevel | str | int, message: str, *, stacklevel: int = 1) -> None:
    """Logs ``message`` at ``level`` through graphtrain's filter (level, rank)."""
    lvl = _level(level)
    refresh_rank()
    if not _C.log_enabled(int(lvl)):
        return
    frame = sys._getframe(stacklevel)
    _C.log(int(lvl), message, frame.f_code.co_filename, frame.f_lineno)


_once_lock = threading.Lock()
_once_keys: set[object] = set()


def log_once(level: LogLevel | str | int, message: str, key: object = None) -> None:
    """Logs at most once per key (by default, per calling line) for the life of the process.

    A record that the level filters out does not use up its key.
    """
    lvl = _level(level)
    refresh_rank()
    if not _C.log_enabled(int(lvl)):
        return
    frame = sys._getframe(1)
    site = key if key is not None else (frame.f_code.co_filename, frame.f_lineno)
    with _once_lock:
        if site in _once_keys:
            return
        _once_keys.add(site)
    _C.log(int(lvl), message, frame.f_code.co_filename, frame.f_lineno)


def set_log_level(level: LogLevel | str | int) -> None:
    """Sets the level for C++ and Python alike (the ``log_level`` option, source 'api')."""
    set_option("log_level", _level(level).name)


def log_level() -> LogLevel:
    """The level in force."""
    return LogLevel(_C.log_level())


@contextlib.contextmanager
def capture_output(phase: str) -> Iterator[None]:
    """Captures everything written to stdout and stderr inside the block, from Python and from
    native code, filters known-useless lines and logs what remains as one record for ``phase``.

    Descriptors are always restored, also when the block raises. Never wrap a training step in it.
    """
    _flush(sys.stdout, sys.stderr)
    capture = _C.OutputCapture(phase)
    saved = None
    if capture.redirecting:
        # Python-level writers (print, warnings) may not write to fds 1 and 2 (pytest, notebooks):
        # point them at the descriptors for the scope so their lines are caught in order.
        saved = (sys.stdout, sys.stderr)
        sys.stdout = open(1, "w", buffering=1, closefd=False, errors="replace")
        sys.stderr = open(2, "w", buffering=1, closefd=False, errors="replace")
    try:
        yield
    finally:
        if saved is not None:
            ours = (sys.stdout, sys.stderr)
            sys.stdout, sys.stderr = saved
            for stream in ours:  # flushes; closefd=False keeps the descriptors open
                with contextlib.suppress(Exception):
                    stream.close()
        _flush(sys.stdout, sys.stderr)
        capture.finish_and_emit()


def _flush(*streams: object) -> None:
    for stream in streams:
        if stream is not None:
            with contextlib.suppress(Exception):
                stream.flush()


def _install() -> None:
    logger = get_logger()
    if not any(isinstance(h, _DefaultHandler) for h in logger.handlers):
        logger.addHandler(_DefaultHandler())
    _C.set_log_sink(_emit)
    # Drop the Python sink before the interpreter goes, so late C++ records go to stderr directly.
    atexit.register(_C.set_log_sink, None)


_install()

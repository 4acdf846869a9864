"""Capture in a forked child process (GRAPHTRAIN_CAPTURE_PROCESS, on by default).

torch.export and graphtrain's ATen translators, with what a trace allocates, take ~30 MiB of a
training process's peak memory (gpt of the tests: 337 against 305 MiB): capturing in a child of
fork() keeps all of it out of the process that trains. The child inherits the model as it is,
captures, and hands back the graph as the on-disk cache stores it (graphtrain/_cache.py): what a
fresh process can load from the cache, the parent can run. The child's log records and Python
warnings are re-emitted in the parent, its errors of graphtrain's own kinds re-raised there.

The parent captures in its own process instead when the child cannot hand the capture over
(a Function argument or module output a cache file cannot hold, a torch.autograd.Function defined
inside a function), when the child fails in another way, and where fork is not safe: outside
Linux, with CUDA initialized, inside torch.distributed (its process group belongs to the parent).
"""

from __future__ import annotations

import gc
import logging
import os
import pickle
import select
import signal
import sys
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch

from . import _C, _cache, custom_function
from ._captured import Captured
from .errors import GraphtrainError
from .log import _once_keys, _once_lock, get_logger, log

# A capture still running after this many seconds is reported (once): a hang in the child would
# otherwise look like a training run that never starts.
SLOW_SECONDS = 120.0


def unavailable(tensors: list[torch.Tensor]) -> str:
    """Why this capture cannot run in a forked child, or "" when it can."""
    from ._options import options

    if not options()["capture_process"].value:
        return "GRAPHTRAIN_CAPTURE_PROCESS=0"
    if not sys.platform.startswith("linux") or not hasattr(os, "fork"):
        return f"fork is not used on {sys.platform}"
    if torch.cuda.is_initialized():
        return "CUDA is initialized (a forked child cannot use it)"
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return "torch.distributed is initialized"
    if any(t.device.type != "cpu" for t in tensors):
        return "an input is not on the CPU"
    return ""


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.NOTSET)
        self.records: list[dict] = []

    def emit(self, record: logging.LogRecord) -> None:
        d = dict(record.__dict__)
        d.update(msg=record.getMessage(), args=None, exc_info=None, exc_text=None)
        self.records.append(d)


def _picklable(x: Any) -> bool:
    try:
        pickle.dumps(x)
        return True
    except Exception:  # noqa: BLE001 - whatever pickling raises
        return False


def _child(fn: Callable[[], Captured], t0: float) -> dict:
    """Runs in the child: the capture, encoded as the cache stores it, or what the parent does
    instead, with the child's log records, warnings and used-up log_once keys."""
    # Torch's OpenMP threads do not exist here: with more than one, its next parallel region
    # waits for them forever. graphtrain's pool forgets its workers itself (an at-fork handler).
    torch.set_num_threads(1)
    logger = get_logger()
    collect = _Collect()
    logger.handlers, logger.propagate = [collect], False  # the parent logs them, once
    once_before = set(_once_keys)
    answer: dict[str, Any] = {}
    with warnings.catch_warnings(record=True) as caught:
        try:
            captured = fn()
            data = _cache.encode(captured, time.perf_counter() - t0)
            if data is None:
                answer["in_process"] = "the capture cannot be stored"
            else:
                model = _C.Model.from_bytes(captured.model)
                names = [a.get("func_name", "") for _, a in model.nodes("PythonOp", "graphtrain")]
                why = custom_function.not_importable(names)
                answer.update({"in_process": why} if why else {"data": data})
        except GraphtrainError as e:
            answer["error"] = e if _picklable(e) else type(e)(str(e))
        except Exception as e:  # noqa: BLE001 - a bug: the parent captures and shows its traceback
            answer["in_process"] = f"{type(e).__name__}: {e}"
    answer["records"] = collect.records
    answer["warnings"] = [
        (
            str(w.message),
            w.category if _picklable(w.category) else UserWarning,
            w.filename,
            w.lineno,
        )
        for w in caught
    ]
    answer["once"] = [k for k in _once_keys - once_before if _picklable(k)]
    return answer


def _read(fd: int, pid: int, what: str) -> bytes:
    chunks, start, reported = [], time.monotonic(), False
    while True:
        ready, _, _ = select.select([fd], [], [], 5.0)
        if not ready:
            if not reported and time.monotonic() - start > SLOW_SECONDS:
                reported = True
                log(
                    "WARNING",
                    f"capturing {what} in child process {pid} has taken over "
                    f"{SLOW_SECONDS:.0f} s; if it hangs, GRAPHTRAIN_CAPTURE_PROCESS=0 captures "
                    "in this process",
                )
            continue
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def capture(fn: Callable[[], Captured], t0: float, what: str) -> bytes | None:
    """Runs `fn` in a forked child and returns the capture encoded as the cache stores it,
    or None when this process must capture itself (the reason is logged at INFO). Re-raises the
    child's graphtrain errors (UnsupportedModelError, GraphError, ...)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()  # or the child flushes the parent's buffered output a second time
        except (AttributeError, OSError, ValueError):
            pass
    r, w = os.pipe()
    # The child's garbage collector must not walk the parent's objects: writing their headers
    # would copy every page it shares with the parent (~0.1 s, and the memory).
    gc.freeze()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # Python 3.12+: fork with threads
        pid = os.fork()
    if pid != 0:
        gc.unfreeze()
    if pid == 0:  # the child: never returns
        status = 1
        try:
            os.close(r)
            payload = pickle.dumps(_child(fn, t0))
            with os.fdopen(w, "wb") as out:
                out.write(payload)
            status = 0
        finally:
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except Exception:  # noqa: BLE001, S110 - exiting either way
                    pass
            os._exit(status)
    os.close(w)
    log("INFO", f"capturing {what} in child process {pid}")
    try:
        payload = _read(r, pid, what)
        _, status = os.waitpid(pid, 0)
    except BaseException:  # KeyboardInterrupt: the child goes too
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        raise
    finally:
        os.close(r)
    if not payload or status != 0:
        how = (
            f"was killed by signal {os.WTERMSIG(status)}"
            if os.WIFSIGNALED(status)
            else f"exited with status {os.waitstatus_to_exitcode(status)}"
        )
        log(
            "WARNING",
            f"the capture process for {what} {how} without a result; capturing in this "
            "process (GRAPHTRAIN_CAPTURE_PROCESS=0 skips the child)",
        )
        return None
    answer = pickle.loads(payload)  # noqa: S301 - written by our own child
    _replay(answer)
    if "error" in answer:
        raise answer["error"]
    if "in_process" in answer:
        log("INFO", f"capturing {what} in this process: {answer['in_process']}")
        return None
    return answer["data"]


def _replay(answer: dict) -> None:
    """The child's log records and warnings, as if this process had made them."""
    logger = get_logger()
    for d in answer["records"]:
        logger.handle(logging.makeLogRecord(d))
    for message, category, filename, lineno in answer["warnings"]:
        warnings.warn_explicit(message, category, filename, lineno)
    with _once_lock:
        _once_keys.update(answer["once"])

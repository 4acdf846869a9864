"""The on-disk cache of captured graphs (GRAPHTRAIN_CACHE_DIR).

A cached capture is a real ONNX model (it opens in Netron) whose metadata holds what GraphModule
needs besides the graph, and a checksum. Writes are atomic (a temporary file renamed into place),
so two processes writing one key both leave a whole file; a corrupted or incompatible file is
reported once and replaced by a fresh capture.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import stat
import sys
import tempfile
from typing import Any

import onnx
import torch
from torch.utils import _pytree as pytree

from ._capture import OPSET, Captured, GraphInput
from ._options import options
from ._structure import leaf_from_json, leaf_to_json
from .log import log, log_once

FORMAT = 1
_META_KEY = "graphtrain.capture"
_SUM_KEY = "graphtrain.checksum"


def _rank() -> int:
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    try:
        return int(os.environ.get("RANK", "0"))
    except ValueError:
        return 0


def _source(cls: type) -> str:
    try:
        return inspect.getsource(cls.forward)
    except (OSError, TypeError):
        fn = getattr(cls.forward, "__code__", None)
        return hashlib.sha256(fn.co_code).hexdigest() if fn else cls.__qualname__


def cache_key(module: torch.nn.Module, schema: Any, training: bool) -> str:
    """Covers what changes the captured graph: module structure and forward sources, parameter and
    buffer names, shapes and dtypes, the input schema, train/eval, versions, and the rank."""
    from . import __version__

    h = hashlib.sha256()

    def add(*items: Any) -> None:
        for item in items:
            h.update(repr(item).encode())
            h.update(b"\0")

    add(
        FORMAT,
        OPSET,
        __version__,
        torch.__version__,
        training,
        _rank(),
        schema,
        options()["enable_custom_autograd"].value,
        options()["fallback_policy"].value,
        options()["enable_compute_optimizer"].value,
        options()["disable_passes"].value,
    )
    seen: set[type] = set()
    for name, sub in module.named_modules():
        cls = type(sub)
        add(name, cls.__module__, cls.__qualname__)
        if cls not in seen:
            seen.add(cls)
            add(_source(cls))
    for name, p in module.named_parameters(remove_duplicate=False):
        add(name, tuple(p.shape), p.dtype, p.requires_grad)
    for name, b in module.named_buffers(remove_duplicate=False):
        add(name, tuple(b.shape), b.dtype)
    return h.hexdigest()[:32]


def _checksum(model: onnx.ModelProto, meta: str) -> str:
    return hashlib.sha256(model.graph.SerializeToString() + meta.encode()).hexdigest()


def save(path: str, captured: Captured, seconds: float) -> None:
    if captured.uncacheable:
        log("DEVINFO", f"capture not cached: {captured.uncacheable}")
        return
    try:
        leaves = [leaf_to_json(x) for x in captured.out_leaves]
    except TypeError as e:
        log("DEVINFO", f"capture not cached: the module returns {e}, which cannot be stored")
        return
    meta = json.dumps(
        {
            "format": FORMAT,
            "inputs": [[i.kind, i.key, i.name] for i in captured.inputs],
            "outputs": captured.outputs,
            "output_float": captured.output_float,
            "buffer_updates": captured.buffer_updates,
            "out_spec": pytree.treespec_dumps(captured.out_spec),
            "out_leaves": leaves,
            "capture_seconds": seconds,
            "static_shapes": captured.static_shapes,
        }
    )
    model = onnx.ModelProto()
    model.CopyFrom(captured.model)
    for key, value in ((_META_KEY, meta), (_SUM_KEY, _checksum(model, meta))):
        entry = model.metadata_props.add()
        entry.key, entry.value = key, value
    folder = os.path.dirname(path)
    os.makedirs(folder, mode=0o700, exist_ok=True)  # a new cache folder is the user's alone
    if not _trusted(folder):
        return
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=".onnx")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(model.SerializeToString())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _untrusted(path: str) -> str:
    """Why `path` may hold what another user wrote (owned by someone else, or writable by group or
    others, as ssh judges key files), or "" when it can only be this user's."""
    st = os.stat(path)
    if st.st_uid != os.getuid():
        return f"it is owned by user id {st.st_uid}, not by this user ({os.getuid()})"
    if st.st_mode & 0o022:
        return f"it is writable by group or others (mode {stat.S_IMODE(st.st_mode):o})"
    return ""


def _trusted(where: str) -> bool:
    why = _untrusted(where)
    if why:
        log_once(
            "WARNING",
            f"not using the graph cache at {where}: {why}. A cached graph runs as code; "
            "make it yours with no write access for others (chmod go-w), or point "
            "GRAPHTRAIN_CACHE_DIR elsewhere. Capturing instead.",
            key=("untrusted-cache", where),
        )
    return not why


def load(path: str) -> tuple[Captured, float] | None:
    """The cached capture at `path`, or None when there is none or it is unusable (warned once).
    A graph another user could have written is never loaded: it could train wrong in silence."""
    if not os.path.exists(path):
        return None
    if not (_trusted(os.path.dirname(path)) and _trusted(path)):
        return None
    try:
        model = onnx.ModelProto()
        with open(path, "rb") as f:
            model.ParseFromString(f.read())
        props = {p.key: p.value for p in model.metadata_props}
        meta = props[_META_KEY]
        del model.metadata_props[:]
        if props.get(_SUM_KEY) != _checksum(model, meta):
            raise ValueError("checksum mismatch")
        m = json.loads(meta)
        if m["format"] != FORMAT:
            raise ValueError(f"format {m['format']}, expected {FORMAT}")
        leaves = [leaf_from_json(x) for x in m["out_leaves"]]
        captured = Captured(
            model=model,
            inputs=[GraphInput(k, key, name) for k, key, name in m["inputs"]],
            outputs=m["outputs"],
            output_float=m["output_float"],
            buffer_updates=[tuple(x) for x in m["buffer_updates"]],
            out_spec=pytree.treespec_loads(m["out_spec"]),
            out_leaves=leaves,
            static_shapes=m.get("static_shapes"),
        )
        return captured, float(m["capture_seconds"])
    except Exception as e:  # noqa: BLE001 - any defect means: capture again
        log_once(
            "WARNING",
            f"the cached graph {path} is unusable ({type(e).__name__}: {e}); capturing "
            "again and replacing it",
            key=("bad-cache", path),
        )
        return None

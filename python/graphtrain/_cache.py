"""The on-disk cache of captured graphs (GRAPHTRAIN_CACHE_DIR).

A cached capture is a real ONNX model (it opens in Netron) whose metadata holds what GraphModule
needs besides the graph, and a checksum of every byte before it. The metadata entries are written
and read as protobuf bytes here (appending a field to a serialized message is valid protobuf), so
a cache hit needs neither the onnx package nor torch.export. Writes are atomic (a temporary file
renamed into place), so two processes writing one key both leave a whole file; a corrupted or
incompatible file is reported once and replaced by a fresh capture.
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

import torch
from torch.utils import _pytree as pytree

from ._captured import OPSET, Captured, GraphInput
from ._onnx_writer import metadata_entry
from ._options import options
from ._structure import leaf_from_json, leaf_to_json
from .log import log, log_once

FORMAT = 2  # 2: the checksum covers the file's bytes before it
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
    from .custom_function import decomposition_names

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
        decomposition_names(),
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


_METADATA_PROPS = 14  # ModelProto.metadata_props: StringStringEntryProto {key = 1, value = 2}


def _metadata_entry(key: str, value: str) -> bytes:
    """One ModelProto.metadata_props entry, to append to a serialized model."""
    return metadata_entry(_METADATA_PROPS, key, value)


def _read_varint(data: bytes, i: int) -> tuple[int, int]:
    n = shift = 0
    while True:
        if i >= len(data) or shift > 63:
            raise ValueError("truncated or corrupted protobuf")
        b = data[i]
        n |= (b & 0x7F) << shift
        i += 1
        if b < 0x80:
            return n, i
        shift += 7


def _fields(data: bytes, wanted: int) -> list[bytes]:
    """The payloads of one length-delimited field of a serialized message (top level only)."""
    out, i = [], 0
    while i < len(data):
        key, i = _read_varint(data, i)
        kind = key & 7
        if kind == 0:
            _, i = _read_varint(data, i)
        elif kind in (1, 5):
            i += 8 if kind == 1 else 4
        elif kind == 2:
            size, i = _read_varint(data, i)
            if key >> 3 == wanted:
                out.append(data[i : i + size])
            i += size
        else:
            raise ValueError(f"protobuf wire type {kind} at byte {i}")
        if i > len(data):
            raise ValueError("truncated protobuf")
    return out


def _metadata(data: bytes) -> dict[str, str]:
    props = {}
    for entry in _fields(data, _METADATA_PROPS):
        key, value = (_fields(entry, n) for n in (1, 2))
        props[key[0].decode() if key else ""] = value[0].decode() if value else ""
    return props


def encode(captured: Captured, seconds: float) -> bytes | None:
    """The cache file of a capture (the graph, its metadata, a checksum), or None when the cache
    cannot hold it (logged at DEVINFO)."""
    if captured.uncacheable:
        log("DEVINFO", f"capture not cached: {captured.uncacheable}")
        return None
    try:
        leaves = [leaf_to_json(x) for x in captured.out_leaves]
    except TypeError as e:
        log("DEVINFO", f"capture not cached: the module returns {e}, which cannot be stored")
        return None
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
    body = captured.model + _metadata_entry(_META_KEY, meta)
    return body + _metadata_entry(_SUM_KEY, hashlib.sha256(body).hexdigest())


def decode(data: bytes) -> tuple[Captured, float]:
    """The capture in a cache file's bytes and the seconds capturing took; ValueError (or another
    exception) when they are damaged or of another format."""
    props = _metadata(data)
    if _META_KEY not in props:
        raise ValueError("it holds no graphtrain metadata")
    expected = props.get(_SUM_KEY, "")
    trailer = _metadata_entry(_SUM_KEY, expected)
    body = data[: len(data) - len(trailer)]
    if not data.endswith(trailer) or hashlib.sha256(body).hexdigest() != expected:
        raise ValueError("checksum mismatch")
    m = json.loads(props[_META_KEY])
    if m["format"] != FORMAT:
        raise ValueError(f"format {m['format']}, expected {FORMAT}")
    captured = Captured(
        model=data,
        inputs=[GraphInput(k, key, name) for k, key, name in m["inputs"]],
        outputs=m["outputs"],
        output_float=m["output_float"],
        buffer_updates=[tuple(x) for x in m["buffer_updates"]],
        out_spec=pytree.treespec_loads(m["out_spec"]),
        out_leaves=[leaf_from_json(x) for x in m["out_leaves"]],
        static_shapes=m.get("static_shapes"),
    )
    return captured, float(m["capture_seconds"])


def save(path: str, data: bytes) -> None:
    """Writes an encoded capture to `path` atomically."""
    folder = os.path.dirname(path)
    os.makedirs(folder, mode=0o700, exist_ok=True)  # a new cache folder is the user's alone
    if not _trusted(folder):
        return
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=".onnx")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
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
        with open(path, "rb") as f:
            return decode(f.read())
    except Exception as e:  # noqa: BLE001 - any defect means: capture again
        log_once(
            "WARNING",
            f"the cached graph {path} is unusable ({type(e).__name__}: {e}); capturing "
            "again and replacing it",
            key=("bad-cache", path),
        )
        return None

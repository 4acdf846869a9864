"""StatisticsSubscriber: dumps the statistics of every module's outputs (forward) and their
gradients (backward), step by step, in the layout of ONNX Runtime's statistics tool:

    OUT/[rank_R/]step_N/order.txt                         names in the order they were dumped
    OUT/[rank_R/]step_N/{Class}_{index}_{k}th_output_forward    one text file per tensor
    OUT/[rank_R/]step_N/{Class}_{index}_{k}th_output_backward
    OUT/[rank_R/]step_N/statistics.bin                    the same numbers, full precision

Statistics come from graphtrain's C++ (one pass, pooled across buckets, bounded memory).
"""

from __future__ import annotations

import os
import shutil
import struct
import sys
import threading
from typing import Any

import torch
from torch.utils import _pytree as pytree

from .. import _C, _callbacks
from ..log import log_once
from ._subscriber import RunContext, SubscriberBase

# statistics.bin: records of  name length (uint32), name (utf-8), module path length (uint32),
# module path (utf-8), then the fields below (float64).
SIDECAR_FIELDS = (
    "count",
    "finite",
    "min",
    "max",
    "mean",
    "std",
    "nan",
    "inf",
    "negative",
    "positive",
    "zero",
)
_active: list[StatisticsSubscriber] = []


def _rank_dir(root: str) -> str:
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return os.path.join(root, f"rank_{dist.get_rank()}")
    return root


class StatisticsSubscriber(SubscriberBase):
    """Dumps module output statistics to `output_dir` for steps in [start_step, end_step).

    An existing output_dir raises unless override_output_dir (which empties it); an unwritable one
    raises now, not at step 40. With torch.distributed initialized, each rank owns (checks,
    replaces, writes) only its own `output_dir/rank_R`.
    """

    def __init__(
        self,
        output_dir: str,
        start_step: int | None = None,
        end_step: int | None = None,
        override_output_dir: bool = False,
        bucket_size: int = 1 << 29,
    ) -> None:
        super().__init__(start_step, end_step)
        if bucket_size < 1:
            raise ValueError(f"bucket_size must be positive, got {bucket_size}")
        mine = _rank_dir(output_dir)
        if os.path.exists(mine):
            if not override_output_dir:
                raise FileExistsError(
                    f"statistics output folder '{mine}' exists; pass override_output_dir=True to replace it"
                )
            shutil.rmtree(mine)
        try:
            os.makedirs(mine)
            probe = os.path.join(mine, ".write-test")
            with open(probe, "w") as f:
                f.write("ok")
            os.unlink(probe)
        except OSError as e:
            raise PermissionError(f"cannot write statistics to '{output_dir}': {e.strerror}") from e
        self.output_dir = output_dir
        self.bucket_size = bucket_size
        self._lock = threading.Lock()
        self._open: dict[str, tuple[Any, Any]] = {}
        _active.append(self)

    def post_forward_tensor_apply_impl(
        self, ctx: RunContext, module: torch.nn.Module, tensor_index: int, tensor: torch.Tensor
    ) -> torch.Tensor:
        name = f"{type(module).__name__}_{ctx.module_index}_{tensor_index}th_output"
        path = ctx.module_name or type(module).__name__
        self.dump(ctx.step, f"{name}_forward", tensor, path)
        if tensor.requires_grad:
            step = ctx.step  # the backward dump goes with the step whose forward produced it
            tensor.register_hook(lambda g: self.dump(step, f"{name}_backward", g, path))
        return tensor

    def post_forward_module_apply_impl(
        self, ctx: RunContext, module: torch.nn.Module, args: Any, outputs: Any
    ) -> tuple[Any, Any]:
        for k, leaf in enumerate(pytree.tree_leaves(outputs)):
            if leaf is not None and not isinstance(leaf, torch.Tensor):
                log_once(
                    "DEVINFO",
                    f"statistics: output {k} of module '{ctx.module_name or type(module).__name__}' "
                    f"is a {type(leaf).__name__}, not a tensor; skipped",
                    key=("stats-non-tensor", id(self), ctx.module_name, k),
                )
        return args, outputs

    def dump(self, step: int, name: str, tensor: torch.Tensor, module_path: str = "") -> None:
        if not isinstance(tensor, torch.Tensor):
            log_once(
                "DEVINFO",
                f"statistics: '{name}' is not a tensor; skipped",
                key=("stats-skip", name),
            )
            return
        data = tensor.detach()
        if data.device.type != "cpu":
            data = data.cpu()
        if not data.is_contiguous():
            data = data.contiguous()
        stats = _C.tensor_stats(data, self.bucket_size, 128, name)
        folder = os.path.join(_rank_dir(self.output_dir), f"step_{step}")
        encoded, where = name.encode(), module_path.encode()
        record = (
            struct.pack("<I", len(encoded))
            + encoded
            + struct.pack("<I", len(where))
            + where
            + struct.pack(f"<{len(SIDECAR_FIELDS)}d", *(float(stats[k]) for k in SIDECAR_FIELDS))
        )
        with self._lock:
            order, sidecar = self._step_files(folder)
            with open(os.path.join(folder, name), "w") as f:
                f.write(f"module: {module_path}\n" + stats["text"])
            # One write each, flushed at once: a reader (or a crash) sees whole records.
            order.write(name + "\n")
            order.flush()
            sidecar.write(record)
            sidecar.flush()

    def _step_files(self, folder: str) -> tuple[Any, Any]:
        """order.txt and statistics.bin of a step folder, kept open for the step's next dumps (a
        few steps at once: a backward may still write into the previous step)."""
        files = self._open.get(folder)
        if files is None:
            os.makedirs(folder, exist_ok=True)
            files = (
                open(os.path.join(folder, "order.txt"), "a"),
                open(os.path.join(folder, "statistics.bin"), "ab"),
            )
            self._open[folder] = files
            while len(self._open) > 3:
                for f in self._open.pop(next(iter(self._open))):
                    f.close()
        return files


def read_sidecar(path: str) -> dict[str, dict[str, Any]]:
    """The records of a statistics.bin file: name -> field -> value (and "module" -> path). A last
    record cut short (a run killed while writing it) is left out."""
    out: dict[str, dict[str, Any]] = {}
    data = open(path, "rb").read()
    at, width = 0, 8 * len(SIDECAR_FIELDS)
    try:
        while at < len(data):
            (n,) = struct.unpack_from("<I", data, at)
            name = data[at + 4 : at + 4 + n].decode()
            at += 4 + n
            (m,) = struct.unpack_from("<I", data, at)
            module = data[at + 4 : at + 4 + m].decode()
            at += 4 + m
            values = struct.unpack_from(f"<{len(SIDECAR_FIELDS)}d", data, at)
            out[name] = {"module": module, **dict(zip(SIDECAR_FIELDS, values))}
            at += width
    except (struct.error, UnicodeDecodeError):
        pass
    return out


def _no_subscriber(name: str) -> RuntimeError:
    return RuntimeError(
        f"inspect_activation('{name}'): no StatisticsSubscriber is subscribed; subscribe one "
        "with GlobalSubscriberManager.subscribe(model, [StatisticsSubscriber(...)]) first"
    )


def _inspect(name: str, tensor: torch.Tensor) -> torch.Tensor:
    from ._subscriber import GlobalSubscriberManager

    if not _active:
        raise _no_subscriber(name)
    sub = _active[-1]
    step = GlobalSubscriberManager.step
    if sub.active(step):
        sub.dump(step, f"{name}_forward", tensor, name)
        if tensor.requires_grad:
            tensor.register_hook(lambda g: sub.dump(step, f"{name}_backward", g, name))
    return tensor


def inspect_activation(name: str, tensor: torch.Tensor) -> torch.Tensor:
    """Dumps an intermediate tensor (and, in backward, its gradient) with the active
    StatisticsSubscriber, and returns it unchanged. Inside a GraphModule it becomes a Hook node
    of the graph that does the same at run time."""
    from ._subscriber import capturing

    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"inspect_activation('{name}') needs a tensor, got {type(tensor).__name__}")
    if capturing():
        if not _active:
            raise _no_subscriber(name)
        return _callbacks.mark("inspect", name, tensor)
    return _inspect(name, tensor)


_callbacks.register_hook_kind(
    "inspect", lambda kind, name, run, value, passive: _inspect(name, value)
)

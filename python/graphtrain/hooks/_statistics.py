"""StatisticsSubscriber: dumps the statistics of every module's outputs (forward) and their
gradients (backward), and optionally of every parameter's gradient, step by step, in the layout of
ONNX Runtime's statistics tool:

    OUT/[rank_R/]step_N/order.txt                         names in the order they were dumped
    OUT/[rank_R/]step_N/{Class}_{index}_{k}th_output_forward    one text file per tensor
    OUT/[rank_R/]step_N/{Class}_{index}_{k}th_output_backward
    OUT/[rank_R/]step_N/{parameter path}_gradient         with parameter_gradients=True
    OUT/[rank_R/]step_N/statistics.bin                    the same numbers, full precision

With text=False only order.txt and statistics.bin are written; `graphtrain-stats text OUT`
renders the text files from them, byte for byte as they would have been written.
Statistics come from graphtrain's C++ (one pass, pooled across buckets, bounded memory).
"""

from __future__ import annotations

import os
import shutil
import struct
import sys
import threading
import weakref
from typing import Any

import torch
from torch.utils import _pytree as pytree

from .. import _C, _callbacks
from ..log import log_once
from ._subscriber import RunContext, SubscriberBase

# statistics.bin starts with SIDECAR_MAGIC, then one record per dumped tensor:
#   name, module path, dtype: each a uint32 length and utf-8 bytes;
#   shape: uint32 rank, int64 sizes;  SIDECAR_FIELDS: float64 each;
#   the first values (as in the text file) and the sample (values spread evenly over the tensor,
#   for comparing element by element): each a uint32 count and float64 values.
# Files without the magic are the first format: name, module, SIDECAR_FIELDS only.
# The writer is C++ (graphtrain::stats_record, _C.stats_record).
SIDECAR_MAGIC = b"GTSTATS\x02"
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
FIRST_VALUES = 128
SAMPLE_VALUES = 256
_active: list[StatisticsSubscriber] = []


def _rank_dir(root: str) -> str:
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return os.path.join(root, f"rank_{dist.get_rank()}")
    return root


def _close_all(files: dict[int, tuple[str, int, int]]) -> None:
    for _, *fds in files.values():
        for fd in fds:
            os.close(fd)
    files.clear()


class StatisticsSubscriber(SubscriberBase):
    """Dumps module output statistics to `output_dir` for steps in [start_step, end_step).

    parameter_gradients=True also dumps every parameter's gradient once backward has accumulated
    it (`{parameter path}_gradient`, with the step of the forward that led to it). text=False
    writes only the binary sidecar (and order.txt): cheaper; `graphtrain-stats text` renders the
    text files later.

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
        parameter_gradients: bool = False,
        text: bool = True,
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
        self.parameter_gradients = parameter_gradients
        self.text = text
        self._lock = threading.Lock()
        self._dir = mine  # this rank's folder
        self._open: dict[int, tuple[str, int, int]] = {}
        weakref.finalize(self, _close_all, self._open)
        self._forward_step = 0  # the step of the last forward: parameter gradients belong to it
        self._watched: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()
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

    def post_forward_outmost_module_apply_impl(
        self, ctx: RunContext, module: torch.nn.Module, args: Any, outputs: Any
    ) -> tuple[Any, Any]:
        self._forward_step = ctx.step
        if self.parameter_gradients and module not in self._watched:
            self._watched.add(module)
            for path, param in module.named_parameters():
                if param.requires_grad:
                    param.register_post_accumulate_grad_hook(self._gradient_hook(path))
        return args, outputs

    def _gradient_hook(self, path: str) -> Any:
        owner = path.rpartition(".")[0]

        def hook(param: torch.Tensor) -> None:
            if param.grad is not None and self.active(self._forward_step):
                self.dump(self._forward_step, f"{path}_gradient", param.grad, owner)

        return hook

    def dump(self, step: int, name: str, tensor: torch.Tensor, module_path: str = "") -> None:
        if not isinstance(tensor, torch.Tensor):
            log_once(
                "DEVINFO",
                f"statistics: '{name}' is not a tensor; skipped",
                key=("stats-skip", name),
            )
            return
        data = tensor.detach()
        if not data.is_cpu:
            data = data.cpu()
        if not data.is_contiguous():
            data = data.contiguous()
        record, text = _C.stats_record(
            data, name, module_path, self.bucket_size, FIRST_VALUES, SAMPLE_VALUES, self.text
        )
        with self._lock:
            folder, order, sidecar = self._step_files(step)
            if text is not None:
                with open(os.path.join(folder, name), "w") as f:
                    f.write(text_file(module_path, text))
            # One unbuffered write each: a reader (or a crash) sees whole records.
            os.write(order, (name + "\n").encode())
            os.write(sidecar, record)

    def _step_files(self, step: int) -> tuple[str, int, int]:
        """The folder of a step and the descriptors of its order.txt and statistics.bin, kept open
        for the step's next dumps (a few steps at once: a backward may still write into the
        previous step)."""
        files = self._open.get(step)
        if files is None:
            folder = os.path.join(self._dir, f"step_{step}")
            os.makedirs(folder, exist_ok=True)
            flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC
            sidecar = os.open(os.path.join(folder, "statistics.bin"), flags, 0o644)
            if os.fstat(sidecar).st_size == 0:
                os.write(sidecar, SIDECAR_MAGIC)
            files = (folder, os.open(os.path.join(folder, "order.txt"), flags, 0o644), sidecar)
            self._open[step] = files
            while len(self._open) > 3:
                _, *fds = self._open.pop(next(iter(self._open)))
                for fd in fds:
                    os.close(fd)
        return files


_from_options: tuple[Any, StatisticsSubscriber] | None = None


def subscribe_from_options(module: torch.nn.Module) -> None:
    """GRAPHTRAIN_STATS_DIR / GRAPHTRAIN_STATS_STEPS: one StatisticsSubscriber for the process
    (parameter gradients, binary only), subscribed to `module` (each GraphModule's model)."""
    global _from_options
    from .._options import options
    from ._subscriber import SubscriberManager

    if _from_options is None:
        opts = options()
        folder, steps = opts["stats_dir"].value, opts["stats_steps"].value
        mine = _rank_dir(folder)
        if os.path.isdir(mine) and os.listdir(mine):
            raise FileExistsError(
                f"GRAPHTRAIN_STATS_DIR: '{mine}' already holds files; choose a new folder (or "
                "remove it) for this run's statistics"
            )
        sub = StatisticsSubscriber(
            folder,
            end_step=steps or None,
            override_output_dir=True,
            parameter_gradients=True,
            text=False,
        )
        _from_options = (SubscriberManager(), sub)
    manager, sub = _from_options
    manager.subscribe(module, [sub])


def text_file(module_path: str, text: str) -> str:
    """The content of a tensor's text dump file."""
    return f"module: {module_path}\n" + text


def read_sidecar(path: str) -> dict[str, dict[str, Any]]:
    """The records of a statistics.bin file: name -> field -> value, plus "module" (its path),
    "dtype", "shape", "first" and "sample" (None, None, [], [] in files of the first format). A
    last record cut short (a run killed while writing it) is left out."""
    out: dict[str, dict[str, Any]] = {}
    data = open(path, "rb").read()
    current = data.startswith(SIDECAR_MAGIC)
    at = len(SIDECAR_MAGIC) if current else 0

    def text() -> str:
        nonlocal at
        (n,) = struct.unpack_from("<I", data, at)
        if at + 4 + n > len(data):
            raise struct.error("cut short")
        at += 4 + n
        return data[at - n : at].decode()

    def numbers(code: str) -> list[Any]:
        nonlocal at
        (n,) = struct.unpack_from("<I", data, at)
        values = struct.unpack_from(f"<{n}{code}", data, at + 4)
        at += 4 + struct.calcsize(f"<{n}{code}")
        return list(values)

    try:
        while at < len(data):
            name, module = text(), text()
            record: dict[str, Any] = {"module": module, "dtype": None, "shape": None}
            if current:
                record["dtype"] = text()
                record["shape"] = numbers("q")
            values = struct.unpack_from(f"<{len(SIDECAR_FIELDS)}d", data, at)
            at += 8 * len(SIDECAR_FIELDS)
            record.update(zip(SIDECAR_FIELDS, values))
            record["first"] = numbers("d") if current else []
            record["sample"] = numbers("d") if current else []
            out[name] = record
    except (struct.error, UnicodeDecodeError):
        pass
    return out


def render_text(record: dict[str, Any], name: str) -> str:
    """The text dump file of a statistics.bin record, as StatisticsSubscriber(text=True) writes it."""
    if record["dtype"] is None:
        raise ValueError(f"'{name}' comes from a statistics.bin of the first format (no text data)")
    fields = [record[k] for k in SIDECAR_FIELDS if k != "finite"]
    return text_file(
        record["module"],
        _C.format_stats(name, record["dtype"], record["shape"], fields, record["first"]),
    )


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

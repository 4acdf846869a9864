"""DeepSpeed ZeRO stage 3 inside a GraphModule: `ZeROOffloadSubscriber` takes over the stage-3 hooks
DeepSpeed registered on the wrapped model and drives them from the graph's ShardGather nodes.

DeepSpeed keeps each parameter partitioned across ranks (outside forward a size-0 placeholder) and
gathers a module's parameters from forward hooks on that module. A captured graph runs none of
those hooks, and torch.export cannot trace them, so:

- Taking over. DeepSpeed keeps the handles of the hooks it registered
  (`DeepSpeedZeRoOffload.forward_hooks` / `backward_hooks`, and `fwd_pre_hook` on its root, which
  starts a step); the ones on the wrapped model's modules are removed. The functions they called
  (`pre/post_sub_module_forward_function`, `pre/post_sub_module_backward_function`) are called
  from the graph instead. These are private API: the DeepSpeed versions it works with are pinned
  (SUPPORTED) and tested.
- Capture. Each module holding DeepSpeed parameters reads them through one `graphtrain::gather`
  per parameter at its boundary (graphtrain/_gather.py), from a size-0 stand-in; the graph input
  of a DeepSpeed parameter is a size-0 placeholder at run time too.
- Forward. The first ShardGather of a module fetches the module (DeepSpeed's all-gather, with
  its prefetch), takes the full tensors of its parameters and releases the module at once: the
  graph holds the full tensors while it reads them, nothing else does.
- Backward. The backward graph gathers again (never stashing full parameters); each parameter's
  ShardGatherGrad sets its full `.grad` (summed over the gathers of a tied parameter) and runs
  the gradient hooks DeepSpeed registered on it, which reduce-scatter it into DeepSpeed's
  partitioned gradients, as its eager backward does. Torch autograd never sees a full gradient.

Train as with DeepSpeed alone: `engine(batch)`, `engine.backward(loss)`, `engine.step()`, with the
model wrapped in GraphModule before `deepspeed.initialize` or after it (`engine.module =
GraphModule(engine.module)`)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from packaging.version import Version
from torch import nn

from .. import _gather
from ..log import log_once

# DeepSpeed versions whose private stage-3 hooks this drives: [first, last), tested with 0.19.8.
SUPPORTED = ("0.19.8", "0.20")


def _check_version() -> Any:
    try:
        import deepspeed
    except ImportError as e:  # parameters carry ds_id, yet deepspeed cannot be imported
        raise RuntimeError(
            "the model's parameters are partitioned by DeepSpeed ZeRO stage 3, but deepspeed "
            f"cannot be imported ({e})"
        ) from e
    found = Version(deepspeed.__version__.split("+")[0])
    if not Version(SUPPORTED[0]) <= found < Version(SUPPORTED[1]):
        raise RuntimeError(
            f"graphtrain.hooks.ZeROOffloadSubscriber drives DeepSpeed's private stage-3 hooks and "
            f"works with DeepSpeed >= {SUPPORTED[0]}, < {SUPPORTED[1]} (tested: 0.19.8); found "
            f"deepspeed {deepspeed.__version__}. Install deepspeed=={SUPPORTED[0]}, or shard with "
            "graphtrain.distributed.zero3(model) instead of DeepSpeed."
        )
    return deepspeed


def _offloads_in(fn: Any, cls: type, depth: int = 0) -> Iterator[Any]:
    """DeepSpeedZeRoOffload objects a hook function refers to (its closure, through wrappers)."""
    if depth > 4:
        return
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            value = cell.cell_contents
        except ValueError:
            continue
        if isinstance(value, cls):
            yield value
        elif callable(value):
            yield from _offloads_in(value, cls, depth + 1)
    wrapped = getattr(fn, "__wrapped__", None)
    if wrapped is not None:
        yield from _offloads_in(wrapped, cls, depth + 1)


def _find_offload(module: nn.Module) -> Any:
    from deepspeed.runtime.zero.parameter_offload import DeepSpeedZeRoOffload

    for m in module.modules():
        for hooks in (m._forward_pre_hooks, m._forward_hooks):
            for fn in hooks.values():
                for offload in _offloads_in(fn, DeepSpeedZeRoOffload):
                    return offload
    raise RuntimeError(
        f"{type(module).__name__}'s parameters are partitioned by DeepSpeed ZeRO stage 3, but its "
        "modules carry none of DeepSpeed's stage-3 hooks (were they removed?); graphtrain drives "
        "those hooks. Wrap the model given to deepspeed.initialize (or engine.module) in "
        "GraphModule."
    )


class ZeROOffloadSubscriber:
    """Runs a DeepSpeed ZeRO stage-3 model inside a GraphModule with DeepSpeed's own partitioning.

    A GraphModule creates it by itself when the model it wraps has DeepSpeed stage-3 parameters
    (in either order: wrapped before deepspeed.initialize, or engine.module wrapped after it);
    `ZeROOffloadSubscriber(model)` does the same explicitly. It takes DeepSpeed's forward and
    backward module hooks off the model and calls what they called from the captured graph."""

    def __init__(self, module: nn.Module) -> None:
        existing = getattr(module, _gather.LAYOUT_ATTR, None)
        if existing is not None:
            raise RuntimeError(
                f"{type(module).__name__} already has a sharding layout "
                f"({type(existing).__name__}); a model is sharded by one framework only"
            )
        deepspeed = _check_version()
        from deepspeed.runtime.zero import parameter_offload

        self._stack = parameter_offload.FWD_MODULE_STACK
        self.module = module
        self.offload = _find_offload(module)
        self.coordinator = self.offload.get_param_coordinator()
        for name, m in module.named_modules():
            if getattr(m, "_z3_leaf", False):
                raise RuntimeError(
                    f"module '{name}' ({type(m).__name__}) is a DeepSpeed ZeRO-3 leaf module "
                    "(set_z3_leaf_modules); graphtrain gathers per module and does not support "
                    "leaf modules: unset it, or keep this model out of GraphModule"
                )
        # The modules that hold DeepSpeed parameters, and each distinct parameter (a tied one is
        # held by several modules: one group, gathered by each).
        self.units: list[tuple[nn.Module, list[tuple[str, int]]]] = []
        self.params: list[nn.Parameter] = []
        index: dict[int, int] = {}
        for m in module.modules():
            held = []
            for attr, p in m._parameters.items():
                if p is None or not hasattr(p, "ds_id"):
                    continue
                if id(p) not in index:
                    index[id(p)] = len(self.params)
                    self.params.append(p)
                held.append((attr, index[id(p)]))
            if held:
                self.units.append((m, held))
        self._take_hooks()
        self._forward: dict[nn.Module, dict[int, torch.Tensor]] = {}
        self._backward: dict[nn.Module, dict[int, torch.Tensor]] = {}
        self._grads: dict[int, list[Any]] = {}  # param index -> [summed gradient, gathers left]
        self._backward_queued = False
        setattr(module, _gather.LAYOUT_ATTR, self)
        log_once(
            "INFO",
            f"ZeROOffloadSubscriber: DeepSpeed {deepspeed.__version__} stage 3 drives "
            f"{len(self.params)} parameters of {len(self.units)} modules of "
            f"{type(module).__name__} from the captured graph",
            key=("zero-offload", id(module)),
        )

    def _take_hooks(self) -> None:
        """Removes DeepSpeed's module hooks from the model's modules (those on modules outside it,
        such as a GraphModule given to deepspeed.initialize, stay and keep working)."""
        dicts = {
            id(d) for m in self.module.modules() for d in (m._forward_pre_hooks, m._forward_hooks)
        }
        taken = 0
        for handle in [*self.offload.forward_hooks, *self.offload.backward_hooks]:
            d = handle.hooks_dict_ref()
            if d is not None and id(d) in dicts:
                handle.remove()
                taken += 1
        # The root's pre-forward hook starts DeepSpeed's step (its prefetch trace): when the
        # root is the wrapped model, the GraphModule starts it (before_forward).
        root_hook = self.offload.fwd_pre_hook
        d = root_hook.hooks_dict_ref()
        self.starts_step = d is not None and id(d) in dicts
        if self.starts_step:
            root_hook.remove()
        self.hooks_taken = taken

    # -- capture -----------------------------------------------------------------------------------

    @contextlib.contextmanager
    def capturing(self) -> Iterator[None]:
        """While torch.export traces the model: each DeepSpeed parameter is a size-0 stand-in
        (its graph input), read through a gather at the boundary of each module holding it."""
        stand_ins = [
            nn.Parameter(torch.empty(0, dtype=p.dtype), requires_grad=p.requires_grad)
            for p in self.params
        ]
        # DeepSpeed replaces torch.nn.functional.linear with its own autograd Function (to keep
        # weights out of autograd's saved tensors); captured, that would be an opaque Python call
        # per linear layer. The graph keeps no full weight for the backward anyway: capture torch's.
        from deepspeed.runtime.zero.linear import zero3_linear_wrap
        from deepspeed.runtime.zero.partition_parameters import (
            InsertPostInitMethodToModuleSubClasses as _Init,
        )

        linear = torch.nn.functional.linear
        if linear is zero3_linear_wrap and hasattr(_Init, "linear_bk"):
            torch.nn.functional.linear = _Init.linear_bk
        saved = []
        for u, (m, held) in enumerate(self.units):
            for attr, k in held:
                m._parameters[attr] = stand_ins[k]
            saved.append(m.__dict__.get("forward"))
            m.forward = self._gathering_forward(m, held, u)
        try:
            yield
        finally:
            torch.nn.functional.linear = linear
            for (m, held), forward in zip(self.units, saved):
                for attr, k in held:
                    m._parameters[attr] = self.params[k]
                    m.__dict__.pop(attr, None)
                if forward is None:
                    del m.forward
                else:
                    m.forward = forward

    def _gathering_forward(self, m: nn.Module, held: list[tuple[str, int]], unit: int) -> Any:
        original = m.forward

        def forward(*args: Any, **kwargs: Any) -> Any:
            anchors = _gather.anchors(args, kwargs)
            for attr, k in held:
                p = self.params[k]
                full = _gather.gather(anchors, m._parameters[attr], k, p.ds_numel, unit)
                m.__dict__[attr] = full.view(p.ds_shape)
            try:
                return original(*args, **kwargs)
            finally:
                for attr, _ in held:
                    m.__dict__.pop(attr, None)

        return forward

    # -- run time ----------------------------------------------------------------------------------

    def before_forward(self) -> None:
        self._forward.clear()
        self._backward.clear()
        self._grads.clear()
        if self.starts_step:
            self.coordinator.reset_step()

    def _fetch(self, m: nn.Module, held: list[tuple[str, int]], backward: bool) -> dict:
        """Gathers module `m` through DeepSpeed, takes its parameters' full tensors and releases
        it (the tensors stay alive as long as the graph reads them)."""
        if backward:
            self.offload.pre_sub_module_backward_function(m)
        else:
            self.offload.pre_sub_module_forward_function(m)
            self._stack.pop()  # pushed for its post-forward hook, which does not run
        full = {k: self.params[k].data for _, k in held}
        for k, t in full.items():
            p = self.params[k]
            if t.shape != p.ds_shape:
                raise RuntimeError(
                    f"DeepSpeed did not gather parameter {p.ds_id} of {type(m).__name__} "
                    f"(shape {list(t.shape)}, expected {list(p.ds_shape)})"
                )
        if backward:
            self.offload.post_sub_module_backward_function(m)
        else:
            self.offload.post_sub_module_forward_function(m)
        return full

    def after_forward(self) -> None:
        self._forward.clear()  # parameters the graph did not read (a fetch takes the module's)

    def _after_backward(self) -> None:
        self._backward.clear()  # parameters the backward did not read: a bias, an embedding
        self._backward_queued = False
        # A group gathered more often than gradients came back (a gather whose output got no
        # gradient): what was summed is the whole gradient.
        pending, self._grads = self._grads, {}
        for k, (grad, _) in pending.items():
            self._deliver(self.params[k], grad)

    def _queue_after_backward(self) -> None:
        if not self._backward_queued:
            torch.autograd.Variable._execution_engine.queue_callback(self._after_backward)
            self._backward_queued = True

    def gather(self, attrs: dict) -> torch.Tensor:
        k, unit = int(attrs["group"]), int(attrs["unit"])
        m, held = self.units[unit]
        backward = bool(attrs.get("recompute"))
        cache = self._backward if backward else self._forward
        got = cache.get(m)
        if got is None or k not in got:
            if backward:
                self._queue_after_backward()
            got = cache[m] = self._fetch(m, held, backward)
        full = got.pop(k)
        if not got:
            del cache[m]
        return full.reshape(-1)

    def gradient(self, attrs: dict, grad: torch.Tensor) -> torch.Tensor:
        k = int(attrs["group"])
        p = self.params[k]
        self._queue_after_backward()
        entry = self._grads.get(k)
        if entry is None:
            # A copy: the engine reuses the memory of its values.
            entry = self._grads[k] = [grad.view(p.ds_shape).clone(), int(attrs.get("uses", 1))]
        else:
            entry[0].add_(grad.view(p.ds_shape))
        entry[1] -= 1
        if entry[1] == 0:
            del self._grads[k]
            self._deliver(p, entry[0])
        return grad.new_empty(0)

    @staticmethod
    def _deliver(p: nn.Parameter, grad: torch.Tensor) -> None:
        """Sets the full gradient of `p` as torch's AccumulateGrad would and runs DeepSpeed's
        gradient hooks on it (they reduce it into the partitions and drop it)."""
        data = None
        if p.shape != grad.shape:  # partitioned: a full-shape view of nothing, for the setter
            data = p.data
            p.data = torch.empty((), dtype=p.dtype).expand(grad.shape)
        try:
            if p.grad is None:
                p.grad = grad
            else:
                p.grad.add_(grad)
            for hook in list((p._post_accumulate_grad_hooks or {}).values()):
                hook(p)
        finally:
            if data is not None:
                p.data = data


def attach(module: nn.Module) -> ZeROOffloadSubscriber:
    """The model's ZeROOffloadSubscriber (created on first use)."""
    layout = getattr(module, _gather.LAYOUT_ATTR, None)
    if isinstance(layout, ZeROOffloadSubscriber):
        return layout
    return ZeROOffloadSubscriber(module)

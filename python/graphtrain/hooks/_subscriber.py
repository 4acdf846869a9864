"""Subscribers: actions run at module boundaries of a model's forward (and, through tensor hooks,
its backward), for debugging convergence."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils import _pytree as pytree

_state = threading.local()


def capturing() -> bool:
    """True while GraphModule traces the model: hooks must not act, the step must not advance."""
    return getattr(_state, "capturing", False)


class capture_scope:
    def __enter__(self) -> None:
        _state.capturing = True

    def __exit__(self, *exc: object) -> None:
        _state.capturing = False


@dataclass
class RunContext:
    """What a subscriber action knows: the step and the module's pre-order index and depth."""

    step: int
    module_index: int
    depth: int
    module_name: str


class SubscriberBase:
    """Base of subscribers. Override any of the *_apply_impl methods; each runs only for steps in
    [start_step, end_step) (None: unbounded)."""

    def __init__(self, start_step: int | None = None, end_step: int | None = None) -> None:
        if start_step is not None and end_step is not None and end_step <= start_step:
            raise ValueError(f"end_step ({end_step}) must be greater than start_step ({start_step})")
        self.start_step = start_step
        self.end_step = end_step

    def active(self, step: int) -> bool:
        return (self.start_step is None or step >= self.start_step) and (self.end_step is None or step < self.end_step)

    # Module-level actions: may return replacements for the arguments / outputs.
    def pre_forward_module_apply_impl(self, ctx: RunContext, module: torch.nn.Module, args: Any,
                                      kwargs: dict) -> tuple[Any, dict]:
        return args, kwargs

    def post_forward_module_apply_impl(self, ctx: RunContext, module: torch.nn.Module, args: Any,
                                       outputs: Any) -> tuple[Any, Any]:
        return args, outputs

    def post_forward_outmost_module_apply_impl(self, ctx: RunContext, module: torch.nn.Module, args: Any,
                                               outputs: Any) -> tuple[Any, Any]:
        return args, outputs

    # Tensor-level actions, once per tensor among the inputs / outputs; may return another tensor.
    def pre_forward_tensor_apply_impl(self, ctx: RunContext, module: torch.nn.Module, tensor_index: int,
                                      tensor: torch.Tensor) -> torch.Tensor:
        return tensor

    def post_forward_tensor_apply_impl(self, ctx: RunContext, module: torch.nn.Module, tensor_index: int,
                                       tensor: torch.Tensor) -> torch.Tensor:
        return tensor


def _map_tensors(value: Any, fn: Any) -> Any:
    """Applies fn(index, tensor) to each tensor leaf, in order; returns the rebuilt structure."""
    leaves, spec = pytree.tree_flatten(value)
    index = 0
    out = []
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            out.append(fn(index, leaf))
            index += 1
        else:
            out.append(leaf)
    return pytree.tree_unflatten(out, spec)


class SubscriberManager:
    """Attaches subscribers to a model (a plain nn.Module, or a GraphModule's wrapped model).
    Modules are indexed in pre-order with their depth; subscribers run in registration order; the
    step counts forwards of the outermost module."""

    def __init__(self) -> None:
        self.step = 0
        self._subscribers: list[SubscriberBase] = []
        self._handles: list[Any] = []

    def subscribe(self, module: torch.nn.Module, subscribers: Sequence[SubscriberBase]) -> None:
        from ..graph_module import GraphModule

        if isinstance(module, GraphModule):
            module = module.module
        if not isinstance(module, torch.nn.Module):
            raise TypeError(f"subscribe() needs an nn.Module, got {type(module).__name__}")
        if not isinstance(subscribers, (list, tuple)) or not subscribers:
            raise ValueError("subscribe() needs a non-empty list of subscribers")
        for s in subscribers:
            if not isinstance(s, SubscriberBase):
                raise TypeError(f"{type(s).__name__} is not a SubscriberBase")
        self._subscribers.extend(subscribers)
        depths: dict[str, int] = {}
        for index, (name, sub) in enumerate(module.named_modules()):
            depth = 0 if name == "" else name.count(".") + 1
            depths[name] = depth
            outermost = name == ""
            ctx_args = (index, depth, name)
            self._handles.append(sub.register_forward_pre_hook(self._pre_hook(ctx_args), with_kwargs=True))
            self._handles.append(sub.register_forward_hook(self._post_hook(ctx_args, outermost), with_kwargs=True))

    def _context(self, info: tuple[int, int, str]) -> RunContext:
        return RunContext(self.step, *info)

    def _pre_hook(self, info: tuple[int, int, str]) -> Any:
        def hook(module: torch.nn.Module, args: Any, kwargs: dict) -> Any:
            if capturing():
                return None
            ctx = self._context(info)
            for s in self._subscribers:
                if not s.active(ctx.step):
                    continue
                args, kwargs = s.pre_forward_module_apply_impl(ctx, module, args, kwargs)
                args = _map_tensors(args, lambda i, t, s=s: s.pre_forward_tensor_apply_impl(ctx, module, i, t))
            return args, kwargs

        return hook

    def _post_hook(self, info: tuple[int, int, str], outermost: bool) -> Any:
        def hook(module: torch.nn.Module, args: Any, kwargs: dict, outputs: Any) -> Any:
            if capturing():
                return None
            ctx = self._context(info)
            for s in self._subscribers:
                if not s.active(ctx.step):
                    continue
                args, outputs = s.post_forward_module_apply_impl(ctx, module, args, outputs)
                outputs = _map_tensors(outputs, lambda i, t, s=s: s.post_forward_tensor_apply_impl(ctx, module, i, t))
                if outermost:
                    args, outputs = s.post_forward_outmost_module_apply_impl(ctx, module, args, outputs)
            if outermost:
                self.step += 1
            return outputs

        return hook


GlobalSubscriberManager = SubscriberManager()

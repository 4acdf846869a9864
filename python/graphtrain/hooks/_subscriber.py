"""Subscribers: actions run at module boundaries of a model's forward (and, through tensor hooks,
its backward), for debugging convergence."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils import _pytree as pytree

from .. import _callbacks

_state = threading.local()


def capturing() -> bool:
    """True while GraphModule traces a model: hooks neither act nor count a step; subscribed
    module boundaries become Hook nodes of the graph instead."""
    return getattr(_state, "paths", None) is not None


class capture_scope:
    """The block in which GraphModule traces `root` (paths of its modules name the Hook nodes)."""

    def __init__(self, root: torch.nn.Module | None = None) -> None:
        self.paths = {id(m): name for name, m in root.named_modules()} if root is not None else {}

    def __enter__(self) -> None:
        self._previous = getattr(_state, "paths", None)
        _state.paths = self.paths

    def __exit__(self, *exc: object) -> None:
        _state.paths = self._previous


def _capture_path(module: torch.nn.Module) -> str | None:
    return getattr(_state, "paths", {}).get(id(module))


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
            raise ValueError(
                f"end_step ({end_step}) must be greater than start_step ({start_step})"
            )
        self.start_step = start_step
        self.end_step = end_step

    def active(self, step: int) -> bool:
        return (self.start_step is None or step >= self.start_step) and (
            self.end_step is None or step < self.end_step
        )

    # Module-level actions: may return replacements for the arguments / outputs.
    def pre_forward_module_apply_impl(
        self, ctx: RunContext, module: torch.nn.Module, args: Any, kwargs: dict
    ) -> tuple[Any, dict]:
        return args, kwargs

    def post_forward_module_apply_impl(
        self, ctx: RunContext, module: torch.nn.Module, args: Any, outputs: Any
    ) -> tuple[Any, Any]:
        return args, outputs

    def post_forward_outmost_module_apply_impl(
        self, ctx: RunContext, module: torch.nn.Module, args: Any, outputs: Any
    ) -> tuple[Any, Any]:
        return args, outputs

    # Tensor-level actions, once per tensor among the inputs / outputs; may return another tensor.
    def pre_forward_tensor_apply_impl(
        self, ctx: RunContext, module: torch.nn.Module, tensor_index: int, tensor: torch.Tensor
    ) -> torch.Tensor:
        return tensor

    def post_forward_tensor_apply_impl(
        self, ctx: RunContext, module: torch.nn.Module, tensor_index: int, tensor: torch.Tensor
    ) -> torch.Tensor:
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


@dataclass
class _Subscription:
    manager: SubscriberManager
    info: tuple[int, int, str]  # pre-order index, depth, path from the subscribed module
    outermost: bool


# module -> its subscriptions, in registration order (one pair of torch hooks per module).
_subscriptions: weakref.WeakKeyDictionary[torch.nn.Module, list[_Subscription]] = (
    weakref.WeakKeyDictionary()
)


_generation = 0  # counts subscribe() calls: a cached hook_signature is valid while it is unchanged


def generation() -> int:
    return _generation


def _acts_before_forward(module: torch.nn.Module) -> bool:
    """Whether a subscriber of `module` overrides a pre-forward action: only then does a captured
    graph need a Hook node (a call into Python) at the module's inputs."""
    return any(
        type(s).pre_forward_module_apply_impl is not SubscriberBase.pre_forward_module_apply_impl
        or type(s).pre_forward_tensor_apply_impl is not SubscriberBase.pre_forward_tensor_apply_impl
        for sub in _subscriptions.get(module, ())
        for s in sub.manager._subscribers
    )


def hook_signature(root: torch.nn.Module) -> tuple[str, ...]:
    """The subscribed modules under `root` (with "+pre" when they act before forward): a graph
    captured with hooks is valid for these only."""
    return tuple(
        name + ("+pre" if _acts_before_forward(m) else "")
        for name, m in root.named_modules()
        if _subscriptions.get(m)
    )


def run_pre(module: torch.nn.Module, args: Any, kwargs: dict) -> tuple[Any, dict]:
    for sub in _subscriptions.get(module, ()):
        args, kwargs = sub.manager._pre(sub, module, args, kwargs)
    return args, kwargs


def run_post(module: torch.nn.Module, args: Any, outputs: Any) -> Any:
    for sub in _subscriptions.get(module, ()):
        outputs = sub.manager._post(sub, module, args, outputs)
    return outputs


class hooks_suppressed:
    """A block in which subscribed hooks do nothing (the shape-finding run of an eager island's
    forward while its GraphModule captures: fake tensors, not a step)."""

    def __enter__(self) -> None:
        self._previous = getattr(_state, "suppressed", False)
        _state.suppressed = True

    def __exit__(self, *exc: object) -> None:
        _state.suppressed = self._previous


def _pre_hook(module: torch.nn.Module, args: Any, kwargs: dict) -> Any:
    if not _subscriptions.get(module) or getattr(_state, "suppressed", False):
        return None
    if capturing():
        path = _capture_path(module)
        if path is None or not _acts_before_forward(module):
            return None
        return _callbacks.mark("pre", path, (args, kwargs))
    return run_pre(module, args, kwargs)


def _post_hook(module: torch.nn.Module, args: Any, kwargs: dict, outputs: Any) -> Any:
    if not _subscriptions.get(module) or getattr(_state, "suppressed", False):
        return None
    if capturing():
        path = _capture_path(module)
        return None if path is None else _callbacks.mark("post", path, outputs, passive=args)
    return run_post(module, args, outputs)


def _graph_hook(kind: str, path: str, run: _callbacks.CallbackRun, value: Any, passive: Any) -> Any:
    module = run.module_at(path)
    if kind == "pre":
        return run_pre(module, *value)
    return run_post(module, passive, value)


_callbacks.register_hook_kind("pre", _graph_hook)
_callbacks.register_hook_kind("post", _graph_hook)


class SubscriberManager:
    """Attaches subscribers to a model (a plain nn.Module, or a GraphModule's wrapped model, before
    or after wrapping). Modules are indexed in pre-order with their depth; subscribers run in
    registration order; the step counts forwards of the outermost module. Inside a GraphModule the
    same actions run at the same module boundaries, from Hook nodes of the graph."""

    def __init__(self) -> None:
        self.step = 0
        self._subscribers: list[SubscriberBase] = []

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
        global _generation
        _generation += 1
        self._subscribers.extend(s for s in subscribers if s not in self._subscribers)
        for index, (name, sub) in enumerate(module.named_modules()):
            depth = 0 if name == "" else name.count(".") + 1
            entries = _subscriptions.get(sub)
            if entries is None:
                entries = _subscriptions[sub] = []
                sub.register_forward_pre_hook(_pre_hook, with_kwargs=True)
                sub.register_forward_hook(_post_hook, with_kwargs=True)
            if not any(e.manager is self for e in entries):
                entries.append(_Subscription(self, (index, depth, name), name == ""))

    def _pre(
        self, sub: _Subscription, module: torch.nn.Module, args: Any, kwargs: dict
    ) -> tuple[Any, dict]:
        ctx = RunContext(self.step, *sub.info)
        for s in self._subscribers:
            if not s.active(ctx.step):
                continue
            args, kwargs = s.pre_forward_module_apply_impl(ctx, module, args, kwargs)
            args = _map_tensors(
                args, lambda i, t, s=s: s.pre_forward_tensor_apply_impl(ctx, module, i, t)
            )
        return args, kwargs

    def _post(self, sub: _Subscription, module: torch.nn.Module, args: Any, outputs: Any) -> Any:
        ctx = RunContext(self.step, *sub.info)
        for s in self._subscribers:
            if not s.active(ctx.step):
                continue
            args, outputs = s.post_forward_module_apply_impl(ctx, module, args, outputs)
            outputs = _map_tensors(
                outputs, lambda i, t, s=s: s.post_forward_tensor_apply_impl(ctx, module, i, t)
            )
            if sub.outermost:
                args, outputs = s.post_forward_outmost_module_apply_impl(ctx, module, args, outputs)
        if sub.outermost:
            self.step += 1
        return outputs


GlobalSubscriberManager = SubscriberManager()

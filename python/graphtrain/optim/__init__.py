"""Fused optimizers: torch.optim.AdamW and torch.optim.SGD whose step runs as one multi-tensor loop
in graphtrain's C++ engine, on its thread pool.

They are drop-in: the same constructor arguments, param groups, state (`step`, `exp_avg`,
`exp_avg_sq`, `max_exp_avg_sq`, `momentum_buffer`) and `state_dict()` as torch's, so LR schedulers,
checkpoints and code that reads the state keep working, and a state dict moves between the two.
The update follows torch's order of operations, so losses match torch.optim within float rounding.
Parameters that are not contiguous float32 CPU tensors step through torch's own formula.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from itertools import chain
from typing import Any

import torch
from torch.optim.optimizer import _global_optimizer_post_hooks, _global_optimizer_pre_hooks

from .. import _C

__all__ = ["AdamW", "SGD"]


def _with_step_hooks(step: Callable[..., Any]) -> Callable[..., Any]:
    """`step` with torch's step pre- and post-hooks (global and the optimizer's), as torch's own
    wrapper runs them, and its profiler label only while torch's profiler records: that wrapper
    opens a record_function each step, ~0.15 ms, a quarter of AdamW's whole step on a small model.
    Marked hooked, so torch.optim.Optimizer does not wrap it again."""

    @functools.wraps(step)
    def wrapper(self: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> Any:
        if torch.autograd._profiler_enabled():
            name = f"Optimizer.step#{type(self).__name__}.step"
            with torch.autograd.profiler.record_function(name):
                return _hooked(self, step, args, kwargs)
        return _hooked(self, step, args, kwargs)

    wrapper.hooked = True  # type: ignore[attr-defined]
    return wrapper


def _hooked(self: torch.optim.Optimizer, step: Callable[..., Any], args: Any, kwargs: Any) -> Any:
    for pre_hook in chain(
        _global_optimizer_pre_hooks.values(), self._optimizer_step_pre_hooks.values()
    ):
        result = pre_hook(self, (self, *args), kwargs)
        if result is not None:
            if not (isinstance(result, tuple) and len(result) == 2):
                raise RuntimeError(
                    f"an optimizer step pre-hook must return None or (args, kwargs), got {result}"
                )
            (_, *args), kwargs = result
    out = step(self, *args, **kwargs)
    self._optimizer_step_code()
    for post_hook in chain(
        self._optimizer_step_post_hooks.values(), _global_optimizer_post_hooks.values()
    ):
        post_hook(self, (self, *args), kwargs)
    return out


class _FastZeroGrad:
    """zero_grad(set_to_none=True) as a plain loop: torch's opens a record_function per call."""

    param_groups: list[dict[str, Any]]

    def zero_grad(self, set_to_none: bool = True) -> None:
        if not set_to_none or torch.autograd._profiler_enabled():
            super().zero_grad(set_to_none)  # type: ignore[misc]
            return
        for group in self.param_groups:
            for p in group["params"]:
                p.grad = None


def _fusible(*tensors: torch.Tensor) -> bool:
    for t in tensors:
        if t.dtype is not torch.float32 or not t.is_cpu or not t.is_contiguous():
            return False
    return True


def _evaluate(closure: Callable[[], Any] | None) -> Any:
    """The closure's loss, computed with gradients on (as torch's optimizers do)."""
    if closure is None:
        return None
    with torch.enable_grad():
        return closure()


def _grad(p: torch.Tensor, name: str) -> torch.Tensor:
    if p.grad.is_sparse:
        raise RuntimeError(f"graphtrain.optim.{name} does not support sparse gradients")
    return p.grad


class AdamW(_FastZeroGrad, torch.optim.AdamW):
    """torch.optim.AdamW with a fused step (see the module's doc)."""

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        amsgrad: bool = False,
        *,
        maximize: bool = False,
    ) -> None:
        super().__init__(
            params,
            lr=lr,
            betas=betas,
            eps=eps,
            weight_decay=weight_decay,
            amsgrad=amsgrad,
            maximize=maximize,
            foreach=False,
        )
        self._plans: dict[int, _AdamWPlan] = {}

    @_with_step_hooks
    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = _evaluate(closure)
        for group in self.param_groups:
            columns = self._planned_columns(group) or self._columns(group)
            if not columns:
                continue
            beta1, beta2 = (float(b) for b in group["betas"])
            _C.adamw_step(
                *columns[:4],
                columns[4] if group["amsgrad"] else [],
                columns[6],
                columns[5],
                float(group["lr"]),
                beta1,
                beta2,
                float(group["eps"]),
                float(group["weight_decay"]),
                group["amsgrad"],
                group["maximize"],
            )
        return loss

    def _columns(self, group: dict[str, Any]) -> list[list[int]] | None:
        """The fused loop's columns for this step (pointers of the parameters, gradients, exp_avg,
        exp_avg_sq, max_exp_avg_sq and step counts, then sizes); the parameters it cannot take
        step through torch's formula here. Where it takes them all, the plan is kept for the next
        steps (_planned_columns)."""
        amsgrad = group["amsgrad"]
        fused: list[tuple[torch.Tensor, ...]] = []
        states: list[dict[str, Any]] = []
        for p in group["params"]:
            if p.grad is None:
                continue
            grad = _grad(p, "AdamW")
            state = self.state[p]
            if len(state) == 0:  # as torch initializes it
                state["step"] = torch.tensor(0.0, dtype=torch.float32)
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                if amsgrad:
                    state["max_exp_avg_sq"] = torch.zeros_like(
                        p, memory_format=torch.preserve_format
                    )
            m, v, count = state["exp_avg"], state["exp_avg_sq"], state["step"]
            vmax = state["max_exp_avg_sq"] if amsgrad else v
            # The fused step counts too (a 0-d tensor op costs microseconds each).
            if _fusible(p, grad, m, v, vmax, count) and count.dim() == 0:
                fused.append((p, grad, m, v, vmax, count))
                states.append(state)
            else:
                count += 1
                _torch_adamw(p, grad, m, v, vmax, count.item(), group)
                states.append({})  # (no plan: this parameter steps through torch)
        if not fused:
            return None
        columns = [[t.data_ptr() for t in column] for column in zip(*fused)]
        columns.append([p.numel() for p, *_ in fused])
        if all(states):
            self._plans[id(group)] = _AdamWPlan(group, fused, states, columns)
        return columns

    def _planned_columns(self, group: dict[str, Any]) -> list[list[int]] | None:
        """The columns of the step before, with this step's gradients, where nothing they were made
        from has changed: the group's parameters (each at the same address, the same ones with a
        gradient), their state tensors, the gradients fit for the loop; else None. The full walk
        costs ~8 us a parameter in Python, this ~1."""
        plan = self._plans.get(id(group))
        if plan is None or plan.group is not group or plan.amsgrad != group["amsgrad"]:
            return None
        params = group["params"]
        if len(params) != len(plan.params) or any(a is not b for a, b in zip(params, plan.params)):
            return None
        grads = []
        for p, ptr, state, m, v, vmax, count in plan.entries:
            g = p.grad
            if (
                g is None
                or g.dtype is not torch.float32
                or g.layout is not torch.strided
                or not g.is_cpu
                or not g.is_contiguous()
                or p.data_ptr() != ptr
                or self.state.get(p) is not state
                or state.get("exp_avg") is not m
                or state.get("exp_avg_sq") is not v
                or state.get("step") is not count
                or (plan.amsgrad and state.get("max_exp_avg_sq") is not vmax)
            ):
                return None
            grads.append(g.data_ptr())
        if any(p.grad is not None for p in plan.idle):
            return None
        columns = list(plan.columns)
        columns[1] = grads
        return columns

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._plans = {}
        super().load_state_dict(state_dict)

    def __setstate__(self, state: dict[str, Any]) -> None:
        # A copy or unpickled optimizer (torch pickles defaults, state and groups) plans anew.
        super().__setstate__(state)
        self._plans = {}


class _AdamWPlan:
    """What AdamW._columns found for a group whose parameters all step in the fused loop."""

    def __init__(
        self,
        group: dict[str, Any],
        fused: list[tuple[torch.Tensor, ...]],
        states: list[dict[str, Any]],
        columns: list[list[int]],
    ) -> None:
        self.group = group
        self.amsgrad = group["amsgrad"]
        self.params = tuple(group["params"])
        self.entries = [
            (p, ptr, state, m, v, vmax, count)
            for (p, _, m, v, vmax, count), state, ptr in zip(fused, states, columns[0])
        ]
        with_grad = {id(p) for p, *_ in fused}
        self.idle = [p for p in self.params if id(p) not in with_grad]
        self.columns = columns


def _torch_adamw(
    p: torch.Tensor,
    grad: torch.Tensor,
    m: torch.Tensor,
    v: torch.Tensor,
    vmax: torch.Tensor,
    step: float,
    group: dict[str, Any],
) -> None:
    """torch's single-tensor AdamW update, for a parameter the fused loop does not take."""
    beta1, beta2 = group["betas"]
    lr = group["lr"]
    if group["maximize"]:
        grad = -grad
    p.mul_(1 - lr * group["weight_decay"])
    m.lerp_(grad, 1 - beta1)
    v.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    step_size = lr / (1 - beta1**step)
    bc2_sqrt = (1 - beta2**step) ** 0.5
    if group["amsgrad"]:
        torch.maximum(vmax, v, out=vmax)
        v = vmax
    p.addcdiv_(m, (v.sqrt() / bc2_sqrt).add_(group["eps"]), value=-step_size)


class SGD(_FastZeroGrad, torch.optim.SGD):
    """torch.optim.SGD with a fused step (see the module's doc)."""

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        momentum: float = 0,
        dampening: float = 0,
        weight_decay: float = 0,
        nesterov: bool = False,
        *,
        maximize: bool = False,
    ) -> None:
        super().__init__(
            params,
            lr=lr,
            momentum=momentum,
            dampening=dampening,
            weight_decay=weight_decay,
            nesterov=nesterov,
            maximize=maximize,
            foreach=False,
        )

    @_with_step_hooks
    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = _evaluate(closure)
        for group in self.param_groups:
            momentum = float(group["momentum"])
            fused: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
            first: list[bool] = []
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = _grad(p, "SGD")
                state = self.state[p]
                buf = state.get("momentum_buffer")
                new = momentum != 0 and buf is None
                if new:  # filled by the step (torch starts it as the decayed gradient)
                    buf = state["momentum_buffer"] = torch.empty_like(
                        p, memory_format=torch.preserve_format
                    )
                if _fusible(p, grad, *([buf] if momentum != 0 else [])):
                    fused.append((p, grad, buf if momentum != 0 else p))
                    first.append(new)
                else:
                    _torch_sgd(p, grad, buf, new, group)
            if fused:
                ptrs = [[t.data_ptr() for t in column] for column in zip(*fused)]
                _C.sgd_step(
                    ptrs[0],
                    ptrs[1],
                    ptrs[2] if momentum != 0 else [],
                    [p.numel() for p, *_ in fused],
                    first,
                    float(group["lr"]),
                    momentum,
                    float(group["dampening"]),
                    float(group["weight_decay"]),
                    group["nesterov"],
                    group["maximize"],
                )
        return loss


def _torch_sgd(
    p: torch.Tensor,
    grad: torch.Tensor,
    buf: torch.Tensor | None,
    new: bool,
    group: dict[str, Any],
) -> None:
    """torch's single-tensor SGD update, for a parameter the fused loop does not take."""
    if group["maximize"]:
        grad = -grad
    if group["weight_decay"] != 0:
        grad = grad.add(p, alpha=group["weight_decay"])
    if buf is not None:
        if new:
            buf.copy_(grad)
        else:
            buf.mul_(group["momentum"]).add_(grad, alpha=1 - group["dampening"])
        grad = grad.add(buf, alpha=group["momentum"]) if group["nesterov"] else buf
    p.add_(grad, alpha=-group["lr"])

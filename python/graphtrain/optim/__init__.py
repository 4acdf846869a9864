"""Fused optimizers: torch.optim.AdamW and torch.optim.SGD whose step runs as one multi-tensor loop
in graphtrain's C++ engine, on its thread pool.

They are drop-in: the same constructor arguments, param groups, state (`step`, `exp_avg`,
`exp_avg_sq`, `max_exp_avg_sq`, `momentum_buffer`) and `state_dict()` as torch's, so LR schedulers,
checkpoints and code that reads the state keep working, and a state dict moves between the two.
The update follows torch's order of operations, so losses match torch.optim within float rounding.
Parameters that are not contiguous float32 CPU tensors step through torch's own formula.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch

from .. import _C

__all__ = ["AdamW", "SGD"]


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


class AdamW(torch.optim.AdamW):
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

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = _evaluate(closure)
        for group in self.param_groups:
            amsgrad = group["amsgrad"]
            beta1, beta2 = (float(b) for b in group["betas"])
            lr, wd, eps = float(group["lr"]), float(group["weight_decay"]), float(group["eps"])
            live: list[tuple[torch.Tensor, torch.Tensor, dict[str, Any]]] = []
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if len(state) == 0:  # as torch initializes it
                    state["step"] = torch.tensor(0.0, dtype=torch.float32)
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    if amsgrad:
                        state["max_exp_avg_sq"] = torch.zeros_like(
                            p, memory_format=torch.preserve_format
                        )
                live.append((p, _grad(p, "AdamW"), state))
            if not live:
                continue
            fused: list[tuple[torch.Tensor, ...]] = []
            for p, grad, state in live:
                m, v, count = state["exp_avg"], state["exp_avg_sq"], state["step"]
                vmax = state["max_exp_avg_sq"] if amsgrad else v
                # The fused step counts too (a 0-d tensor op costs microseconds each).
                if _fusible(p, grad, m, v, vmax, count) and count.dim() == 0:
                    fused.append((p, grad, m, v, vmax, count))
                else:
                    count += 1
                    _torch_adamw(p, grad, m, v, vmax, count.item(), group)
            if fused:
                ptrs = [[t.data_ptr() for t in column] for column in zip(*fused)]
                _C.adamw_step(
                    ptrs[0],
                    ptrs[1],
                    ptrs[2],
                    ptrs[3],
                    ptrs[4] if amsgrad else [],
                    [p.numel() for p, *_ in fused],
                    ptrs[5],
                    lr,
                    beta1,
                    beta2,
                    eps,
                    wd,
                    amsgrad,
                    group["maximize"],
                )
        return loss


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


class SGD(torch.optim.SGD):
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

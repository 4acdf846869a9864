"""The Python side of callback nodes (cpp/include/graphtrain/callback.h).

At capture, a subscribed module's boundaries (and `inspect_activation` calls) become
`graphtrain::hook` custom ops in the exported program, which translate into `Hook` nodes. At run
time the engine calls `dispatch` for each callback node: a Hook runs the module's subscribers on
torch tensors that share the engine's memory, and returns what they return; its `HookGrad` runs the
tensor hooks those subscribers registered, through torch autograd, on the gradients. PythonOps
(`custom_function`) use the same path.

What a forward run keeps for its backward (the tensors a hook saw, a Function's autograd graph)
lives in a `CallbackRun`; the int64 context a callback node returns indexes into it.
"""

from __future__ import annotations

import functools
import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.utils import _pytree as pytree

from . import _C
from ._structure import describe_structure, leaf_from_json, rebuild
from ._translate import register_translator

_local = threading.local()


class CallbackRun:
    """One engine run of a GraphModule's graph: its model, whether a backward will follow, and
    what its callback nodes kept for that backward."""

    def __init__(self, module: torch.nn.Module, training: bool) -> None:
        self.module = module
        self.training = training
        self._kept: dict[int, Any] = {}
        self._next = 0
        self._modules: dict[str, torch.nn.Module] = {}

    def keep(self, entry: Any) -> int:
        key = self._next
        self._next += 1
        self._kept[key] = entry
        return key

    def take(self, key: int) -> Any:
        return self._kept.pop(key, None)

    def peek(self, key: int) -> Any:
        return self._kept.get(key)

    def module_at(self, path: str) -> torch.nn.Module:
        m = self._modules.get(path)
        if m is None:
            m = self._modules[path] = self.module.get_submodule(path) if path else self.module
        return m


@contextmanager
def recording(run: CallbackRun | None) -> Iterator[None]:
    """Callback nodes of engine runs inside this block belong to `run`."""
    previous = getattr(_local, "run", None)
    _local.run = run
    try:
        yield
    finally:
        _local.run = previous


def current_run() -> CallbackRun:
    run = getattr(_local, "run", None)
    if run is None:
        raise RuntimeError(
            "a graphtrain callback node ran outside a GraphModule call; graphs with hooks or "
            "PythonOps run through GraphModule"
        )
    return run


def context_tensor(key: int) -> torch.Tensor:
    return torch.tensor(key, dtype=torch.int64)


@functools.lru_cache(maxsize=4096)
def parsed_info(info: str) -> dict:
    """A callback node's `info` attribute, decoded once (the result is shared: read it only)."""
    d = json.loads(info)
    for part in ("value", "passive"):
        if part in d:
            d[part]["treespec"] = pytree.treespec_loads(d[part]["spec"])
            d[part]["decoded"] = [leaf_from_json(x) for x in d[part]["leaves"]]
    return d


# ---- the marker op of capture ----------------------------------------------------------------------


@torch.library.custom_op("graphtrain::hook", mutates_args=())
def _hook_op(
    xs: list[torch.Tensor], kind: str, module: str, num_passive: int, info: str
) -> list[torch.Tensor]:
    return [x.clone() for x in xs[num_passive:]]


@_hook_op.register_fake
def _(
    xs: list[torch.Tensor], kind: str, module: str, num_passive: int, info: str
) -> list[torch.Tensor]:
    return [torch.empty_like(x) for x in xs[num_passive:]]


def _hook_op_backward(ctx: Any, grads: list[torch.Tensor]) -> tuple:
    return None, None, None, None, None


torch.library.register_autograd("graphtrain::hook", _hook_op_backward)

HOOK_OP = torch.ops.graphtrain.hook.default


def mark(kind: str, module: str, value: Any, passive: Any = ()) -> Any:
    """At capture: routes the tensors of `value` through a Hook node (reading those of `passive`
    too) and returns `value` rebuilt with the node's outputs."""
    tensors, desc = describe_structure(value)
    passive_tensors, passive_desc = describe_structure(passive)
    if not tensors:
        return value
    info = json.dumps({"value": desc, "passive": passive_desc})
    outs = iter(_hook_op(passive_tensors + tensors, kind, module, len(passive_tensors), info))
    leaves, spec = pytree.tree_flatten(value)
    return pytree.tree_unflatten(
        [next(outs) if isinstance(x, torch.Tensor) else x for x in leaves], spec
    )


# ---- run time ------------------------------------------------------------------------------------

HookHandler = Callable[[str, str, CallbackRun, Any, Any], Any]
# kind -> fn(kind, module path, run, value, passive) -> new value; set by graphtrain.hooks
HOOK_KINDS: dict[str, HookHandler] = {}


def _hook(attrs: dict, inputs: list[Any]) -> list[Any]:
    run = current_run()
    info = parsed_info(attrs["info"])
    kind, path, p = attrs["kind"], attrs["module"], attrs["num_passive"]
    values = inputs[p:]
    proxies = list(values)
    if run.training:  # tensors the backward reaches: torch tensor hooks may be registered on them
        for i, (v, rg) in enumerate(zip(values, info["value"]["requires_grad"])):
            if rg and v.is_floating_point():
                proxies[i] = v.detach().requires_grad_()
    value = rebuild(info["value"], proxies)
    passive = rebuild(info["passive"], inputs[:p])
    with torch.enable_grad() if run.training else torch.no_grad():
        new_value = HOOK_KINDS[kind](kind, path, run, value, passive)
    results = [x for x in pytree.tree_leaves(new_value) if isinstance(x, torch.Tensor)]
    where = f"the subscribers of module '{path or '(root)'}' ({kind} forward)"
    if len(results) != len(values):
        raise RuntimeError(
            f"{where} returned {len(results)} tensors where the module has {len(values)}; a "
            "subscriber may replace tensors, not add or drop them"
        )
    out: list[Any] = []
    for i, (v, r) in enumerate(zip(values, results)):
        if r is proxies[i] or r is v:
            out.append(v)
            continue
        if r.shape != v.shape or r.dtype != v.dtype:
            raise RuntimeError(
                f"{where} replaced tensor {i} ({v.dtype} {list(v.shape)}) by a {r.dtype} "
                f"{list(r.shape)} tensor; a replacement must keep shape and dtype"
            )
        out.append(r.detach().contiguous())
    # Kept for the HookGrad calls (one per value the backward reaches, `grad_values`) only when
    # they have something to run (tensor hooks, a replaced tensor's autograd graph); otherwise
    # gradients pass and the module outputs are not held until backward.
    key = -1
    waiting = set(attrs.get("grad_values", ()))
    if (
        run.training
        and waiting
        and any(
            pr is not v and (r is not pr or getattr(pr, "_backward_hooks", None))
            for pr, v, r in zip(proxies, values, results)
        )
    ):
        key = run.keep((proxies, results, waiting))
    return out + [context_tensor(key)]


def _hook_grad(attrs: dict, inputs: list[Any]) -> list[Any]:
    """The gradient of the Hook's input `index` from its whole gradient g: g through the torch
    hooks registered on the tensor passed through, or through the replacement's autograd graph."""
    run = current_run()
    key, g = int(inputs[0]), inputs[1]
    index = attrs["index"]
    entry = run.peek(key) if key >= 0 else None
    if entry is None:
        return [g]
    proxies, results, waiting = entry
    waiting.discard(index)
    if not waiting:
        run.take(key)
    proxy, result = proxies[index], results[index]
    if result is proxy:
        # Passed through: its tensor hooks, in order, each seeing the previous one's result, as
        # torch's engine runs a leaf's hooks.
        for hook in list((getattr(proxy, "_backward_hooks", None) or {}).values()):
            new = hook(g)
            g = g if new is None else new
        return [g]
    if not (isinstance(proxy, torch.Tensor) and proxy.requires_grad and result.requires_grad):
        return [g if proxy is result else torch.zeros_like(proxy)]
    (d,) = torch.autograd.grad(
        [result], [proxy], [g], retain_graph=bool(waiting), allow_unused=True
    )
    return [torch.zeros_like(proxy) if d is None else d.contiguous()]


HANDLERS: dict[str, Callable[[dict, list[Any]], list[Any]]] = {
    "Hook": _hook,
    "HookGrad": _hook_grad,
}


def register_handler(op_type: str, fn: Callable[[dict, list[Any]], list[Any]]) -> None:
    """Runs `fn(attributes, inputs) -> outputs` for every callback node of `op_type`."""
    HANDLERS[op_type] = fn


def register_hook_kind(kind: str, fn: HookHandler) -> None:
    """Runs `fn(kind, module path, run, value, passive) -> new value` for Hook nodes of `kind`."""
    HOOK_KINDS[kind] = fn


def dispatch(op_type: str, attrs: dict, inputs: list[Any]) -> list[Any]:
    return HANDLERS[op_type](attrs, inputs)


_C.set_callback(dispatch)


def _translate_hook(n: torch.fx.Node, t: Any) -> list[str]:
    xs, kind, module, num_passive, info = n.args
    outs = t.emit(
        "Hook",
        [t.value(x) for x in xs],
        n_out=len(xs) - num_passive + 1,
        domain="graphtrain",
        kind=kind,
        module=module,
        num_passive=num_passive,
        info=info,
    )
    return outs[:-1]  # the last output is the context, for HookGrad


register_translator(HOOK_OP, _translate_hook)

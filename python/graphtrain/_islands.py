"""Eager islands: named submodules of a GraphModule's model that run in PyTorch inside its graph.

At capture, each island's forward is replaced by a call of `EagerIsland`, a torch.autograd.Function
kept opaque as a PythonOp node (custom_function.py): at run time the node calls the submodule
itself on torch tensors sharing the engine's memory, with torch autograd recording it, and its
backward runs torch autograd through that call (the island's parameters accumulate `.grad` there,
as in eager mode). Everything else stays in the engine. A submodule that torch.export cannot
capture can so run eager while the rest is captured; `graphtrain-stats bisect` uses islands to find
the module whose graph execution makes a run diverge.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterable
from typing import Any

import torch
from torch.nn.utils.stateless import _reparametrize_module as reparametrized
from torch.utils import _pytree as pytree

from . import _callbacks, custom_function
from ._structure import leaf_from_json, leaf_to_json
from .errors import UnsupportedModelError
from .hooks._subscriber import hooks_suppressed

_local = threading.local()
_TENSOR = object()  # where a tensor goes among an island's outputs


def parse(names: Iterable[str] | str | None) -> tuple[str, ...]:
    """Island paths from a list or a comma-separated string (GRAPHTRAIN_EAGER_MODULES)."""
    if names is None:
        return ()
    if isinstance(names, str):
        names = names.split(",")
    return tuple(sorted({n.strip() for n in names if n.strip()}))


def check(root: torch.nn.Module, paths: tuple[str, ...]) -> None:
    """A clear error for a path that names no submodule of `root`, or a container (ModuleList,
    ModuleDict) that is never called itself."""
    known = dict(root.named_modules())
    for p in paths:
        if p in known and type(known[p]).forward is torch.nn.Module.forward:
            raise ValueError(
                f"eager module '{p}' is a {type(known[p]).__name__}, which has no forward of its "
                "own: name the submodules in it that are called"
            )
        if p not in known or p == "":
            close = [n for n in known if n and n.endswith(p.rsplit(".", 1)[-1])][:5]
            raise ValueError(
                f"eager module '{p}' is not a submodule of {type(root).__name__}"
                + (f"; modules with that last name: {', '.join(close)}" if close else "")
                + " (eager_modules= / GRAPHTRAIN_EAGER_MODULES take paths from named_modules())"
            )


def _forward(path: str) -> tuple[Any, torch.nn.Module]:
    """The island's own forward, without its hooks (they are Hook nodes around its PythonOp; its
    submodules' hooks run eagerly inside it), and the module: while capturing the saved forward,
    else the module's."""
    originals = getattr(_local, "originals", None)
    if originals is not None:  # capturing: the shapes-only run on fake tensors
        return originals[path]
    run = _callbacks.current_run()
    module = run.module.get_submodule(path) if path else run.module
    return module.forward, module


class EagerIsland(torch.autograd.Function):
    """forward(path, spec, constants, *tensors): calls the submodule at `path` with the arguments
    rebuilt from the pytree spec, the JSON constants and the tensors, and with its trainable
    parameters replaced by the last tensors (named in the spec); returns its tensor outputs. The
    parameters are inputs of the node so that the graph knows the island reads them: their
    gradients come back through the engine to torch, like every other parameter's."""

    @staticmethod
    def forward(ctx: Any, path: str, spec: str, constants: str, *tensors: torch.Tensor) -> Any:
        needs = ctx.needs_input_grad[3:]
        names = json.loads(spec)["params"]
        cut = len(tensors) - len(names)
        with torch.enable_grad():
            leaves = [t.detach().requires_grad_() if need else t for t, need in zip(tensors, needs)]
            args, kwargs = _rebuild(spec, constants, leaves[:cut])
            forward, module = _forward(path)
            with reparametrized(module, dict(zip(names, leaves[cut:])), tie_weights=True):
                if getattr(_local, "originals", None) is not None:
                    with hooks_suppressed(), _quiet_symbols(leaves):
                        try:
                            out = forward(*args, **kwargs)
                        except Exception as e:  # not on fake tensors: the example run's shapes
                            out = _recorded_outputs(path, leaves[:cut], e)
                else:
                    out = forward(*args, **kwargs)
        flat, out_spec = pytree.tree_flatten(out)
        outs = [o for o in flat if isinstance(o, torch.Tensor)]
        if not outs:
            raise UnsupportedModelError(
                f"eager module '{path}' returns no tensor ({type(out).__name__}); an eager "
                "island must return at least one tensor"
            )
        # Non-tensor parts (None, ints) are the same at every call: kept from the capture's run.
        _local.out_spec = (out_spec, [_TENSOR if isinstance(o, torch.Tensor) else o for o in flat])
        ctx.leaves, ctx.outs = leaves, outs
        ctx.needs = needs
        return tuple(o.detach() for o in outs)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> Any:
        pairs = [(o, g) for o, g in zip(ctx.outs, grads) if g is not None and o.requires_grad]
        if pairs:
            torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
        dx = [
            (leaf.grad if leaf.grad is not None else torch.zeros_like(leaf)) if need else None
            for leaf, need in zip(ctx.leaves, ctx.needs)
        ]
        return (None, None, None, *dx)


def _rebuild(spec: str, constants: str, tensors: list[torch.Tensor]) -> Any:
    it_t, it_c = iter(tensors), iter(json.loads(constants))
    leaves = [
        next(it_t) if c == "tensor" else leaf_from_json(next(it_c))
        for c in json.loads(spec)["kinds"]
    ]
    return pytree.tree_unflatten(leaves, pytree.treespec_loads(json.loads(spec)["tree"]))


def _call(path: str, args: tuple, kwargs: dict) -> Any:
    leaves, tree = pytree.tree_flatten((args, kwargs))
    kinds, tensors, constants = [], [], []
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            kinds.append("tensor")
            tensors.append(leaf)
        else:
            try:
                constants.append(leaf_to_json(leaf))
            except TypeError:
                raise UnsupportedModelError(
                    f"eager module '{path}' is called with a {type(leaf).__name__} argument, "
                    "which an eager island cannot pass; islands take tensors and plain constants"
                ) from None
            kinds.append("constant")
    module = _local.originals[path][1]
    params = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
    spec = json.dumps(
        {"kinds": kinds, "tree": pytree.treespec_dumps(tree), "params": [n for n, _ in params]}
    )
    tensors += [p for _, p in params]
    outs = custom_function.opaque_call(EagerIsland, (path, spec, json.dumps(constants), *tensors))
    it = iter([outs] if isinstance(outs, torch.Tensor) else outs)
    out_spec, others = _local.out_spec
    return pytree.tree_unflatten([next(it) if o is _TENSOR else o for o in others], out_spec)


def needs_example_run() -> bool:
    """Whether the capture that just failed had an island that could not run on fake tensors
    and no example run to take its output shapes from (see record)."""
    return getattr(_local, "needs_example", False)


def record(root: torch.nn.Module, paths: tuple[str, ...], args: tuple, kwargs: dict) -> None:
    """Runs `root` once in eager mode on the example inputs (no gradient, subscribers quiet) and
    keeps each island's tensor input sizes and outputs: the output shapes of an island whose
    forward cannot run on torch.export's fake tensors (data-dependent Python control flow)."""
    seen: dict[str, Any] = {}
    handles = []
    # The run leaves no trace: buffers (BatchNorm's running statistics) and the RNG are restored.
    buffers = [(b, b.detach().clone()) for b in root.buffers()]
    rng = torch.get_rng_state()
    for path in paths:

        def hook(module: Any, a: tuple, k: dict, out: Any, path: str = path) -> None:
            ins = [t.shape for t in pytree.tree_leaves((a, k)) if isinstance(t, torch.Tensor)]
            seen.setdefault(path, (ins, pytree.tree_map_only(torch.Tensor, _Meta, out)))

        module = root.get_submodule(path)
        handles.append(module.register_forward_hook(hook, with_kwargs=True))
    try:
        with torch.no_grad(), hooks_suppressed():
            root(*args, **kwargs)
    except Exception:  # noqa: S110 - the capture that follows reports what goes wrong
        pass
    finally:
        for h in handles:
            h.remove()
        with torch.no_grad():
            for b, saved in buffers:
                b.copy_(saved)
        torch.set_rng_state(rng)
    _local.recorded = seen


def _quiet_symbols(tensors: list[Any]) -> Any:
    """While an island's forward runs on fake tensors: sizes it reads from data (x.sum() > 0 asks
    for one) are not outputs of the op, and torch.export must not wait for them."""
    mode = torch._guards.detect_fake_mode(tensors)
    env = getattr(mode, "shape_env", None)
    return env.ignore_fresh_unbacked_symbols() if env is not None else contextlib.nullcontext()


class _Meta:
    def __init__(self, t: torch.Tensor) -> None:
        self.shape, self.dtype = tuple(t.shape), t.dtype


def _recorded_outputs(path: str, inputs: list[torch.Tensor], error: Exception) -> Any:
    """Empty tensors of the island's recorded output shapes, each dim that equals an input's dim
    in the example run taken from that input (so batch and sequence sizes stay symbolic)."""
    recorded = getattr(_local, "recorded", {}).get(path)
    if recorded is None:
        _local.needs_example = True
        raise error
    shapes, out = recorded
    dims: dict[int, Any] = {}
    for shape, x in zip(shapes, [t for t in inputs if isinstance(t, torch.Tensor)]):
        for size, sym in zip(shape, x.shape):
            dims.setdefault(size, sym)
    return pytree.tree_map_only(
        _Meta, lambda m: torch.empty([dims.get(d, d) for d in m.shape], dtype=m.dtype), out
    )


class islands:
    """While GraphModule captures `root`: the submodules at `paths` are called through
    EagerIsland (their forwards replaced on the instances, restored after)."""

    def __init__(self, root: torch.nn.Module, paths: tuple[str, ...]) -> None:
        self.root, self.paths = root, paths

    def __enter__(self) -> None:
        _local.needs_example = False
        self._previous = getattr(_local, "originals", None)
        _local.originals = {}
        self._saved = []
        for path in self.paths:
            module = self.root.get_submodule(path)
            self._saved.append((module, module.__dict__.get("forward")))
            _local.originals[path] = (module.forward, module)
            module.forward = lambda *a, _p=path, **k: _call(_p, a, k)

    def __exit__(self, *exc: object) -> None:
        for module, forward in self._saved:
            if forward is None:
                del module.forward
            else:
                module.forward = forward
        _local.originals = self._previous
        _local.recorded = {}

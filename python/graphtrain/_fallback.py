"""The ATen fallback: an ATen op that graphtrain cannot run natively becomes an `ATenOp` callback
node (cpp/include/graphtrain/callback.h) that calls PyTorch's own kernel on the engine's tensors
(DLPack, zero copy). Its output shapes are the ones torch.export recorded, in the graph's symbolic
dims; its gradient (`ATenOpGrad`) is computed by torch autograd through what the forward call
recorded, the same host-callback path as PythonOp.

An in-place ATen op writes into a copy of its first input; later readers see the node's output.
"""

from __future__ import annotations

import functools
import json
from typing import TYPE_CHECKING, Any

import torch
from torch.utils import _pytree as pytree

from . import _callbacks
from ._structure import TENSOR, leaf_from_json, leaf_to_json
from ._translate import val, writes_first_argument
from .errors import GraphError

if TYPE_CHECKING:
    from ._capture import Translator

_SYMINT = {"__symint__": 1}


def applies(node: torch.fx.Node) -> bool:
    """Whether `node` may fall back: a call of an ATen op overload."""
    return isinstance(node.target, torch._ops.OpOverload) and node.target.namespace == "aten"


def target_name(target: torch._ops.OpOverload) -> str:
    """ "aten.cumsum.default": the name an ATenOp calls its op by."""
    return f"aten.{target._schema.name.split('::')[1]}.{target._overloadname}"


def _dim(d: Any) -> str:
    """A dim as the engine's symbolic dims read it: "64", "s0", "2*s0", "s0*s1 + 1"; "?" for an
    expression they cannot (floor division, min/max), which becomes a fresh dim."""
    if isinstance(d, int):
        return str(d)
    text = str(d).replace(" ", "")
    if all(c.isalnum() or c in "*+-_" for c in text):
        return text
    return "?"


def _tensor_outputs(node: torch.fx.Node, t: Translator) -> list[torch.Tensor]:
    meta = val(node)
    outs = [meta] if isinstance(meta, torch.Tensor) else list(meta or ())
    if not outs or not all(isinstance(o, torch.Tensor) for o in outs):
        t.unsupported(
            node,
            f"an op returning {type(meta).__name__} (the ATen fallback runs ops "
            "that return tensors)",
        )
    return outs


def translate(node: torch.fx.Node, t: Translator, why: str) -> Any:
    """Emits the ATenOp of `node`; returns its output value name(s)."""
    target = node.target
    flat, spec = pytree.tree_flatten((list(node.args), dict(node.kwargs)))
    inputs: list[str] = []
    input_dtypes: list[int] = []
    leaves: list[Any] = []
    for x in flat:
        if isinstance(x, torch.fx.Node):
            v = val(x)
            if isinstance(v, torch.Tensor):
                leaves.append(leaf_to_json(TENSOR))
                input_dtypes.append(t.onnx_dtype(v.dtype))
            elif isinstance(v, torch.SymInt):
                leaves.append(_SYMINT)
                input_dtypes.append(t.onnx_dtype(torch.int64))
            else:
                t.unsupported(node, f"an argument of type {type(v).__name__}")
            inputs.append(t.value(x))
            continue
        try:
            leaves.append(leaf_to_json(x))
        except TypeError:
            t.unsupported(node, f"an argument of type {type(x).__name__} ({x!r})")
    outs_meta = _tensor_outputs(node, t)
    in_place = writes_first_argument(node)  # it writes (a copy of) its first input
    info = json.dumps({"spec": pytree.treespec_dumps(spec), "leaves": leaves})
    attrs: dict[str, Any] = dict(
        target=target_name(target),
        info=info,
        reason=why,
        input_dtypes=input_dtypes,
        output_dtypes=[t.onnx_dtype(m.dtype) for m in outs_meta],
        output_shapes=[";".join(_dim(d) for d in m.shape) for m in outs_meta],
        in_place=int(in_place),
    )
    attrs = {k: v for k, v in attrs.items() if v != []}  # ONNX cannot type an empty list
    outs = t.emit("ATenOp", inputs, n_out=len(outs_meta) + 1, domain="graphtrain", **attrs)
    if in_place and isinstance(val(node), torch.Tensor):
        t.mutated(node.args[0], outs[0])  # an in-place op returns what it wrote
    result = outs[:-1]
    return result[0] if isinstance(val(node), torch.Tensor) else result


def fallback_ops(model: Any) -> dict[str, list[str]]:
    """ATen op -> the modules where it runs through PyTorch, for the ATenOp nodes of a captured
    graph (a graphtrain._C.Model)."""
    found: dict[str, list[str]] = {}
    for scope, attrs in model.nodes("ATenOp", "graphtrain"):
        modules = found.setdefault(attrs.get("target", "?"), [])
        if (scope or "(top level)") not in modules:
            modules.append(scope or "(top level)")
    return found


def describe_fallbacks(found: dict[str, list[str]]) -> str:
    """ "aten.cumsum.default (in 'blocks.0', 'blocks.1'), ...", for warnings and explain."""
    parts = []
    for target, modules in sorted(found.items()):
        shown = ", ".join(f"'{m}'" for m in modules[:4])
        more = f" and {len(modules) - 4} more" if len(modules) > 4 else ""
        parts.append(f"{target} (in {shown}{more})")
    return "; ".join(parts)


# ---- run time ------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=1024)
def _resolve(target: str) -> Any:
    _, name, overload = target.split(".")
    try:
        return getattr(getattr(torch.ops.aten, name), overload)
    except AttributeError as e:
        raise GraphError(
            f"this graph calls ATen op {target}, which this PyTorch ({torch.__version__}) does not "
            "have; capture the model again with this PyTorch (clear GRAPHTRAIN_CACHE_DIR)"
        ) from e


@functools.lru_cache(maxsize=4096)
def _parsed(info: str) -> tuple[Any, list[Any]]:
    d = json.loads(info)
    leaves = [_SYMINT if x == _SYMINT else leaf_from_json(x) for x in d["leaves"]]
    return pytree.treespec_loads(d["spec"]), leaves


def _run_forward(attrs: dict, inputs: list[Any]) -> list[Any]:
    run = _callbacks.current_run()
    op = _resolve(attrs["target"])
    treespec, leaves = _parsed(attrs["info"])
    in_place = attrs.get("in_place", 0)
    wants = attrs.get("grad_inputs", [])  # set by the gradient builder on training graphs
    bases: list[torch.Tensor | None] = []  # per input: the leaf its gradient is taken for
    with torch.enable_grad() if run.training else torch.no_grad():
        values = []
        for j, x in enumerate(inputs):
            base = x.detach()
            grad = run.training and base.is_floating_point() and j < len(wants) and wants[j]
            if grad:
                base.requires_grad_()
            bases.append(base if grad else None)
            values.append(base.clone() if in_place and j == 0 else base)
        it = iter(values)
        args = [
            int(next(it).reshape(-1)[0]) if x is _SYMINT else next(it) if x is TENSOR else x
            for x in leaves
        ]
        call_args, call_kwargs = pytree.tree_unflatten(args, treespec)
        out = op(*call_args, **call_kwargs)
    outs = [out] if isinstance(out, torch.Tensor) else list(out)
    if len(outs) != len(attrs["output_dtypes"]):
        raise GraphError(
            f"ATen op {attrs['target']} returned {len(outs)} tensors at run time, "
            f"{len(attrs['output_dtypes'])} at capture"
        )
    keep = run.training and any(o.requires_grad for o in outs)
    key = run.keep((bases, outs)) if keep else -1
    return [o.detach() for o in outs] + [_callbacks.context_tensor(key)]


def _run_backward(attrs: dict, inputs: list[Any]) -> list[Any]:
    run = _callbacks.current_run()
    key = int(inputs[0])
    entry = run.take(key) if key >= 0 else None
    n = len(attrs.get("input_dtypes", []))
    if entry is None:
        return [None] * n
    bases, outs = entry
    pairs = [(o, g) for o, g in zip(outs, inputs[1:]) if g is not None and o.requires_grad]
    wrt = [b for b in bases if b is not None]
    got = iter(
        torch.autograd.grad([o for o, _ in pairs], wrt, [g for _, g in pairs], allow_unused=True)
        if pairs and wrt
        else [None] * len(wrt)
    )
    result: list[Any] = []
    for b in bases:
        if b is None:
            result.append(None)
            continue
        g = next(got)
        result.append(torch.zeros_like(b) if g is None else g.contiguous())
    return result


_callbacks.register_handler("ATenOp", _run_forward)
_callbacks.register_handler("ATenOpGrad", _run_backward)

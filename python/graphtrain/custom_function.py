"""Custom torch.autograd.Functions kept opaque in captured graphs, as `PythonOp` nodes.

At capture, `Function.apply` inside the module becomes one `graphtrain::python_op` custom op of the
exported program (its fake kernel runs the user's forward on fake tensors, which gives the output
shapes), then one `PythonOp` node of the IR named by the class's qualified name. At run time the
node calls `Function.apply` itself on torch tensors sharing the engine's memory, so the user's
forward runs with a real autograd context (save_for_backward, needs_input_grad,
mark_non_differentiable, mark_dirty, attributes); its `PythonOpGrad` node runs torch autograd
backward through that very context.

Shape inference: `register_shape_inferer(func_or_qualified_name, fn)`, or a static
`infer_shape(node, input_shapes, input_dtypes) -> (output_shapes, output_dtypes)` on the Function,
found by itself. Shapes are lists of ints and symbolic dim names ("batch", "batch*seq").

Decompositions: `register_decomposition(func_or_qualified_name, fn)` declares that the Function
computes fn(*args) in torch ops and that its backward is the gradient of that: GraphModule then
traces fn in its place, so its ops run natively and graphtrain builds the gradient, instead of a
PythonOp calling back into Python twice a step. Built in: BLOOM's GeLUFunction (the tanh GELU,
with its exact derivative as the backward), which made BLOOM's training step no faster than eager.
"""

from __future__ import annotations

import importlib
import itertools
import json
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch

from . import _C, _callbacks
from ._dtypes import ONNX_TO_TORCH, TORCH_TO_ONNX
from ._options import options
from ._structure import leaf_from_json, leaf_to_json
from ._translate import register_translator, val
from .errors import GraphError, UnsupportedModelError

InferShape = Callable[
    [dict, list[list[Any]], list[torch.dtype]],
    tuple[Sequence[Sequence[Any]], Sequence[torch.dtype]],
]

_functions: dict[str, type] = {}  # func_name -> Function class, from captures or imports
_objects: dict[int, Any] = {}  # arguments of this process's captures that cannot be stored
_notes: dict[str, dict] = {}  # call key -> what the fake run learned (outputs, dirty inputs)
_python_inferers: dict[str, InferShape] = {}  # registered through register_shape_inferer
_decompositions: dict[str, Callable[..., Any]] = {}  # registered through register_decomposition
_counter = itertools.count()
_local = threading.local()
_ORIGINAL_APPLY = torch.autograd.Function.__dict__["apply"]


def func_name(cls: type) -> str:
    """The name a PythonOp calls its Function by: module path plus qualified name."""
    return f"{cls.__module__}.{cls.__qualname__}"


def _import(name: str) -> type | str:
    """The Function class a PythonOp names, imported by name, or why it cannot be."""
    parts = name.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for attr in parts[cut:]:
                obj = getattr(obj, attr)
        except AttributeError as e:
            return str(e)
        if isinstance(obj, type) and issubclass(obj, torch.autograd.Function):
            return obj
        return f"it is a {type(obj).__name__}, not a torch.autograd.Function"
    return "no module of that name"


def not_importable(names: Iterable[str]) -> str:
    """Why one of these PythonOp Functions could not be imported by name in another process, or
    "" when each can be."""
    for name in names:
        found = _import(name)
        if isinstance(found, str):
            return f"torch.autograd.Function '{name}' cannot be imported by name ({found})"
    return ""


def resolve(name: str) -> type:
    """The Function class of a PythonOp: one seen in this process, else imported by name."""
    cls = _functions.get(name)
    if cls is not None:
        return cls
    found = _import(name)
    if isinstance(found, str):
        raise GraphError(
            f"the graph calls torch.autograd.Function '{name}' (a PythonOp), which cannot be "
            f"imported: {found}. Define the Function at the top level of an importable module "
            "(not inside a function), or delete the cached graph (GRAPHTRAIN_CACHE_DIR) so the "
            "model is captured again"
        )
    _functions[name] = found
    return found


# ---- shape inferers ------------------------------------------------------------------------------


def _engine_inferer(name: str, fn: InferShape) -> Callable:
    def call(attrs: dict, shapes: list[list[Any]], dtypes: list[int]) -> tuple[list, list[int]]:
        result = fn(attrs, shapes, [ONNX_TO_TORCH.get(d, torch.float32) for d in dtypes])
        if not (isinstance(result, (tuple, list)) and len(result) == 2):
            raise TypeError(f"it must return (output_shapes, output_dtypes), got {result!r}")
        out_shapes, out_dtypes = result
        codes = []
        for d in out_dtypes:
            if d not in TORCH_TO_ONNX:
                raise TypeError(f"output dtype {d!r} is not a torch dtype graphtrain holds")
            codes.append(TORCH_TO_ONNX[d])
        return [list(s) for s in out_shapes], codes

    return call


def register_shape_inferer(func_or_qualified_name: type | str, fn: InferShape) -> None:
    """Registers `fn(node, input_shapes, input_dtypes) -> (output_shapes, output_dtypes)` as the
    shape inferer of a Function's PythonOps. `node` is a dict of the node's attributes; shapes are
    lists of ints and symbolic dim names; dtypes are torch dtypes. The engine calls it during shape
    inference, so symbolic dims flow through the PythonOp."""
    name = _qualified(func_or_qualified_name, "register_shape_inferer")
    if not callable(fn):
        raise TypeError(f"the shape inferer of '{name}' must be callable, got {type(fn).__name__}")
    _python_inferers[name] = fn
    _C.register_python_op_inferer(name, _engine_inferer(name, fn))


def _qualified(func_or_qualified_name: type | str, api: str) -> str:
    if isinstance(func_or_qualified_name, type):
        if not issubclass(func_or_qualified_name, torch.autograd.Function):
            raise TypeError(f"{func_or_qualified_name.__name__} is not a torch.autograd.Function")
        return func_name(func_or_qualified_name)
    if isinstance(func_or_qualified_name, str) and func_or_qualified_name:
        return func_or_qualified_name
    raise TypeError(
        f"{api} needs a torch.autograd.Function class or its qualified name, got "
        f"{func_or_qualified_name!r}"
    )


def register_decomposition(func_or_qualified_name: type | str, fn: Callable[..., Any]) -> None:
    """Declares that the Function computes `fn(*args, **kwargs)` in torch ops and that its backward
    is exactly that computation's gradient. GraphModule then traces `fn` where the model applies
    the Function (its ops run natively, graphtrain builds the gradient) instead of keeping the
    Function opaque. A Function whose backward is not the gradient of its forward (a
    straight-through estimator, a gradient clipped or scaled on purpose) must not be registered.
    Register before the model's first call: graphs captured before stay as they are (the graph
    cache keys on the registered names)."""
    name = _qualified(func_or_qualified_name, "register_decomposition")
    if not callable(fn):
        raise TypeError(f"the decomposition of '{name}' must be callable, got {type(fn).__name__}")
    _decompositions[name] = fn


def decomposition_names() -> list[str]:
    """The Functions with a registered decomposition, sorted (part of the graph cache key)."""
    return sorted(_decompositions)


def _bloom_gelu(x: torch.Tensor) -> torch.Tensor:
    # bloom_gelu_forward, x * 0.5 * (1 + tanh(0.79788456 * x * (1 + 0.044715 * x^2))): the tanh
    # GELU (its constant is sqrt(2 / pi) in float32); bloom_gelu_back is its exact derivative.
    return torch.nn.functional.gelu(x, approximate="tanh")


register_decomposition("transformers.models.bloom.modeling_bloom.GeLUFunction", _bloom_gelu)


def prepare(model: Any) -> None:
    """Before a graph's shape inference: resolves each PythonOp's Function (a clear error for one
    that cannot be imported) and registers its static infer_shape unless one was registered.
    `model` is a graphtrain._C.Model."""
    for _, attrs in model.nodes("PythonOp", "graphtrain"):
        name = attrs.get("func_name", "")
        cls = resolve(name)
        infer = getattr(cls, "infer_shape", None)
        if infer is not None and name not in _python_inferers:
            _C.register_python_op_inferer(name, _engine_inferer(name, infer))


# ---- capture -------------------------------------------------------------------------------------


def _storable(name: str, x: Any, capture_notes: dict) -> Any:
    try:
        return leaf_to_json(x)
    except TypeError:
        key = id(x)
        _objects[key] = x  # kept for this process: a graph holding it is not cached
        capture_notes.setdefault(
            "uncacheable",
            f"torch.autograd.Function '{name}' takes a {type(x).__name__} "
            "argument, which a cached graph cannot hold",
        )
        return {"__object__": key}


def _arguments(layout: list[Any], tensors: list[torch.Tensor]) -> list[Any]:
    """A Function's positional arguments from their stored layout and the tensors in order."""
    it = iter(tensors)
    out = []
    for a in layout:
        if isinstance(a, dict) and "__tensor__" in a:
            out.append(next(it))
        elif isinstance(a, dict) and "__object__" in a:
            out.append(_objects[a["__object__"]])
        else:
            out.append(leaf_from_json(a))
    return out


def _patched_apply(cls: type, *args: Any, **kwargs: Any) -> Any:
    original = _ORIGINAL_APPLY.__func__
    if (
        not getattr(_local, "capturing", False)
        or getattr(_local, "inside", False)
        or cls.__module__.startswith(("torch._", "graphtrain."))
    ):
        return original(cls, *args, **kwargs)
    name = func_name(cls)
    decomposition = _decompositions.get(name)
    if decomposition is not None:  # traced: its ops run natively, autodiff builds the gradient
        return decomposition(*args, **kwargs)
    if not options()["enable_custom_autograd"].value:
        try:
            return original(cls, *args, **kwargs)
        except UnsupportedModelError:
            raise
        except Exception as e:
            raise UnsupportedModelError(
                f"torch.export cannot trace through torch.autograd.Function '{name}' "
                f"(GRAPHTRAIN_ENABLE_CUSTOM_AUTOGRAD=0): {type(e).__name__}: {e}. "
                "Set GRAPHTRAIN_ENABLE_CUSTOM_AUTOGRAD=1 to keep it opaque (a PythonOp that calls it)"
            ) from e
    if kwargs:
        raise UnsupportedModelError(
            f"torch.autograd.Function '{name}' is applied with keyword arguments "
            f"({', '.join(kwargs)}); graphtrain keeps Functions opaque only when called "
            "with positional arguments"
        )
    return opaque_call(cls, args)


def opaque_call(cls: type, args: tuple) -> Any:
    """`cls.apply(*args)` as one PythonOp of the graph being captured (see the module doc)."""
    name = func_name(cls)
    _functions[name] = cls
    key = str(next(_counter))
    notes = _notes.setdefault(key, {})
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    layout = [
        {"__tensor__": 1} if isinstance(a, torch.Tensor) else _storable(name, a, notes)
        for a in args
    ]
    info = json.dumps(
        {"key": key, "arguments": layout, "requires_grad": [t.requires_grad for t in tensors]}
    )
    outs = _python_op(tensors, name, info)
    return outs[0] if notes["single"] else tuple(outs)


class opaque_functions:
    """While GraphModule captures: Function.apply becomes a PythonOp (see the module doc), in the
    capturing thread only (other threads applying Functions meanwhile get the original)."""

    _lock = threading.Lock()
    _depth = 0

    def __enter__(self) -> None:
        self._previous = getattr(_local, "capturing", False)
        _local.capturing = True
        with opaque_functions._lock:
            if opaque_functions._depth == 0:
                torch.autograd.Function.apply = classmethod(_patched_apply)
            opaque_functions._depth += 1

    def __exit__(self, *exc: object) -> None:
        _local.capturing = self._previous
        with opaque_functions._lock:
            opaque_functions._depth -= 1
            if opaque_functions._depth == 0:
                torch.autograd.Function.apply = _ORIGINAL_APPLY


@torch.library.custom_op("graphtrain::python_op", mutates_args=())
def _python_op(xs: list[torch.Tensor], func: str, info: str) -> list[torch.Tensor]:
    return [o.clone() for o in _fake_or_real(xs, func, info)]


@_python_op.register_fake
def _(xs: list[torch.Tensor], func: str, info: str) -> list[torch.Tensor]:
    return _fake_or_real(xs, func, info)


torch.library.register_autograd("graphtrain::python_op", lambda ctx, grads: (None, None, None))


def _fake_or_real(xs: list[torch.Tensor], func: str, info: str) -> list[torch.Tensor]:
    """Runs the Function's forward (on fake tensors while exporting) to learn its outputs."""
    d = _callbacks.parsed_info(info)
    cls = _functions[func]
    args = _arguments(d["arguments"], xs)
    versions = [x._version for x in xs]
    _local.inside = True
    try:
        with torch.no_grad():
            out = _ORIGINAL_APPLY.__func__(cls, *args)
    except Exception as e:
        # A forward that cannot run on fake tensors (numpy, a C extension): its shape inferer
        # gives the outputs.
        out = _outputs_from_inferer(func, xs, e)
    finally:
        _local.inside = False
    single = isinstance(out, torch.Tensor)
    outs = [out] if single else list(out) if isinstance(out, (tuple, list)) else None
    if outs is None or not outs or not all(isinstance(o, torch.Tensor) for o in outs):
        raise UnsupportedModelError(
            f"torch.autograd.Function '{func}' returns {type(out).__name__}; graphtrain keeps "
            "Functions opaque when they return a tensor or a tuple of tensors"
        )
    dirty = [
        [k, j]
        for k, o in enumerate(outs)
        for j, x in enumerate(xs)
        if x._version != versions[j] and _same_memory(o, x)
    ]
    _notes.setdefault(d["key"], {}).update(single=single, dirty=dirty)
    # A custom op's outputs may not alias its inputs: views are cloned here (at run time the
    # Function's own outputs, views included, go back to the engine uncopied).
    return [
        o.clone() if o._base is not None or any(_same_memory(o, x) for x in xs) else o for o in outs
    ]


def _outputs_from_inferer(func: str, xs: list[torch.Tensor], error: Exception) -> Any:
    infer = _python_inferers.get(func) or getattr(_functions[func], "infer_shape", None)
    if infer is None:
        raise UnsupportedModelError(
            f"torch.autograd.Function '{func}' cannot run on torch.export's fake tensors ({type(error).__name__}: "
            f"{error}), so graphtrain cannot learn its output shapes. Give it a static infer_shape(node, input_shapes, "
            "input_dtypes) or register one with graphtrain.custom_function.register_shape_inferer"
        ) from error
    symbols = {str(d): d for x in xs for d in x.shape if not isinstance(d, int)}
    shapes, dtypes = infer(
        {"func_name": func},
        [[d if isinstance(d, int) else str(d) for d in x.shape] for x in xs],
        [x.dtype for x in xs],
    )
    outs = []
    for shape, dtype in zip(shapes, dtypes):
        dims = []
        for d in shape:
            if not isinstance(d, int) and d not in symbols:
                known = ", ".join(symbols) or "none"
                raise UnsupportedModelError(
                    f"the shape inferer of torch.autograd.Function '{func}' gave dim {d!r}, "
                    f"which is neither an int nor an input dim ({known})"
                )
            dims.append(d if isinstance(d, int) else symbols[d])
        outs.append(torch.empty(dims, dtype=dtype))
    return outs[0] if len(outs) == 1 else tuple(outs)


def _same_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a is b or a.untyped_storage()._cdata == b.untyped_storage()._cdata


def _translate(n: torch.fx.Node, t: Any) -> list[str]:
    xs, func, info = n.args
    d = _callbacks.parsed_info(info)
    notes = _notes.pop(d["key"], {})  # what the fake run learned; not needed after translation
    if notes.get("uncacheable"):
        t.uncacheable = notes["uncacheable"]
    outs_meta = val(n)
    inputs_meta = [val(x) for x in xs]
    attrs = dict(
        info=info,
        input_ranks=[m.dim() for m in inputs_meta],
        input_dtypes=[t.onnx_dtype(m.dtype) for m in inputs_meta],
        input_requires_grad=[int(r) for r in d["requires_grad"]],
        output_ranks=[m.dim() for m in outs_meta],
        output_dtypes=[t.onnx_dtype(m.dtype) for m in outs_meta],
        dirty_inputs=[j for _, j in notes.get("dirty", [])],
    )
    attrs = {k: v for k, v in attrs.items() if v != []}  # ONNX cannot type an empty list
    outs = t.emit(
        "PythonOp",
        [t.value(x) for x in xs],
        n_out=len(outs_meta) + 1,
        domain="graphtrain",
        func_name=func,
        **attrs,
    )
    for k, j in notes.get("dirty", []):
        t.mutated(xs[j], outs[k])  # later readers of a dirtied input see the Function's output
    return outs[:-1]


register_translator(torch.ops.graphtrain.python_op.default, _translate)


# ---- run time ------------------------------------------------------------------------------------


def _run_forward(attrs: dict, inputs: list[Any]) -> list[Any]:
    run = _callbacks.current_run()
    name = attrs["func_name"]
    cls = resolve(name)
    d = _callbacks.parsed_info(attrs["info"])
    dirty = set(attrs.get("dirty_inputs", []))
    bases: list[torch.Tensor | None] = []
    proxies = []
    # The engine runs inside torch autograd's forward (grad mode off): this call records a graph
    # of its own when a backward will follow.
    with torch.enable_grad() if run.training else torch.no_grad():
        for j, (x, rg) in enumerate(zip(inputs, d["requires_grad"])):
            base = x.detach()
            grad = run.training and rg and x.is_floating_point()
            if grad:
                base.requires_grad_()
            bases.append(base if grad else None)
            # A dirtied input is modified in a copy: the engine's input keeps its value for
            # readers that ran before the Function in eager order; later readers read the output.
            proxies.append(base.clone() if j in dirty else base)
        out = cls.apply(*_arguments(d["arguments"], proxies))
    outs = [out] if isinstance(out, torch.Tensor) else list(out)
    if len(outs) != len(attrs["output_ranks"]):
        raise GraphError(
            f"torch.autograd.Function '{name}' returned {len(outs)} outputs at run time, "
            f"{len(attrs['output_ranks'])} at capture"
        )
    key = run.keep((bases, outs)) if any(b is not None for b in bases) else -1
    return [o.detach() for o in outs] + [_callbacks.context_tensor(key)]


def _run_backward(attrs: dict, inputs: list[Any]) -> list[Any]:
    run = _callbacks.current_run()
    key = int(inputs[0])
    grads = inputs[1:]
    entry = run.take(key) if key >= 0 else None
    if entry is None:
        return [None] * len(attrs.get("input_dtypes", []))
    bases, outs = entry
    pairs = [(o, g) for o, g in zip(outs, grads) if g is not None and o.requires_grad]
    if pairs:
        # backward (not autograd.grad): reentrant checkpointing requires it, and leaves the
        # Function reached outside its inputs (parameters in a closure) accumulate as in eager.
        torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
    return [
        None if b is None else (b.grad if b.grad is not None else torch.zeros_like(b))
        for b in bases
    ]


_callbacks.register_handler("PythonOp", _run_forward)
_callbacks.register_handler("PythonOpGrad", _run_backward)

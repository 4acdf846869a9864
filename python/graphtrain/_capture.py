"""Capture: torch.export of a module into an ATen-level FX graph, translated into graphtrain's IR
(built as an ONNX model: parameters and buffers become graph inputs, module scopes stay on the
nodes as metadata)."""

from __future__ import annotations

import os
import re
import threading
import traceback
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, ExitStack
from typing import Any

import numpy as np
import torch
from torch.utils import _pytree as pytree

from . import _aten, _fallback, _gather
from . import _onnx_writer as proto
from ._captured import OPSET, Captured, GraphInput, dynamic_dims
from ._dtypes import TORCH_TO_NUMPY, TORCH_TO_ONNX
from ._structure import TENSOR, ObjectLeaf, leaf_to_json, object_to_json
from ._translate import TRANSLATORS, val, writes_first_argument
from .errors import UnsupportedModelError
from .log import capture_output


class _Flat(torch.nn.Module):
    """Calls the module on flat tensors (the rest of its arguments fixed) and returns flat tensors."""

    def __init__(self, module: torch.nn.Module, spec: Any, leaves: list[Any], record: dict) -> None:
        super().__init__()
        self.module = module
        self._spec = spec
        self._leaves = leaves
        self._record = record  # receives the output's structure while tracing

    def forward(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        # Where each symbolic size lives among the inputs: (tensor input, dim).
        self._input_dims: dict[str, list[int]] = {}
        for i, t in enumerate(tensors):
            for d, size in enumerate(t.shape):
                if isinstance(size, torch.SymInt):
                    self._input_dims.setdefault(str(size.node.expr), [i, d])
        it = iter(tensors)
        leaves = [next(it) if x is TENSOR else x for x in self._leaves]
        args, kwargs = pytree.tree_unflatten(leaves, self._spec)
        out = self.module(*args, **kwargs)
        flat, out_spec = pytree.tree_flatten(out)
        self._record["spec"] = out_spec
        leaves: list[Any] = []
        tensors: list[torch.Tensor] = []
        for path, x in zip(pytree.tree_flatten_with_path(out)[0], flat):
            if isinstance(x, torch.Tensor):
                leaves.append(TENSOR)
                tensors.append(x)
            elif isinstance(x, (torch.SymInt, torch.SymFloat, torch.SymBool)):
                raise UnsupportedModelError(
                    f"{type(self.module).__name__} returns a size computed from its inputs "
                    f"({pytree.keystr(path[0])} = {x}); graphtrain returns tensors and constants. "
                    "Return it as a tensor (torch.tensor(size)) or compute it outside the model."
                )
            else:
                leaves.append(self._leaf(x, tensors, pytree.keystr(path[0])))
        self._record["leaves"] = leaves
        return tuple(tensors)

    def _leaf(self, x: Any, tensors: list[torch.Tensor], where: str) -> Any:
        """A non-tensor output leaf: a constant as it is, an object holding tensors (a cache) as an
        ObjectLeaf whose tensors become graph outputs."""
        try:
            leaf_to_json(x)
            return x
        except TypeError:
            pass
        mine: list[torch.Tensor] = []
        try:
            encoded = object_to_json(x, mine)
        except TypeError as e:
            raise UnsupportedModelError(
                f"{type(self.module).__name__} returns a {type(x).__module__}.{type(x).__qualname__} "
                f"at {where or 'the top'}, which graphtrain cannot rebuild with each call's tensors "
                f"(it holds {e}). Register it as a pytree node (torch.utils._pytree."
                "register_pytree_node) or return tensors."
            ) from e
        tensors.extend(mine)
        return ObjectLeaf(encoded, len(mine), self._input_dims)


def _user_frame(node: torch.fx.Node) -> str:
    """The user's source line behind a node, from its stack trace."""
    trace = node.meta.get("stack_trace") or ""
    frames = re.findall(r'File "([^"]+)", line (\d+), in (\S+)\n\s*(.*)', trace)
    for path, line, fn, code in reversed(frames):
        if "/torch/" not in path and "/graphtrain/" not in path:
            return f"{path}:{line} in {fn}: {code.strip()}"
    return "unknown source line"


def _scope(node: torch.fx.Node) -> str:
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return ""
    path = list(stack.values())[-1][0]
    if path.startswith("_empty_nn_module_stack"):  # torch.export's placeholder for "no module"
        return ""
    path = path.removeprefix("L['self'].").removeprefix("module.")
    return "" if path in ("module", "L['self']") else path.removeprefix("module.")


class Translator:
    """Builds the IR from an exported program, op by op (see TRANSLATORS)."""

    def __init__(self, ep: torch.export.ExportedProgram) -> None:
        self.ep = ep
        self.nodes: list[proto.Node] = []
        self.initializers: list[proto.Tensor] = []
        self.values: dict[Any, Any] = {}
        self.buffer_of: dict[torch.fx.Node, str] = {}
        self.buffer_updates: dict[str, str] = {}
        self.scope = ""
        self._count = 0
        self._consts: dict[tuple, str] = {}
        self.uncacheable = ""  # set by a translator that emits what only this process can run
        self.routes: list[tuple[torch.fx.Node, str]] = []  # how each FX node runs (explain)

    # -- naming and emission --
    def fresh(self, hint: str) -> str:
        self._count += 1
        return f"{hint}_{self._count}"

    def emit(
        self, op: str, inputs: list[str], n_out: int = 1, domain: str = "", **attrs: Any
    ) -> Any:
        outs = [self.fresh(op.lower()) for _ in range(n_out)]
        node = proto.Node(op, inputs, outs, name=self.fresh(op), domain=domain, **attrs)
        if self.scope:
            node.metadata.append(("graphtrain.scope", self.scope))
        self.nodes.append(node)
        return outs[0] if n_out == 1 else outs

    def const(self, array: np.ndarray) -> str:
        array = np.asarray(array)
        key = (array.dtype.str, array.shape, array.tobytes()) if array.size <= 64 else None
        if key is not None and key in self._consts:
            return self._consts[key]
        name = self.fresh("const")
        self.initializers.append(proto.Tensor(array, name))
        if key is not None:
            self._consts[key] = name
        return name

    def tensor_attr(self, name: str) -> proto.Tensor:
        for init in self.initializers:
            if init.name == name:
                return init
        raise KeyError(name)

    # -- operands --
    def value(self, node: Any) -> str:
        if not isinstance(node, torch.fx.Node):
            raise TypeError(f"expected a tensor, got {node!r}")
        return self.values[node]

    def np_dtype(self, dtype: torch.dtype) -> Any:
        return TORCH_TO_NUMPY[dtype]

    def onnx_dtype(self, dtype: torch.dtype) -> int:
        return TORCH_TO_ONNX[dtype]

    def scalar(self, v: Any, like: Any) -> str:
        dtype = val(like).dtype
        return self.const(np.array(v, dtype=self.np_dtype(dtype)))

    def operand(self, x: Any, like: Any) -> str:
        if isinstance(x, torch.fx.Node):
            v = val(x)
            if isinstance(v, torch.Tensor):
                return self.value(x)
            # a SymInt used as a scalar operand
            return self.emit("Squeeze", [self.value(x), self.ints([0])])
        return self.scalar(x, like)

    def promoted(self, a: Any, b: Any, dtype: torch.dtype | None = None) -> list[str]:
        """Two operands (tensor nodes, SymInt nodes or Python numbers) in one dtype: `dtype`, else
        torch's type promotion of the pair (an int64 tensor times 0.5 computes in float32)."""

        def meta(x: Any) -> Any:
            v = val(x) if isinstance(x, torch.fx.Node) else x
            return 0 if isinstance(v, (torch.SymInt, torch.SymBool)) else v

        if dtype is None:
            dtype = torch.result_type(meta(a), meta(b))
        out = []
        for x in (a, b):
            if isinstance(x, torch.fx.Node):
                v = val(x)
                name = self.operand(x, x)
                have = v.dtype if isinstance(v, torch.Tensor) else torch.int64
                if have != dtype:
                    name = self.emit("Cast", [name], to=self.onnx_dtype(dtype))
                out.append(name)
            else:
                out.append(self.const(np.array(x, dtype=self.np_dtype(dtype))))
        return out

    def ints(self, values: list[int]) -> str:
        return self.const(np.array(list(values), np.int64))

    def shape_vector(self, items: Any) -> str:
        items = list(items)
        if all(isinstance(i, int) for i in items):
            return self.ints(items)
        parts = [self.ints([i]) if isinstance(i, int) else self.value(i) for i in items]
        return parts[0] if len(parts) == 1 else self.emit("Concat", parts, axis=0)

    def scalar_int(self, v: Any) -> str:
        if isinstance(v, int):
            return self.const(np.array(v, np.int64))
        return self.emit("Squeeze", [self.value(v), self.ints([0])])

    def scalar_of(self, v: Any, dtype: torch.dtype) -> str:
        if isinstance(v, (int, float)):
            return self.const(np.array(v, dtype=self.np_dtype(dtype)))
        s = self.scalar_int(v)
        return s if dtype == torch.int64 else self.emit("Cast", [s], to=self.onnx_dtype(dtype))

    def mutated(self, node: Any, new_value: str) -> None:
        """`node` was changed in place: later readers see `new_value`; a buffer is written back."""
        self.values[node] = new_value
        if node in self.buffer_of:
            self.buffer_updates[self.buffer_of[node]] = new_value

    def unsupported(self, node: torch.fx.Node, what: str) -> None:
        error = UnsupportedModelError(_unsupported_message(node, what))
        error.what = what
        raise error

    def mark(self) -> tuple[int, int]:
        return len(self.nodes), len(self.initializers)

    def rollback(self, mark: tuple[int, int]) -> None:
        """Drops what a translator emitted after `mark` (it gave up half-way)."""
        del self.nodes[mark[0] :], self.initializers[mark[1] :]
        kept = {i.name for i in self.initializers}
        self._consts = {k: v for k, v in self._consts.items() if v in kept}


def _unsupported_message(node: torch.fx.Node, what: str) -> str:
    scope = _scope(node) or "the top-level module"
    return (
        f"graphtrain cannot run {what} (ATen op {node.target}) in module '{scope}', at {_user_frame(node)}. "
        "Change the model to avoid it, set GRAPHTRAIN_FALLBACK_POLICY=aten to run the op through "
        "PyTorch's kernel inside the graph, or GRAPHTRAIN_FALLBACK_POLICY=eager to run this model "
        "in plain PyTorch."
    )


def _translate_body(t: Translator, gm: torch.fx.GraphModule, fallback: bool) -> list[Any]:
    """Translates the call_function and get_attr nodes of `gm`'s graph (its placeholders already
    have values); returns the nodes its output returns."""
    for node in gm.graph.nodes:
        if node.op == "call_function":
            if node.target in _aten.SKIPPED:
                continue
            t.scope = _scope(node)
            region = _REGIONS.get(node.target)
            if region is not None:
                t.values[node] = region(t, gm, node, fallback)
                continue
            count = len(t.nodes)
            t.values[node] = _translate_node(t, node, fallback)
            t.routes.append((node, _route(t.nodes[count:])))
        elif node.op == "get_attr":
            value = getattr(gm, node.target)
            if isinstance(value, torch.nn.Module):  # the body of a region (below)
                t.values[node] = value
            else:
                t.values[node] = t.const(value.detach().cpu().numpy())
        elif node.op == "output":
            return list(node.args[0])
    return []


_CALLBACK_ROUTES = {"ATenOp": "ATen fallback", "PythonOp": "PythonOp", "Hook": "hook"}


def _route(emitted: list[proto.Node]) -> str:
    """How the nodes one FX node became run: natively, or through a callback into Python."""
    for n in emitted:
        if n.domain == "graphtrain" and n.op_type in _CALLBACK_ROUTES:
            return _CALLBACK_ROUTES[n.op_type]
    return "native"


def _inline(t: Translator, body: torch.fx.GraphModule, operands: Any, fallback: bool) -> list[str]:
    placeholders = [n for n in body.graph.nodes if n.op == "placeholder"]
    for p, x in zip(placeholders, operands):
        t.values[p] = t.values[x] if isinstance(x, torch.fx.Node) else x
    scope = t.scope
    outs = [t.values[o] for o in _translate_body(t, body, fallback)]
    t.scope = scope
    return outs


def _grad_region(t: Translator, gm: Any, node: torch.fx.Node, fallback: bool) -> list[str]:
    """torch.no_grad() / enable_grad() around a block: its body, inlined; with grad off, its
    outputs are cut from the gradient (StopGradient)."""
    enabled, body, *operands = node.args
    outs = _inline(t, t.values[body], operands, fallback)
    if enabled:
        return outs
    return [t.emit("StopGradient", [o], domain="graphtrain") for o in outs]


def _autocast_region(t: Translator, gm: Any, node: torch.fx.Node, fallback: bool) -> list[str]:
    """torch.autocast around a block: inlined when autocast is disabled (or float32); a lower
    precision is an error until graphtrain has bf16/fp16 kernels."""
    device, dtype, enabled, _cache, body, *operands = node.args
    if enabled and dtype not in (None, torch.float32):
        where = t.scope or "the top-level module"
        raise UnsupportedModelError(
            f"the model runs a torch.autocast region ({device}, {dtype}) in module '{where}', at "
            f"{_user_frame(node)}; graphtrain has no {dtype} kernels yet. Remove the autocast (train "
            "in float32), or set GRAPHTRAIN_FALLBACK_POLICY=eager to run this model in plain PyTorch."
        )
    return _inline(t, t.values[body], operands, fallback)


_REGIONS: dict[Any, Callable] = {
    torch.ops.higher_order.wrap_with_set_grad_enabled: _grad_region,
    torch.ops.higher_order.wrap_with_autocast: _autocast_region,
}


def _translate_node(t: Translator, node: torch.fx.Node, fallback: bool) -> Any:
    """The IR value(s) of one FX node: its native translation, else (with `fallback`, for ATen ops)
    an ATenOp node that runs PyTorch's kernel."""
    fn = TRANSLATORS.get(node.target) or TRANSLATORS.get(str(node.target))  # an op or its name
    can_fall_back = fallback and _fallback.applies(node)
    why = "this operation"
    if fn is not None:
        mark = t.mark()
        try:
            result = fn(node, t)
            if writes_first_argument(node) and isinstance(result, str):
                t.mutated(node.args[0], result)  # in place: later readers see the new value
            return result
        except UnsupportedModelError as e:
            if not can_fall_back:
                raise
            why = getattr(e, "what", "this use of the op")
        except Exception as e:  # an argument form the translator does not handle natively
            why = f"this use of the op ({e})"
        t.rollback(mark)
    if can_fall_back:
        return _fallback.translate(node, t, why)
    raise UnsupportedModelError(_unsupported_message(node, why))


def _value_info(name: str, meta: Any) -> bytes:
    dims = [int(d) if isinstance(d, int) else str(d) for d in meta.shape]
    return proto.value_info(name, TORCH_TO_ONNX[meta.dtype], dims)


# torch.export is not thread-safe ("ProxyTorchDispatchMode slot already occupied"): one capture at a
# time in the process; runs of captured graphs stay concurrent.
_CAPTURE_LOCK = threading.Lock()

CaptureContext = Callable[[torch.nn.Module], AbstractContextManager]


def export_module(
    module: torch.nn.Module,
    flat: list[Any],
    spec: Any,
    contexts: Sequence[CaptureContext] = (),
    dynamic: bool = True,
) -> tuple[Any, dict]:
    """torch.export of the module over its flattened tensor arguments. With `dynamic`, the dims of
    `dynamic_dims` are symbolic where torch.export can keep them so (batch and sequence sizes do
    not re-capture); without, every size is specialized, which traces 3-5x faster (no symbolic
    shape reasoning). A program that writes through views is functionalized. `contexts` are
    entered while torch.export traces (GraphModule's: subscribed module boundaries become Hook
    nodes, torch.autograd.Functions become PythonOps)."""
    leaves = [TENSOR if isinstance(x, torch.Tensor) else x for x in flat]
    # Inputs keep requires_grad, so what is traced (a Function's needs_input_grad) matches the run.
    tensors = tuple(
        x.detach().requires_grad_(x.requires_grad) for x in flat if isinstance(x, torch.Tensor)
    )
    record: dict = {}
    wrapper = _Flat(module, spec, leaves, record)
    dims = tuple({i: torch.export.Dim.AUTO for i in dynamic_dims(t)} for t in tensors)
    shapes = (dims,) if tensors and dynamic else None
    with ExitStack() as stack:
        stack.enter_context(capture_output("graph capture (torch.export)"))
        for make in contexts:
            stack.enter_context(make(module))
        ep = torch.export.export(wrapper, tensors, dynamic_shapes=shapes, strict=False)
        if _writes_into_a_view(ep):
            # An in-place write through a view (x[:, :2].fill_(0), x[i] = v) must reach the base
            # tensor: functionalization rewrites it into slice_scatter and the like.
            ep = ep.run_decompositions({})
    return ep, record


def _writes_into_a_view(ep: Any) -> bool:
    for node in ep.graph.nodes:
        if not writes_first_argument(node):
            continue
        target = node.args[0]
        if target.op == "call_function" and isinstance(target.target, torch._ops.OpOverload):
            returns = target.target._schema.returns
            if returns and returns[0].alias_info is not None:
                return True
    return False


def translate(ep: Any, record: dict, name: str, fallback: bool = True) -> Captured:
    t = Translator(ep)
    sig = ep.graph_signature
    graph_inputs: list[bytes] = []
    inputs: list[GraphInput] = []
    placeholders = [n for n in ep.graph.nodes if n.op == "placeholder"]
    user_index = 0
    for node, spec in zip(placeholders, sig.input_specs):
        kind = spec.kind.name
        meta = node.meta["val"]
        if kind in ("PARAMETER", "BUFFER"):
            target = spec.target.removeprefix("module.")
            gname = target
            t.values[node] = gname
            if kind == "BUFFER":
                t.buffer_of[node] = target
            graph_inputs.append(_value_info(gname, meta))
            inputs.append(GraphInput("param" if kind == "PARAMETER" else "buffer", target, gname))
        elif kind in ("CONSTANT_TENSOR",):
            value = ep.constants[spec.target]
            t.values[node] = t.const(value.detach().cpu().numpy())
        elif kind == "USER_INPUT":
            gname = f"input_{user_index}"
            t.values[node] = gname
            if isinstance(meta, torch.Tensor):
                graph_inputs.append(_value_info(gname, meta))
                inputs.append(GraphInput("input", user_index, gname))
            user_index += 1
        else:
            raise UnsupportedModelError(
                f"graphtrain cannot capture an input of kind {kind} ('{spec.target}')"
            )
    outputs: list[str] = []
    output_float: list[bool] = []
    out_nodes = []
    for out, spec in zip(_translate_body(t, ep.graph_module, fallback), sig.output_specs):
        kind = spec.kind.name
        if kind == "BUFFER_MUTATION":  # a functionalized graph returns the buffers it updates
            t.buffer_updates[spec.target.removeprefix("module.")] = t.values[out]
        elif kind in ("USER_OUTPUT", "LOSS_OUTPUT"):
            out_nodes.append(out)
        else:
            raise UnsupportedModelError(
                f"graphtrain cannot capture a model that writes into its input tensors in place "
                f"('{spec.target}'); write into a copy instead"
            )
    for out in out_nodes:
        value = t.values[out]
        if value in outputs or value in [i.name for i in inputs]:
            value = t.emit("Identity", [value])
        outputs.append(value)
        output_float.append(val(out).dtype.is_floating_point)
    value_infos = [_value_info(o, val(n)) for o, n in zip(outputs, out_nodes)]
    updates = list(t.buffer_updates.items())
    for _, value in updates:
        value_infos.append(proto.value_info(value, 0, None))  # element type undefined
    _gather.count_uses(t.nodes)
    model = proto.model(
        t.nodes,
        name,
        graph_inputs,
        value_infos,
        t.initializers,
        opsets=[("", OPSET), ("graphtrain", 1)],
        ir_version=10,
    )
    return Captured(
        model=model,
        inputs=inputs,
        outputs=outputs,
        output_float=output_float,
        buffer_updates=[(v, b) for b, v in updates],
        out_spec=record["spec"],
        out_leaves=list(record["leaves"]),
        uncacheable=t.uncacheable,
        routes=[(str(n.target), _scope(n), how) for n, how in t.routes],
    )


def capture(
    module: torch.nn.Module,
    flat: list[Any],
    spec: Any,
    name: str,
    contexts: Sequence[CaptureContext] = (),
    fallback: bool = True,
    dynamic: bool = True,
) -> Captured:
    """torch.export + translation; failures become UnsupportedModelError with the cause. With
    `fallback`, ATen ops without a native translation become ATenOp nodes (PyTorch's kernel);
    without `dynamic`, every size is specialized (Captured.static_shapes)."""
    with _CAPTURE_LOCK:
        try:
            ep, record = export_module(module, flat, spec, contexts, dynamic)
        except UnsupportedModelError:
            raise
        except Exception as e:
            where = model_frame(e)
            hint = ""
            if "data-dependent" in str(e):
                hint = (
                    " A Python branch or a size that depends on a tensor's values (.nonzero(), "
                    ".item(), `if t.sum() > 0`) cannot be captured into a graph: compute it "
                    "outside the module, or choose the model's option that avoids it."
                )
            raise UnsupportedModelError(
                f"torch.export could not capture {type(module).__name__}: {export_reason(e)}"
                f"{f' at {where}' if where else ''}.{hint} "
                "Set GRAPHTRAIN_FALLBACK_POLICY=eager to run this model in plain PyTorch."
            ) from e
    captured = translate(ep, record, name, fallback)
    if not dynamic:
        captured.static_shapes = [list(x.shape) for x in flat if isinstance(x, torch.Tensor)]
    return captured


_NOT_MODEL_CODE = tuple(
    os.path.dirname(f) + os.sep for f in (torch.__file__, os.__file__, __file__)
)


def model_frame(e: BaseException) -> str:
    """Where in the model's own code (not torch's, graphtrain's or Python's) the failure was
    raised: "path:line (`code`)", the path from its package folder; "" when no frame is."""
    for frame in reversed(traceback.extract_tb(e.__traceback__)):
        if frame.filename.startswith(_NOT_MODEL_CODE) or frame.filename.startswith("<"):
            continue
        path = frame.filename
        if "site-packages" + os.sep in path:
            path = path.split("site-packages" + os.sep, 1)[1]
        code = f" (`{frame.line.strip()}`)" if frame.line else ""
        return f"{path}:{frame.lineno}{code}"
    return ""


def export_reason(e: Exception) -> str:
    """torch.export's reason for a failure, in one line."""
    cause = "".join(traceback.format_exception_only(type(e), e)).strip().splitlines()
    return cause[0] if cause else str(e)

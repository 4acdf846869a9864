"""Capture: torch.export of a module into an ATen-level FX graph, translated into graphtrain's IR
(built as an ONNX model: parameters and buffers become graph inputs, module scopes stay on the
nodes as metadata)."""

from __future__ import annotations

import re
import traceback
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper, numpy_helper
from torch.utils import _pytree as pytree

from . import _aten
from ._callbacks import TENSOR  # importing _callbacks registers the Hook translator
from .errors import UnsupportedModelError
from .log import capture_output

OPSET = 20  # Gelu is standard from 20

TORCH_TO_ONNX = {
    torch.float32: TensorProto.FLOAT, torch.float64: TensorProto.DOUBLE, torch.float16: TensorProto.FLOAT16,
    torch.bfloat16: TensorProto.BFLOAT16, torch.int64: TensorProto.INT64, torch.int32: TensorProto.INT32,
    torch.int8: TensorProto.INT8, torch.uint8: TensorProto.UINT8, torch.bool: TensorProto.BOOL,
}
TORCH_TO_NUMPY = {
    torch.float32: np.float32, torch.float64: np.float64, torch.float16: np.float16, torch.int64: np.int64,
    torch.int32: np.int32, torch.int8: np.int8, torch.uint8: np.uint8, torch.bool: np.bool_,
}


@dataclass
class GraphInput:
    kind: str  # "param", "buffer" or "input"
    key: Any   # parameter / buffer name, or the position among the flattened tensor inputs
    name: str  # the graph input's name


@dataclass
class Captured:
    model: onnx.ModelProto
    inputs: list[GraphInput]
    outputs: list[str]                 # graph outputs holding the user's tensor outputs
    output_float: list[bool]
    buffer_updates: list[tuple[str, str]] = field(default_factory=list)  # (graph output, buffer name)
    out_spec: Any = None               # pytree spec of the module's output
    out_leaves: list[Any] = field(default_factory=list)  # non-tensor leaves; TENSOR marks tensors
    uncacheable: str = ""              # why the on-disk cache cannot hold this capture, if it cannot


class _Flat(torch.nn.Module):
    """Calls the module on flat tensors (the rest of its arguments fixed) and returns flat tensors."""

    def __init__(self, module: torch.nn.Module, spec: Any, leaves: list[Any], record: dict) -> None:
        super().__init__()
        self.module = module
        self._spec = spec
        self._leaves = leaves
        self._record = record  # receives the output's structure while tracing

    def forward(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        it = iter(tensors)
        leaves = [next(it) if x is TENSOR else x for x in self._leaves]
        args, kwargs = pytree.tree_unflatten(leaves, self._spec)
        out = self.module(*args, **kwargs)
        flat, out_spec = pytree.tree_flatten(out)
        self._record["spec"] = out_spec
        self._record["leaves"] = [TENSOR if isinstance(x, torch.Tensor) else x for x in flat]
        return tuple(x for x in flat if isinstance(x, torch.Tensor))


def _user_frame(node: torch.fx.Node) -> str:
    """The user's source line behind a node, from its stack trace."""
    trace = node.meta.get("stack_trace") or ""
    frames = re.findall(r'File "([^"]+)", line (\d+), in (\S+)\n\s*(.*)', trace)
    for path, line, fn, code in reversed(frames):
        if "/torch/" not in path and "/graphtrain/" not in path:
            return f'{path}:{line} in {fn}: {code.strip()}'
    return "unknown source line"


def _scope(node: torch.fx.Node) -> str:
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return ""
    path = list(stack.values())[-1][0]
    path = path.removeprefix("L['self'].").removeprefix("module.")
    return "" if path in ("module", "L['self']") else path.removeprefix("module.")


class Translator:
    """Builds the IR from an exported program, op by op (see _aten.TRANSLATORS)."""

    def __init__(self, ep: torch.export.ExportedProgram) -> None:
        self.ep = ep
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[TensorProto] = []
        self.values: dict[Any, Any] = {}
        self.buffer_of: dict[torch.fx.Node, str] = {}
        self.buffer_updates: dict[str, str] = {}
        self.scope = ""
        self._count = 0
        self._consts: dict[tuple, str] = {}
        self.uncacheable = ""  # set by a translator that emits what only this process can run

    # -- naming and emission --
    def fresh(self, hint: str) -> str:
        self._count += 1
        return f"{hint}_{self._count}"

    def emit(self, op: str, inputs: list[str], n_out: int = 1, domain: str = "", **attrs: Any) -> Any:
        outs = [self.fresh(op.lower()) for _ in range(n_out)]
        node = helper.make_node(op, inputs, outs, name=self.fresh(op), domain=domain, **attrs)
        if self.scope:
            entry = node.metadata_props.add()
            entry.key, entry.value = "graphtrain.scope", self.scope
        self.nodes.append(node)
        return outs[0] if n_out == 1 else outs

    def const(self, array: np.ndarray) -> str:
        array = np.asarray(array)
        key = (array.dtype.str, array.shape, array.tobytes()) if array.size <= 64 else None
        if key is not None and key in self._consts:
            return self._consts[key]
        name = self.fresh("const")
        self.initializers.append(numpy_helper.from_array(array, name))
        if key is not None:
            self._consts[key] = name
        return name

    def tensor_attr(self, name: str) -> TensorProto:
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
        dtype = _aten.val(like).dtype
        return self.const(np.array(v, dtype=self.np_dtype(dtype)))

    def operand(self, x: Any, like: Any) -> str:
        if isinstance(x, torch.fx.Node):
            v = _aten.val(x)
            if isinstance(v, torch.Tensor):
                return self.value(x)
            # a SymInt used as a scalar operand
            return self.emit("Squeeze", [self.value(x), self.ints([0])])
        return self.scalar(x, like)

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
        raise UnsupportedModelError(_unsupported_message(node, what))


def _unsupported_message(node: torch.fx.Node, what: str) -> str:
    scope = _scope(node) or "the top-level module"
    return (f"graphtrain cannot run {what} (ATen op {node.target}) in module '{scope}', at {_user_frame(node)}. "
            "Change the model to avoid it, or set GRAPHTRAIN_FALLBACK_POLICY=eager to run this model "
            "in plain PyTorch.")


def _value_info(name: str, meta: Any) -> onnx.ValueInfoProto:
    dims = []
    for d in meta.shape:
        dims.append(int(d) if isinstance(d, int) else str(d))
    return helper.make_tensor_value_info(name, TORCH_TO_ONNX[meta.dtype], dims)


def export_module(module: torch.nn.Module, flat: list[Any], spec: Any) -> tuple[Any, dict]:
    """torch.export of the module over its flattened tensor arguments, all dims dynamic where
    torch.export can keep them so (batch and sequence sizes do not re-capture)."""
    leaves = [TENSOR if isinstance(x, torch.Tensor) else x for x in flat]
    # Inputs keep requires_grad, so what is traced (a Function's needs_input_grad) matches the run.
    tensors = tuple(x.detach().requires_grad_(x.requires_grad) for x in flat if isinstance(x, torch.Tensor))
    record: dict = {}
    wrapper = _Flat(module, spec, leaves, record)
    dims = tuple({i: torch.export.Dim.AUTO for i in range(t.dim())} for t in tensors)
    from .custom_function import opaque_functions
    from .hooks._subscriber import capture_scope

    # While torch.export traces: subscribed module boundaries become Hook nodes (no hook acts, no
    # step counts) and torch.autograd.Functions become PythonOps.
    with capture_output("graph capture (torch.export)"), capture_scope(module), opaque_functions():
        ep = torch.export.export(wrapper, tensors, dynamic_shapes=(dims,) if tensors else None, strict=False)
    return ep, record


def translate(ep: Any, record: dict, name: str) -> Captured:
    t = Translator(ep)
    sig = ep.graph_signature
    graph_inputs: list[onnx.ValueInfoProto] = []
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
            raise UnsupportedModelError(f"graphtrain cannot capture an input of kind {kind} ('{spec.target}')")
    outputs: list[str] = []
    output_float: list[bool] = []
    for node in ep.graph.nodes:
        if node.op == "call_function":
            if node.target in _aten.SKIPPED:
                continue
            fn = _aten.TRANSLATORS.get(node.target)
            if fn is None:
                raise UnsupportedModelError(_unsupported_message(node, "this operation"))
            t.scope = _scope(node)
            try:
                t.values[node] = fn(node, t)
            except UnsupportedModelError:
                raise
            except Exception as e:  # a translator that meets an argument form it does not know
                raise UnsupportedModelError(_unsupported_message(node, f"this use of the op ({e})")) from e
        elif node.op == "output":
            for out in node.args[0]:
                name = t.values[out]
                if name in outputs or name in [i.name for i in inputs]:
                    name = t.emit("Identity", [name])
                outputs.append(name)
                output_float.append(_aten.val(out).dtype.is_floating_point)
        elif node.op == "get_attr":
            value = getattr(ep.graph_module, node.target)
            t.values[node] = t.const(value.detach().cpu().numpy())
    out_nodes = [n for n in ep.graph.nodes if n.op == "output"][0].args[0]
    value_infos = [_value_info(o, _aten.val(n)) for o, n in zip(outputs, out_nodes)]
    updates = list(t.buffer_updates.items())
    for buf, value in updates:
        value_infos.append(helper.make_tensor_value_info(value, TensorProto.UNDEFINED, None))
    graph = helper.make_graph(t.nodes, name, graph_inputs, value_infos, initializer=t.initializers)
    opsets = [helper.make_opsetid("", OPSET), helper.make_opsetid("graphtrain", 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 10
    return Captured(model=model, inputs=inputs, outputs=outputs, output_float=output_float,
                    buffer_updates=[(v, b) for b, v in updates], out_spec=record["spec"],
                    out_leaves=list(record["leaves"]), uncacheable=t.uncacheable)


def capture(module: torch.nn.Module, flat: list[Any], spec: Any, name: str) -> Captured:
    """torch.export + translation; failures become UnsupportedModelError with the cause."""
    try:
        ep, record = export_module(module, flat, spec)
    except UnsupportedModelError:
        raise
    except Exception as e:
        cause = "".join(traceback.format_exception_only(type(e), e)).strip().splitlines()
        raise UnsupportedModelError(
            f"torch.export could not capture {type(module).__name__}: {cause[0] if cause else e}. "
            "Set GRAPHTRAIN_FALLBACK_POLICY=eager to run this model in plain PyTorch.") from e
    return translate(ep, record, name)

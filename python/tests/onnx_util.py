"""Helpers to build single-node ONNX models and run them in graphtrain and onnxruntime."""

from __future__ import annotations

import os
import tempfile

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import graphtrain.engine as ge

NP_TO_ONNX = {
    np.dtype("float32"): TensorProto.FLOAT,
    np.dtype("float64"): TensorProto.DOUBLE,
    np.dtype("int64"): TensorProto.INT64,
    np.dtype("int32"): TensorProto.INT32,
    np.dtype("bool"): TensorProto.BOOL,
    np.dtype("float16"): TensorProto.FLOAT16,
    np.dtype("uint8"): TensorProto.UINT8,
    np.dtype("int8"): TensorProto.INT8,
}


def node_model(
    op: str,
    inputs: dict[str, np.ndarray | None],
    attrs: dict | None = None,
    n_outputs: int = 1,
    out_types: list[int] | None = None,
    constant_inputs: tuple[str, ...] = (),
    opset: int = 18,
    domain: str = "",
) -> onnx.ModelProto:
    """One node reading `inputs` (None: an absent optional input; names in `constant_inputs`
    become initializers) and producing `n_outputs` outputs."""
    graph_inputs, inits, names = [], [], []
    for name, value in inputs.items():
        if value is None:
            names.append("")
            continue
        names.append(name)
        value = np.asarray(value)
        if name in constant_inputs:
            inits.append(numpy_helper.from_array(value, name))
        else:
            graph_inputs.append(
                helper.make_tensor_value_info(name, NP_TO_ONNX[value.dtype], list(value.shape))
            )
    outs = [f"out{i}" for i in range(n_outputs)]
    node = helper.make_node(op, names, outs, domain=domain, **(attrs or {}))
    types = out_types or [TensorProto.FLOAT] * n_outputs
    graph = helper.make_graph(
        [node],
        "test",
        graph_inputs,
        [helper.make_tensor_value_info(o, t, None) for o, t in zip(outs, types)],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def run_graphtrain(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "m.onnx")
        onnx.save(model, path)
        sess = ge.Session(path)
        return [np.asarray(o) for o in sess.run(feeds)]


def run_node(
    op, inputs, attrs=None, n_outputs=1, out_types=None, constant_inputs=(), opset=18, domain=""
):
    model = node_model(op, inputs, attrs, n_outputs, out_types, constant_inputs, opset, domain)
    feeds = {
        k: np.asarray(v) for k, v in inputs.items() if v is not None and k not in constant_inputs
    }
    return run_graphtrain(model, feeds)


def run_ort(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def graph_session(nodes: list, inputs: list, outputs: list[str]) -> ge.Session:
    """A Session of a graph of `nodes` (ONNX and graphtrain ops) with float inputs [(name, shape)]
    and float outputs named `outputs`."""
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(s)) for n, s in inputs],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outputs],
    )
    opsets = [helper.make_opsetid("", 18), helper.make_opsetid("graphtrain", 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    return ge.Session(ge.Model.from_bytes(model.SerializeToString()))

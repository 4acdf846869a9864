"""graphtrain._onnx_writer, the encoder capture writes its graphs with instead of the onnx package:
byte for byte what onnx.helper and numpy_helper write for the same arguments, on every kind of
field it writes and on the graphs of real captures."""

import numpy as np
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper
from torch.utils import _pytree as pytree

import graphtrain._capture as capture_mod
from graphtrain import _onnx_writer as proto
from models import training_inputs, training_model

ATTRS = [
    ("i", 3),
    ("neg", -7),
    ("flag", True),
    ("f", 0.1),
    ("nf", -2.5e-8),
    ("s", "tanh"),
    ("b", b"\x00\xff"),
    ("ints", [1, -1, 0, 2**40]),
    ("floats", [1.0, -0.5, 3]),
    ("strs", ["a", "bc"]),
    ("npint", np.int64(5)),
    ("npfloat", np.float32(0.25)),
]


def onnx_node(n: proto.Node) -> bytes:
    """The same node built by onnx.helper (tensor attributes through numpy_helper)."""
    attrs = {}
    for a in n.attribute:
        v = a.value
        if a.type == proto.TENSOR:
            arr = np.frombuffer(v.raw, dtype=helper.tensor_dtype_to_np_dtype(v.data_type))
            v = numpy_helper.from_array(arr.reshape(v.dims), v.name)
        attrs[a.name] = v
    node = helper.make_node(n.op_type, n.input, n.output, name=n.name, domain=n.domain, **attrs)
    for k, v in n.metadata:
        entry = node.metadata_props.add()
        entry.key, entry.value = k, v
    return node.SerializeToString()


@pytest.mark.parametrize("name,value", ATTRS)
def test_each_attribute_kind_encodes_as_onnx_helper(name, value):
    mine = proto.Node("Op", ["x"], ["y"], name="op_1", domain="graphtrain", **{name: value})
    theirs = helper.make_node("Op", ["x"], ["y"], name="op_1", domain="graphtrain", **{name: value})
    assert mine.encode() == theirs.SerializeToString()


def test_nodes_sort_attributes_skip_none_and_keep_scopes():
    mine = proto.Node("Add", ["a", "b"], ["c"], name="", domain="", z=1, a=[2.0], skip=None)
    mine.metadata.append(("graphtrain.scope", "blocks.0.attn"))
    assert mine.encode() == onnx_node(mine)
    tensor = proto.Tensor(np.array([1.5, -2], np.float32), "fill")
    with_tensor = proto.Node("ConstantOfShape", ["shape"], ["y"], name="c_2", value=tensor)
    assert with_tensor.encode() == onnx_node(with_tensor)


@pytest.mark.parametrize(
    "array",
    [
        np.float32(3.5),
        np.arange(6, dtype=np.float32).reshape(2, 3),
        np.array([-1, 2**40], np.int64),
        np.array([True, False, True]),
        np.array([1.5, -0.25], np.float16),
        np.zeros((0, 4), np.float64),
        np.array([[1, 2]], np.int32),
        np.array([7], np.uint8),
        np.arange(6, dtype=np.float32).reshape(2, 3).T,  # not contiguous
    ],
)
def test_initializers_encode_as_numpy_helper(array):
    array = np.asarray(array)
    assert (
        proto.Tensor(array, "w").encode() == numpy_helper.from_array(array, "w").SerializeToString()
    )


def test_an_initializer_of_an_unsupported_dtype_is_named():
    with pytest.raises(TypeError, match="cannot hold numpy dtype <U1"):
        proto.Tensor(np.array(["a"]), "s")
    with pytest.raises(TypeError, match="attribute 'x'.*dict"):
        proto.Node("Op", [], [], x={"a": 1})


@pytest.mark.parametrize("shape", [None, [], [2, 3], ["batch", 64], [None, 5]])
def test_value_infos_encode_as_make_tensor_value_info(shape):
    theirs = helper.make_tensor_value_info("v", TensorProto.FLOAT, shape)
    assert proto.value_info("v", TensorProto.FLOAT, shape) == theirs.SerializeToString()
    undefined = helper.make_tensor_value_info("u", TensorProto.UNDEFINED, None)
    assert proto.value_info("u", 0, None) == undefined.SerializeToString()


def onnx_model(nodes, name, inputs, outputs, initializers, opsets, ir_version) -> bytes:
    """The model built by onnx.helper from the writer's pieces."""
    from onnx import ModelProto, NodeProto, ValueInfoProto

    def parse(cls, data):
        m = cls()
        m.ParseFromString(data)
        return m

    graph = helper.make_graph(
        [parse(NodeProto, onnx_node(n)) for n in nodes],
        name,
        [parse(ValueInfoProto, v) for v in inputs],
        [parse(ValueInfoProto, v) for v in outputs],
        initializer=[parse(TensorProto, t.encode()) for t in initializers],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets])
    model.ir_version = ir_version
    assert isinstance(model, ModelProto)
    return model.SerializeToString()


def _gpt2() -> tuple[torch.nn.Module, tuple, dict]:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=100, n_positions=32)
    ids = torch.randint(0, 100, (2, 8))
    return GPT2LMHeadModel(config).train(), (), {"input_ids": ids, "labels": ids}


@pytest.mark.parametrize("name", ["gpt", "encoder", "cnn", "hf-gpt2"])
def test_real_captures_write_what_onnx_helper_writes(name, monkeypatch):
    written = []
    real = proto.model

    def spy(*args, **kwargs):
        data = real(*args, **kwargs)
        written.append((data, args, kwargs))
        return data

    monkeypatch.setattr(capture_mod.proto, "model", spy)
    if name == "hf-gpt2":
        model, args, kwargs = _gpt2()
    else:
        model, args, kwargs = training_model(name), training_inputs(name), {}
    flat, spec = pytree.tree_flatten((args, kwargs))
    captured = capture_mod.capture(model, flat, spec, name)
    ((data, args, kwargs),) = written
    assert captured.model == data
    assert data == onnx_model(*args, **kwargs)
    assert len(captured.proto().graph.node) > 10  # onnx parses it whole

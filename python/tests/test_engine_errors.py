"""Bad input gets a clear error that names the problem, never a crash."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import graphtrain.engine as ge
from graphtrain.errors import GraphError, GraphtrainError, InputError, ModelFileError
from models import export
from onnx_util import node_model


@pytest.fixture(scope="module")
def mlp_path(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("m") / "mlp.onnx")
    export("mlp", path)
    return path


def test_missing_file():
    with pytest.raises(ModelFileError, match="cannot open '/nonexistent/model.onnx'"):
        ge.Session("/nonexistent/model.onnx")


@pytest.mark.parametrize("keep", [0.0, 0.1, 0.5, 0.9, 0.999])
def test_truncated_model(mlp_path, tmp_path, keep):
    data = open(mlp_path, "rb").read()
    bad = tmp_path / "cut.onnx"
    bad.write_bytes(data[: int(len(data) * keep)])
    with pytest.raises(GraphtrainError, match="cut.onnx"):
        ge.Session(str(bad))


def test_corrupted_models_never_crash(mlp_path, tmp_path):
    data = bytearray(open(mlp_path, "rb").read())
    rng = np.random.default_rng(1)
    errors = 0
    for i in range(300):
        bad = bytearray(data)
        for _ in range(rng.integers(1, 8)):
            bad[rng.integers(0, len(bad))] = rng.integers(0, 256)
        p = tmp_path / f"c{i}.onnx"
        p.write_bytes(bytes(bad))
        try:
            s = ge.Session(str(p))
            s.run({"x": np.zeros((2, 32), np.float32)})
        except GraphtrainError:
            errors += 1
    assert errors > 0


def test_not_onnx_at_all(tmp_path):
    p = tmp_path / "text.onnx"
    p.write_text("this is not a model")
    with pytest.raises(ModelFileError, match="not a valid ONNX protobuf"):
        ge.Session(str(p))


def test_unknown_op_names_op_and_node(tmp_path):
    m = node_model("FancyOp", {"x": np.zeros((2,), np.float32)}, domain="my.domain")
    m.opset_import.append(helper.make_opsetid("my.domain", 1))
    p = tmp_path / "u.onnx"
    onnx.save(m, p)
    with pytest.raises(
        GraphError,
        match=r"node '.*' \(my.domain::FancyOp\): op my.domain::FancyOp has no cpu kernel",
    ):
        ge.Session(str(p))


def test_unsupported_opset_and_control_flow(tmp_path):
    m = node_model("Relu", {"x": np.zeros((2,), np.float32)}, opset=9)
    p = tmp_path / "old.onnx"
    onnx.save(m, p)
    with pytest.raises(ModelFileError, match="opset 9; graphtrain supports opsets 13"):
        ge.Session(str(p))
    body = helper.make_graph(
        [], "b", [], [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])]
    )
    node = helper.make_node("If", ["c"], ["y"], then_branch=body, else_branch=body)
    g = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    p2 = tmp_path / "if.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)]), p2)
    with pytest.raises(ModelFileError, match="subgraph; control flow"):
        ge.Session(str(p2))


def test_dangling_input_and_cycle(tmp_path):
    n = helper.make_node("Relu", ["nowhere"], ["y"], name="r")
    g = helper.make_graph(
        [n], "g", [], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    )
    p = tmp_path / "d.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)]), p)
    with pytest.raises(
        ModelFileError, match="node 'r' \\(Relu\\) input 0 'nowhere' is not a graph input"
    ):
        ge.Session(str(p))
    a = helper.make_node("Relu", ["b_out"], ["a_out"], name="a")
    b = helper.make_node("Relu", ["a_out"], ["b_out"], name="b")
    g = helper.make_graph(
        [a, b], "g", [], [helper.make_tensor_value_info("a_out", TensorProto.FLOAT, None)]
    )
    p = tmp_path / "cyc.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)]), p)
    with pytest.raises(ModelFileError, match="cycle"):
        ge.Session(str(p))


def test_type_mismatch_is_found_by_the_verifier(tmp_path):
    m = node_model("Add", {"a": np.zeros((2,), np.float32), "b": np.zeros((2,), np.int64)})
    p = tmp_path / "t.onnx"
    onnx.save(m, p)
    with pytest.raises(GraphError, match="different element types: 'a' is float32, 'b' is int64"):
        ge.Session(str(p))


def test_wrong_inputs_at_run_time(mlp_path):
    s = ge.Session(mlp_path)
    with pytest.raises(InputError, match="input 'x' must be float32, got float64"):
        s.run({"x": np.zeros((2, 32))})
    with pytest.raises(
        InputError, match=r"input 'x' must have rank 2 \(float32\[batch, 32\]\), got float32\[32\]"
    ):
        s.run({"x": np.zeros((32,), np.float32)})
    with pytest.raises(InputError, match=r"input 'x' dim 1 must be 32"):
        s.run({"x": np.zeros((2, 31), np.float32)})
    with pytest.raises(InputError, match="input 'x' .* was not given"):
        s.run({})
    with pytest.raises(InputError, match="no input named 'y'"):
        s.run({"x": np.zeros((2, 32), np.float32), "y": np.zeros(1, np.float32)})
    with pytest.raises(InputError, match="takes 1 inputs"):
        s.run([])
    with pytest.raises(InputError, match="expected a numpy array or a torch tensor"):
        s.run({"x": "text"})


def test_symbolic_dims_must_agree_across_inputs(tmp_path):
    path = str(tmp_path / "enc.onnx")
    export("encoder", path)
    s = ge.Session(path)
    with pytest.raises(InputError, match="'seq'"):
        s.run({"ids": np.zeros((2, 5), np.int64), "mask": np.ones((2, 6), np.int64)})

"""Real models exported from torch: forward parity with onnxruntime (a third-party runtime),
shape inference against onnx.shape_inference, and files written by graphtrain that onnx's checker
accepts and onnxruntime runs."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import graphtrain.engine as ge
from models import example_inputs, export
from onnx_util import graph_session

MODELS = ["mlp", "encoder", "gpt", "cnn"]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    d = tmp_path_factory.mktemp("models")
    paths = {}
    for name in MODELS:
        paths[name] = str(d / f"{name}.onnx")
        export(name, paths[name])
    return paths


def feeds(path, name, batch, seq):
    return {
        k: v.numpy()
        for k, v in zip(ge.Model(path).input_names, example_inputs(name, batch, seq, seed=batch))
    }


@pytest.mark.parametrize("name", MODELS)
def test_forward_parity_with_onnxruntime(name, exported):
    sess = ge.Session(exported[name])
    ref_sess = ort.InferenceSession(exported[name], providers=["CPUExecutionProvider"])
    for batch, seq in [(4, 12), (3, 7)]:  # two shapes, one plan: symbolic dims bind per run
        f = feeds(exported[name], name, batch, seq)
        (out,) = sess.run(f)
        (ref,) = ref_sess.run(None, f)
        diff = float(np.max(np.abs(out - ref)))
        print(f"{name} batch={batch} seq={seq}: max abs diff {diff:.3g}")
        scale = float(np.max(np.abs(ref)))
        np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5 * max(scale, 1.0))


@pytest.mark.parametrize("name", MODELS)
def test_shape_inference_matches_onnx(name, tmp_path):
    path = str(tmp_path / f"{name}.onnx")
    export(name, path, dynamic=False)
    inferred = onnx.shape_inference.infer_shapes(onnx.load(path), data_prop=True)
    expected = {}
    for vi in list(inferred.graph.value_info) + list(inferred.graph.output):
        t = vi.type.tensor_type
        if t.HasField("shape") and all(d.HasField("dim_value") for d in t.shape.dim):
            expected[vi.name] = [d.dim_value for d in t.shape.dim]
    model = ge.Model(path)
    model.infer_shapes()
    ours = model.value_types()
    assert len(expected) > 5
    for value, dims in expected.items():
        assert value in ours, value
        assert ours[value][1] == dims, f"{value}: graphtrain {ours[value][1]}, onnx {dims}"


def test_symbolic_dims_flow_through_attention(exported):
    model = ge.Model(exported["encoder"])
    model.infer_shapes()
    types = model.value_types()
    assert types["out"] == ("float32", ["batch", 3])
    # The attention scores keep the named dims through Shape -> Gather -> Concat -> Reshape.
    scores = [dims for _, dims in types.values() if dims and len(dims) == 4 and dims[1] == 4]
    assert ["batch", 4, "seq", "seq"] in scores


@pytest.mark.parametrize("name", MODELS)
def test_written_model_passes_checker_and_runs_in_onnxruntime(name, exported, tmp_path):
    out = str(tmp_path / "written.onnx")
    ge.Model(exported[name]).save(out)
    onnx.checker.check_model(onnx.load(out), full_check=True)
    f = feeds(exported[name], name, 2, 5)
    (ref,) = ort.InferenceSession(exported[name], providers=["CPUExecutionProvider"]).run(None, f)
    (again,) = ort.InferenceSession(out, providers=["CPUExecutionProvider"]).run(None, f)
    np.testing.assert_array_equal(again, ref)


def test_external_data_round_trip(exported, tmp_path):
    out = str(tmp_path / "ext.onnx")
    ge.Model(exported["gpt"]).save(out, external_data_threshold=1024)
    assert (tmp_path / "ext.onnx.data").stat().st_size > 10_000
    proto = onnx.load(out, load_external_data=False)
    for init in proto.graph.initializer:
        big = np.prod(init.dims) * 4 >= 1024
        assert (init.data_location == onnx.TensorProto.EXTERNAL) == big, init.name
    onnx.checker.check_model(out)  # path form: the checker reads external data beside it
    f = feeds(exported["gpt"], "gpt", 2, 6)
    (ours,) = ge.Session(out).run(f)
    (ref,) = ort.InferenceSession(out, providers=["CPUExecutionProvider"]).run(None, f)
    np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-5)


def test_run_dlpack_capsules_keep_their_data_alive():
    # GraphModule's path: torch tensors in as DLPack capsules, results out as capsules. An output
    # that is an input's data (Reshape is a view) must stay valid after the caller dropped both
    # the tensor and the capsule; an output capsule nobody consumes is freed by itself.
    import gc

    import torch
    from onnx import TensorProto, helper
    from torch.utils.dlpack import from_dlpack, to_dlpack

    graph = helper.make_graph(
        [
            helper.make_node("Reshape", ["x", "shape"], ["view"]),
            helper.make_node("Relu", ["x"], ["relu"]),
        ],
        "g",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
            helper.make_tensor_value_info("shape", TensorProto.INT64, [1]),
        ],
        [
            helper.make_tensor_value_info("view", TensorProto.FLOAT, [6]),
            helper.make_tensor_value_info("relu", TensorProto.FLOAT, [2, 3]),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    session = ge.Session(ge.Model.from_bytes(model.SerializeToString()))
    x = torch.arange(-3.0, 3.0).reshape(2, 3)
    expected = x.clone()
    capsules = session.run_dlpack([to_dlpack(x * 1), to_dlpack(torch.tensor([6]))])
    del x
    gc.collect()
    torch.randn(1000, 1000)  # reuse freed memory, if any was freed too early
    view, relu = from_dlpack(capsules[0]), from_dlpack(capsules[1])
    del capsules
    gc.collect()
    torch.testing.assert_close(view, expected.reshape(6))
    torch.testing.assert_close(relu, expected.clamp(min=0))
    unused = session.run_dlpack([to_dlpack(expected), to_dlpack(torch.tensor([6]))])
    assert all(type(c).__name__ == "PyCapsule" for c in unused)
    del unused  # never consumed: the capsules free the results themselves


def test_run_dlpack_keeps_a_stash_in_cpp_for_the_next_run():
    # GraphModule's forward keeps the values stashed for the backward as one Stash (engine tensors
    # that never become torch tensors) and feeds it to the backward, where it stands for its
    # tensors in order. A stashed view of an input stays valid after the input is gone. The run
    # it feeds takes its tensors (and frees each after its last reader): a Stash feeds one run.
    import gc

    import torch
    from onnx import helper
    from torch.utils.dlpack import from_dlpack, to_dlpack

    forward = graph_session(
        [helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Identity", ["x"], ["kept"])],
        [("x", [2, 3])],
        ["y", "kept"],
    )
    backward = graph_session(
        [helper.make_node("Mul", ["dy", "kept"], ["dx"])],
        [("dy", [2, 3]), ("kept", [2, 3])],
        ["dx"],
    )
    x = torch.arange(-3.0, 3.0).reshape(2, 3)
    expected = x.clone()
    y_capsule, stash = forward.run_dlpack([to_dlpack(x * 1)], keep=1)
    assert isinstance(stash, ge.Stash) and len(stash) == 1 and stash.nbytes == 6 * 4
    del x
    gc.collect()
    torch.randn(1000, 1000)  # reuse freed memory, if any was freed too early
    torch.testing.assert_close(from_dlpack(y_capsule), expected.clamp(min=0))
    (dx,) = backward.run_dlpack([to_dlpack(torch.full((2, 3), 2.0)), stash])
    torch.testing.assert_close(from_dlpack(dx), expected * 2)
    assert len(stash) == 0 and stash.nbytes == 0
    with pytest.raises(Exception, match="input 1: this Stash was fed to an earlier run"):
        backward.run_dlpack([to_dlpack(torch.full((2, 3), 2.0)), stash])
    with pytest.raises(Exception, match="keep 3 outputs in C\\+\\+, the graph has 2"):
        forward.run_dlpack([to_dlpack(expected)], keep=3)

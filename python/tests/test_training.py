"""TrainingSession: whole-model gradients against torch autograd, 20 AdamW steps against
torch.optim.AdamW, checkpoints, export for inference, and the stash the builder keeps."""

import numpy as np
import onnxruntime as ort
import pytest
import torch

import graphtrain.engine as ge
from graphtrain.errors import GraphError, InputError, ModelFileError
from models import TRAINING_INPUT_NAMES, export_training, training_inputs

MODELS = ["mlp", "encoder", "gpt", "cnn"]


def feeds_of(name, inputs):
    return {n: t.numpy() for n, t in zip(TRAINING_INPUT_NAMES[name], inputs)}


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    d = tmp_path_factory.mktemp("train")
    return {name: str(d / f"{name}.onnx") for name in MODELS}


@pytest.mark.parametrize("name", MODELS)
def test_whole_model_gradients_match_torch(name, exported):
    model = export_training(name, exported[name])
    ts = ge.TrainingSession(exported[name])
    inputs = training_inputs(name, seed=5)
    loss = ts.train_step(feeds_of(name, inputs))
    ref_loss = model(*inputs)
    ref_loss.backward()
    np.testing.assert_allclose(loss, ref_loss.item(), rtol=1e-5)
    params = dict(model.named_parameters())
    assert sorted(ts.parameter_names) == sorted(params)
    scale = max(float(p.grad.abs().max()) for p in params.values())
    for pname, p in params.items():
        # rtol 1e-4; the absolute floor is relative to the model's largest gradient (a conv bias
        # followed by BatchNorm has a true gradient of zero, and both sides hold rounding noise).
        np.testing.assert_allclose(
            ts.gradient(pname), p.grad.numpy(), rtol=1e-4, atol=1e-6 * scale, err_msg=pname
        )


@pytest.mark.parametrize("name", MODELS)
def test_twenty_adamw_steps_match_torch(name, exported):
    model = export_training(name, exported[name])
    ts = ge.TrainingSession(exported[name], optimizer="adamw", lr=1e-3, weight_decay=0.01)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    ours, theirs = [], []
    for step in range(20):
        inputs = training_inputs(name, seed=step)
        ts.zero_grad()
        ours.append(ts.train_step(feeds_of(name, inputs)))
        ts.optimizer_step()
        opt.zero_grad()
        loss = model(*inputs)
        loss.backward()
        opt.step()
        theirs.append(loss.item())
    print(name, "losses", [f"{a:.5f}/{b:.5f}" for a, b in zip(ours[::5], theirs[::5])])
    np.testing.assert_allclose(ours, theirs, rtol=1e-4)
    # Weights too. (Biases are skipped: a key projection's bias has a true gradient of zero, and
    # Adam turns the rounding noise both sides see into full-size, unrelated steps.)
    for pname, p in model.named_parameters():
        if pname.endswith("weight"):
            np.testing.assert_allclose(
                ts.parameter(pname), p.detach().numpy(), rtol=1e-3, atol=1e-5, err_msg=pname
            )


def test_sgd_with_momentum_matches_torch(exported):
    model = export_training("mlp", exported["mlp"])
    ts = ge.TrainingSession(
        exported["mlp"], optimizer="sgd", lr=0.05, momentum=0.9, weight_decay=1e-4
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
    for step in range(10):
        inputs = training_inputs("mlp", seed=step)
        ts.zero_grad()
        ours = ts.train_step(feeds_of("mlp", inputs))
        ts.optimizer_step()
        opt.zero_grad()
        loss = model(*inputs)
        loss.backward()
        opt.step()
        np.testing.assert_allclose(ours, loss.item(), rtol=1e-4)


def test_checkpoint_round_trip_is_exact(exported, tmp_path):
    export_training("encoder", exported["encoder"])
    batches = [feeds_of("encoder", training_inputs("encoder", seed=s)) for s in range(10)]

    def steps(ts, bs):
        out = []
        for b in bs:
            ts.zero_grad()
            out.append(ts.train_step(b))
            ts.optimizer_step()
        return out

    straight = ge.TrainingSession(exported["encoder"])
    ten = steps(straight, batches)
    first = ge.TrainingSession(exported["encoder"])
    five = steps(first, batches[:5])
    ck = str(tmp_path / "ck.onnx")
    first.save_checkpoint(ck)
    resumed = ge.TrainingSession(exported["encoder"])
    resumed.load_checkpoint(ck)
    assert resumed.optimizer_steps == 5
    rest = steps(resumed, batches[5:])
    assert five + rest == ten
    for p in straight.parameter_names:
        np.testing.assert_array_equal(resumed.parameter(p), straight.parameter(p))


def test_bad_checkpoints_are_named(exported, tmp_path):
    export_training("mlp", exported["mlp"])
    export_training("cnn", exported["cnn"])
    ck = str(tmp_path / "mlp.ck")
    ge.TrainingSession(exported["mlp"]).save_checkpoint(ck)
    with pytest.raises(
        ModelFileError, match=r"checkpoint .*: parameter 'model\.\w+\.\w+' is missing"
    ):
        ge.TrainingSession(exported["cnn"]).load_checkpoint(ck)
    with pytest.raises(ModelFileError, match="adamw state but this session uses sgd"):
        ge.TrainingSession(exported["mlp"], optimizer="sgd").load_checkpoint(ck)
    open(ck, "wb").write(open(ck, "rb").read()[:100])
    with pytest.raises(ModelFileError):
        ge.TrainingSession(exported["mlp"]).load_checkpoint(ck)


def test_export_for_inference_runs_in_onnxruntime(exported, tmp_path):
    export_training("mlp", exported["mlp"])
    ts = ge.TrainingSession(exported["mlp"])
    batch = feeds_of("mlp", training_inputs("mlp", seed=1))
    for _ in range(3):
        ts.zero_grad()
        ts.train_step(batch)
        ts.optimizer_step()
    out = str(tmp_path / "trained.onnx")
    ts.export_for_inference(out)
    (loss,) = ort.InferenceSession(out, providers=["CPUExecutionProvider"]).run(None, batch)
    np.testing.assert_allclose(loss, ts.eval_step(batch), rtol=1e-5)


def test_mlp_stash_is_minimal(exported):
    """The MLP's backward reads exactly what its rules need; nothing else crosses."""
    export_training("mlp", exported["mlp"])
    ts = ge.TrainingSession(exported["mlp"])
    stashed = sorted(ts.stashed)
    assert len(stashed) == len(set(stashed))  # no duplicates
    expected = sorted(
        [
            "x",  # fc1.weight's gradient
            "/model/Relu_output_0",  # ReLU's gradient and LayerNorm's input
            "/model/norm/LayerNormalization_output_0",  # fc2.weight's gradient
            "/model/Mul_1_output_0",  # head.weight's gradient
            "model.fc2.weight",
            "model.head.weight",
            "model.norm.weight",  # input gradients
        ]
    )
    # The builder's own values: LayerNorm's mean and inverse std, the scores' gradient that the
    # loss writes in the forward (fuse_loss_gradient), in place of the scores and labels, and the
    # GELU's derivative (exported in its erf form, Div, Erf, Add, Mul, Mul, it is one Gelu to
    # autodiff, recognize_gelu, named after the last Mul), in place of its input
    # (stash_gelu_derivative): fc2's output is not stashed.
    extra = [s for s in stashed if s not in expected]
    assert sorted(s.split("_out")[0] for s in extra) == [
        "/SoftmaxCrossEntropyLoss",
        "/model/Mul_1",
        "/model/norm/LayerNormalization",
        "/model/norm/LayerNormalization",
    ], extra
    assert "/model/fc2/Gemm_output_0" not in stashed
    assert set(expected) <= set(stashed)
    assert len(stashed) == 11


def test_clear_errors(exported, tmp_path):
    export_training("mlp", exported["mlp"])
    with pytest.raises(GraphError, match="no value named 'nope' for the loss"):
        ge.TrainingSession(exported["mlp"], loss="nope")
    with pytest.raises(GraphError, match="'bogus' is not an initializer"):
        ge.TrainingSession(exported["mlp"], trainable=["bogus"])
    ts = ge.TrainingSession(exported["mlp"])
    with pytest.raises(InputError, match="input 'labels' .* was not given"):
        ts.train_step({"x": np.zeros((2, 32), np.float32)})
    with pytest.raises(InputError, match="no input named 'y'"):
        ts.train_step({"x": np.zeros((2, 32), np.float32), "y": np.zeros(2, np.int64)})
    with pytest.raises(InputError, match="input 'x' dim 1 must be 32"):
        ts.train_step({"x": np.zeros((2, 31), np.float32), "labels": np.zeros(2, np.int64)})

"""The export cache: a second process with the same key captures nothing and trains the same;
what changes the graph captures anew; a damaged file is replaced."""

import os
import subprocess
import sys
from pathlib import Path

import onnx

SCRIPT = r"""
import sys, torch
sys.path.insert(0, {tests!r})
import graphtrain
from models import training_model, training_inputs
torch.manual_seed(0)
hidden = int(sys.argv[1]); dtype = sys.argv[2]; mode = sys.argv[3]; batch = int(sys.argv[4])
model = training_model("mlp", hidden=hidden)
if mode == "eval":
    model.eval()
gm = graphtrain.GraphModule(model)
x, y = training_inputs("mlp", seed=3, **({{"batch": batch}} if batch else {{}}))
if dtype == "int64":  # integer features, cast inside the model
    class Cast(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = training_model("mlp", hidden=hidden)

        def forward(self, x, y):
            return self.inner(x.float(), y)

    gm = graphtrain.GraphModule(Cast())
    x = (x * 10).long()
loss = gm(x, y)
if mode == "train":
    loss.backward()
print("RESULT", gm.captures, repr(loss.item()))
"""


def run(cache: Path, hidden=64, dtype="float32", mode="train", level="WARNING", batch=0, then=""):
    code = SCRIPT.format(tests=str(Path(__file__).parent)) + then
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRAPHTRAIN_")}
    env.update(GRAPHTRAIN_CACHE_DIR=str(cache), GRAPHTRAIN_LOG_LEVEL=level)
    r = subprocess.run(
        [sys.executable, "-c", code, str(hidden), dtype, mode, str(batch)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    line = [x for x in r.stdout.splitlines() if x.startswith("RESULT")][0].split()
    return int(line[1]), float(line[2]), r.stderr


def test_second_process_captures_nothing_and_agrees(tmp_path):
    captures, loss, _ = run(tmp_path)
    assert captures == 1
    files = list(tmp_path.glob("*.onnx"))
    assert len(files) == 1
    onnx.checker.check_model(onnx.load(files[0]))  # a cached graph is a real ONNX model
    captures2, loss2, log = run(tmp_path, level="INFO")
    assert captures2 == 0 and loss2 == loss
    assert f"loaded the captured graph of WithLoss (train) from {files[0]}" in log
    assert "capturing took" in log


def test_cache_hit_loads_no_capture_machinery(tmp_path):
    """A graph from the cache runs without torch.export, the ATen translators or the onnx package
    (their import costs ~45 MiB of the training process's peak memory)."""
    heavy = ("onnx", "torch._dynamo", "graphtrain._capture", "graphtrain._aten")
    report = f"print('LOADED', [m for m in {heavy!r} if m in sys.modules], file=sys.stderr)"
    assert run(tmp_path, then=report)[0] == 1
    captures, _, log = run(tmp_path, then=report)
    assert captures == 0
    assert "LOADED []" in log, log


def test_a_new_batch_size_replaces_the_specialized_graph(tmp_path):
    """The first capture specializes every size and is cached; a process with another batch size
    loads it, captures once with the sizes symbolic and replaces the file; every size then loads."""
    captures, loss, log = run(tmp_path, level="INFO")
    assert captures == 1 and "sizes specialized" in log
    assert run(tmp_path)[0] == 0
    captures, _, log = run(tmp_path, batch=5, level="INFO")
    assert captures == 1 and "sizes symbolic" in log
    assert len(list(tmp_path.glob("*.onnx"))) == 1
    assert run(tmp_path, batch=7)[0] == 0
    assert run(tmp_path) == (0, loss, "")


def test_changes_that_matter_capture_anew(tmp_path):
    run(tmp_path)
    assert run(tmp_path, hidden=48)[0] == 1  # a hidden size: parameter shapes
    assert run(tmp_path, mode="eval")[0] == 1  # train / eval
    assert run(tmp_path, dtype="int64")[0] == 1  # an input dtype
    assert run(tmp_path, dtype="int64")[0] == 0
    assert len(list(tmp_path.glob("*.onnx"))) == 4
    assert not list(tmp_path.glob(".tmp-*"))
    assert run(tmp_path, hidden=48)[0] == 0


def test_damaged_file_is_replaced_with_one_warning(tmp_path):
    _, loss, _ = run(tmp_path)
    (path,) = tmp_path.glob("*.onnx")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    captures, loss2, log = run(tmp_path)
    assert captures == 1 and loss2 == loss
    assert log.count("is unusable") == 1 and str(path) in log
    assert run(tmp_path)[0] == 0  # replaced by a good file
    # A flipped byte inside the graph: the checksum catches it.
    data = bytearray(path.read_bytes())
    data[len(data) // 3] ^= 0x01
    path.write_bytes(bytes(data))
    assert run(tmp_path)[0] == 1


def test_two_processes_writing_one_key(tmp_path):
    code = SCRIPT.format(tests=str(Path(__file__).parent))
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRAPHTRAIN_")}
    env["GRAPHTRAIN_CACHE_DIR"] = str(tmp_path)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, "64", "float32", "train", "0"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    results = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), results
    losses = {r[0].split()[-1] for r in results}
    assert len(losses) == 1
    files = list(tmp_path.glob("*"))
    assert len(files) == 1 and files[0].suffix == ".onnx"  # one whole file, no temporary left
    onnx.checker.check_model(onnx.load(files[0]))
    assert run(tmp_path)[0] == 0


def test_new_cache_folder_is_private(tmp_path):
    cache = tmp_path / "shared" / "graphs"
    run(cache)
    assert (cache.stat().st_mode & 0o777) == 0o700
    assert all((p.stat().st_mode & 0o077) == 0 for p in cache.iterdir())


def test_graph_another_user_could_write_is_refused_with_one_warning(tmp_path):
    _, loss, _ = run(tmp_path)
    (path,) = tmp_path.glob("*.onnx")
    path.chmod(0o664)  # group-writable: someone else could have planted it
    captures, loss2, log = run(tmp_path)
    assert captures == 1 and loss2 == loss
    assert (
        log.count("not using the graph cache") == 1
        and "writable by group or others (mode 664)" in log
    )
    path.chmod(0o600)
    assert run(tmp_path)[0] == 0
    tmp_path.chmod(0o777)  # a folder anyone can write into: nothing in it is trusted
    captures, _, log = run(tmp_path)
    assert captures == 1 and f"not using the graph cache at {tmp_path}" in log
    tmp_path.chmod(0o700)
    if os.getuid() == 0:  # root can give the file away
        os.chown(path, 12345, -1)
        captures, _, log = run(tmp_path)
        assert captures == 1 and "owned by user id 12345" in log

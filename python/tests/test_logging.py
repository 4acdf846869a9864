import logging
import socket

import pytest

import graphtrain
from conftest import run_python
from graphtrain import LogLevel, log, log_once


@pytest.fixture
def records():
    """Records reaching a handler the user attached to the 'graphtrain' logger."""
    seen: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record):
            seen.append(record)

    h = Keep()
    logger = logging.getLogger("graphtrain")
    logger.addHandler(h)
    yield seen
    logger.removeHandler(h)


def test_python_messages_use_the_standard_logging_module(records):
    log("WARNING", "python warning")
    log(LogLevel.INFO, "filtered at the default level")
    assert [r.getMessage() for r in records] == ["python warning"]
    assert records[0].name == "graphtrain" and records[0].levelno == logging.WARNING
    assert records[0].pathname == __file__  # the caller's location, not graphtrain's


def test_cpp_messages_reach_the_same_handlers(records):
    # The capture's record is formatted and emitted by C++ code.
    with graphtrain.capture_output("phase under test"):
        print("a line the user should see", flush=True)
    assert len(records) == 1
    assert "phase under test" in records[0].getMessage()
    assert "a line the user should see" in records[0].getMessage()


def test_level_set_from_api_and_debug_options(records):
    graphtrain.set_log_level("info")
    log("INFO", "now visible")
    assert graphtrain.options()["log_level"].source == "api"
    graphtrain.DebugOptions(log_level=LogLevel.ERROR).apply()
    log("WARNING", "now hidden")
    assert [r.getMessage() for r in records] == ["now visible"]
    graphtrain.DebugOptions().apply()  # no level given: keeps the one in force
    assert graphtrain.options()["log_level"].value == "ERROR"


def test_debug_options_validate():
    with pytest.raises(graphtrain.GraphtrainError, match="onnx_prefix"):
        graphtrain.DebugOptions(save_onnx=True)
    with pytest.raises(graphtrain.OptionError, match="LOUD"):
        graphtrain.DebugOptions(log_level="LOUD")


def test_log_once_per_site(records):
    for _ in range(10):
        log_once("WARNING", "said once")
    for i in range(3):
        log_once("WARNING", f"keyed {i}", key="my-key")
    assert [r.getMessage() for r in records] == ["said once", "keyed 0"]


def test_log_once_not_used_up_while_filtered(records):
    def site():
        log_once("INFO", "info once")

    site()  # filtered at WARNING
    graphtrain.set_log_level("INFO")
    site()
    site()
    assert [r.getMessage() for r in records] == ["info once"]


def test_default_handler_prints_when_logging_is_unconfigured():
    r = run_python("import graphtrain; graphtrain.log('WARNING', 'plain warning')")
    assert r.returncode == 0
    assert r.stderr.strip() == "graphtrain WARNING: plain warning"


def test_users_logging_config_applies_without_duplicates():
    code = (
        "import logging, sys; logging.basicConfig(stream=sys.stdout, format='USER %(name)s "
        "%(levelname)s %(message)s'); import graphtrain; graphtrain.log('WARNING', 'hello')"
    )
    r = run_python(code)
    assert r.stdout.strip() == "USER graphtrain WARNING hello"
    assert r.stderr == ""


def test_rank_from_environment():
    code = (
        "import graphtrain; graphtrain.log('WARNING','warn'); graphtrain.log('ERROR','err');"
        "graphtrain.log('INFO','info')"
    )
    r = run_python(code, {"RANK": "1"})
    assert r.stderr.strip().splitlines() == ["graphtrain ERROR [rank 1]: err"]
    r = run_python(code, {"RANK": "1", "GRAPHTRAIN_LOG_LEVEL": "INFO"})
    assert r.stderr.strip().splitlines() == [
        "graphtrain WARNING [rank 1]: warn",
        "graphtrain ERROR [rank 1]: err",
        "graphtrain INFO [rank 1]: info",
    ]
    r = run_python(code, {"RANK": "0", "GRAPHTRAIN_LOG_LEVEL": "INFO"})
    assert "graphtrain INFO [rank 0]: info" in r.stderr


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("level", ["WARNING", "INFO"])
def test_rank_from_torch_distributed(level):
    """Two real gloo ranks on loopback; RANK is not set, the rank comes from torch.distributed."""
    port = _free_port()
    code = f"""
import os, sys
import torch.distributed as dist
import torch.multiprocessing as mp
import graphtrain

def work(rank):
    os.environ.pop("RANK", None)
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    graphtrain.log("WARNING", f"warning from process {{rank}}")
    graphtrain.log("INFO", f"info from process {{rank}}")
    dist.barrier()
    dist.destroy_process_group()

if __name__ == "__main__":
    mp.start_processes(work, nprocs=2, start_method="spawn")
"""
    import os
    import subprocess
    import sys
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(code)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRAPHTRAIN_")}
    env.pop("RANK", None)
    env["GRAPHTRAIN_LOG_LEVEL"] = level
    r = subprocess.run(
        [sys.executable, f.name], env=env, capture_output=True, text=True, timeout=180
    )
    os.unlink(f.name)
    assert r.returncode == 0, r.stderr
    lines = sorted(line for line in r.stderr.splitlines() if line.startswith("graphtrain"))
    if level == "WARNING":
        assert lines == ["graphtrain WARNING: warning from process 0"]
    else:
        assert lines == [
            "graphtrain INFO [rank 0]: info from process 0",
            "graphtrain INFO [rank 1]: info from process 1",
            "graphtrain WARNING [rank 0]: warning from process 0",
            "graphtrain WARNING [rank 1]: warning from process 1",
        ]

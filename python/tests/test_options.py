import subprocess
import sys
from pathlib import Path

import pytest

import graphtrain
from conftest import run_python
from graphtrain import OptionError

ROOT = Path(__file__).resolve().parents[2]
DESIGN_OPTIONS = [
    "GRAPHTRAIN_LOG_LEVEL",
    "GRAPHTRAIN_CACHE_DIR",
    "GRAPHTRAIN_FALLBACK_POLICY",
    "GRAPHTRAIN_ENABLE_CUSTOM_AUTOGRAD",
    "GRAPHTRAIN_ENABLE_COMPUTE_OPTIMIZER",
    "GRAPHTRAIN_SAVE_ONNX_PATH",
    "GRAPHTRAIN_NUM_THREADS",
    "GRAPHTRAIN_ENABLE_ZERO_STAGE3",
    "GRAPHTRAIN_PRINT_MEMORY_STATS",
]


def test_every_design_option_exists_with_a_doc():
    opts = graphtrain.options()
    for env in DESIGN_OPTIONS:
        o = opts[env]
        assert o.env == env and o.doc
    assert opts["num_threads"].type == "int"
    assert opts["enable_zero_stage3"].value is False
    assert opts["log_level"].choices == ("VERBOSE", "DEVINFO", "INFO", "WARNING", "ERROR", "FATAL")


def test_environment_overrides_default_with_its_source():
    code = (
        "import graphtrain; o = graphtrain.options();"
        "print(o['num_threads'].value, o['num_threads'].source,"
        " o['enable_zero_stage3'].value, o['log_level'].value, o['log_level'].source)"
    )
    r = run_python(code, {"GRAPHTRAIN_NUM_THREADS": "3", "GRAPHTRAIN_ENABLE_ZERO_STAGE3": "True"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["3", "env", "True", "WARNING", "default"]


def test_api_setting_wins_and_reload_forgets_it():
    graphtrain.set_option("num_threads", 5)
    graphtrain.set_option("enable_compute_optimizer", False)
    o = graphtrain.options()
    assert (o["num_threads"].value, o["num_threads"].source) == (5, "api")
    assert o["enable_compute_optimizer"].value is False
    graphtrain.reload_options()
    assert graphtrain.options()["num_threads"].source != "api"


@pytest.mark.parametrize(
    "env, value, expected",
    [
        ("GRAPHTRAIN_LOG_LEVEL", "LOUD", "VERBOSE, DEVINFO, INFO, WARNING, ERROR, FATAL"),
        ("GRAPHTRAIN_NUM_THREADS", "-3", "an integer from 0 to 4096"),
        ("GRAPHTRAIN_ENABLE_ZERO_STAGE3", "yes", "0, 1, true, false"),
        ("GRAPHTRAIN_FALLBACK_POLICY", "sometimes", "ATEN, OFF, EAGER"),
    ],
)
def test_bad_environment_value_fails_at_import_naming_variable_value_and_accepted(
    env, value, expected
):
    r = run_python("import graphtrain", {env: value})
    assert r.returncode != 0
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("graphtrain.errors.OptionError:"), r.stderr
    assert f"{env}='{value}'" in last
    assert expected in last


def test_bad_api_value_raises_option_error_and_keeps_old_value():
    with pytest.raises(OptionError, match=r"num_threads.*'-3'.*from 0 to"):
        graphtrain.set_option("num_threads", -3)
    with pytest.raises(ValueError):  # OptionError is a ValueError too
        graphtrain.set_option("enable_zero_stage3", "maybe")
    with pytest.raises(OptionError, match="no runtime option named 'nope'"):
        graphtrain.set_option("nope", 1)
    assert graphtrain.options()["num_threads"].source != "api"


def test_options_print_as_a_table():
    text = str(graphtrain.options())
    lines = text.splitlines()
    assert lines[0].split() == ["option", "environment", "variable", "value", "source"]
    assert any(line.startswith("log_level") and "GRAPHTRAIN_LOG_LEVEL" in line for line in lines)


def test_cli_prints_the_table():
    r = subprocess.run(
        [sys.executable, "-m", "graphtrain", "options"], capture_output=True, text=True, check=True
    )
    assert "GRAPHTRAIN_NUM_THREADS" in r.stdout and "source" in r.stdout


def test_readme_options_table_matches_registry():
    r = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "readme_options.py")],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    readme = (ROOT / "README.md").read_text()
    for env in DESIGN_OPTIONS:
        assert f"`{env}`" in readme

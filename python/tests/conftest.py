import os
import subprocess
import sys

import pytest

import graphtrain


@pytest.fixture(autouse=True)
def _fresh_options():
    """Every test starts from the environment's options and leaves no API settings behind."""
    graphtrain.reload_options()
    yield
    graphtrain.reload_options()


def run_python(code: str, env: dict[str, str] | None = None, timeout: float = 120):
    """Runs `code` in a fresh interpreter with GRAPHTRAIN_* variables replaced by `env`."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("GRAPHTRAIN_")}
    full_env.pop("RANK", None)
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-c", code], env=full_env, capture_output=True, text=True, timeout=timeout
    )

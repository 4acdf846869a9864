"""The main demo. Today graphtrain's foundation exists: runtime options and one logger for C++
and Python. Once GraphModule lands, this trains a small model and compares it with plain PyTorch.
"""

from __future__ import annotations

import ctypes

import graphtrain


def main() -> None:
    print("graphtrain", graphtrain.__version__)
    print()
    print("Runtime options (GRAPHTRAIN_* environment variables override the defaults):")
    print(graphtrain.options())
    print()

    print("Logging: WARNING is the default level; this INFO line is filtered out:")
    graphtrain.log("INFO", "you do not see this at WARNING")
    graphtrain.log("WARNING", "a warning from Python, through the standard logging module")
    print()

    print("Output capture: what native code prints in a noisy phase becomes one record,")
    print("with known-useless lines suppressed:")
    libc = ctypes.CDLL(None)
    with graphtrain.capture_output("demo phase"):
        for text in (b"[graphtrain-noise] useless line\n", b"a line worth reading\n"):
            libc.write(1, text, len(text))
    print()
    print("Set GRAPHTRAIN_LOG_LEVEL=INFO (or DebugOptions(log_level='INFO')) for more detail.")


if __name__ == "__main__":
    main()

import ctypes
import logging
import os

import pytest

import graphtrain
from conftest import run_python

libc = ctypes.CDLL(None, use_errno=True)


def native_write(fd: int, text: str) -> None:
    """write(2) called from C, as a native library would."""
    data = text.encode()
    assert libc.write(fd, data, len(data)) == len(data)


def fd_count() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.fixture
def records():
    seen: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())

    h = Keep()
    logging.getLogger("graphtrain").addHandler(h)
    yield seen
    logging.getLogger("graphtrain").removeHandler(h)


def test_native_output_is_captured_and_filtered(records, capfd):
    with graphtrain.capture_output("graph building"):
        native_write(1, "[graphtrain-noise] known chatter\n")
        native_write(2, "native stderr line\n")
        print("python print line")
    out, err = capfd.readouterr()
    assert "native stderr line" not in err and "python print line" not in out
    assert len(records) == 1
    msg = records[0]
    assert msg.startswith("graph building: native output (2 line(s) shown, 1 known-useless")
    assert "\n  native stderr line" in msg and "\n  python print line" in msg
    assert "known chatter" not in msg


def test_only_noise_gives_no_warning(records):
    with graphtrain.capture_output("quiet phase"):
        native_write(1, "[graphtrain-noise] a\n")
    assert records == []


def test_verbose_filters_nothing(records):
    graphtrain.set_log_level("VERBOSE")
    with graphtrain.capture_output("verbose phase"):
        native_write(1, "[graphtrain-noise] a\n")
    assert len(records) == 1 and "[graphtrain-noise] a" in records[0]


def test_descriptor_count_unchanged_after_100_captures():
    before = fd_count()
    for _ in range(100):
        with graphtrain.capture_output("loop"):
            native_write(1, "[graphtrain-noise] x\n")
    assert fd_count() == before


def test_exception_inside_scope_restores_streams(capfd, records):
    before = fd_count()
    with pytest.raises(KeyError):
        with graphtrain.capture_output("failing phase"):
            native_write(1, "before the error\n")
            raise KeyError("boom")
    native_write(1, "after the scope\n")
    out, _ = capfd.readouterr()
    assert out == "after the scope\n"
    assert fd_count() == before
    assert any("before the error" in r for r in records)


def test_no_stdout_at_all():
    code = (
        "import os, graphtrain\n"
        "os.close(1)\n"
        "with graphtrain.capture_output('no stdout'):\n"
        "    os.write(2, b'captured anyway\\n')\n"
        "import fcntl\n"
        "try:\n"
        "    fcntl.fcntl(1, fcntl.F_GETFD); print('REOPENED', file=__import__('sys').stderr)\n"
        "except OSError:\n"
        "    pass\n"
    )
    r = run_python(code)
    assert r.returncode == 0, r.stderr
    assert "captured anyway" in r.stderr and "REOPENED" not in r.stderr


def test_two_threads_capturing_at_once():
    import threading

    before = fd_count()
    errors = []

    def work():
        try:
            for _ in range(30):
                with graphtrain.capture_output("thread"):
                    native_write(1, "[graphtrain-noise] t\n")
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and fd_count() == before

"""Real torch.distributed ranks for tests: processes spawned over gloo on loopback."""

from __future__ import annotations

import os
import socket
import tempfile
import traceback
from collections.abc import Callable
from typing import Any

import torch
import torch.multiprocessing as mp


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(
    rank: int, world: int, port: int, out: str, fn: Callable[..., Any], args: tuple, env: dict
) -> None:
    import torch.distributed as dist

    os.environ.update(env, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    try:
        dist.init_process_group("gloo", rank=rank, world_size=world)
        result = fn(rank, world, *args)
        torch.save(result, os.path.join(out, f"result_{rank}.pt"))
    except BaseException:
        with open(os.path.join(out, f"error_{rank}.txt"), "w") as f:
            f.write(traceback.format_exc())
        raise SystemExit(1) from None
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_ranks(
    world: int,
    fn: Callable[..., Any],
    *args: Any,
    timeout: float = 300,
    env: dict[str, str] | None = None,
) -> list[Any]:
    """Runs fn(rank, world, *args) in `world` spawned processes with a gloo process group; returns
    the results by rank. A rank that fails fails the call with its traceback."""
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory() as out:
        port = _free_port()
        procs = [
            ctx.Process(target=_entry, args=(r, world, port, out, fn, args, env or {}))
            for r in range(world)
        ]
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout)
        hung = [r for r, p in enumerate(procs) if p.is_alive()]
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
        errors = []
        for r in range(world):
            path = os.path.join(out, f"error_{r}.txt")
            if os.path.exists(path):
                errors.append(f"rank {r}:\n{open(path).read()}")
        if errors:
            raise AssertionError("\n".join(errors))
        if hung:
            raise AssertionError(f"ranks {hung} did not finish within {timeout} s")
        return [
            torch.load(os.path.join(out, f"result_{r}.pt"), weights_only=False)
            for r in range(world)
        ]

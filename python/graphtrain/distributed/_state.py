"""Full and sharded state of a zero3 model: full_state_dict / load_full_state_dict (the model as
if never sharded, on rank 0), sharded checkpoints (one file per rank, written atomically, resumed
bit-exact), and memory_report (what this rank holds)."""

from __future__ import annotations

import json
import os
import tempfile
from collections import OrderedDict
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ._zero3 import ShardingError, _State, state_of


def _buffers(module: nn.Module) -> dict[str, torch.Tensor]:
    return dict(module.named_buffers())


def full_state_dict(module: nn.Module) -> dict[str, torch.Tensor]:
    """The model's state dict as if it had never been sharded (the keys of model.state_dict()
    before zero3, full tensors), on the group's rank 0; {} on the other ranks. A collective: every
    rank calls it."""
    state = state_of(module)
    values: dict[str, torch.Tensor] = {}
    for g in state.groups:
        full = g.gather_data()
        if state.rank == 0:
            for e in g.entries:
                value = full[e.offset : e.offset + e.numel].view(e.shape).clone()
                for path in e.paths:
                    values[path] = value
    if state.rank != 0:
        return {}
    for paths, p in state.persistent:
        for path in paths:
            values[path] = p.detach().clone()
    values.update({k: v.detach().clone() for k, v in _buffers(module).items()})
    return OrderedDict((k, values[k]) for k in state.keys if k in values)


def load_full_state_dict(module: nn.Module, state_dict: dict[str, torch.Tensor] | None) -> None:
    """Loads a full (unsharded) state dict into a zero3 model: rank 0's `state_dict` is sharded
    to every rank (the others may pass None). Keys must match the model's exactly. A collective."""
    state = state_of(module)
    if state.rank == 0:
        if state_dict is None:
            raise ValueError("load_full_state_dict: rank 0 must pass the state dict")
        _check_keys(state, module, state_dict)
    for g in state.groups:
        flat = torch.zeros(g.padded, dtype=g.dtype)
        if state.rank == 0:
            for e in g.entries:
                flat[e.offset : e.offset + e.numel].copy_(
                    _checked(state_dict, e.name, e.shape).reshape(-1)
                )
        if state.world > 1:
            dist.broadcast(flat, src=state.src, group=state.group)
        size = g.shard_size
        with torch.no_grad():
            g.shard.copy_(flat[state.rank * size : (state.rank + 1) * size])
    for paths, p in state.persistent:
        with torch.no_grad():
            if state.rank == 0:
                p.copy_(_checked(state_dict, paths[0], p.shape))
            if state.world > 1:
                dist.broadcast(p.data, src=state.src, group=state.group)
    for name, b in _buffers(module).items():
        if state.rank == 0:
            b.copy_(_checked(state_dict, name, b.shape))
        if state.world > 1:
            dist.broadcast(b, src=state.src, group=state.group)


def _check_keys(state: _State, module: nn.Module, state_dict: dict[str, torch.Tensor]) -> None:
    expected = set(state.keys)
    missing = sorted(expected - set(state_dict))
    unexpected = sorted(set(state_dict) - expected)
    if missing or unexpected:
        raise KeyError(
            f"load_full_state_dict: the state dict does not fit {type(module).__name__}: "
            f"missing {missing[:8]}{' ...' if len(missing) > 8 else ''}, "
            f"unexpected {unexpected[:8]}{' ...' if len(unexpected) > 8 else ''}"
        )


def _checked(state_dict: Any, key: str, shape: torch.Size) -> torch.Tensor:
    value = state_dict[key]
    if tuple(value.shape) != tuple(shape):
        raise ValueError(
            f"load_full_state_dict: '{key}' has shape {list(value.shape)}, the model's is "
            f"{list(shape)}"
        )
    return value.detach()


# ---- sharded checkpoints -------------------------------------------------------------------------


def _layout(state: _State) -> list[list[Any]]:
    return [[g.unit, str(g.dtype), g.numel, g.padded] for g in state.groups]


def _rank_file(path: str, rank: int, world: int) -> str:
    return os.path.join(path, f"rank_{rank}_of_{world}.pt")


def _atomic_save(obj: Any, target: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(target), prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def save_sharded(module: nn.Module, optimizer: torch.optim.Optimizer | None, path: str) -> None:
    """Writes this rank's shards (parameters, persistent parameters, buffers) and the optimizer's
    state to `path/rank_R_of_N.pt`, each file atomically; rank 0 writes `path/checkpoint.json`
    once every rank has written, so a checkpoint without it is incomplete. A collective."""
    state = state_of(module)
    os.makedirs(path, exist_ok=True)
    _atomic_save(
        {
            "world_size": state.world,
            "rank": state.rank,
            "layout": _layout(state),
            "model": module.state_dict(),
            "optimizer": optimizer.state_dict() if optimizer is not None else None,
        },
        _rank_file(path, state.rank, state.world),
    )
    if state.world > 1:
        dist.barrier(group=state.group)
    if state.rank == 0:
        fd, tmp = tempfile.mkstemp(dir=path, prefix=".tmp-")
        with os.fdopen(fd, "w") as f:
            json.dump({"format": 1, "world_size": state.world, "layout": _layout(state)}, f)
        os.replace(tmp, os.path.join(path, "checkpoint.json"))
    if state.world > 1:
        dist.barrier(group=state.group)


def load_sharded(module: nn.Module, optimizer: torch.optim.Optimizer | None, path: str) -> None:
    """Resumes from save_sharded's `path`: the same world size and model layout are required."""
    state = state_of(module)
    meta_path = os.path.join(path, "checkpoint.json")
    if not os.path.exists(meta_path):
        raise FileNotFoundError(
            f"'{path}' is not a complete sharded checkpoint (no checkpoint.json: not written by "
            "save_sharded, or a save that did not finish)"
        )
    with open(meta_path) as f:
        meta = json.load(f)
    if meta["world_size"] != state.world:
        raise ShardingError(
            f"sharded checkpoint '{path}' was written by {meta['world_size']} ranks and this run "
            f"has {state.world}: resume with {meta['world_size']} ranks, or save a full state dict "
            "(full_state_dict) and load it with load_full_state_dict"
        )
    if meta["layout"] != _layout(state):
        raise ShardingError(
            f"sharded checkpoint '{path}' has another sharding layout than this model (a different "
            "model, unit or persistence_threshold)"
        )
    data = torch.load(_rank_file(path, state.rank, state.world), weights_only=True)
    module.load_state_dict(data["model"])
    if optimizer is not None:
        if data["optimizer"] is None:
            raise ShardingError(f"sharded checkpoint '{path}' holds no optimizer state")
        optimizer.load_state_dict(data["optimizer"])


# ---- memory --------------------------------------------------------------------------------------


def _bytes(ts: list[torch.Tensor]) -> tuple[int, int]:
    return sum(t.numel() for t in ts), sum(t.numel() * t.element_size() for t in ts)


def memory_report(
    module: nn.Module, optimizer: torch.optim.Optimizer | None = None
) -> dict[str, int]:
    """What this rank holds for the model between steps: elements and bytes of parameters,
    gradients and optimizer state (its tensors), and for reference the model's full parameter
    elements, the padding and the persistent (unsharded) elements."""
    state = state_of(module)
    params = list(module.parameters())
    p_n, p_b = _bytes([p.detach() for p in params])
    g_n, g_b = _bytes([p.grad for p in params if p.grad is not None])
    opt: list[torch.Tensor] = []
    if optimizer is not None:
        for per_param in optimizer.state.values():
            opt.extend(v for v in per_param.values() if isinstance(v, torch.Tensor))
    o_n, o_b = _bytes(opt)
    persistent = sum(p.numel() for _, p in state.persistent)
    return {
        "world_size": state.world,
        "rank": state.rank,
        "parameter_elements": p_n,
        "parameter_bytes": p_b,
        "gradient_elements": g_n,
        "gradient_bytes": g_b,
        "optimizer_state_elements": o_n,
        "optimizer_state_bytes": o_b,
        "full_parameter_elements": sum(g.numel for g in state.groups) + persistent,
        "padding_elements": sum(g.padded - g.numel for g in state.groups),
        "persistent_elements": persistent,
    }

"""What each rank runs in the zero3 tests (test_zero3.py): training runs and checks, returned to
the test process, which compares them with single-process runs."""

from __future__ import annotations

import gc
import os
import weakref
from typing import Any

import torch
import torch.distributed as dist

from graphtrain.distributed import (
    ShardingError,
    full_state_dict,
    load_full_state_dict,
    load_sharded,
    memory_report,
    save_sharded,
    zero3,
)
from models import GPT

BATCH = 8
LR = 1e-2


def gpt(seed: int = 0, **sizes: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return GPT(**sizes).train()


def batch(step: int, vocab: int = 64, micro: int = 0, micros: int = 1) -> tuple[torch.Tensor, ...]:
    """The global batch of a step (the same for every world size), or one micro-batch of it."""
    g = torch.Generator().manual_seed(1000 * step + micro)
    n = BATCH // micros
    ids = torch.randint(0, vocab, (n, 12), generator=g)
    return ids, torch.randint(0, vocab, (n, 12), generator=g)


def local(t: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    n = t.shape[0] // world
    return t[rank * n : (rank + 1) * n]


def train(
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    steps: range,
    rank: int,
    world: int,
    micros: int = 1,
    vocab: int = 64,
) -> list[float]:
    """AdamW steps on each rank's slice of the global batch; the losses averaged over ranks (the
    global batch's loss)."""
    losses = []
    for step in steps:
        opt.zero_grad()
        total = 0.0
        for k in range(micros):
            ids, targets = batch(step, vocab, k, micros)
            loss = model(local(ids, rank, world), local(targets, rank, world)) / micros
            loss.backward()
            total += loss.item()
        t = torch.tensor(total, dtype=torch.float64)
        if world > 1:
            dist.all_reduce(t)
        losses.append(t.item() / world)
        opt.step()
    return losses


def reference(steps: int, micros: int = 1, **sizes: int) -> tuple[list[float], dict]:
    """The single-process run on the global batches."""
    model = gpt(**sizes)
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    losses = train(model, opt, range(steps), 0, 1, micros, sizes.get("vocab", 64))
    return losses, {k: v.detach().clone() for k, v in model.state_dict().items()}


def _gathered_buffers(model: torch.nn.Module) -> list[Any]:
    """Weak references to every full buffer gathered in one training step (forward and backward)."""
    refs: list[Any] = []
    for g in model._graphtrain_zero3.groups:

        def acquire(anchors: list, g: Any = g, acquire: Any = g.acquire) -> None:
            acquire(anchors)
            if g.full is not None:
                refs.append(weakref.ref(g.full))

        def for_backward(for_backward: Any = g.for_backward) -> torch.Tensor:
            buf = for_backward()
            refs.append(weakref.ref(buf))
            return buf

        g.acquire, g.for_backward = acquire, for_backward
    ids, targets = batch(0)
    model(ids[:2], targets[:2]).backward()
    return refs


def two_ranks(rank: int, world: int, folder: str) -> dict[str, Any]:
    out: dict[str, Any] = {}

    # Plain zero3: parity, memory, nothing full held between steps, the full state.
    model = zero3(gpt())
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    out["losses"] = train(model, opt, range(5), rank, world)
    out["memory"] = memory_report(model, opt)
    out["gathers"] = dict(model._graphtrain_zero3.counts)
    out["full"] = full_state_dict(model)
    out["stand_in"] = repr(model.blocks[0].attn.qkv.weight)
    out["head_is_tok"] = model.head.weight is model.tok.weight
    out["parameter_names"] = [n for n, _ in model.named_parameters()]
    opt.zero_grad(set_to_none=True)
    refs = _gathered_buffers(model)
    gc.collect()
    out["buffers_seen"] = len(refs)
    out["buffers_alive"] = sum(r() is not None for r in refs)
    out["held"] = [
        g.unit
        for g in model._graphtrain_zero3.groups
        if g.full is not None or g.backward_full is not None or g.count
    ]
    try:
        model.blocks[0].attn.qkv.weight.sum()
        out["outside_forward"] = None
    except ShardingError as e:
        out["outside_forward"] = str(e)

    # Gradient accumulation over two micro-batches.
    model = zero3(gpt())
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    out["accumulate"] = train(model, opt, range(3), rank, world, micros=2)

    # Gradients through reduce-scatter (NCCL's way; gloo's default here is all-reduce).
    model = zero3(gpt())
    model._graphtrain_zero3.all_reduce = False
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    out["reduce_scatter"] = train(model, opt, range(3), rank, world)

    # Whole blocks as units, small parameters persistent.
    from models import Block

    model = zero3(gpt(), unit=Block, persistence_threshold=100)
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    out["units"] = train(model, opt, range(5), rank, world)
    out["units_memory"] = memory_report(model, opt)
    out["units_full"] = full_state_dict(model)

    # Sharded checkpoint after 3 steps, resumed for 2 more: bit-exact.
    ckpt = os.path.join(folder, "ckpt")
    model = zero3(gpt())
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    train(model, opt, range(3), rank, world)
    save_sharded(model, opt, ckpt)
    out["continued"] = train(model, opt, range(3, 5), rank, world)
    continued_full = full_state_dict(model)
    model = zero3(gpt(seed=7))
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    load_sharded(model, opt, ckpt)
    out["resumed"] = train(model, opt, range(3, 5), rank, world)
    resumed_full = full_state_dict(model)
    out["resume_exact"] = rank != 0 or all(
        torch.equal(continued_full[k], resumed_full[k]) for k in continued_full
    )

    # A full state dict loaded into a sharded model, and read back.
    model = zero3(gpt(seed=3))
    load_full_state_dict(model, out["full"] if rank == 0 else None)
    back = full_state_dict(model)
    out["full_roundtrip"] = rank != 0 or all(torch.equal(back[k], out["full"][k]) for k in back)

    # Errors.
    errors: dict[str, str] = {}
    model = gpt()
    early = torch.optim.AdamW(model.parameters(), lr=LR)
    zero3(model)
    ids, targets = batch(0)
    model(local(ids, rank, world), local(targets, rank, world)).backward()
    try:
        early.step()
    except ShardingError as e:
        errors["optimizer_before"] = str(e)
    try:
        zero3(model)
    except ShardingError as e:
        errors["twice"] = str(e)
    foreign = gpt()
    foreign.ln.weight.ds_id = 3  # what DeepSpeed's stage 3 marks its parameters with
    try:
        zero3(foreign)
    except ShardingError as e:
        errors["foreign"] = str(e)
    out["errors"] = errors

    # A Hugging Face model: GPT-2 with its tied head.
    from real_models import gpt2

    losses = []
    torch.manual_seed(0)
    hf = zero3(gpt2())
    opt = torch.optim.AdamW(hf.parameters(), lr=LR)
    for step in range(3):
        ids = batch(step, vocab=96)[0]
        opt.zero_grad()
        loss = hf(input_ids=local(ids, rank, world), labels=local(ids, rank, world)).loss
        loss.backward()
        opt.step()
        t = loss.detach().double()
        dist.all_reduce(t)
        losses.append(t.item() / world)
    out["gpt2"] = losses
    out.update(graph_module(rank, world, folder))
    out.update(per_rank(rank, world, folder))
    out.update(data_parallel(rank, world))
    return out


def _reaches_gather(graph: Any, name: str) -> bool:
    """Whether value `name` of an ONNX graph is a ShardGather's output or a view chain of one."""
    producer = {o: n for n in graph.node for o in n.output}
    views = {"Identity", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Slice"}
    n = producer.get(name)
    while n is not None and n.op_type in views:
        n = producer.get(n.input[0])
    return n is not None and n.op_type == "ShardGather"


def graph_module(rank: int, world: int, folder: str) -> dict[str, Any]:
    """zero3 inside GraphModule: explicit, through GRAPHTRAIN_ENABLE_ZERO_STAGE3, and on GPT-2."""
    import onnx

    import graphtrain

    out: dict[str, Any] = {}
    saved = os.path.join(folder, f"graphs_{rank}")
    debug = graphtrain.DebugOptions(save_onnx=True, onnx_prefix="zero3", save_path=saved)
    gm = graphtrain.GraphModule(zero3(gpt()), debug_options=debug)
    opt = torch.optim.AdamW(gm.parameters(), lr=LR)
    out["gm"] = train(gm, opt, range(5), rank, world)
    out["gm_captures"] = gm.captures
    out["gm_memory"] = memory_report(gm.module, opt)
    out["gm_held"] = [
        g.unit for g in gm.module._graphtrain_zero3.groups if g.full is not None or g.count
    ]
    fwd = onnx.load(os.path.join(saved, "zero3_train_training_forward.onnx")).graph
    bwd = onnx.load(os.path.join(saved, "zero3_train_training_backward.onnx")).graph
    out["gm_gathers"] = sum(n.op_type == "ShardGather" for n in fwd.node)
    out["gm_regathers"] = sum(n.op_type == "ShardGather" for n in bwd.node)
    out["gm_scatters"] = sum(n.op_type == "ShardGatherGrad" for n in bwd.node)
    out["gm_stashed_full"] = [o.name for o in fwd.output if _reaches_gather(fwd, o.name)]
    out["gm_groups"] = len(gm.module._graphtrain_zero3.groups)

    os.environ["GRAPHTRAIN_ENABLE_ZERO_STAGE3"] = "1"
    graphtrain.reload_options()
    try:
        gm = graphtrain.GraphModule(gpt())
        opt = torch.optim.AdamW(gm.parameters(), lr=LR)
        out["option"] = train(gm, opt, range(5), rank, world)
        out["option_sharded"] = hasattr(gm.module, "_graphtrain_zero3")
    finally:
        del os.environ["GRAPHTRAIN_ENABLE_ZERO_STAGE3"]
        graphtrain.reload_options()

    from real_models import gpt2

    torch.manual_seed(0)
    hf = graphtrain.GraphModule(zero3(gpt2()))
    opt = torch.optim.AdamW(hf.parameters(), lr=LR)
    losses = []
    for step in range(3):
        ids = batch(step, vocab=96)[0]
        opt.zero_grad()
        loss = hf(input_ids=local(ids, rank, world), labels=local(ids, rank, world)).loss
        loss.backward()
        opt.step()
        t = loss.detach().double()
        dist.all_reduce(t)
        losses.append(t.item() / world)
    out["gm_gpt2"] = losses
    out["gm_gpt2_eager"] = hf._eager
    return out


def per_rank(rank: int, world: int, folder: str) -> dict[str, Any]:
    """Statistics dumps and logs of a sharded GraphModule, rank by rank."""
    import sys

    import graphtrain
    from graphtrain.hooks import StatisticsSubscriber, SubscriberManager

    out: dict[str, Any] = {}
    model = zero3(gpt())
    stats = os.path.join(folder, "stats")
    SubscriberManager().subscribe(model, [StatisticsSubscriber(stats, text=False)])
    gm = graphtrain.GraphModule(model)
    ids, targets = batch(0)
    gm(local(ids, rank, world), local(targets, rank, world)).backward()
    order = os.path.join(stats, f"rank_{rank}", "step_0", "order.txt")
    out["stats_names"] = open(order).read().split()

    log_file = os.path.join(folder, f"log_{rank}.txt")
    sys.stderr.flush()
    saved = os.dup(2)
    with open(log_file, "w") as f:
        os.dup2(f.fileno(), 2)
    try:
        graphtrain.log("WARNING", f"a warning on rank {rank}")  # the default level
        graphtrain.set_log_level("INFO")
        graphtrain.log("INFO", f"an info line on rank {rank}")
    finally:
        graphtrain.set_log_level("WARNING")
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
    out["log"] = open(log_file).read()
    return out


def data_parallel(rank: int, world: int) -> dict[str, Any]:
    """GraphModule under DistributedDataParallel, and under FSDP2's fully_shard."""
    from torch.distributed.fsdp import fully_shard
    from torch.nn.parallel import DistributedDataParallel

    import graphtrain
    from graphtrain.errors import UnsupportedModelError

    out: dict[str, Any] = {}
    gm = graphtrain.GraphModule(gpt())
    ddp = DistributedDataParallel(gm)
    opt = torch.optim.AdamW(ddp.parameters(), lr=LR)
    out["ddp"] = train(ddp, opt, range(4), rank, world)
    ids, targets = batch(4)
    opt.zero_grad()
    ddp(local(ids, rank, world), local(targets, rank, world)).backward()
    out["ddp_grad"] = gm.module.blocks[0].fc.weight.grad.clone()  # all-reduced by DDP
    out["ddp_captures"] = gm.captures

    gm = graphtrain.GraphModule(gpt())
    fully_shard(gm)  # one unit: the whole model gathered around the GraphModule's forward
    opt = torch.optim.AdamW(gm.parameters(), lr=LR)
    out["fsdp"] = train(gm, opt, range(4), rank, world)
    out["fsdp_captures"] = gm.captures

    model = gpt()
    for block in model.blocks:
        fully_shard(block)
    gm = graphtrain.GraphModule(model)
    fully_shard(gm)
    try:
        gm(local(ids, rank, world), local(targets, rank, world))
        out["fsdp_inner"] = None
    except UnsupportedModelError as e:
        out["fsdp_inner"] = str(e)
    return out


def hf_reference(steps: int) -> list[float]:
    from real_models import gpt2

    torch.manual_seed(0)
    hf = gpt2()
    opt = torch.optim.AdamW(hf.parameters(), lr=LR)
    losses = []
    for step in range(steps):
        ids = batch(step, vocab=96)[0]
        opt.zero_grad()
        loss = hf(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


ODD = {"vocab": 61, "dim": 34, "heads": 2}  # sizes that do not divide by 4: padding


def four_ranks(rank: int, world: int, folder: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    model = zero3(gpt(**ODD))
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    out["losses"] = train(model, opt, range(5), rank, world, vocab=ODD["vocab"])
    out["memory"] = memory_report(model, opt)
    try:
        load_sharded(zero3(gpt()), None, os.path.join(folder, "ckpt"))
        out["wrong_world"] = None
    except ShardingError as e:
        out["wrong_world"] = str(e)
    return out

"""What each rank runs in the DeepSpeed tests (test_deepspeed.py): DeepSpeed ZeRO stage 3 training
the GPT test model and GPT-2, eagerly and inside GraphModule (ZeROOffloadSubscriber), all in one
launch of 2 ranks (DeepSpeed's start is slow)."""

from __future__ import annotations

import logging
import os
from typing import Any

import torch
import torch.distributed as dist

from zero3_cases import BATCH, LR, batch, gpt, local

os.environ.setdefault("DS_ACCELERATOR", "cpu")


def _config(world: int, micros: int = 1, persistence: int = 0) -> dict[str, Any]:
    return {
        "train_micro_batch_size_per_gpu": BATCH // world // micros,
        "gradient_accumulation_steps": micros,
        "gradient_clipping": 0.0,  # DeepSpeed's default clips at 1.0; the reference does not
        "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": persistence},
        "zero_allow_untested_optimizer": True,
    }


def _initialize(model: torch.nn.Module, world: int, micros: int = 1, persistence: int = 0) -> Any:
    import deepspeed

    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    config = _config(world, micros, persistence)
    engine, *_ = deepspeed.initialize(model=model, optimizer=opt, config=config)
    return engine


def _train(
    engine: Any, steps: int, rank: int, world: int, micros: int = 1, hf: bool = False
) -> list[float]:
    """engine(batch), engine.backward(loss), engine.step(), micro-batch by micro-batch; the global
    batch's loss of each step."""
    losses = []
    for step in range(steps):
        total = 0.0
        for k in range(micros):
            if hf:
                ids = batch(step, vocab=96)[0]
                loss = engine(
                    input_ids=local(ids, rank, world), labels=local(ids, rank, world)
                ).loss
            else:
                ids, targets = batch(step, 64, k, micros)
                loss = engine(local(ids, rank, world), local(targets, rank, world))
            engine.backward(loss)
            engine.step()
            total += loss.item() / micros
        t = torch.tensor(total, dtype=torch.float64)
        dist.all_reduce(t)
        losses.append(t.item() / world)
    return losses


def _held(model: torch.nn.Module) -> list[str]:
    """Parameters whose full values are still held after a step (DeepSpeed's placeholders are
    size 0 outside forward)."""
    return [n for n, p in model.named_parameters() if p.numel() != 0]


class _FrozenLookup(torch.nn.Module):
    """A tied embedding whose lookup runs without gradient: its weight's gradient comes only
    from the head, though the graph gathers it twice."""

    def __init__(self) -> None:
        super().__init__()
        self.tok = torch.nn.Embedding(64, 32)
        self.mix = torch.nn.Linear(32, 32)
        self.head = torch.nn.Linear(32, 64, bias=False)
        self.head.weight = self.tok.weight

    def forward(self, ids: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            x = self.tok(ids)
        logits = self.head(torch.tanh(self.mix(x)))
        return torch.nn.functional.cross_entropy(logits.reshape(-1, 64), targets.reshape(-1))


def _frozen_lookup() -> torch.nn.Module:
    torch.manual_seed(0)
    return _FrozenLookup()


def two_ranks(rank: int, world: int) -> dict[str, Any]:
    import deepspeed
    from deepspeed.utils import logger

    import graphtrain
    from graphtrain.distributed import _deepspeed
    from graphtrain.hooks import ZeROOffloadSubscriber

    logger.setLevel(logging.WARNING)
    out: dict[str, Any] = {}

    # DeepSpeed alone (what the others must match).
    engine = _initialize(gpt(), world)
    out["eager"] = _train(engine, 5, rank, world)

    # GraphModule given to deepspeed.initialize.
    gm = graphtrain.GraphModule(gpt())
    engine = _initialize(gm, world)
    out["before"] = _train(engine, 5, rank, world)
    sub = gm.module._graphtrain_sharding
    out["before_type"] = type(sub).__name__
    out["before_captures"] = gm.captures
    out["before_eager"] = gm._eager
    out["before_held"] = _held(gm.module)
    out["before_left"] = (len(sub._forward), len(sub._backward), len(sub._grads))
    out["before_hooks_taken"] = sub.hooks_taken
    out["before_hooks_left"] = sum(
        len(m._forward_pre_hooks) + len(m._forward_hooks) for m in gm.module.modules()
    )
    out["before_starts_step"] = sub.starts_step
    # DeepSpeed's replacement of torch.nn.functional.linear (an autograd Function) is not what
    # the graph captures: no opaque Python calls
    out["before_python_ops"] = sum(
        n.op_type == "PythonOp" for r in gm._runners.values() for n in r.captured.proto().graph.node
    )
    # DeepSpeed recorded the order in which the graph fetches modules (its prefetch follows it)
    out["before_trace"] = sub.coordinator.is_complete_trace()

    # deepspeed.initialize first, then its module wrapped.
    engine = _initialize(gpt(), world)
    engine.module = graphtrain.GraphModule(engine.module)
    out["after"] = _train(engine, 5, rank, world)
    out["after_starts_step"] = engine.module.module._graphtrain_sharding.starts_step
    out["after_trace"] = engine.module.module._graphtrain_sharding.coordinator.is_complete_trace()
    out["after_held"] = _held(engine.module.module)

    # Gradient accumulation over two micro-batches (DeepSpeed accumulates in its partitions).
    engine = _initialize(graphtrain.GraphModule(gpt()), world, micros=2)
    out["accumulate"] = _train(engine, 3, rank, world, micros=2)

    # Small parameters persistent (whole on every rank, as DeepSpeed's default keeps those under
    # 100000 elements): biases and norms here.
    gm = graphtrain.GraphModule(gpt())
    engine = _initialize(gm, world, persistence=200)
    out["persistent"] = _train(engine, 3, rank, world)
    out["persistent_count"] = sum(bool(getattr(p, "ds_persist", False)) for p in gm.parameters())

    # A tied weight gathered twice whose one use gets no gradient: DeepSpeed alone, and inside
    # GraphModule.
    out["frozen_eager"] = _train(_initialize(_frozen_lookup(), world), 3, rank, world)
    out["frozen_graph"] = _train(
        _initialize(graphtrain.GraphModule(_frozen_lookup()), world), 3, rank, world
    )

    # A Hugging Face model: GPT-2, its head tied to the token embedding.
    from real_models import gpt2

    torch.manual_seed(0)
    engine = _initialize(graphtrain.GraphModule(gpt2()), world)
    out["gpt2"] = _train(engine, 3, rank, world, hf=True)
    out["gpt2_eager"] = engine.module._eager

    # Errors: a DeepSpeed outside the supported range; wrapping twice.
    errors: dict[str, str] = {}
    real = deepspeed.__version__
    deepspeed.__version__ = "0.21.1"
    try:
        ZeROOffloadSubscriber(gpt())
    except RuntimeError as e:
        errors["version"] = str(e)
    finally:
        deepspeed.__version__ = real
    try:
        ZeROOffloadSubscriber(gm.module)
    except RuntimeError as e:
        errors["twice"] = str(e)
    out["errors"] = errors
    out["supported"] = _deepspeed.SUPPORTED
    return out

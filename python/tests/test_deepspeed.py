"""DeepSpeed ZeRO stage 3 inside GraphModule (graphtrain.hooks.ZeROOffloadSubscriber) on real
ranks: parity with one process in both wrapping orders, with gradient accumulation and on GPT-2;
DeepSpeed's partitioning kept (nothing full held between steps); clear errors. One launch."""

from __future__ import annotations

import os
import sys

import pytest

import deepspeed_cases as ds
import zero3_cases as cases
from ranks import run_ranks


@pytest.fixture(scope="module")
def two() -> list[dict]:
    # DeepSpeed builds a small C++ op on its first start on a machine (about a minute), with g++
    # and the ninja of this environment (the pip package in the venv's bin).
    path = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])
    return run_ranks(2, ds.two_ranks, timeout=600, env={"DS_ACCELERATOR": "cpu", "PATH": path})


def close(a: list[float], b: list[float]) -> None:
    assert a == pytest.approx(b, rel=1e-5), (a, b)


def test_deepspeed_alone_matches_one_process(two: list[dict]) -> None:
    close(two[0]["eager"], cases.reference(5)[0])


def test_graph_module_given_to_deepspeed(two: list[dict]) -> None:
    r = two[0]
    close(r["before"], cases.reference(5)[0])
    assert r["before_type"] == "ZeROOffloadSubscriber"
    assert r["before_captures"] == 1 and not r["before_eager"]
    # DeepSpeed's module hooks are off the wrapped model (the graph drives them); the ones on the
    # GraphModule itself, DeepSpeed's root, stay and start each step.
    assert r["before_hooks_taken"] > 0 and r["before_hooks_left"] == 0
    assert not r["before_starts_step"]
    assert r["before_trace"]  # DeepSpeed's prefetch follows the order the graph fetches in
    assert r["before_python_ops"] == 0


def test_deepspeed_model_wrapped_after_initialize(two: list[dict]) -> None:
    close(two[0]["after"], cases.reference(5)[0])
    assert two[0]["after_starts_step"]  # its root hook was on the wrapped model
    assert two[0]["after_trace"]


def test_partitions_kept_between_steps(two: list[dict]) -> None:
    for r in two:
        assert r["before_held"] == [] and r["after_held"] == []
        assert r["before_left"] == (0, 0, 0)  # no full tensor or gradient left in the subscriber


def test_gradient_accumulation(two: list[dict]) -> None:
    close(two[0]["accumulate"], cases.reference(3, micros=2)[0])


def test_persistent_parameters(two: list[dict]) -> None:
    assert two[0]["persistent_count"] > 0
    close(two[0]["persistent"], cases.reference(3)[0])


def test_gradient_of_a_weight_gathered_more_often_than_differentiated(two: list[dict]) -> None:
    close(two[0]["frozen_graph"], two[0]["frozen_eager"])


def test_hugging_face_gpt2(two: list[dict]) -> None:
    assert not two[0]["gpt2_eager"]
    close(two[0]["gpt2"], cases.hf_reference(3))


def test_errors(two: list[dict]) -> None:
    e = two[0]["errors"]
    low, high = two[0]["supported"]
    assert "0.21.1" in e["version"] and low in e["version"] and high in e["version"]
    assert "graphtrain.distributed.zero3" in e["version"]
    assert "already has a sharding layout" in e["twice"]

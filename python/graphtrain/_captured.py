"""What a capture hands to the run time: the graph as serialized ONNX, and how a call's arguments
and outputs map onto it. Light on purpose: a graph loaded from the cache runs without torch.export,
the ATen translators or the onnx package."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

OPSET = 20  # Gelu is standard from 20


@dataclass
class GraphInput:
    kind: str  # "param", "buffer" or "input"
    key: Any  # parameter / buffer name, or the position among the flattened tensor inputs
    name: str  # the graph input's name


@dataclass
class Captured:
    model: bytes  # the graph, a serialized onnx.ModelProto (the C++ engine parses it)
    inputs: list[GraphInput]
    outputs: list[str]  # graph outputs holding the user's tensor outputs
    output_float: list[bool]
    buffer_updates: list[tuple[str, str]] = field(
        default_factory=list
    )  # (graph output, buffer name)
    out_spec: Any = None  # pytree spec of the module's output
    out_leaves: list[Any] = field(default_factory=list)  # non-tensor leaves; TENSOR marks tensors
    uncacheable: str = ""  # why the on-disk cache cannot hold this capture, if it cannot
    # The tensor arguments' shapes when every size was captured as it was (specialized); None when
    # the dims of `dynamic_dims` are symbolic.
    static_shapes: list[list[int]] | None = None
    routes: list[tuple[str, str, str]] = field(
        default_factory=list
    )  # (ATen op, module, how it runs)

    def proto(self) -> Any:
        """The graph as an onnx.ModelProto, for tools and tests (imports onnx)."""
        import onnx

        return onnx.load_from_string(self.model)


def dynamic_dims(t: torch.Tensor) -> range:
    """The dims a capture keeps symbolic. All of them (batch, sequence, features), except for
    images and feature maps (floating tensors of rank 4 or more: batch, channels, height, width),
    where only the batch is: their sizes rarely change in training, and symbolic spatial sizes
    make torch.export's shape reasoning very slow on windowed vision models (minutes for a Swin).
    A new image size captures a new graph."""
    return range(1) if t.dim() >= 4 and t.is_floating_point() else range(t.dim())

"""Element-type tables between torch, ONNX and numpy (a leaf module: it imports no graphtrain code)."""

from __future__ import annotations

import numpy as np
import torch
from onnx import TensorProto

TORCH_TO_ONNX: dict[torch.dtype, int] = {
    torch.float32: TensorProto.FLOAT,
    torch.float64: TensorProto.DOUBLE,
    torch.float16: TensorProto.FLOAT16,
    torch.bfloat16: TensorProto.BFLOAT16,
    torch.int64: TensorProto.INT64,
    torch.int32: TensorProto.INT32,
    torch.int16: TensorProto.INT16,
    torch.int8: TensorProto.INT8,
    torch.uint8: TensorProto.UINT8,
    torch.bool: TensorProto.BOOL,
}
ONNX_TO_TORCH: dict[int, torch.dtype] = {code: dtype for dtype, code in TORCH_TO_ONNX.items()}
TORCH_TO_NUMPY: dict[torch.dtype, type] = {
    torch.float32: np.float32,
    torch.float64: np.float64,
    torch.float16: np.float16,
    torch.int64: np.int64,
    torch.int32: np.int32,
    torch.int16: np.int16,
    torch.int8: np.int8,
    torch.uint8: np.uint8,
    torch.bool: np.bool_,
}

"""Element-type tables between torch, ONNX and numpy (a leaf module: it imports no graphtrain code).
The ONNX codes are TensorProto.DataType's values, written out: the run-time path does not import
the onnx package (11 MiB)."""

from __future__ import annotations

import numpy as np
import torch

TORCH_TO_ONNX: dict[torch.dtype, int] = {
    torch.float32: 1,  # FLOAT
    torch.float64: 11,  # DOUBLE
    torch.float16: 10,  # FLOAT16
    torch.bfloat16: 16,  # BFLOAT16
    torch.int64: 7,  # INT64
    torch.int32: 6,  # INT32
    torch.int16: 5,  # INT16
    torch.int8: 3,  # INT8
    torch.uint8: 2,  # UINT8
    torch.bool: 9,  # BOOL
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

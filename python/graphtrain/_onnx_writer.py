"""The part of ONNX's protobuf that capture writes (nodes, attributes, initializers, value infos, a
model), encoded here in pure Python, so that capture does not import the onnx package: its import
(ml_dtypes' native module) took 0.7 s of a 1.2 s cold first step. The bytes equal those of
onnx.helper's make_node / make_attribute / make_tensor_value_info / make_graph / make_model and
numpy_helper.from_array for the same arguments (python/tests/test_onnx_writer.py compares them):
fields in field-number order, repeated numbers unpacked, as onnx's proto2 messages serialize.
Field numbers are onnx.proto's."""

from __future__ import annotations

import numbers
import struct
from collections.abc import Sequence
from typing import Any

import numpy as np

# AttributeProto.AttributeType
FLOAT, INT, STRING, TENSOR, FLOATS, INTS, STRINGS = 1, 2, 3, 4, 6, 7, 8

# numpy dtype -> TensorProto.DataType
_NUMPY_TO_ONNX = {
    np.dtype(np.float32): 1,
    np.dtype(np.uint8): 2,
    np.dtype(np.int8): 3,
    np.dtype(np.uint16): 4,
    np.dtype(np.int16): 5,
    np.dtype(np.int32): 6,
    np.dtype(np.int64): 7,
    np.dtype(np.bool_): 9,
    np.dtype(np.float16): 10,
    np.dtype(np.float64): 11,
    np.dtype(np.uint32): 12,
    np.dtype(np.uint64): 13,
}


def varint(n: int) -> bytes:
    """A protobuf varint; a negative int64 as its 64-bit two's complement (10 bytes)."""
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


def field(number: int, payload: bytes) -> bytes:
    """A length-delimited field (a string, bytes or a nested message)."""
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def _int_field(number: int, value: int) -> bytes:
    return varint(number << 3) + varint(value)


def _float_field(number: int, value: float) -> bytes:
    return varint(number << 3 | 5) + struct.pack("<f", value)


def _text(s: str | bytes) -> bytes:
    return s if isinstance(s, bytes) else s.encode()


class Tensor:
    """A TensorProto as numpy_helper.from_array makes it: dims, data type, name, raw data."""

    __slots__ = ("name", "dims", "data_type", "raw")

    def __init__(self, array: np.ndarray, name: str = "") -> None:
        array = np.asarray(array)
        code = _NUMPY_TO_ONNX.get(array.dtype)
        if code is None:
            raise TypeError(f"an ONNX initializer cannot hold numpy dtype {array.dtype}")
        self.name = name
        self.dims = [int(d) for d in array.shape]
        self.data_type = code
        self.raw = np.asarray(array, dtype=array.dtype.newbyteorder("<")).tobytes()  # C order

    def encode(self) -> bytes:
        out = [_int_field(1, d) for d in self.dims]
        out.append(_int_field(2, self.data_type))
        if self.name:
            out.append(field(8, self.name.encode()))
        out.append(field(9, self.raw))
        return b"".join(out)


class Attribute:
    """An AttributeProto of one of the kinds capture emits; the type is inferred from the value as
    onnx.helper.make_attribute infers it."""

    __slots__ = ("name", "type", "value")

    def __init__(self, name: str, value: Any) -> None:
        self.name = name
        self.type, self.value = _infer(name, value)

    @property
    def i(self) -> int:
        return self.value

    @i.setter
    def i(self, value: int) -> None:
        self.type, self.value = INT, int(value)

    def encode(self) -> bytes:
        out = [field(1, self.name.encode())]
        t, v = self.type, self.value
        if t == FLOAT:
            out.append(_float_field(2, v))
        elif t == INT:
            out.append(_int_field(3, v))
        elif t == STRING:
            out.append(field(4, v))
        elif t == TENSOR:
            out.append(field(5, v.encode()))
        elif t == FLOATS:
            out.extend(_float_field(7, x) for x in v)
        elif t == INTS:
            out.extend(_int_field(8, x) for x in v)
        elif t == STRINGS:
            out.extend(field(9, x) for x in v)
        out.append(_int_field(20, t))
        return b"".join(out)


def _infer(name: str, value: Any) -> tuple[int, Any]:
    if isinstance(value, numbers.Integral):
        return INT, int(value)
    if isinstance(value, numbers.Real):
        return FLOAT, float(value)
    if isinstance(value, (str, bytes)):
        return STRING, _text(value)
    if isinstance(value, Tensor):
        return TENSOR, value
    if isinstance(value, (list, tuple, range, np.ndarray)):
        items = list(value)
        if items and all(isinstance(x, numbers.Integral) for x in items):
            return INTS, [int(x) for x in items]
        if items and all(isinstance(x, numbers.Real) for x in items):
            return FLOATS, [float(x) for x in items]
        if items and all(isinstance(x, (str, bytes)) for x in items):
            return STRINGS, [_text(x) for x in items]
    raise TypeError(
        f"attribute '{name}': cannot write {type(value).__name__} value {value!r} into an ONNX "
        "attribute (ints, floats, strings, a tensor, or non-empty lists of one of them)"
    )


class Node:
    """A NodeProto: inputs, outputs, name, op type, attributes (sorted by name, None values left
    out, as make_node does), domain, and metadata properties."""

    __slots__ = ("op_type", "input", "output", "name", "domain", "attribute", "metadata")

    def __init__(
        self,
        op_type: str,
        inputs: Sequence[str],
        outputs: Sequence[str],
        name: str = "",
        domain: str = "",
        **attrs: Any,
    ) -> None:
        self.op_type = op_type
        self.input = list(inputs)
        self.output = list(outputs)
        self.name = name
        self.domain = domain
        self.attribute = [Attribute(k, v) for k, v in sorted(attrs.items()) if v is not None]
        self.metadata: list[tuple[str, str]] = []

    def encode(self) -> bytes:
        out = [field(1, x.encode()) for x in self.input]
        out.extend(field(2, x.encode()) for x in self.output)
        if self.name:
            out.append(field(3, self.name.encode()))
        out.append(field(4, self.op_type.encode()))
        out.extend(field(5, a.encode()) for a in self.attribute)
        out.append(field(7, self.domain.encode()))
        out.extend(field(9, _entry(k, v)) for k, v in self.metadata)
        return b"".join(out)


def _entry(key: str, value: str) -> bytes:
    """A StringStringEntryProto."""
    return field(1, key.encode()) + field(2, value.encode())


def metadata_entry(number: int, key: str, value: str) -> bytes:
    """A metadata_props entry (field `number` of its message), to append to a serialized one."""
    return field(number, _entry(key, value))


def value_info(name: str, elem_type: int, shape: Sequence[int | str | None] | None) -> bytes:
    """A ValueInfoProto of a tensor as make_tensor_value_info writes it: no shape where `shape` is
    None, a dim_value for an int, a dim_param for a name, an empty dim for None."""
    tensor = _int_field(1, elem_type)
    if shape is not None:
        dims = []
        for d in shape:
            if d is None:
                dims.append(field(1, b""))
            elif isinstance(d, str):
                dims.append(field(1, field(2, d.encode())))
            else:
                dims.append(field(1, _int_field(1, int(d))))
        tensor += field(2, b"".join(dims))
    return field(1, name.encode()) + field(2, field(1, tensor))


def model(
    nodes: Sequence[Node],
    name: str,
    inputs: Sequence[bytes],
    outputs: Sequence[bytes],
    initializers: Sequence[Tensor],
    opsets: Sequence[tuple[str, int]],
    ir_version: int,
) -> bytes:
    """A serialized ModelProto: its graph and opset imports. `inputs` / `outputs` are value_info's."""
    graph = [field(1, n.encode()) for n in nodes]
    graph.append(field(2, name.encode()))
    graph.extend(field(5, t.encode()) for t in initializers)
    graph.extend(field(11, v) for v in inputs)
    graph.extend(field(12, v) for v in outputs)
    out = [_int_field(1, ir_version), field(7, b"".join(graph))]
    out.extend(field(8, field(1, d.encode()) + _int_field(2, v)) for d, v in opsets)
    return b"".join(out)

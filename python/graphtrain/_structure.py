"""Argument and output structures as JSON: the non-tensor leaves of a pytree, encoded so that node
attributes of captured graphs survive the on-disk cache (a leaf module: no graphtrain imports)."""

from __future__ import annotations

import functools
import importlib
from typing import Any

import torch
from torch.utils import _pytree as pytree


class _TensorSlot:
    """Marks where a tensor goes among the leaves of an argument or output structure."""

    def __repr__(self) -> str:
        return "<tensor>"


TENSOR = _TensorSlot()

_LAYOUTS = {"strided": torch.strided}
_MEMORY_FORMATS = {
    "contiguous_format": torch.contiguous_format,
    "preserve_format": torch.preserve_format,
    "channels_last": torch.channels_last,
}


class ObjectLeaf:
    """An output leaf that is an object holding tensors (a transformers DynamicCache, say): its
    class and attributes as JSON, its tensors taken out in order. At run time a new object of the
    class is built around the tensors of that call (never the object built while tracing). An
    attribute that is a size computed from the inputs (a cache's sequence length) is kept as its
    expression over the inputs' dims; `dims` maps each symbol to (tensor input, dim)."""

    def __init__(
        self, encoded: dict, num_tensors: int, dims: dict[str, list[int]] | None = None
    ) -> None:
        self.encoded = encoded
        self.num_tensors = num_tensors
        self.dims = dims or {}

    def rebuild(self, tensors: Any, inputs: list[torch.Tensor]) -> Any:
        """A new object with the next `num_tensors` tensors of the iterator `tensors`; sizes are
        evaluated on this call's tensor `inputs`."""
        sizes = {sym: inputs[i].shape[d] for sym, (i, d) in self.dims.items()}
        return _object_from_json(self.encoded, tensors, sizes)


@functools.lru_cache(maxsize=256)
def _expression(text: str) -> Any:
    import sympy

    return sympy.sympify(text)


def _size(text: str, sizes: dict[str, int]) -> int:
    expr = _expression(text)
    return int(expr.subs({s: sizes[str(s)] for s in expr.free_symbols}))


_MAX_OBJECT_DEPTH = 8


def object_to_json(x: Any, tensors: list[torch.Tensor], depth: int = 0) -> Any:
    """`x` (an object, container or leaf) as JSON, appending its tensors to `tensors` in order.
    Raises TypeError naming what cannot be stored and rebuilt."""
    if isinstance(x, torch.Tensor):
        tensors.append(x)
        return {"__tensor__": 1}
    if depth > _MAX_OBJECT_DEPTH:
        raise TypeError(f"a {type(x).__name__} nested more than {_MAX_OBJECT_DEPTH} levels deep")
    if type(x) in (list, tuple):
        kind = "__tuple__" if isinstance(x, tuple) else "__list__"
        return {kind: [object_to_json(i, tensors, depth + 1) for i in x]}
    if type(x) is dict:
        if not all(k is None or isinstance(k, (str, int, float, bool)) for k in x):
            raise TypeError("a dict with keys that are not numbers or strings")
        return {"__dict__": [[k, object_to_json(v, tensors, depth + 1)] for k, v in x.items()]}
    if isinstance(x, type):
        return {"__class__": f"{x.__module__}:{x.__qualname__}"}
    if isinstance(x, torch.SymInt):
        return {"__size__": str(x.node.expr)}
    if type(x).__module__.startswith("sympy"):
        return {"__size__": str(x)}
    try:
        return leaf_to_json(x)
    except TypeError:
        pass
    cls = type(x)
    if not hasattr(x, "__dict__") or "<locals>" in cls.__qualname__:
        raise TypeError(f"a {cls.__module__}.{cls.__qualname__}")
    attrs = {k: object_to_json(v, tensors, depth + 1) for k, v in vars(x).items()}
    return {"__object__": f"{cls.__module__}:{cls.__qualname__}", "attrs": attrs}


def _import(qualified: str) -> Any:
    module, qualname = qualified.split(":")
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def _object_from_json(x: Any, tensors: Any, sizes: dict[str, int]) -> Any:
    if isinstance(x, dict):
        if "__tensor__" in x:
            return next(tensors)
        if "__size__" in x:
            return _size(x["__size__"], sizes)
        if "__tuple__" in x:
            return tuple(_object_from_json(i, tensors, sizes) for i in x["__tuple__"])
        if "__list__" in x:
            return [_object_from_json(i, tensors, sizes) for i in x["__list__"]]
        if "__dict__" in x:
            return {k: _object_from_json(v, tensors, sizes) for k, v in x["__dict__"]}
        if "__class__" in x:
            return _import(x["__class__"])
        if "__object__" in x:
            obj = object.__new__(_import(x["__object__"]))
            attrs = x["attrs"].items()
            obj.__dict__.update({k: _object_from_json(v, tensors, sizes) for k, v in attrs})
            return obj
    return leaf_from_json(x)


def leaf_to_json(x: Any) -> Any:
    """A non-tensor leaf as JSON; tuples and lists keep their kind. Raises TypeError otherwise."""
    if x is TENSOR:
        return {"__tensor__": 1}
    if isinstance(x, ObjectLeaf):
        return {"__object_leaf__": x.encoded, "n": x.num_tensors, "dims": x.dims}
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    if isinstance(x, (tuple, list)):
        return {"__tuple__" if isinstance(x, tuple) else "__list__": [leaf_to_json(i) for i in x]}
    if isinstance(x, torch.dtype):
        return {"__dtype__": str(x).removeprefix("torch.")}
    if isinstance(x, torch.device):
        return {"__device__": str(x)}
    if isinstance(x, torch.layout) and x == torch.strided:
        return {"__layout__": "strided"}
    if isinstance(x, torch.memory_format):
        for name, fmt in _MEMORY_FORMATS.items():
            if x == fmt:
                return {"__memory_format__": name}
    raise TypeError(f"a {type(x).__name__}")


def leaf_from_json(x: Any) -> Any:
    if isinstance(x, dict):
        if "__tensor__" in x:
            return TENSOR
        if "__object_leaf__" in x:
            return ObjectLeaf(x["__object_leaf__"], x["n"], x.get("dims"))
        if "__tuple__" in x:
            return tuple(leaf_from_json(i) for i in x["__tuple__"])
        if "__list__" in x:
            return [leaf_from_json(i) for i in x["__list__"]]
        if "__dtype__" in x:
            return getattr(torch, x["__dtype__"])
        if "__device__" in x:
            return torch.device(x["__device__"])
        if "__layout__" in x:
            return _LAYOUTS[x["__layout__"]]
        if "__memory_format__" in x:
            return _MEMORY_FORMATS[x["__memory_format__"]]
    return x


def describe_structure(value: Any) -> tuple[list[torch.Tensor], dict]:
    """The tensors of a pytree and a JSON-able description of the rest."""
    leaves, spec = pytree.tree_flatten(value)
    tensors = [x for x in leaves if isinstance(x, torch.Tensor)]
    encoded = []
    for x in leaves:
        try:
            encoded.append(leaf_to_json(TENSOR if isinstance(x, torch.Tensor) else x))
        except TypeError:
            encoded.append(None)  # an argument that cannot be stored: subscribers see None
    return tensors, {
        "spec": pytree.treespec_dumps(spec),
        "leaves": encoded,
        "requires_grad": [t.requires_grad for t in tensors],
    }


def rebuild(desc: dict, tensors: list[torch.Tensor]) -> Any:
    """The structure `desc` (decoded: "treespec" and "decoded" leaves) with its tensors filled in."""
    it = iter(tensors)
    leaves = [next(it) if x is TENSOR else x for x in desc["decoded"]]
    return pytree.tree_unflatten(leaves, desc["treespec"])

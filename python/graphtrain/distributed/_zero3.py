"""ZeRO stage 3 in eager PyTorch: each rank keeps 1/N of every parameter (and so of its gradient
and optimizer state); a unit's parameters are gathered for its forward and again for its backward.

The layout. A *unit* is a module whose parameters are sharded together: by default every module
that directly owns parameters, or the modules `unit` selects (each takes the parameters of its
subtree that no nested unit takes; the root takes what is left). A unit's parameters of one dtype
and requires_grad form one *group*: flattened into one buffer, padded to a multiple of the world
size N, of which rank r keeps elements [r S, (r + 1) S) as an nn.Parameter (the shard), registered
on the unit as `_zero3_shard_K`. The parameters themselves leave the modules: outside forward their
attributes hold stand-ins (full shape and dtype, 4 bytes of memory) that raise when computed with.

Forward. The modules that read a group's parameters gather it first (reference-counted: the same
gathered buffer serves nested and tied uses) through `_Gather`, an autograd function whose output
is the full flat buffer; the parameter attributes become views of it, and the buffer is released
when the module's forward returns. Saved tensors that are views of a gathered buffer are packed as
their geometry (saved_tensors_hooks), so the autograd graph does not keep full parameters alive.

Backward. The first unpack of a group gathers it again (kept until the group's `_Gather.backward`,
which runs after every use's backward); `_Gather.backward` starts an asynchronous reduce-scatter of
the full gradient (sum, then / N), and when the backward ends the results are added to the shards'
.grad (set when None), as torch accumulates a leaf's: gradient accumulation works unchanged.
Parameters under `persistence_threshold` elements stay whole on every rank and their gradients are
all-reduced (averaged) once accumulated.

Prefetch. The order in which groups are gathered in the first forward is kept; gathering one starts
an asynchronous gather of the next in forward, and of the previous one in backward. A prefetched
buffer is used only if its shard has not changed since (an optimizer step in between discards it).

Collectives are issued in the same order on every rank because every rank runs the same modules in
the same order; a model whose ranks take different branches would deadlock, as under any ZeRO.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.optim.optimizer import register_optimizer_step_pre_hook

from .. import _gather
from ..log import log_once

_STATE_ATTR = "_graphtrain_zero3"
_REPLACED_ATTR = "_graphtrain_zero3_replaced"  # set on the parameters zero3 took out of a model


# torch 2.13 deprecates the *_tensor names in favour of *_single.
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


IN_FLIGHT = 2  # gradient reductions running at once, each holding a full gradient


class ShardingError(RuntimeError):
    """zero3 cannot shard this model, or a sharded model is used in a way that cannot work."""


# ---- stand-ins -----------------------------------------------------------------------------------

_METADATA = {
    "shape",
    "size",
    "dim",
    "ndim",
    "dtype",
    "device",
    "layout",
    "numel",
    "nelement",
    "element_size",
    "is_floating_point",
    "is_complex",
    "requires_grad",
    "is_cuda",
    "is_cpu",
    "is_meta",
    "is_sparse",
    "is_quantized",
    "__len__",
    "__repr__",
    "__format__",
    "_is_view",
    "__get__",
    "names",
    "is_leaf",
    "grad",
    "grad_fn",
    "data",
    "_base",
    "is_nested",
    "__reduce_ex__",
}


class ShardedParameterStandIn(torch.Tensor):
    """A parameter's place outside forward: its shape and dtype, no data (an expanded scalar).
    Reading metadata works; computing with it raises, naming the parameter and where it lives."""

    _zero3_name: str
    _zero3_module: str

    @staticmethod
    def __new__(cls, shape: torch.Size, dtype: torch.dtype, name: str, module: str) -> Any:
        data = torch.zeros((), dtype=dtype).expand(shape)
        t = torch.Tensor._make_subclass(cls, data, False)
        t._zero3_name = name
        t._zero3_module = module
        return t

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = getattr(func, "__name__", str(func))
        if name in _METADATA:
            with torch._C.DisableTorchFunctionSubclass():
                return func(*args, **(kwargs or {}))
        stand_in = next(
            (a for a in _flat_args(args, kwargs) if isinstance(a, ShardedParameterStandIn)), None
        )
        where = (
            f"parameter '{stand_in._zero3_name}' (of module '{stand_in._zero3_module or '(root)'}')"
            if stand_in is not None
            else "a parameter"
        )
        raise ShardingError(
            f"{where} is sharded by graphtrain.distributed.zero3 and is gathered only inside the "
            f"forward of the modules that own it; '{name}' used it outside them. Read it inside the "
            "owning module's forward, or get full values with "
            "graphtrain.distributed.full_state_dict(model)."
        )

    def __repr__(self, *args: Any, **kwargs: Any) -> str:  # type: ignore[override]
        return (
            f"ShardedParameterStandIn({self._zero3_name}: {tuple(self.shape)}, "
            f"{str(self.dtype).replace('torch.', '')})"
        )


def _flat_args(args: Any, kwargs: Any) -> Iterable[Any]:
    for a in list(args) + list((kwargs or {}).values()):
        if isinstance(a, list | tuple):
            yield from a
        else:
            yield a


# ---- layout --------------------------------------------------------------------------------------


@dataclass
class _Entry:
    """One parameter of a group: where it lives in the flat buffer, and who holds it."""

    name: str  # its path in the model (the first one, for a tied parameter)
    paths: list[str]  # every path it has in the model (several for a tied parameter)
    shape: torch.Size
    offset: int
    numel: int
    refs: list[tuple[nn.Module, str]]  # (module, attribute) of every module that holds it
    stand_in: torch.Tensor | None = None


@dataclass(eq=False)
class _Group:
    index: int
    unit: str  # the path of the unit module
    dtype: torch.dtype
    requires_grad: bool
    entries: list[_Entry]
    numel: int  # elements of the parameters
    padded: int  # numel rounded up to a multiple of the world size
    shard: nn.Parameter
    state: _State
    unit_module: nn.Module  # holds the shard as attribute `_zero3_shard_K`
    shard_attr: str
    full: torch.Tensor | None = None  # gathered for forward (an autograd output)
    count: int = 0  # forwards in flight that use it
    backward_full: torch.Tensor | None = None  # gathered again for backward (no autograd)
    backward_weak: Any = None  # a weak reference to the last backward buffer
    pending: tuple[Any, torch.Tensor, int] | None = None  # (work, buffer, shard version)

    @property
    def shard_size(self) -> int:
        return self.padded // self.state.world

    # -- collectives --

    def _start_gather(self) -> tuple[Any, torch.Tensor]:
        buf = torch.empty(self.padded, dtype=self.dtype)
        work = _all_gather(buf, self.shard.detach(), group=self.state.group, async_op=True)
        return work, buf

    def prefetch(self) -> None:
        if self.pending is None and self.state.world > 1:
            work, buf = self._start_gather()
            self.pending = (work, buf, self.shard._version)

    def gather_data(self) -> torch.Tensor:
        """The full flat buffer from the shards: a prefetched one if still valid, else now (with
        one rank, the shard itself)."""
        if self.state.world == 1:
            return self.shard.detach()
        if self.pending is not None:
            work, buf, version = self.pending
            self.pending = None
            work.wait()
            if version == self.shard._version:
                self.state.counts["prefetched"] += 1
                return buf
        self.state.counts["waited"] += 1
        work, buf = self._start_gather()
        work.wait()
        return buf

    def reduce_gradient(self, grad: torch.Tensor) -> None:
        """Starts reducing the full gradient `grad` (which this call may overwrite) across the
        ranks; this rank's slice goes into the shard's .grad when the backward ends."""
        state = self.state
        if state.all_reduce:
            # gloo's reduce-scatter is slower than its all-reduce (12.6 MB between 2 ranks here:
            # 26 ms against 15.5): reduce all of it in place and keep this rank's slice.
            work = dist.all_reduce(grad, group=state.group, async_op=True)
            out = grad[state.rank * self.shard_size : (state.rank + 1) * self.shard_size]
        else:
            out = torch.empty(self.shard_size, dtype=grad.dtype)
            work = _reduce_scatter(out, grad, group=state.group, async_op=True)
        state.queue_gradient(self, work, out)

    # -- forward --

    def acquire(self, anchors: list[torch.Tensor]) -> None:
        self.count += 1
        if self.count > 1:
            return
        if torch.compiler.is_exporting():
            # Captured by a GraphModule: a ShardGather node at this boundary, reading the shard as the
            # traced module holds it (the graph's parameter input).
            full = _gather.gather(
                anchors, getattr(self.unit_module, self.shard_attr), self.index, self.padded
            )
        else:
            self.backward_full = None
            if self.requires_grad and torch.is_grad_enabled():
                full = _Gather.apply(self.shard, self)
            else:
                full = self.gather_data()
            self.state.live[full.untyped_storage().data_ptr()] = self
            self.state.note_forward(self)
        self.full = full
        # One split, not a slice per parameter: its gradient is one concatenation (a slice's is a
        # zero-filled full-size buffer each).
        sizes = [e.numel for e in self.entries]
        if self.padded > self.numel:
            sizes.append(self.padded - self.numel)
        for e, part in zip(self.entries, full.split(sizes)):
            view = part.view(e.shape)
            for module, attr in e.refs:
                module.__dict__[attr] = view

    def release(self) -> None:
        self.count -= 1
        if self.count > 0:
            return
        full, self.full = self.full, None
        if full is not None and not torch.compiler.is_exporting():
            self.state.live.pop(full.untyped_storage().data_ptr(), None)
        for e in self.entries:
            for module, attr in e.refs:
                module.__dict__[attr] = e.stand_in

    # -- backward --

    def for_backward(self) -> torch.Tensor:
        buf = self.backward_full
        if buf is None and self.backward_weak is not None:
            buf = self.backward_weak()
        if buf is None:
            buf = self.gather_data()
            self.state.note_backward(self)
        # Strong until _Gather.backward (after every use) for groups with gradients; a frozen
        # group has no such moment, and lives as long as the unpacked tensors.
        if self.requires_grad:
            self.backward_full = buf
        self.backward_weak = weakref.ref(buf)
        return buf


class _Gather(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, shard: torch.Tensor, group: _Group) -> torch.Tensor:
        ctx.group = group
        return group.gather_data()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, None]:
        group: _Group = ctx.group
        group.backward_full = None  # every use of the gathered parameters has run its backward
        group.backward_weak = None
        if group.state.world == 1:
            return grad, None
        # Asynchronous: the rest of the backward runs while it reduces; the shard's .grad gets it
        # when the backward ends (_State.finish_gradients).
        group.reduce_gradient(grad.contiguous())
        return None, None


@dataclass(frozen=True)
class _Saved:
    """A saved tensor that is a view of a gathered buffer, kept as its geometry."""

    group: _Group
    size: torch.Size
    stride: tuple[int, ...]
    offset: int


@dataclass(eq=False)
class _State:
    group: Any  # the process group (None: the default one)
    world: int
    rank: int
    groups: list[_Group] = field(default_factory=list)
    persistent: list[tuple[list[str], nn.Parameter]] = field(default_factory=list)  # paths, param
    keys: list[str] = field(default_factory=list)  # the model's state_dict keys before sharding
    live: dict[int, _Group] = field(default_factory=dict)  # storage pointer -> gathered group
    order: list[_Group] = field(default_factory=list)  # gather order of the first forward
    position: dict[_Group, int] = field(default_factory=dict)  # index in `order`, once done
    order_done: bool = False
    hook_handles: list[Any] = field(default_factory=list)
    # gathers served by a prefetch, and gathers waited for
    counts: dict[str, int] = field(default_factory=lambda: {"prefetched": 0, "waited": 0})
    reducing: list[tuple[_Group, Any, torch.Tensor]] = field(default_factory=list)
    all_reduce: bool = False  # reduce gradients with all-reduce (gloo), not reduce-scatter

    @property
    def src(self) -> int:
        """The global rank of the group's rank 0 (broadcasts come from it)."""
        return dist.get_global_rank(self.group, 0) if self.group is not None else 0

    def queue_gradient(self, g: _Group, work: Any, out: torch.Tensor) -> None:
        if not self.reducing:
            torch.autograd.Variable._execution_engine.queue_callback(self.finish_gradients)
        self.reducing.append((g, work, out))
        # At most IN_FLIGHT full gradients wait for their reduction: more would hold the full
        # gradients that sharding is there to avoid.
        if len(self.reducing) > IN_FLIGHT:
            self.finish_gradients(keep=IN_FLIGHT)

    def finish_gradients(self, keep: int = 0) -> None:
        """The reduced gradients into the shards' .grad, accumulating as torch does for a leaf: all
        of them when the backward ends, all but the `keep` newest while it runs."""
        cut = len(self.reducing) - keep
        pending, self.reducing = self.reducing[:cut], self.reducing[cut:]
        for g, work, out in pending:
            work.wait()
            out = out.div_(self.world) if out._base is None else out.div(self.world)
            if g.shard.grad is None:
                g.shard.grad = out
            else:
                g.shard.grad.add_(out)

    def note_forward(self, g: _Group) -> None:
        if not self.order_done:
            if g not in self.order:
                self.order.append(g)
            return
        k = self.position.get(g)
        if k is not None and k + 1 < len(self.order):
            nxt = self.order[k + 1]
            if nxt.count == 0:
                nxt.prefetch()

    def note_backward(self, g: _Group) -> None:
        k = self.position.get(g) if self.order_done else None
        if k:
            prev = self.order[k - 1]
            if prev.backward_full is None and (
                prev.backward_weak is None or prev.backward_weak() is None
            ):
                prev.prefetch()

    def finish_order(self) -> None:
        if not self.order_done and self.order:
            self.order_done = True
            self.position = {g: k for k, g in enumerate(self.order)}

    # inside a GraphModule: the ShardGather / ShardGatherGrad nodes (graphtrain/_gather.py)

    def gather(self, attrs: dict) -> torch.Tensor:
        g = self.groups[int(attrs["group"])]
        full = g.gather_data()
        if attrs.get("recompute"):  # the backward graph gathering again
            self.finish_order()
            self.note_backward(g)
        else:
            self.note_forward(g)
        return full

    def gradient(self, attrs: dict, grad: torch.Tensor) -> torch.Tensor:
        g = self.groups[int(attrs["group"])]
        self.finish_order()
        if self.world == 1:
            return grad
        # As in eager: reduced asynchronously (from a copy: the engine reuses its memory), into
        # the shard's .grad when torch's backward ends; the graph's own gradient for the shard is
        # zero.
        g.reduce_gradient(grad.clone())
        return torch.zeros(g.shard_size, dtype=grad.dtype)

    # saved-tensor hooks: views of gathered buffers are kept as their geometry

    def pack(self, t: torch.Tensor) -> Any:
        if not self.live:
            return t
        g = self.live.get(t.untyped_storage().data_ptr())
        if g is None:
            return t
        return _Saved(g, t.size(), t.stride(), t.storage_offset())

    def unpack(self, saved: Any) -> torch.Tensor:
        if not isinstance(saved, _Saved):
            return saved
        buf = saved.group.for_backward()
        return buf.as_strided(saved.size, saved.stride, saved.offset)


# ---- applying it ---------------------------------------------------------------------------------


def _foreign(p: nn.Parameter) -> str | None:
    """What already shards this parameter, if anything."""
    if getattr(p, _REPLACED_ATTR, False):
        return "graphtrain.distributed.zero3 (this parameter was already taken out of a model)"
    if hasattr(p, "ds_id") or hasattr(p, "ds_status"):
        return "DeepSpeed ZeRO stage 3"
    if getattr(p, "_is_flat_param", False) or type(p).__name__ == "FlatParameter":
        return "FullyShardedDataParallel"
    if type(p).__name__ == "DTensor" or hasattr(p, "_local_tensor"):
        return "a DTensor (FSDP2 fully_shard or tensor parallel)"
    return None


def _unit_selector(
    unit: Any,
) -> Callable[[nn.Module], bool] | None:
    if unit is None:
        return None
    if isinstance(unit, type):
        unit = (unit,)
    if isinstance(unit, tuple | list | set):
        types = tuple(unit)
        for t in types:
            if not (isinstance(t, type) and issubclass(t, nn.Module)):
                raise TypeError(f"zero3: unit takes nn.Module types or a predicate; got {t!r}")
        return lambda m: isinstance(m, types)
    if callable(unit):
        return unit
    raise TypeError(
        f"zero3: unit takes nn.Module types or a predicate (module -> bool); got {unit!r}"
    )


def _check_group(group: Any) -> tuple[int, int]:
    if not (dist.is_available() and dist.is_initialized()):
        raise ShardingError(
            "zero3 needs torch.distributed initialized (torch.distributed.init_process_group, "
            "for example under torchrun); it was not"
        )
    return dist.get_world_size(group), dist.get_rank(group)


def _optimizer_step_check(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
    for group in optimizer.param_groups:
        for p in group["params"]:
            if getattr(p, _REPLACED_ATTR, False):
                raise ShardingError(
                    f"{type(optimizer).__name__} holds parameter '{p._graphtrain_zero3_name}' "
                    "(full size) that graphtrain.distributed.zero3 took out of the model: the "
                    "optimizer was built before zero3 and would update nothing. Build the "
                    "optimizer after zero3(model), on model.parameters() (the shards)."
                )


_step_hook: Any = None


def zero3(
    module: nn.Module,
    *,
    group: Any = None,
    unit: Any = None,
    persistence_threshold: int = 0,
) -> nn.Module:
    """Shards `module`'s parameters across the ranks of `group` (ZeRO stage 3), in place, and
    returns it. Build the optimizer afterwards, on module.parameters(): it then holds only this
    rank's shards, so its state is sharded too.

    unit: the modules sharded (and gathered) together: nn.Module types or a predicate, like FSDP's
    wrap policy; by default each module that directly owns parameters. Parameters with fewer than
    `persistence_threshold` elements stay whole on every rank (gradients all-reduced). Every rank
    starts from rank 0's parameters and buffers (broadcast here)."""
    global _step_hook
    if not isinstance(module, nn.Module):
        raise TypeError(f"zero3 takes an nn.Module, got {type(module).__name__}")
    if hasattr(module, _STATE_ATTR):
        raise ShardingError("zero3: this module is already sharded by zero3")
    if persistence_threshold < 0:
        raise ValueError(f"zero3: persistence_threshold must be >= 0, got {persistence_threshold}")
    world, rank = _check_group(group)
    select = _unit_selector(unit)

    # Who holds which parameter (a tied parameter is held by several modules).
    refs: dict[int, list[tuple[nn.Module, str, str]]] = {}
    params: dict[int, nn.Parameter] = {}
    holder_path: dict[nn.Module, str] = {}
    for path, m in module.named_modules():
        holder_path[m] = path
        for attr, p in m._parameters.items():
            if p is None:
                continue
            name = f"{path}.{attr}" if path else attr
            owner = _foreign(p)
            if owner is not None:
                raise ShardingError(
                    f"zero3: parameter '{name}' is already sharded by {owner}; shard a model "
                    "with one framework only (give zero3 the plain model)"
                )
            if p.device.type != "cpu" and dist.get_backend(group) == "gloo":
                raise ShardingError(
                    f"zero3: parameter '{name}' is on {p.device}, and the process group's backend "
                    "is gloo (CPU tensors only)"
                )
            params[id(p)] = p
            refs.setdefault(id(p), []).append((m, attr, name))

    # The unit of each module: itself if selected (or if it owns parameters, by default), else
    # the nearest enclosing unit; the root is always one.
    unit_of: dict[nn.Module, nn.Module] = {}

    def assign(m: nn.Module, enclosing: nn.Module) -> None:
        is_unit = m is module or (
            select(m) if select is not None else any(p is not None for p in m._parameters.values())
        )
        unit_of[m] = m if is_unit else enclosing
        for child in m.children():
            if child not in unit_of:
                assign(child, unit_of[m])

    assign(module, module)

    state = _State(
        group=group,
        world=world,
        rank=rank,
        keys=list(module.state_dict().keys()),
        all_reduce=dist.get_backend(group) == "gloo",
    )
    by_key: dict[tuple[nn.Module, torch.dtype, bool], list[nn.Parameter]] = {}
    for pid, holders in refs.items():
        p = params[pid]
        if p.numel() < persistence_threshold:
            state.persistent.append(([n for _, _, n in holders], p))
            continue
        owner_unit = unit_of[holders[0][0]]
        by_key.setdefault((owner_unit, p.dtype, p.requires_grad), []).append(p)

    readers: dict[nn.Module, list[_Group]] = {}  # module -> the groups its forward gathers
    per_unit: dict[nn.Module, int] = {}
    for (u, dtype, requires_grad), ps in by_key.items():
        entries, offset = [], 0
        for p in ps:
            holders = refs[id(p)]
            entries.append(
                _Entry(
                    holders[0][2],
                    [n for _, _, n in holders],
                    p.shape,
                    offset,
                    p.numel(),
                    [(m, a) for m, a, _ in holders],
                )
            )
            offset += p.numel()
        padded = -(-max(offset, 1) // world) * world
        flat = torch.zeros(padded, dtype=dtype)
        with torch.no_grad():
            for e, p in zip(entries, ps):
                flat[e.offset : e.offset + e.numel].copy_(p.detach().reshape(-1))
        if world > 1:
            dist.broadcast(flat, src=state.src, group=group)
        size = padded // world
        shard = nn.Parameter(flat[rank * size : (rank + 1) * size].clone(), requires_grad)
        k = per_unit.get(u, 0)
        per_unit[u] = k + 1
        u.register_parameter(f"_zero3_shard_{k}", shard)
        g = _Group(
            index=len(state.groups),
            unit=holder_path[u],
            dtype=dtype,
            requires_grad=requires_grad,
            entries=entries,
            numel=offset,
            padded=padded,
            shard=shard,
            state=state,
            unit_module=u,
            shard_attr=f"_zero3_shard_{k}",
        )
        state.groups.append(g)
        for e, p in zip(entries, ps):
            e.stand_in = ShardedParameterStandIn(p.shape, dtype, e.name, holder_path[e.refs[0][0]])
            for m, attr in e.refs:
                del m._parameters[attr]
                m.__dict__[attr] = e.stand_in
                # Gathered by the unit (the modules inside it run within its forward), and by any
                # other module holding it (a tied parameter read elsewhere).
                reader = u if unit_of[m] is u else m
                if g not in readers.setdefault(reader, []):
                    readers[reader].append(g)
            p._graphtrain_zero3_replaced = True  # type: ignore[attr-defined]
            p._graphtrain_zero3_name = e.name  # type: ignore[attr-defined]
            p.grad = None
        del ps

    # Persistent parameters: whole on every rank (rank 0's values), gradients averaged.
    for _, p in state.persistent:
        if world > 1:
            dist.broadcast(p.data, src=state.src, group=group)
        if p.requires_grad:
            state.hook_handles.append(p.register_post_accumulate_grad_hook(_all_reduce_hook(state)))
    if world > 1:
        for b in module.buffers():
            dist.broadcast(b, src=state.src, group=group)

    for m, groups in readers.items():
        _wrap_forward(m, groups, state, is_root=m is module)
    if module not in readers:
        _wrap_forward(module, [], state, is_root=True)
    setattr(module, _STATE_ATTR, state)
    setattr(module, _gather.LAYOUT_ATTR, state)
    if _step_hook is None:
        _step_hook = register_optimizer_step_pre_hook(_optimizer_step_check)
    sharded = sum(g.numel for g in state.groups)
    log_once(
        "INFO",
        f"zero3: {sharded} parameter elements in {len(state.groups)} groups sharded over {world} "
        f"ranks ({sum(g.shard_size for g in state.groups)} per rank); "
        f"{sum(p.numel() for _, p in state.persistent)} in {len(state.persistent)} persistent "
        "parameters",
        key=("zero3", id(module)),
    )
    return module


def _all_reduce_hook(state: _State) -> Callable[[torch.Tensor], None]:
    def hook(p: torch.Tensor) -> None:
        if p.grad is not None and state.world > 1:
            dist.all_reduce(p.grad, group=state.group)
            p.grad.div_(state.world)

    return hook


def _wrap_forward(m: nn.Module, groups: list[_Group], state: _State, is_root: bool) -> None:
    original = m.forward

    def forward(*args: Any, **kwargs: Any) -> Any:
        exporting = torch.compiler.is_exporting()
        anchors = _gather.anchors(args, kwargs) if exporting and groups else []
        for g in groups:
            g.acquire(anchors)
        try:
            if exporting:
                return original(*args, **kwargs)
            with torch.autograd.graph.saved_tensors_hooks(state.pack, state.unpack):
                return original(*args, **kwargs)
        finally:
            for g in groups:
                g.release()
            if is_root and not exporting:
                state.finish_order()

    forward.__wrapped__ = original  # type: ignore[attr-defined]
    forward._graphtrain_zero3 = True  # type: ignore[attr-defined]
    m.forward = forward


def is_sharded(module: nn.Module) -> bool:
    return hasattr(module, _STATE_ATTR)


def state_of(module: nn.Module) -> _State:
    state = getattr(module, _STATE_ATTR, None)
    if state is None:
        raise ShardingError(
            f"{type(module).__name__} is not sharded by graphtrain.distributed.zero3 "
            "(call zero3(model) first, on the model you pass here)"
        )
    return state

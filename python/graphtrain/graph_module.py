"""GraphModule: a drop-in nn.Module whose forward and backward run in graphtrain's engine."""

from __future__ import annotations

import contextlib
import os
import time
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import torch
from torch.utils import _pytree as pytree
from torch.utils.dlpack import to_dlpack

from . import (
    _C,
    _cache,
    _capture_process,
    _fallback,
    _gather,  # noqa: F401 - the ShardGather handlers, for graphs loaded from the cache
    _islands,
    custom_function,
)
from ._callbacks import CallbackRun, recording
from ._captured import Captured, dynamic_dims
from ._options import options
from ._structure import TENSOR, ObjectLeaf
from .debug_options import DebugOptions
from .errors import UnsupportedModelError
from .hooks import _subscriber
from .hooks._statistics import subscribe_from_options
from .hooks._subscriber import capture_scope, hook_signature
from .log import log, log_once, refresh_rank

Model = _C.Model
Session = _C.Session

# A DLPack capsule to a tensor: torch.utils.dlpack.from_dlpack calls this after probing its argument
# for a __dlpack__ method (a failed attribute lookup on every capsule, ~30 a training step).
_from_capsule = getattr(torch._C, "_from_dlpack", None) or torch.utils.dlpack.from_dlpack

# Entered while torch.export traces a GraphModule's module: subscribed module boundaries become Hook
# nodes, torch.autograd.Functions become PythonOps.
CAPTURE_CONTEXTS = (capture_scope, lambda module: custom_function.opaque_functions())


class _Runner:
    """The engine side of one capture: an inference session, and forward/backward sessions built
    by graphtrain's gradient builder for the parameters and inputs that want gradients."""

    def __init__(
        self,
        captured: Captured,
        module: torch.nn.Module,
        wants: list[bool],
        debug: DebugOptions,
        label: str,
    ) -> None:
        self.captured = captured
        self._placeholders: dict[tuple[torch.dtype, bool], torch.Tensor] = {}
        self.bind(module)
        self._zeros: dict[tuple[tuple[int, ...], torch.dtype], torch.Tensor] = {}
        self.n_out = len(captured.outputs)
        model = Model.from_bytes(captured.model)
        custom_function.prepare(model)  # PythonOps: their Functions and shape inferers
        self.fallbacks = _fallback.fallback_ops(model)  # ATen op -> modules, before any pass
        self.num_nodes = model.num_nodes
        model.optimize(f"{label} captured", before_autodiff=True)  # recognize_gelu, ...
        names = [i.name for i in captured.inputs]
        self.wrt = [i.name for i, w in zip(captured.inputs, wants) if w]
        self.wrt_index = [k for k, w in enumerate(wants) if w]
        grad_outputs = [o for o, f in zip(captured.outputs, captured.output_float) if f]
        self.float_outputs = [k for k, f in enumerate(captured.output_float) if f]
        self.forward = self.backward = None
        self.calls_back = False
        self.label = label
        if self.wrt and grad_outputs:
            fwd, bwd, info = model.gradient_graphs(grad_outputs, self.wrt, False)
            # Before its passes: the source of the backward graphs for calls where some outputs
            # get no gradient (backward_session).
            self._backward_source = bwd.copy()
            self._grad_inputs = info["grad_inputs"]
            self._backwards: dict[tuple[bool, ...], Session] = {}
            fwd.optimize(f"{label} forward")  # the graph passes, after autodiff
            bwd.optimize(f"{label} backward")
            self.forward, self.backward = Session(fwd), Session(bwd)
            # Hooks, PythonOps, ATen fallbacks or ZeRO-3 gathers: a call needs a CallbackRun.
            self.calls_back = self.forward.calls_back or self.backward.calls_back
            self.grad_names = info["grads"]
            self.n_stash = len(info["stashed"])
        model.optimize(f"{label} inference")  # after autodiff: it read the captured graph
        self.infer = Session(model)
        self.infer_calls_back = self.infer.calls_back
        # the graphs as they run: DebugOptions(save_onnx=True), or GRAPHTRAIN_SAVE_ONNX_PATH
        if debug.save_onnx or options()["save_onnx_path"].value:
            graphs = {"forward": model}
            if self.forward is not None:
                graphs.update(training_forward=fwd, training_backward=bwd)
            self._save(debug, label, graphs)
        assert names == self.infer.input_names

    def bind(self, module: torch.nn.Module) -> None:
        """Takes the module's parameters and buffers as they are now: the graph reads them by name,
        so one replaced since the capture (`module.w = nn.Parameter(...)`, load_state_dict with
        assign=True) is the one it reads."""
        params = dict(module.named_parameters(remove_duplicate=False))
        self.buffers = dict(module.named_buffers(remove_duplicate=False))
        # The graph's inputs as bound now: parameters and buffers resolved, a None for each of the
        # call's tensors (`_from_call`: its slot and its index among them), filled by tensors().
        # DeepSpeed stage-3 parameters (`by_layout`): the graph gets a size-0 placeholder, gathers
        # them itself and hands their gradients to DeepSpeed (graphtrain/distributed/_deepspeed.py),
        # so torch autograd gets none; never the parameter itself, or torch would run its gradient
        # hooks (DeepSpeed's) even for the None gradient it gets.
        self.by_layout: set[int] = set()
        self._bound: list[Any] = []
        self._from_call: list[tuple[int, int]] = []
        for k, gi in enumerate(self.captured.inputs):
            if gi.kind == "param":
                p = params[gi.key]
                if _partitioned_by_deepspeed(p):
                    self.by_layout.add(k)
                    p = self._placeholder(p.dtype, p.requires_grad)
                self._bound.append(p)
            elif gi.kind == "buffer":
                self._bound.append(self.buffers[gi.key])
            else:
                self._from_call.append((k, gi.key))
                self._bound.append(None)

    @staticmethod
    def _save(debug: DebugOptions, label: str, models: dict[str, Any]) -> None:
        folder = debug.save_path or options()["save_onnx_path"].value or "."
        os.makedirs(folder, exist_ok=True)
        for kind, m in models.items():
            path = os.path.join(folder, f"{debug.onnx_prefix or 'graph'}_{label}_{kind}.onnx")
            m.save(path)
            log("INFO", f"saved the {kind} graph to {path}")

    def fits(self, flat_tensors: list[torch.Tensor]) -> bool:
        """Whether this graph runs these tensor arguments: always, unless it specialized sizes
        they do not have."""
        static = self.captured.static_shapes
        return static is None or all(list(t.shape) == s for t, s in zip(flat_tensors, static))

    def tensors(self, flat_tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        """The graph's inputs for a call's tensors: parameters, buffers and the call's tensors."""
        out = self._bound.copy()
        for k, key in self._from_call:
            out[k] = flat_tensors[key]
        return out

    def _placeholder(self, dtype: torch.dtype, requires_grad: bool) -> torch.Tensor:
        key = (dtype, requires_grad)
        t = self._placeholders.get(key)
        if t is None:
            t = self._placeholders[key] = torch.empty(0, dtype=dtype, requires_grad=requires_grad)
        return t

    def backward_session(self, missing: tuple[bool, ...]) -> Session:
        """The backward graph for a call whose float outputs `missing` got no gradient (a model's
        logits returned beside its loss): made once per pattern, without the sums that would add
        their zero gradients (a [tokens, vocab] Add for a language model's logits)."""
        if not any(missing):
            return self.backward
        session = self._backwards.get(missing)
        if session is None:
            model = self._backward_source.copy()
            model.drop_zero_gradients([n for n, m in zip(self._grad_inputs, missing) if m])
            model.optimize(f"{self.label} backward")
            session = self._backwards[missing] = Session(model)
        return session

    def zero_gradient(self, shape: torch.Size, dtype: torch.dtype) -> torch.Tensor:
        """The gradient fed for an output that got none: one zero tensor per shape, filled once.
        Not torch.zeros per step: its fill runs on torch's OpenMP threads, which then spin for a
        while and take the cores from graphtrain's pool (hf-gpt2 at 2 threads: 45 -> 35 ms)."""
        key = (tuple(shape), dtype)
        z = self._zeros.get(key)
        if z is None:
            z = self._zeros[key] = torch.zeros(shape, dtype=dtype)
        return z

    def not_a_zero_gradient(self, grad: torch.Tensor) -> torch.Tensor:
        """`grad`, or a copy where the backward graph returned (a view of) a cached zero gradient:
        torch may keep it as a .grad and accumulate into it."""
        if self._zeros:
            ptr = grad.untyped_storage().data_ptr()
            if any(ptr == z.untyped_storage().data_ptr() for z in self._zeros.values()):
                return grad.clone()
        return grad

    def write_buffers(self, updates: list[torch.Tensor]) -> None:
        if not updates:
            return
        with torch.no_grad():
            for (_, name), value in zip(self.captured.buffer_updates, updates):
                self.buffers[name].copy_(value)


def _run(
    session: Session, tensors: list[Any], keep: int = 0, run: CallbackRun | None = None
) -> list[Any]:
    """Runs a graph on torch tensors, which cross as bare DLPack capsules both ways (the
    protocol's Python layers, __dlpack__ and from_dlpack of an object, cost a few microseconds a
    tensor: ~0.5 ms a step on the GPT bench model). A Stash among the inputs stands for the engine
    tensors it holds; `keep` > 0 returns the last `keep` outputs as one Stash, left in C++. `run`:
    the call its callback nodes belong to (None where the graph has none)."""
    caps = [t if isinstance(t, _C.Stash) else to_dlpack(t.detach()) for t in tensors]
    if run is None:
        out = session.run_dlpack(caps, keep)
    else:
        with recording(run):
            out = session.run_dlpack(caps, keep)
    if keep:
        return [_from_capsule(c) for c in out[:-1]] + [out[-1]]
    return [_from_capsule(c) for c in out]


def _keep_graph() -> bool:
    """Whether the backward running now was asked to keep the graph (retain_graph=True): torch's
    engine knows, through a private accessor; without it, a PyTorch that lacks it frees."""
    get = getattr(torch._C._autograd, "_get_current_graph_task_keep_graph", None)
    return bool(get()) if get is not None else False


class _EngineFunction(torch.autograd.Function):
    """Connects the engine's forward and backward graphs to torch autograd."""

    @staticmethod
    def forward(ctx: Any, runner: _Runner, module: torch.nn.Module, *tensors: torch.Tensor) -> Any:
        # What hooks and PythonOps keep for the backward (graphs without callback nodes: nothing).
        ctx.run = CallbackRun(module, training=True) if runner.calls_back else None
        # The values stashed for the backward stay engine tensors, held by ctx.
        outs = _run(runner.forward, tensors, keep=runner.n_stash, run=ctx.run)
        n, nb = runner.n_out, len(runner.captured.buffer_updates)
        runner.write_buffers(outs[n : n + nb])
        ctx.runner = runner
        ctx.stash = outs[-1] if runner.n_stash else None
        user = outs[:n]
        ctx.mark_non_differentiable(
            *[u for k, u in enumerate(user) if not runner.captured.output_float[k]]
        )
        # An output nothing differentiates (a model's logits beside its loss, a cache of keys and
        # values) gets None, not a zero tensor torch fills: see _Runner.zero_gradient.
        ctx.set_materialize_grads(False)
        ctx.out_meta = [(u.shape, u.dtype) for u in user]
        return tuple(user)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> Any:
        runner: _Runner = ctx.runner
        if ctx.out_meta is None:  # an earlier backward released what this one would read
            raise RuntimeError(
                "graphtrain: a second backward through the same GraphModule call, after a "
                "backward without retain_graph=True, which freed the values the forward stashed. "
                "Pass retain_graph=True to every backward but the last, as in PyTorch."
            )
        # retain_graph=True: this run takes a second handle on the stashed values (no copy), so
        # that a later backward finds them; otherwise it frees each after its last reader.
        retain = _keep_graph()
        stash = ctx.stash.share() if retain and ctx.stash is not None else ctx.stash
        feeds = [
            runner.zero_gradient(*ctx.out_meta[k]) if grads[k] is None else grads[k].contiguous()
            for k in runner.float_outputs
        ] + ([stash] if stash is not None else [])
        session = runner.backward_session(tuple(grads[k] is None for k in runner.float_outputs))
        results = iter(_run(session, feeds, run=ctx.run))
        if not retain:
            ctx.stash = ctx.run = ctx.out_meta = None  # the stashed values are no longer needed
        out: list[Any] = [None] * len(runner.captured.inputs)
        for index, name in zip(runner.wrt_index, runner.grad_names):
            if name:
                grad = runner.not_a_zero_gradient(next(results))
                out[index] = None if index in runner.by_layout else grad
        return (None, None, *out)


# Bumped whenever any module registers a parameter, buffer or submodule (torch's global registration
# hooks), so a GraphModule walks its module's parameters only after something may have changed
# them, not on every call.
_registrations = 0


def _registered(*_: Any) -> None:
    global _registrations
    _registrations += 1


torch.nn.modules.module.register_module_parameter_registration_hook(_registered)
torch.nn.modules.module.register_module_buffer_registration_hook(_registered)
torch.nn.modules.module.register_module_module_registration_hook(_registered)


# Argument types that pytree takes as leaves whatever is registered: _flatten's fast path.
_PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter)

# A GraphModule holds at most MAX_GRAPHS graphs (one per input schema and mode), and warns once
# when it has made WARN_CAPTURES of them: usually a Python number argument that changes every call.
MAX_GRAPHS = 8
WARN_CAPTURES = 8


def _changing_arguments(old: Any, new: Any, args: Any, kwargs: Any) -> list[str]:
    """The arguments (as `args[1]`, `kwargs['scale']`) whose constant value differs between two
    input schemas of the same structure."""
    (old_spec, old_leaves), (new_spec, new_leaves) = old, new
    if old_spec != new_spec:
        return []
    paths = [pytree.keystr(p) for p, _ in pytree.tree_flatten_with_path((args, kwargs))[0]]
    names = []
    for path, a, b in zip(paths, old_leaves, new_leaves):
        if a != b and a[0] == b[0] == "const":
            names.append(
                path.replace("[0]", "args", 1)
                if path.startswith("[0]")
                else path.replace("[1]", "kwargs", 1)
            )
    return names


def _describe(leaf: Any) -> Any:
    if isinstance(leaf, torch.Tensor):
        static = tuple(leaf.shape[len(dynamic_dims(leaf)) :])  # the dynamic dims lead
        device = "cpu" if leaf.is_cpu else leaf.device.type
        return ("tensor", leaf.dtype, leaf.dim(), static, leaf.requires_grad, device)
    try:
        hash(leaf)
        return ("const", type(leaf).__name__, leaf)
    except TypeError:
        return ("const", type(leaf).__name__, repr(leaf))


def _zero3_from_options(module: torch.nn.Module) -> None:
    """GRAPHTRAIN_ENABLE_ZERO_STAGE3=1: shards `module` with graphtrain.distributed.zero3 when
    torch.distributed runs more than one rank (and it is not sharded yet)."""
    import torch.distributed as dist  # only here: capture never imports torch.distributed

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        log_once(
            "WARNING",
            "GRAPHTRAIN_ENABLE_ZERO_STAGE3=1, but torch.distributed is not initialized with more "
            "than one rank: parameters are not sharded (initialize the process group, for "
            "example under torchrun, before creating the GraphModule)",
            key=("zero3-option",),
        )
        return
    from .distributed import zero3
    from .distributed._zero3 import is_sharded

    if not is_sharded(module):
        zero3(module)


def _refuse_foreign_shards(module: torch.nn.Module) -> None:
    """Parameters still sharded by another framework when a capture starts (FSDP2's fully_shard on
    a submodule) cannot be captured: say what to do."""
    for name, p in module.named_parameters():
        if type(p).__name__ == "DTensor":
            raise UnsupportedModelError(
                f"parameter '{name}' of {type(module).__name__} is a DTensor (FSDP2 fully_shard on "
                "a submodule, or tensor parallelism) when the GraphModule captures its forward; "
                "graphtrain captures modules with whole parameters. Shard with "
                "graphtrain.distributed.zero3(model) and wrap the result in GraphModule, or apply "
                "fully_shard to the GraphModule itself (one unit)."
            )


def _partitioned_by_deepspeed(p: torch.Tensor) -> bool:
    return hasattr(p, "ds_id")  # what DeepSpeed's stage 3 marks its parameters with


def _deepspeed_layout(module: torch.nn.Module) -> Any:
    """The model's ZeROOffloadSubscriber when DeepSpeed's ZeRO stage 3 partitions its parameters
    (graphtrain/distributed/_deepspeed.py), else None."""
    if not any(_partitioned_by_deepspeed(p) for p in module.parameters()):
        return None
    from .distributed._deepspeed import attach

    return attach(module)


class GraphModule(torch.nn.Module):
    """Wraps `module`: its forward is captured once (per input schema and train/eval mode) into a
    graph, its gradient graph is built by graphtrain, and both run in graphtrain's C++ engine.

    Parameters stay the module's torch parameters: any torch optimizer, gradient clipping,
    zero_grad and LR scheduler work unchanged, and `.grad` fills as in eager mode. Batch and
    sequence sizes are symbolic: changing them does not re-capture.

    `eager_modules` (and GRAPHTRAIN_EAGER_MODULES) name submodules that run in plain PyTorch inside
    the graph, eager islands (graphtrain/_islands.py): one that cannot be captured, or a suspect.

    Read at construction: GRAPHTRAIN_DISABLE=1 makes it a pass-through to `module` (the baseline
    run of a comparison), and GRAPHTRAIN_STATS_DIR subscribes a StatisticsSubscriber to `module`.
    """

    def __init__(
        self,
        module: torch.nn.Module,
        debug_options: DebugOptions | None = None,
        eager_modules: Sequence[str] | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(module, torch.nn.Module):
            raise TypeError(f"GraphModule wraps an nn.Module, got {type(module).__name__}")
        self.module = module
        self._debug = debug_options or DebugOptions()
        self._debug.apply()
        self._runners: OrderedDict[Any, _Runner] = OrderedDict()  # least recently used first
        self._last: tuple[Any, _Runner | None] = (None, None)  # the last call's key and graph
        self._eager = False
        self.captures = 0  # graphs captured with torch.export (cache hits do not count)
        self._graphs_made = 0  # captures and cache loads
        self._hooks: tuple[str, ...] = ()
        self._hooks_generation = -1
        self._flat_specs: dict[tuple[int, tuple[str, ...]], Any] = {}  # see _flatten
        self._parameters_list: list[torch.nn.Parameter] = []
        self._registrations = -1  # _registrations when _parameters_list was taken
        # DeepSpeed stage 3's ZeROOffloadSubscriber, found at capture
        self._zero_offload: Any = None
        opts = options()
        self._disabled = opts["disable"].value  # GRAPHTRAIN_DISABLE: a pass-through
        explicit = _islands.parse(eager_modules)
        _islands.check(module, explicit)
        # GRAPHTRAIN_EAGER_MODULES applies to every GraphModule: each takes the paths it has.
        names = dict(module.named_modules())
        from_env = [p for p in _islands.parse(opts["eager_modules"].value) if p in names]
        for p in set(_islands.parse(opts["eager_modules"].value)) - set(from_env):
            log_once(
                "WARNING",
                f"GRAPHTRAIN_EAGER_MODULES: '{p}' is not a submodule of {type(module).__name__}; "
                "ignored for it (paths as in model.named_modules())",
                key=("eager-modules", p, type(module).__name__),
            )
        self.eager_modules = _islands.parse([*explicit, *from_env])
        if opts["enable_zero_stage3"].value and not self._disabled:
            _zero3_from_options(module)
        if opts["stats_dir"].value:
            subscribe_from_options(module)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if self._eager or self._disabled:
            return self.module(*args, **kwargs)
        flat, spec = self._flatten(args, kwargs)
        schema = (spec, tuple(_describe(x) for x in flat))
        if self._hooks_generation != _subscriber.generation():  # not a module walk every call
            self._hooks = hook_signature(self.module)
            self._hooks_generation = _subscriber.generation()
        hooks = self._hooks
        if self._registrations != _registrations:  # a parameter or buffer may have been replaced
            self._parameters_list = list(self.module.parameters())
            for r in self._runners.values():
                r.bind(self.module)
            self._registrations = _registrations
        key = (
            schema,
            self.module.training,
            tuple(p.requires_grad for p in self._parameters_list),
            hooks,
        )
        key_schema = (schema, hooks) if hooks else schema
        if self.eager_modules:
            key_schema = (key_schema, ("eager", self.eager_modules))
        tensors_in = [x for x in flat if isinstance(x, torch.Tensor)]
        # The previous call's graph, compared without hashing the key (its pytree spec hashes in
        # Python), else a lookup.
        last_key, runner = self._last
        if runner is None or last_key != key:
            runner = self._runners.get(key)
            if runner is not None:
                self._runners.move_to_end(key)
        if runner is not None:
            if not runner.fits(tensors_in):
                runner = self._runners[key] = self._capture_symbolic(flat, spec, key_schema)
        else:
            try:
                runner = self._capture(flat, spec, key_schema)
                if not runner.fits(tensors_in):  # a cached graph specialized to other sizes
                    runner = self._capture_symbolic(flat, spec, key_schema)
            except UnsupportedModelError as e:
                # Not a DeepSpeed model: its hooks are off its modules, eager cannot run it.
                if options()["fallback_policy"].value == "EAGER" and self._zero_offload is None:
                    log_once(
                        "WARNING",
                        f"{e} Running {type(self.module).__name__} in plain PyTorch "
                        "(GRAPHTRAIN_FALLBACK_POLICY=eager).",
                        key=("fallback", id(self)),
                    )
                    self._eager = True
                    return self.module(*args, **kwargs)
                raise
            self._keep(key, runner, args, kwargs)
        self._last = (key, runner)
        all_inputs = runner.tensors(tensors_in)
        if self._zero_offload is not None:
            self._zero_offload.before_forward()
        needs_grad = (
            torch.is_grad_enabled()
            and runner.forward is not None
            and any(all_inputs[k].requires_grad for k in runner.wrt_index)
        )
        if needs_grad:
            outs = list(_EngineFunction.apply(runner, self.module, *all_inputs))
        else:
            run = CallbackRun(self.module, training=False) if runner.infer_calls_back else None
            res = _run(runner.infer, all_inputs, run=run)
            runner.write_buffers(res[runner.n_out :])
            outs = res[: runner.n_out]
        if self._zero_offload is not None:
            self._zero_offload.after_forward()
        it = iter(outs)
        leaves = [
            next(it)
            if x is TENSOR
            else x.rebuild(it, tensors_in)
            if isinstance(x, ObjectLeaf)
            else x
            for x in runner.captured.out_leaves
        ]
        out_spec = runner.captured.out_spec
        return leaves[0] if out_spec.is_leaf() else pytree.tree_unflatten(leaves, out_spec)

    def _flatten(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[list[Any], Any]:
        """pytree.tree_flatten((args, kwargs)). A call whose arguments are all plain tensors
        (positional, or keyword in the same order) reuses the spec of the first such call: the
        pytree walk costs ~0.05 ms a call."""
        shape = (len(args), tuple(kwargs))
        spec = self._flat_specs.get(shape)
        flat = [*args, *kwargs.values()]
        if spec is not None and all(type(x) in _PLAIN_TENSORS for x in flat):
            return flat, spec
        leaves, spec = pytree.tree_flatten((args, kwargs))
        if len(leaves) == len(flat) and all(
            a is b and type(a) in _PLAIN_TENSORS for a, b in zip(leaves, flat)
        ):
            self._flat_specs[shape] = spec
        return leaves, spec

    def _keep(self, key: Any, runner: _Runner, args: Any, kwargs: Any) -> None:
        """Holds the new graph, dropping the least recently used beyond MAX_GRAPHS; the first time
        a GraphModule reaches WARN_CAPTURES graphs, names the argument whose changes cause them."""
        if self._runners:
            previous = next(reversed(self._runners))
            changing = _changing_arguments(previous[0], key[0], args, kwargs)
        else:
            changing = []
        self._runners[key] = runner
        while len(self._runners) > MAX_GRAPHS:
            self._runners.popitem(last=False)
        self._graphs_made += 1
        if self._graphs_made == WARN_CAPTURES:
            what = (
                f"argument {', '.join(changing)} changes between calls, and each new value is a new "
                "graph. Pass it as a tensor (torch.tensor(value)) so that one graph serves every value"
                if changing
                else "the arguments' structure, dtypes or the module's mode keep changing"
            )
            log(
                "WARNING",
                f"GraphModule({type(self.module).__name__}) has captured {WARN_CAPTURES} graphs: "
                f"{what}. It keeps the {MAX_GRAPHS} most recently used graphs.",
            )

    def _capture_symbolic(self, flat: list[Any], spec: Any, schema: Any) -> _Runner:
        """The graph for sizes other than those the first graph specialized: captured with batch
        and sequence sizes symbolic, so it serves every size after; where torch.export cannot
        keep them symbolic, one more specialized graph."""
        try:
            return self._capture(flat, spec, schema, dynamic=True)
        except UnsupportedModelError as e:
            log_once(
                "WARNING",
                f"{type(self.module).__name__} could not be captured with symbolic sizes ({e}); "
                "each new input size captures a graph of its own.",
                key=("no-symbolic", id(self)),
            )
            return self._capture(flat, spec, schema, dynamic=False, use_cache=False)

    def _capture(
        self, flat: list[Any], spec: Any, schema: Any, dynamic: bool = False, use_cache: bool = True
    ) -> _Runner:
        """The graph for these arguments: from the on-disk cache, or captured. The first capture
        specializes every size (3-5x faster than symbolic sizes: the first step comes sooner);
        `dynamic` keeps batch and sequence sizes symbolic, once a second size shows up. A symbolic
        capture replaces the cached graph; it is never answered from the cache, which holds the
        specialized one it replaces."""
        refresh_rank()
        _refuse_foreign_shards(self.module)
        self._zero_offload = _deepspeed_layout(self.module)
        t0 = time.perf_counter()
        label = "train" if self.module.training else "eval"
        what = f"{type(self.module).__name__} ({label})"
        tensors_in = [x for x in flat if isinstance(x, torch.Tensor)]
        captured = None
        cache_dir = options()["cache_dir"].value
        path = ""
        if cache_dir and use_cache:
            key = _cache.cache_key(self.module, schema, self.module.training)
            path = os.path.join(cache_dir, f"{type(self.module).__name__}-{key}.onnx")
            hit = None if dynamic else _cache.load(path)
            if hit is not None:
                captured, seconds = hit
                log(
                    "INFO",
                    f"loaded the captured graph of {what} from {path}; "
                    f"capturing took {seconds:.2f} s",
                )
        if captured is None:

            def run_capture() -> Captured:
                from ._capture import capture  # torch.export and the translators: ~45 MiB

                return capture(
                    self.module,
                    flat,
                    spec,
                    f"{type(self.module).__name__}_{label}",
                    contexts=(
                        *CAPTURE_CONTEXTS,
                        lambda m: _islands.islands(m, self.eager_modules),
                        lambda m: (
                            self._zero_offload.capturing()
                            if self._zero_offload is not None
                            else contextlib.nullcontext()
                        ),
                    ),
                    fallback=options()["fallback_policy"].value == "ATEN",
                    dynamic=dynamic,
                )

            def capture_with_islands() -> Captured:
                try:
                    return run_capture()
                except UnsupportedModelError:
                    # An island whose forward cannot run on fake tensors: its output shapes come
                    # from one eager run of the model on these inputs, then the capture runs
                    # again.
                    if not _islands.needs_example_run():
                        raise
                    args, kwargs = pytree.tree_unflatten(flat, spec)
                    _islands.record(self.module, self.eager_modules, args, kwargs)
                    return run_capture()

            why = (
                "the DeepSpeed stage-3 layout"
                if self._zero_offload is not None
                else _capture_process.unavailable(tensors_in)
            )
            if why:
                log("DEVINFO", f"capturing {what} in this process: {why}")
            data = None if why else _capture_process.capture(capture_with_islands, t0, what)
            if data is not None:
                captured, _ = _cache.decode(data)
            else:
                captured = capture_with_islands()
                data = _cache.encode(captured, time.perf_counter() - t0) if path else None
            self.captures += 1
            if path and data is not None:
                _cache.save(path, data)
        params = dict(self.module.named_parameters(remove_duplicate=False))
        wants = []
        for gi in captured.inputs:
            if gi.kind == "param":
                p = params[gi.key]
                wants.append(p.requires_grad and p.dtype.is_floating_point)
            elif gi.kind == "input":
                x = tensors_in[gi.key]
                wants.append(x.requires_grad and x.dtype.is_floating_point)
            else:
                wants.append(False)
        runner = _Runner(captured, self.module, wants, self._debug, label)
        found = runner.fallbacks
        if found:
            ops = _fallback.describe_fallbacks(found)
            log_once(  # once: the symbolic-size capture after the specialized one finds the same
                "WARNING",
                f"{type(self.module).__name__} ({label}): {len(found)} ATen op(s) have no "
                f"native graphtrain kernel and run through PyTorch's kernels inside the graph: "
                f"{ops}. graphtrain.explain(model, *args) shows how "
                "every op runs; GRAPHTRAIN_FALLBACK_POLICY=off makes this an error.",
                key=("fallback-ops", id(self), label, ops),
            )
        sizes = "specialized" if captured.static_shapes is not None else "symbolic"
        log(
            "INFO",
            f"prepared {type(self.module).__name__} ({label}) in {time.perf_counter() - t0:.2f} s: "
            f"{runner.num_nodes} nodes, sizes {sizes}",
        )
        return runner

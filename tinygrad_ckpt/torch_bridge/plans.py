"""The engine's checkpoint plans and policies on any torch.nn.Module, and what PyTorch keeps, per module.

    apply_plan(model, "every_layer")                  # its blocks found: transformer.h, model.layers, h, ...
    apply_plan(model, ("budget", 2**20), step=lambda: model(idx, idx)[1])   # the planner, from measured costs
    apply_plan(model, None, policy=tg.korthikanti_selective)           # every block, selectively
    remove_plan(model)                                 # the model as it was: forward, state_dict, hooks
    saves = measure(model, lambda: model(idx, idx)[1])   # one forward + backward, what PyTorch kept, per module
    print(comparison_table(saves, led))               # beside the engine's ledger, layer by layer

A plan is what nn.GPT(checkpoint=...) takes; each checkpointed segment runs under
torch.utils.checkpoint.checkpoint(use_reentrant=False), its blocks given their own `forward` (state_dict is
untouched), so the model's forward must chain its blocks. Scope names are module paths, so policies and
SavedBytes name the model's ops as the engine names its own. A policy runs as selective checkpointing that never
keeps more than running the segment plainly. How, and what is refused: docs/pytorch.md, docs/house.md.
"""

from __future__ import annotations

import contextlib
import re
import warnings
import weakref
from collections import defaultdict
from dataclasses import dataclass

import torch
from torch.utils import checkpoint as torch_checkpoint
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_leaves, tree_unflatten

from ..recompute import planner
from ..recompute.planner import LayerCost, Plan
from ..recompute.policies import Policy, as_policy
from . import saves as ts

aten = torch.ops.aten

# Where blocks sit in the layouts people train: nanoGPT and Hugging Face GPT-2 (transformer.h), Hugging Face Llama,
# Mistral, Qwen (model.layers), GPT-NeoX, Falcon, BERT, T5/BART encoders, bare stacks.
BLOCK_PATHS = ("transformer.h", "model.layers", "gpt_neox.layers", "transformer.layers", "model.decoder.layers",
               "encoder.layer", "encoder.layers", "layers", "h", "blocks")


# ---- the blocks -------------------------------------------------------------------------------------------
def find_blocks(model: torch.nn.Module, blocks: str | None = None) -> tuple[str, torch.nn.Module]:
    """(path, module list) of the model's blocks: at `blocks` (a dotted path) if given, else the first of
    BLOCK_PATHS the model has. A path that is not a ModuleList or Sequential of blocks is refused, naming the ones
    the model has."""
    lists = [name for name, m in model.named_modules()
             if isinstance(m, torch.nn.ModuleList | torch.nn.Sequential) and len(m) and name]
    hint = f"the model's module lists: {', '.join(lists[:8])}" if lists else "the model has no ModuleList"
    if blocks is None:
        for path in BLOCK_PATHS:
            found = _submodule(model, path)
            if isinstance(found, torch.nn.ModuleList | torch.nn.Sequential) and len(found):
                return path, found
        raise ValueError(f"apply_plan: found no blocks at {', '.join(BLOCK_PATHS)}; pass blocks='path.to.list' "
                         f"({hint})")
    found = _submodule(model, blocks)
    if not isinstance(found, torch.nn.ModuleList | torch.nn.Sequential) or not len(found):
        what = "nothing" if found is None else type(found).__name__
        raise ValueError(f"apply_plan: blocks={blocks!r} is {what}, not a ModuleList or Sequential of blocks ({hint})")
    return blocks, found


def _submodule(model: torch.nn.Module, path: str):
    try:
        return model.get_submodule(path)
    except AttributeError:
        return None


# ---- scope names: module paths ----------------------------------------------------------------------------
class ModuleScopes:
    """Forward hooks on every module of `model` that keep torch_saves' scope stack at the running module's path
    ("transformer.h.3.attn"), in forward and in a checkpoint's replay: what SavedBytes records and policies are
    asked with. The pre-hook runs before any other (tensor parallelism's input redistribution happens in scope)."""

    def __init__(self, model: torch.nn.Module):
        self.modules = {}  # path -> module
        self.handles = []
        for path, module in model.named_modules():
            if not path or isinstance(module, torch.nn.ModuleList | torch.nn.ModuleDict):
                continue
            self.modules[path] = module
            self.handles.append(module.register_forward_pre_hook(
                lambda m, a, path=path: ts._SCOPE.append(path) and None, prepend=True))
            self.handles.append(module.register_forward_hook(lambda m, a, o: _pop_scope(), always_call=True))

    def current(self) -> tuple[str, torch.nn.Module | None]:
        scope = ts._current_scope()
        return scope, self.modules.get(scope)

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles = []


def _pop_scope() -> None:
    if ts._SCOPE:
        ts._SCOPE.pop()


@contextlib.contextmanager
def _scope(name: str):
    ts._SCOPE.append(name)
    try:
        yield
    finally:
        _pop_scope()


# ---- op kinds ---------------------------------------------------------------------------------------------
def _overloads(*names) -> set:
    """The aten overloads of these names that this torch has (fused kernels come and go between versions)."""
    found = set()
    for name in names:
        packet = getattr(aten, name, None)
        if packet is not None:
            found.update(getattr(packet, o) for o in packet.overloads())
    return found


_ATTENTION = _overloads("_scaled_dot_product_flash_attention", "_scaled_dot_product_flash_attention_for_cpu",
                        "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
                        "_scaled_dot_product_fused_attention_overrideable", "_flash_attention_forward",
                        "_efficient_attention_forward")
_KINDS = {**{op: "chunked_attention" for op in _ATTENTION},
          **{op: "rms_norm" for op in _overloads("_fused_rms_norm", "rms_norm")},
          **{op: "silu" for op in _overloads("silu")}, **{op: "gelu" for op in _overloads("gelu")},
          **{op: "layer_norm" for op in _overloads("native_layer_norm")},
          **{op: "softmax" for op in _overloads("_softmax", "_safe_softmax")},
          **{op: "matmul" for op in _overloads("mm", "addmm", "bmm", "baddbmm")},
          **{op: "dropout" for op in _overloads("native_dropout", "bernoulli_")}}
_NORMS = {"LayerNorm": "layer_norm", "RMSNorm": "rms_norm"}  # a norm written out of elementwise ops is still one


def _is_alias(func) -> bool:
    """Does the op return a view of an input (reads no data, costs nothing to run again)?"""
    return any(r.alias_info is not None and not r.alias_info.is_write for r in func._schema.returns)


def op_kind(func, module: torch.nn.Module | None) -> str:
    """The engine's op kind of aten op `func` run directly in `module`: "reshape" for a view, "linear" for a matrix
    product in a Linear (or Hugging Face's Conv1D), "dropout" for anything in a Dropout, the norm's kind for the ops
    of a LayerNorm or RMSNorm written by hand, "chunked_attention" for a fused attention kernel (flash, efficient,
    cuDNN), torch_saves' names for the rest ("masked_fill", "add", ...), else the aten name."""
    cls = type(module).__name__ if module is not None else ""
    if _is_alias(func) or func in ts._VIEW_KINDS:
        return "reshape"
    if isinstance(module, torch.nn.Dropout):
        return "dropout"
    kind = _KINDS.get(func) or ts._KINDS.get(func) or func.overloadpacket.__name__.rstrip("_")
    if kind == "matmul" and (isinstance(module, torch.nn.Linear) or cls == "Conv1D"):
        return "linear"
    for suffix, norm in _NORMS.items():
        if cls.endswith(suffix) and kind not in ("layer_norm", "rms_norm"):
            return norm
    return kind


# ---- applying a plan --------------------------------------------------------------------------------------
class AppliedPlan:
    """A plan applied to a model (`apply_plan` returns it; `model._tg_plan` holds it until `remove_plan`): the
    blocks' path, the Plan, the policy, and the forwards it gave the blocks of its checkpointed segments."""

    def __init__(self, model, path, blocks, plan: Plan, policy: Policy | None):
        self.model, self.path, self.blocks, self.plan, self.policy = model, path, list(blocks), plan, policy
        self.names = [f"{path}.{k}" for k in range(len(self.blocks))]
        self.scopes = ModuleScopes(model)
        self.segment_of = {}  # block index -> its top-level checkpointed segment
        for segment in plan.segments:
            if segment.checkpoint:
                self.segment_of.update({k: segment for k in range(segment.start, segment.stop)})
        self.before = {k: self.blocks[k].__dict__.get("forward") for k in self.segment_of}  # own forwards, if any
        self.forwards = {k: _PlannedForward(self, k) for k in self.segment_of}
        for k, forward in self.forwards.items():
            self.blocks[k].__dict__["forward"] = forward
        self.calling = None  # the block whose forward is running its segment's checkpoint now (in the forward)
        self.inside = 0  # > 0 while a checkpointed segment runs its blocks (in forward or in a replay)
        self.carry = None  # (hidden states, output) the segment's first block returned, for the blocks after it
        self.rest = None  # the last block's output beyond its hidden states (a tuple's other items)
        self.warned = False

    def __repr__(self) -> str:
        policy = f", policy {self.policy.name}" if self.policy else ""
        return f"<plan {self.plan.describe()} on {self.path} ({len(self.blocks)} blocks){policy}>"

    def remove(self) -> None:
        for k, own in self.before.items():
            if own is None:
                self.blocks[k].__dict__.pop("forward", None)
            else:
                self.blocks[k].__dict__["forward"] = own
        self.scopes.remove()

    @contextlib.contextmanager
    def running_blocks(self):
        self.inside += 1
        try:
            yield
        finally:
            self.inside -= 1

    def step(self, j: int, args: tuple, kwargs: dict):
        """Block j as one step of the segment's chain: called with the model's arguments, hidden states
        replaced; returns its hidden states (and notes the rest of its output)."""
        def call(h):
            a, kw = _with_hidden(args, kwargs, h)
            # the block whose call runs the segment has had its hooks run (FSDP's all-gather, scope): its own forward
            out = self.forwards[j].own(*a, **kw) if j == self.calling else self.blocks[j](*a, **kw)
            if isinstance(out, tuple | list):
                self.rest = (type(out), tuple(out[1:]))
                return out[0]
            self.rest = None
            return out
        call._name = self.names[j]  # planner.Chunk names its segment after its blocks
        return call

    def checkpoint(self, chunk: planner.Chunk, x):
        region = _PlannedRegion(chunk, self)
        context_fn = region.contexts if self.policy is not None else torch_checkpoint.noop_context_fn
        with _scope(chunk._name):  # the checkpoint keeps x: the ledger names that save after the segment too
            return torch_checkpoint.checkpoint(region, x, use_reentrant=False, context_fn=context_fn)


def _hidden_of(args: tuple, kwargs: dict):
    if args:
        return args[0]
    for key in ("hidden_states", "x", "hidden", "input"):
        if key in kwargs:
            return kwargs[key]
    raise TypeError("apply_plan: a block was called without its hidden states (first argument, or hidden_states=)")


def _with_hidden(args: tuple, kwargs: dict, h) -> tuple[tuple, dict]:
    if args:
        return (h, *args[1:]), kwargs
    key = next(k for k in ("hidden_states", "x", "hidden", "input") if k in kwargs)
    return args, {**kwargs, key: h}


class _PlannedForward:
    """The forward of block k of a checkpointed segment while a plan is applied (see the module docstring)."""

    def __init__(self, applied: AppliedPlan, k: int):
        self.applied, self.k = applied, k

    def own(self, *args, **kwargs):
        before = self.applied.before[self.k]
        block = self.applied.blocks[self.k]
        return before(*args, **kwargs) if before is not None else type(block).forward(block, *args, **kwargs)

    def __call__(self, *args, **kwargs):
        a, k = self.applied, self.k
        if a.inside or not torch.is_grad_enabled():
            return self.own(*args, **kwargs)
        segment = a.segment_of[k]
        if k != segment.start:
            if a.carry is None or _hidden_of(args, kwargs) is not a.carry[0]:
                a.carry = None
                raise RuntimeError(
                    f"apply_plan: {a.names[k]} was called on something other than {a.names[k - 1]}'s output, but the "
                    f"plan checkpoints {a.names[segment.start]}..{a.names[segment.stop - 1]} as one segment, which "
                    f"needs the model to chain its blocks in order; use segments of one block (plan 'every_layer')")
            out = a.carry[1]
            if k == segment.stop - 1:
                a.carry = None
            return out
        steps = [a.step(j, args, kwargs) for j in range(len(a.blocks))]
        a.calling = k
        try:
            hidden = planner.Plan([segment]).run(steps, _hidden_of(args, kwargs), a.checkpoint)
        finally:
            a.calling = None
        out = hidden if a.rest is None else a.rest[0]((hidden, *a.rest[1]))
        a.carry = (hidden, out) if segment.stop - segment.start > 1 else None
        return out


class _PlannedRegion(ts._Region):
    """One checkpointed segment: its blocks run with their own forwards; under a policy, selectively."""

    def __init__(self, chunk, applied: AppliedPlan):
        super().__init__(chunk)
        self.applied = applied
        self.cache = (_PolicyCache(applied, chunk._name, applied.names[chunk.segment.start])
                      if applied.policy is not None else None)

    def contexts(self):
        return _KeepOps(self.cache), _ServeOps(self.cache)

    def _run(self, x):
        with self.applied.running_blocks():
            if self.cache is None:
                return self.chunk(x)
            if self.calls > 1:
                try:
                    return self.chunk(x)
                finally:  # also when the replay stops early (PyTorch raises out of it)
                    self.cache.replay_done()
            with self.cache.watching_saves():
                out = self.chunk(x)
            self.cache.forward_done()
            return out


def _resolve(n: int, plan, policy: Policy | None, owner: str) -> Plan:
    if plan is None:
        return planner.every_layer_plan(n) if policy is not None else planner.no_checkpoint_plan(n)
    return planner.plan_for(n, plan, owner=owner)


def apply_plan(model: torch.nn.Module, plan="every_layer", blocks: str | None = None, policy=None, step=None,
               max_depth: int | None = None) -> AppliedPlan:
    """Checkpoint `model`'s blocks by `plan` (see the module docstring), `policy` deciding op by op inside each
    checkpointed segment (a tg Policy, a function (op, name) -> bool, or a collection of op kinds / name patterns to
    keep, as tg.checkpoint takes). `blocks`: the dotted path of the block list (found if None). ("budget", bytes)
    plans from this model's costs measured by running `step` (forward -> loss) plainly, nesting at most `max_depth`.
    A plan applied before is removed first. Returns the AppliedPlan (also model._tg_plan)."""
    remove_plan(model)
    policy = as_policy(policy)
    path, found = find_blocks(model, blocks)
    if isinstance(plan, tuple) and len(plan) == 2 and plan[0] == "budget":
        if step is None:
            raise ValueError("apply_plan(plan=('budget', bytes)) plans from costs measured on the model: pass "
                             "step=, a function that runs its forward and returns the loss")
        plan = plan_for_budget(model, plan[1], step, blocks=path, max_depth=max_depth)
    plan = _resolve(len(found), plan, policy, owner="apply_plan")
    for segment in plan.segments:
        fsdp = [f"{path}.{k}" for k in range(segment.start, segment.stop) if _is_fsdp(found[k])]
        if segment.checkpoint and segment.stop - segment.start > 1 and fsdp:
            raise ValueError(f"apply_plan: {fsdp[0]} is an FSDP2 unit, and plan {plan.describe()} checkpoints "
                             f"{path}.{segment.start}..{segment.stop - 1} as one segment, run from the first block's "
                             "call: FSDP2 gathers each unit's parameters in its own call. Checkpoint each block "
                             "('every_layer'), or fully_shard each segment's blocks as one unit")
    if policy is not None and plan.depth > 1:
        raise ValueError(f"apply_plan: policy {policy.name} decides inside checkpoints that run their blocks plainly; "
                         f"plan {plan.describe()} nests checkpoints (depth {plan.depth})")
    applied = AppliedPlan(model, path, found, plan, policy)
    model.__dict__["_tg_plan"] = applied
    return applied


def _is_fsdp(module: torch.nn.Module) -> bool:
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:
        return False
    return isinstance(module, FSDPModule)


def remove_plan(model: torch.nn.Module) -> None:
    """Undo apply_plan: the blocks' forwards and every hook it added are gone (nothing if no plan is applied)."""
    applied = model.__dict__.pop("_tg_plan", None)
    if applied is not None:
        applied.remove()


# ---- selective checkpointing ------------------------------------------------------------------------------
@dataclass
class _StandIn:
    """What the replay gets for a cached output backward never needs: an empty tensor of its layout."""

    size: tuple
    stride: tuple
    dtype: torch.dtype
    device: torch.device
    dtensor: tuple | None = None  # (mesh, placements, global shape, global stride) of a DTensor

    @classmethod
    def of(cls, t: torch.Tensor) -> _StandIn:
        local = ts._local(t)
        dt = (t.device_mesh, t.placements, t.shape, t.stride()) if local is not t else None
        return cls(tuple(local.size()), local.stride(), local.dtype, local.device, dt)

    def make(self) -> torch.Tensor:
        t = torch.empty_strided(self.size, self.stride, dtype=self.dtype, device=self.device)
        if self.dtensor is None:
            return t
        mesh, placements, shape, stride = self.dtensor
        return ts.DTensor.from_local(t, mesh, placements, run_check=False, shape=shape, stride=stride)


@dataclass
class _Entry:
    """One op the policy kept: its outputs (detached; a stand-in once nothing needs one), how to rebuild the
    output from them, the storages it read, the outputs' versions when cached, its module, the meter's keys."""

    spec: object
    leaves: list
    inputs: set
    versions: list
    scope: str  # the module that ran the op: what SavedBytes names the outputs after
    held: list


class _PolicyCache:
    """Selective checkpointing of one region: {(op, n-th call of it): _Entry}."""

    def __init__(self, applied: AppliedPlan, name: str, first_block: str):
        self.applied, self.policy, self.name, self.first_block = applied, applied.policy, name, first_block
        self.entries: dict[tuple, _Entry] = {}
        self.cached: set[int] = set()  # storages of the outputs cached so far (alive: the cache holds them)
        self.read: set[int] = set()  # of those, the ones recomputed ops read or autograd keeps
        self.kept = self.recomputed = 0  # ops the policy kept / sent to the replay
        self.handed: list = []  # meter keys of what the replay running now was served
        self.meter = ts.SavedBytes.active
        if self.meter is not None:  # what the cache still holds when the region goes (a replay stopped early)
            weakref.finalize(self, _release_entries, self.meter, self.entries)

    def keeps(self, func) -> bool:
        if _is_alias(func) or func._schema.is_mutable or func is aten.empty_like.default:
            return False  # a view is free again; an in-place op (dropout's noise) cannot be served
        scope, module = self.applied.scopes.current()
        kind = op_kind(func, module)
        save = self.policy.decide(kind, f"{scope}.{kind}" if scope else kind).save
        if kind != "reshape":  # a copy for a view is recomputed by every policy: not a decision that saves memory
            self.kept += save
            self.recomputed += not save
        return save

    def cache(self, key, out, inputs: set) -> None:
        leaves, spec = tree_flatten(out)
        leaves = [t.detach() if isinstance(t, torch.Tensor) else t for t in leaves]
        versions = [t._version for t in leaves if isinstance(t, torch.Tensor)]
        self.entries[key] = _Entry(spec, leaves, inputs & self.cached, versions, ts._current_scope(), [])
        self.cached.update(_storage(t) for t in leaves if isinstance(t, torch.Tensor))

    def reads(self, storages) -> None:
        """A recomputed op reads these storages, or autograd keeps them: the cached ones among them are needed. (Only
        those: a temporary's address may be taken again by a later output once it is freed.)"""
        self.read.update(p for p in storages if p in self.cached)

    @contextlib.contextmanager
    def watching_saves(self):
        """Above the checkpoint's saved-tensor hooks in the forward: note each storage autograd keeps."""
        pack_below, unpack_below = torch._C._autograd._top_saved_tensors_default_hooks(False)

        def pack(x):
            self.reads((_storage(x),))
            return pack_below(x)

        with torch.autograd.graph.saved_tensors_hooks(pack, unpack_below):
            yield

    def forward_done(self) -> None:
        """After the forward: an entry a later in-place op changed is recomputed instead (its inputs are needed
        then); a cached output nothing needs is let go (the replay is served its stand-in)."""
        for key, entry in list(self.entries.items()):
            tensors = [t for t in entry.leaves if isinstance(t, torch.Tensor)]
            if any(t._version != v for t, v in zip(tensors, entry.versions)):
                del self.entries[key]
                self.reads(entry.inputs)
        for entry in self.entries.values():
            for i, t in enumerate(entry.leaves):
                if isinstance(t, torch.Tensor) and _storage(t) not in self.read:
                    entry.leaves[i] = _StandIn.of(t)
            if self.meter is not None:  # kept for backward from here: counted (held during the forward only, the
                # outputs let go above were temporaries, as SavedBytes counts none)
                with _scope(entry.scope):
                    entry.held = [self.meter.hold(t, "cached") for t in entry.leaves if isinstance(t, torch.Tensor)]

    def serve(self, key):
        """The outputs of the key's op, cached in the forward (None: it runs again); the replay holds them now."""
        entry = self.entries.pop(key, None)
        if entry is None:
            return None
        self.handed.extend(entry.held)  # held until the replay ends: autograd keeps them from there (as recomputed)
        return (tree_unflatten([t.make() if isinstance(t, _StandIn) else t for t in entry.leaves], entry.spec),)

    def replay_done(self) -> None:
        _release(self.meter, self.handed)
        self.handed.clear()

    def first_replay(self) -> None:
        """As a replay begins: a policy's report of patterns it never matched, and a warning (once per plan) when
        it kept every op, so that checkpointing saved nothing (a core named differently, patterns missing)."""
        self.policy.finish()
        if self.recomputed or self.applied.warned or not self.kept:
            return
        self.applied.warned = True
        warnings.warn(f"checkpoint policy {self.policy.name} kept every op of {self.name}: it recomputes nothing, so "
                      "this checkpoint keeps what running its blocks plainly keeps (a policy asks by op kind and by "
                      f"module path: {', '.join(self._paths())}, ...)", stacklevel=2)

    def _paths(self) -> list[str]:
        return [p for p in self.applied.scopes.modules if p.startswith(self.first_block + ".")][:6]


def _release(meter, keys: list) -> None:
    if meter is not None:
        for key in keys:
            meter.release(key)


def _release_entries(meter, entries: dict) -> None:
    for entry in entries.values():
        _release(meter, entry.held)
    entries.clear()


class _KeepOps(TorchDispatchMode):
    """The forward of a selectively checkpointed region: caches the outputs of the ops the policy keeps, and notes
    the storages the others read (the replay runs them again)."""

    def __init__(self, cache: _PolicyCache):
        super().__init__()
        self.cache, self.calls = cache, defaultdict(int)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func in torch_checkpoint.SAC_IGNORED_OPS:
            return out
        key = (func, self.calls[func])
        self.calls[func] += 1
        inputs = {_storage(a) for a in tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)}
        if any(_storage(t) in inputs for t in tree_leaves(out) if isinstance(t, torch.Tensor)):
            return out  # a view of an input (aten._unsafe_view's schema does not say so): reads no data
        if self.cache.keeps(func):
            self.cache.cache(key, out, inputs)
        else:
            self.cache.reads(inputs)
        return out


class _ServeOps(TorchDispatchMode):
    """The replay: the ops the forward cached are served (outputs, or stand-ins for those nothing needs); the
    others run again."""

    def __init__(self, cache: _PolicyCache):
        super().__init__()
        self.cache, self.calls, self.entered = cache, defaultdict(int), False

    def __enter__(self):
        self.calls.clear()
        if not self.entered:
            self.entered = True
            self.cache.first_replay()
        return super().__enter__()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in torch_checkpoint.SAC_IGNORED_OPS:
            return func(*args, **kwargs)
        key = (func, self.calls[func])
        self.calls[func] += 1
        served = self.cache.serve(key)
        return served[0] if served is not None else func(*args, **kwargs)


# ---- measuring ----------------------------------------------------------------------------------------------
class TorchSaves(ts.TorchStep):
    """What one PyTorch forward + backward kept for backward (torch_saves.TorchStep: meter, loss, seconds, peak,
    after_forward), per module and layer."""

    def by_layer(self) -> dict:
        return self.meter.by_layer()

    def by_module(self, depth: int | None = None) -> dict:
        return self.meter.by_module(depth)


def _storage(t: torch.Tensor) -> int:
    """The address of the storage that holds t's data here (a wrapper's inside; -id(t) for one with none)."""
    try:
        return ts._local(t).untyped_storage().data_ptr()
    except RuntimeError:  # a tensor subclass with no storage of its own
        return -id(t)


def _exclusion_hooks(model: torch.nn.Module, meter: ts.SavedBytes) -> list:
    """Keep the storages of the parameters a module runs with out of the count while it runs: parameters that exist
    only then (FSDP's all-gathered ones, swapped in by its pre-forward hook, which runs before these) included."""
    handles = []
    for module in model.modules():
        own = []

        def pre(m, a, own=own):
            for p in m.parameters(recurse=False):
                ptr = _storage(p)
                if ptr not in meter.exclude:
                    meter.exclude.add(ptr)
                    own.append(ptr)

        def post(m, a, o, own=own):
            meter.exclude.difference_update(own)
            own.clear()

        handles.append(module.register_forward_pre_hook(pre))
        handles.append(module.register_forward_hook(post, always_call=True))
    return handles


def measure(model: torch.nn.Module, step, seed: int = 0) -> TorchSaves:
    """One forward (`step()` returns the loss) and backward of `model` as it is (its plan applied or not), measured
    by SavedBytes with module paths as scopes; parameters and buffers are not counted; gradients land in .grad."""
    params = {_storage(p) for p in model.parameters()} | {_storage(b) for b in model.buffers()}
    applied = model.__dict__.get("_tg_plan")
    scopes = None if applied is not None else ModuleScopes(model)
    torch.manual_seed(seed)
    ts._SCOPE.clear()  # nothing runs now: a scope left by a step interrupted outside a region is stale
    meter = ts.SavedBytes(exclude=params)
    handles = _exclusion_hooks(model, meter)
    try:
        loss, seconds = ts.timed_step(meter, step)
    finally:
        for h in handles:
            h.remove()
        if scopes is not None:
            scopes.remove()
        ts._SCOPE.clear()
    return TorchSaves(meter, float(loss.detach().float().sum()), seconds)


def measure_costs(model: torch.nn.Module, step, blocks: str | None = None) -> list[LayerCost]:
    """The planner's costs of each block, measured on `model` run plainly: a_k the bytes its modules kept
    (measure().by_layer()), b_k the bytes of its input, f_k its forward FLOPs (torch.utils.flop_counter), t_k = 0
    (a replay is counted whole; PyTorch's early stop may skip a block's last ops). The parameters' .grad and
    torch's RNG state are as they were afterwards (_kept_grads_and_rng)."""
    from torch.utils.flop_counter import FlopCounterMode

    applied = model.__dict__.get("_tg_plan")
    if applied is not None and applied.plan.checkpoint_boundaries():
        raise ValueError("measure_costs measures the blocks run plainly: call remove_plan(model) first")
    path, found = find_blocks(model, blocks)
    inputs = {}
    hooks = [b.register_forward_pre_hook(lambda m, a, kw, k=k: inputs.__setitem__(k, _hidden_of(a, kw)) and None,
                                         with_kwargs=True) for k, b in enumerate(found)]
    try:
        with _kept_grads_and_rng(model):
            saved = measure(model, step).by_layer()
            with torch.no_grad(), FlopCounterMode(display=False) as flops:
                step()
    finally:
        for h in hooks:
            h.remove()
    counts = {name: sum(v.values()) for name, v in flops.get_flop_counts().items()}
    root = type(model).__name__
    return [LayerCost(counts.get(f"{root}.{path}.{k}", 0), saved.get(f"{path}.{k}", 0),
                      inputs[k].numel() * inputs[k].element_size()) for k in range(len(found))]


@contextlib.contextmanager
def _kept_grads_and_rng(model: torch.nn.Module):
    """Run a measuring step that leaves no trace: each parameter's .grad (the same tensor, untouched: the step
    accumulates into fresh ones) and torch's RNG state (CPU, and CUDA's where initialised) restored on every exit."""
    params = list({id(p): p for p in model.parameters()}.values())
    grads = [p.grad for p in params]
    cpu = torch.get_rng_state()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    for p in params:
        p.grad = None
    try:
        yield
    finally:
        for p, g in zip(params, grads):
            p.grad = g
        torch.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)


def plan_for_budget(model: torch.nn.Module, budget: int, step, blocks: str | None = None,
                    max_depth: int | None = None) -> Plan:
    """The planner's plan (least recompute whose peak of saved bytes fits `budget`) for `model`'s blocks, from the
    costs measure_costs measures with `step`."""
    return planner.plan_chain(measure_costs(model, step, blocks), int(budget), max_depth=max_depth)


# ---- set beside the engine's ledger --------------------------------------------------------------------------
def _saves(x, by: str) -> dict:
    if isinstance(x, dict):
        return x
    if isinstance(x, TorchSaves | ts.SavedBytes):
        return x.by_layer() if by == "layer" else x.by_module()
    return x.saved_breakdown(by=by)  # an engine Ledger


OUTSIDE = "(outside any module)"


def comparison_rows(torch_saves, engine, by: str = "layer") -> list[dict]:
    """Per layer (or module), PyTorch's saved bytes (a TorchSaves, SavedBytes or {name: bytes}) beside the engine's
    (a Ledger or {name: bytes}): [{name, torch, engine, difference}], in the engine's order, then PyTorch's own.
    What ops outside any module keep (the loss) is one row: PyTorch's scope "" and the engine's layers named after
    such an op ("cross_entropy")."""
    ours, theirs = dict(_saves(torch_saves, by)), dict(_saves(engine, by))
    outside = [n for n in theirs if n not in ours and "." not in n and n != "(top)"] + \
        [n for n in ("(top)",) if n in theirs]
    ours[OUTSIDE] = ours.pop("", 0)
    theirs[OUTSIDE] = sum(theirs.pop(n) for n in outside)
    names = _in_block_order([n for n in theirs if n != OUTSIDE] + [n for n in ours if n not in theirs]) + [OUTSIDE]
    return [{"name": n, "torch": ours.get(n, 0), "engine": theirs.get(n, 0),
             "difference": ours.get(n, 0) - theirs.get(n, 0)} for n in names if ours.get(n) or theirs.get(n)]


def _in_block_order(names: list) -> list:
    """Names in the order given, except that the blocks of one list ("transformer.h.3", and a segment's
    "transformer.h.2-3") go together by index, where the first of them was (a replay names its blocks in backward)."""
    def block(name):
        m = re.fullmatch(r"(.*\.)(\d+)(?:-(\d+))?", name)
        return (m.group(1), int(m.group(2)), m.group(3) is None) if m else None

    out, placed = [], set()
    for name in names:
        key = block(name)
        if key is None:
            out.append(name)
        elif key[0] not in placed:
            placed.add(key[0])
            out += sorted((n for n in names if (b := block(n)) and b[0] == key[0]), key=lambda n: block(n)[1:])
    return out


def comparison_table(torch_saves, engine, by: str = "layer") -> str:
    """comparison_rows() as a fixed-width table, with the totals."""
    rows = comparison_rows(torch_saves, engine, by)
    width = max([len(r["name"]) for r in rows] + [8])
    lines = [f"{by:<{width}}  {'PyTorch':>12}  {'engine':>12}  {'difference':>12}  {'ratio':>7}"]
    for r in rows + [{"name": "total", **{k: sum(x[k] for x in rows) for k in ("torch", "engine", "difference")}}]:
        ratio = f"{r['torch'] / r['engine']:.3f}" if r["engine"] else "-"
        lines.append(f"{r['name']:<{width}}  {r['torch']:>12,}  {r['engine']:>12,}  {r['difference']:>+12,}  "
                     f"{ratio:>7}")
    return "\n".join(lines)


__all__ = ["BLOCK_PATHS", "find_blocks", "ModuleScopes", "op_kind", "AppliedPlan", "apply_plan", "remove_plan",
           "TorchSaves", "measure", "measure_costs", "plan_for_budget", "comparison_rows", "comparison_table"]

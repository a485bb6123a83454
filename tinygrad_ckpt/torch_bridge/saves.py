"""The engine's plans and policies run in PyTorch, and what PyTorch keeps for backward, measured.

`run_blocks(blocks, x, spec)` runs a list of torch modules as the engine's GPT(checkpoint=spec) would: plans
with `torch.utils.checkpoint.checkpoint(use_reentrant=False)`, a `Policy` with selective activation
checkpointing (`selective_contexts`), each aten op given the engine's op kind (`engine_op`) and scoped name.

`SavedBytes` counts what PyTorch holds for backward over the step, each storage once, from when it is kept
until autograd lets it go: saved tensors outside checkpointed segments, and inside them what the replay
rebuilds and what selective checkpointing caches; parameters are not counted. `measure_step` takes one forward
and backward under it, and `TorchStep.like_for_like` counts each storage as the engine would.
The models it runs live in torch_bridge (TorchGPT, TorchLlama), any other model's blocks in torch_bridge.plans.
It needs the optional extra `[torch]`. In full: docs/house.md.
"""

from __future__ import annotations

import gc
import math
import weakref
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np
import torch
from torch.utils import checkpoint as torch_checkpoint
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes, is_traceable_wrapper_subclass

try:  # tensor parallelism's sharded tensors (SavedBytes counts a DTensor's local shard)
    from torch.distributed.tensor import DTensor
except ImportError:  # a torch built without distributed
    DTensor = type("DTensor", (), {})

from ..memory.events import layer_of
from ..recompute import planner
from ..recompute.policies import Policy

aten = torch.ops.aten


def run_blocks(blocks, x, spec):
    """Run `blocks` over x as the engine's GPT(checkpoint=spec) would: None (plainly), "every_layer", "sqrt",
    an int k (k segments), a planner Plan (nested plans nest checkpoints) or a Policy (every block
    checkpointed with selective activation checkpointing deciding op by op), through planner.Plan.run."""
    n = len(blocks)
    if spec is None:
        return planner.no_checkpoint_plan(n).run(blocks, x, None)
    if isinstance(spec, Policy):
        return planner.every_layer_plan(n).run(blocks, x, lambda chunk, x: _checkpoint(
            chunk, x, context_fn=lambda: selective_contexts(spec)))
    plan = planner.plan_for(n, spec, owner="TorchGPT")
    return plan.run(blocks, x, _checkpoint)


def _checkpoint(chunk: planner.Chunk, x, **options):
    """torch.utils.checkpoint(use_reentrant=False) of the chunk's blocks. It saves its inputs as it enters (the
    engine's checkpoint, as its forward ends): a meter notes which saves those are."""
    meter = SavedBytes.active
    if meter is not None:
        meter.entering = True  # until the region's forward starts
    return torch_checkpoint.checkpoint(_Region(chunk), x, use_reentrant=False, **options)


class _Region:
    """The function a torch checkpoint runs: blocks (by an inner plan, if any). Its first call is the forward;
    later calls are replays. While a `SavedBytes` meter is active it reports what the region keeps."""

    def __init__(self, chunk: planner.Chunk):
        self.chunk, self.calls = chunk, 0

    def __call__(self, x):
        depth = len(_SCOPE)
        try:
            return self._measured(x)
        finally:  # a KeyboardInterrupt skips the always_call forward hooks that pop the blocks' scopes
            del _SCOPE[depth:]

    def _measured(self, x):
        replay, self.calls = self.calls > 0, self.calls + 1
        meter = SavedBytes.active
        if meter is None:
            return self._run(x)
        if not replay:  # what selective checkpointing caches here and no replay takes back goes with the region
            self.cached, self.regenerated = [], []
            meter.entering = False
            meter.regions += 1
            self.number = meter.regions
            weakref.finalize(self, meter.release_all, self.cached)
            weakref.finalize(self, meter.release_all, self.regenerated)
        outer, meter.region = meter.region, self
        try:
            with meter.inside_region(replay):
                out = self._run(x)
            if not replay:
                meter.log.append((None, "forward_done", self.number))  # a marker: this region's forward ended
            return out
        finally:
            meter.region = outer

    def _run(self, x):
        return self.chunk(x)


# aten op -> the engine's op kind (inside a Linear module, a matrix product is "linear")
_KINDS = {
    aten.addmm.default: "matmul", aten.mm.default: "matmul", aten.bmm.default: "matmul",
    aten.native_layer_norm.default: "layer_norm", aten.gelu.default: "gelu", aten._softmax.default: "softmax",
    aten.masked_fill.Scalar: "masked_fill", aten.add.Tensor: "add", aten.mul.Tensor: "mul",
    aten.native_dropout.default: "dropout", aten.bernoulli_.float: "dropout", aten.div_.Scalar: "dropout",
    aten.empty_like.default: "dropout", aten.embedding.default: "embedding",
}
_ALIASES = {aten.view.default, aten._unsafe_view.default, aten.transpose.int, aten.t.default, aten.split.Tensor,
            aten.expand.default, aten.slice.Tensor, aten.permute.default, aten.split_with_sizes.default}
_VIEW_KINDS = _ALIASES | {aten.clone.default, aten.reshape.default}  # the engine's reshape may copy, as clone


_LINEARS = {"lm_head", "gate", "w1", "w2", "w3"}  # with c_* (nanoGPT) and *_proj (Llama): the Linear modules' names


def engine_op(op, scope: str) -> tuple[str, str]:
    """(op kind, scoped name) of an aten op as this engine names it: aten.addmm in "transformer.h.0.attn.c_attn"
    is ("linear", "transformer.h.0.attn.c_attn.linear"); aten.bmm in "transformer.h.0.attn" is ("matmul",
    "transformer.h.0.attn.matmul"); a view or
    a copy for a view is "reshape"; inside a Dropout module everything is "dropout"."""
    last = scope.rsplit(".", 1)[-1]
    if op in _VIEW_KINDS:
        kind = "reshape"
    elif last in ("drop", "dropout", "resid_dropout") and op in _KINDS:
        kind = "dropout"
    else:
        kind = _KINDS.get(op, str(op.overloadpacket.__name__))
        if kind == "matmul" and (last.startswith("c_") or last.endswith("_proj") or last in _LINEARS):
            kind = "linear"
    return kind, f"{scope}.{kind}" if scope else kind


def _current_scope() -> str:
    return _SCOPE[-1] if _SCOPE else ""


_SCOPE: list[str] = []  # the scoped names of the modules running now (kept by SavedBytes' module hooks)


def selective_contexts(policy: Policy):
    """create_selective_checkpoint_contexts with the engine's policy deciding each aten op (by its engine op
    kind and scoped name; views are recomputed), plus, under a SavedBytes meter, an observer that counts what
    the cache keeps."""
    def decide(ctx, op, *args, **kwargs):
        kind, name = engine_op(op, _current_scope())
        mutable = op.overloadpacket.__name__.endswith("_") or op is aten.empty_like.default  # dropout's noise
        save = kind != "reshape" and not mutable and policy.decide(kind, name).save
        return torch_checkpoint.CheckpointPolicy.MUST_SAVE if save else \
            torch_checkpoint.CheckpointPolicy.PREFER_RECOMPUTE

    forward, recompute = torch_checkpoint.create_selective_checkpoint_contexts(decide)
    meter = SavedBytes.active
    if meter is None:
        return forward, recompute
    return (_Both(forward, _CacheObserver(meter, decide, False, policy)),
            _Both(recompute, _CacheObserver(meter, decide, True, policy)))


class _Both:
    """Enter two context managers, the first outermost."""

    def __init__(self, outer, inner):
        self.outer, self.inner = outer, inner

    def __enter__(self):
        self.outer.__enter__()
        self.inner.__enter__()

    def __exit__(self, *exc):
        self.inner.__exit__(*exc)
        return self.outer.__exit__(*exc)


class _CacheObserver(TorchDispatchMode):
    """Runs above selective checkpointing's caching mode: in forward, the outputs of the ops it caches are
    held (until the replay); in the replay they are handed back (no longer held by the cache)."""

    def __init__(self, meter: SavedBytes, decide, replay: bool, policy: Policy):
        super().__init__()
        self.meter, self.decide, self.replay, self.policy = meter, decide, replay, policy

    def keeps_dropout(self) -> bool:
        return self.policy.decide(*engine_op(aten.native_dropout.default, _current_scope())).save

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        cached = self.decide(None, func) == torch_checkpoint.CheckpointPolicy.MUST_SAVE
        kept_noise = func is aten.bernoulli_.float and self.keeps_dropout()
        if kept_noise and self.replay and self.meter.region.regenerated:
            # the replay draws this dropout's noise again (counted from here as PyTorch keeps it): the engine's
            # mask counted in its place since the forward is done
            self.meter.release(self.meter.region.regenerated.pop(0))
        elif cached:
            for t in (out if isinstance(out, (tuple, list)) else (out,)):
                if isinstance(t, torch.Tensor):
                    if self.replay:
                        self.meter.release_tensor(t, "cached")
                    else:
                        self.meter.region.cached.append(self.meter.hold(t, "cached"))
        elif not self.replay and kept_noise:
            # dropout noise for a dropout the policy keeps: an in-place random op cannot be cached, so PyTorch
            # regenerates it in the replay; the engine keeps a mask (logged per holder; like_for_like sizes it)
            self.meter.region.regenerated.append(self.meter.hold_mask(args[0]))
        elif not self.replay and func not in _ALIASES and func is not aten.empty_like.default:
            # an op the replay will run again reads its inputs (a view or empty_like reads no data); noted in forward,
            # while every cached storage is alive and its address its own
            for a in (*args, *(kwargs or {}).values()):
                if isinstance(a, torch.Tensor):
                    self.meter.read(a.untyped_storage().data_ptr())
        return out


# ---- the meter --------------------------------------------------------------------------------------------
@dataclass
class Kept:
    """One storage PyTorch kept for backward: where (scoped module name), its dtype, shape, bytes, and how its
    first holder kept it (saved: an autograd node outside checkpoints; entered: a checkpoint, its input, as it
    entered; recomputed: a checkpoint replay; cached: selective checkpointing, from forward to the replay;
    regenerated: not PyTorch's, the mask the engine keeps where PyTorch draws dropout noise again)."""

    scope: str
    dtype: str
    shape: tuple
    nbytes: int
    how: str
    requires_grad: bool
    ptr: int = 0
    noise: bool = False  # a dropout noise mask: floats that need no grad, each 0 or the same 1/(1-p)
    needed: bool = False  # an autograd node kept it or a replayed op read it (else: cached for nothing)
    taken: bool = False  # cached, then handed back to the replay (else: held until the region goes)
    region: int = 0  # cached: the number of the region whose cache held it
    entered: int = 0  # a checkpoint's input: the number of the region it entered with it (the last, if nested)

    @property
    def layer(self) -> str:
        """The layer of the module that kept it, as the ledger names layers ("transformer.h.3"; "" outside any)."""
        return layer_of(f"{self.scope}.op") if self.scope else ""  # the path of a module: its ops' layer


@dataclass
class SavedBytes:
    """Live bytes kept for backward, each storage counted once while any holder keeps it, and their peak.

    Every holder taken or let go is logged, in order (`log`), so that TorchStep.like_for_like can replay the
    step counting each storage as the engine would. The log also holds what the engine keeps where PyTorch
    keeps nothing: where selective checkpointing regenerates the noise of a dropout the policy keeps (an
    in-place random op cannot be cached), the engine keeps a mask (hold_mask; not in `live`)."""

    exclude: set = field(default_factory=set)  # storage pointers not to count (the parameters)
    live: int = 0
    peak: int = 0
    at_peak: list = field(default_factory=list)  # Kept records live at the peak
    after_forward: int = 0
    forward_events: int = 0  # len(log) as the forward ended (forward_done)
    kept: list = field(default_factory=list)  # Kept, one per storage each time it starts being held
    log: list = field(default_factory=list)  # (Kept, how, +1 or -1): a holder of that kind taken or let go;
    # (None, "forward_done", n): the forward of region n has ended
    regions: int = 0  # checkpointed regions numbered so far
    entering: bool = False  # a checkpoint is saving its inputs (before its region's forward starts)
    _refs: dict = field(default_factory=lambda: defaultdict(int))  # (ptr, how) -> holders
    _live: dict = field(default_factory=dict)  # ptr -> Kept
    _masks: dict = field(default_factory=dict)  # key (a negative number) -> Kept: masks held in PyTorch's place

    region: object = None  # the checkpointed region running now
    active = None  # class attribute: the meter measuring now (one at a time)

    def hold(self, t: torch.Tensor, how: str) -> tuple | None:
        """Count t's storage as kept by one more holder of kind `how`; returns the key to release it with."""
        storage = _local(t).untyped_storage()
        ptr, nbytes = storage.data_ptr(), storage.nbytes()
        if ptr in self.exclude or nbytes == 0:
            return None
        if how in ("saved", "entered"):
            self.read(ptr)  # an autograd node keeps it: backward reads it
        if ptr not in self._live:
            record = Kept(_current_scope(), str(t.dtype).removeprefix("torch."), tuple(_local(t).shape), nbytes, how,
                          t.requires_grad, ptr, _is_noise(_local(t)), needed=how != "cached",
                          region=self.region.number if how == "cached" else 0)
            self._live[ptr] = record
            self.kept.append(record)
            self.live += nbytes
            if self.live > self.peak:
                self.peak, self.at_peak = self.live, list(self._live.values())
        if how == "entered":
            self._live[ptr].entered = self.regions + 1  # the region about to start
        self._refs[ptr, how] += 1
        self.log.append((self._live[ptr], how, 1))
        return ptr, how

    def hold_mask(self, noise: torch.Tensor) -> tuple:
        """Log the mask the engine keeps where PyTorch regenerates `noise` in the replay (its size: that of
        `noise`'s elements, as like_for_like counts masks); returns the key to release it with."""
        key = (-len(self._masks) - 1, "regenerated")
        record = Kept(_current_scope(), "mask", tuple(noise.shape), noise.numel(), "regenerated", False, key[0])
        self._masks[key[0]] = record
        self._refs[key] += 1
        self.log.append((record, "regenerated", 1))
        return key

    def forward_done(self) -> None:
        """Note where the forward ends (after_forward, and the log's length for like_for_like)."""
        self.after_forward, self.forward_events = self.live, len(self.log)

    def read(self, ptr: int) -> None:
        """The storage at ptr is needed in backward (kept by a node, or read by a replayed op)."""
        if ptr in self._live:
            self._live[ptr].needed = True

    def release(self, key: tuple | None) -> None:
        if key is None:
            return
        ptr, how = key
        self._refs[key] -= 1
        self.log.append((self._masks[ptr] if how == "regenerated" else self._live[ptr], how, -1))
        if self._refs[key]:
            return
        del self._refs[key]
        if how != "regenerated" and not any((ptr, h) in self._refs for h in _HOLDERS):
            self.live -= self._live.pop(ptr).nbytes

    def release_tensor(self, t: torch.Tensor, how: str) -> None:
        """The cache handed t back to a replay: no longer held by it."""
        key = _local(t).untyped_storage().data_ptr(), how
        if key in self._refs and key in self.region.cached:
            self.region.cached.remove(key)
            self._live[key[0]].taken = True
            self.release(key)

    def release_all(self, keys: list) -> None:
        """A checkpointed region is gone: what its cache still held (its replay stopped early) goes with it."""
        for key in keys:
            self.release(key)
        keys.clear()

    def by_module(self, depth: int | None = None) -> dict:
        """{module path: bytes} of every storage kept for backward over the step, each counted once each time it
        starts being held (a replay's storages again), under the module that held it first ("" outside any):
        the counterpart of the ledger's saved_breakdown(by="module"). `depth` cuts paths to that many parts."""
        out: dict[str, int] = {}
        for k in self.kept:
            key = ".".join(k.scope.split(".")[:depth]) if depth else k.scope
            out[key] = out.get(key, 0) + k.nbytes
        return out

    def by_layer(self) -> dict:
        """{layer: bytes} as by_module, per layer as the ledger's saved_breakdown(by="layer") names them
        ("transformer.h.3", "model.layers.0", "transformer.ln_f"; events.layer_of)."""
        out: dict[str, int] = {}
        for k in self.kept:
            out[k.layer] = out.get(k.layer, 0) + k.nbytes
        return out

    # saved-tensor hooks: outside regions the packed tensor is held by its slot; inside a region's forward the
    # checkpoint's hook below drops it (the slot learns at unpack which replayed tensor it stood for); inside a
    # replay the tensor is held until the forward's slot for it is read and let go
    def _pack(self, x):
        return _Slot(self, x, self.hold(x, "entered" if self.entering else "saved"))

    def inside_region(self, replay: bool):
        below = torch._C._autograd._top_saved_tensors_default_hooks(False)
        if below is None:
            raise RuntimeError("SavedBytes: a checkpointed region runs without the checkpoint's saved-tensor hooks")
        pack_below, unpack_below = below

        def pack(x):
            if replay:  # held before the checkpoint's hook sees it: that hook stops the replay (raises) once the
                key = self.hold(x, "recomputed")  # last tensor the forward saved is rebuilt, at that tensor
                return _Slot(self, pack_below(x), key, owns=False)
            self.read(_local(x).untyped_storage().data_ptr())  # a node keeps it: a cached storage is needed
            return _Slot(self, pack_below(x), None, below=unpack_below)

        return torch.autograd.graph.saved_tensors_hooks(pack, _Slot.unpack)

    def __enter__(self):
        if SavedBytes.active is not None:
            raise RuntimeError("SavedBytes: one meter at a time")
        SavedBytes.active = self
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, _Slot.unpack)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc):
        self._hooks.__exit__(*exc)
        SavedBytes.active = None

def _local(t: torch.Tensor) -> torch.Tensor:
    """The tensor whose storage holds t's data on this process: a DTensor's local shard (and the tensor inside any
    other wrapper, such as a collective's AsyncCollectiveTensor), else t."""
    while is_traceable_wrapper_subclass(t):
        t = getattr(t, t.__tensor_flatten__()[0][0])
    return t


def _is_noise(t: torch.Tensor) -> bool:
    """Is t a dropout noise mask as CPU dropout makes it (floats needing no grad, each 0 or 1/(1-p))?"""
    if t.requires_grad or not t.is_floating_point() or t.dim() < 2 or t.numel() == 0:
        return False
    with torch.no_grad(), _disable_current_modes():  # not seen by selective checkpointing's modes
        top = t.max()
        return bool(top > 1) and bool(((t == 0) | (t == top)).all())


class _Slot:
    """What a saved-tensor hook hands autograd: the packed value and the pointer it keeps counted; when autograd
    lets the slot go, the count drops."""

    __slots__ = ("packed", "cell", "below", "__weakref__")

    def __init__(self, meter: SavedBytes, packed, ptr, owns: bool = True, below=None):
        self.packed, self.below = packed, below
        self.cell = [ptr if owns else None]
        weakref.finalize(self, _release_cell, meter, self.cell)

    @staticmethod
    def unpack(slot):
        if slot.below is None:
            return slot.packed
        t = slot.below(slot.packed)  # a replayed tensor, held since the replay: let go with this slot
        if slot.cell[0] is None:
            key = _local(t).untyped_storage().data_ptr(), "recomputed"
            meter = SavedBytes.active
            if meter is not None and key in meter._refs:
                slot.cell[0] = key
        return t


def _release_cell(meter: SavedBytes, cell: list) -> None:
    meter.release(cell[0])
    cell[0] = None


def _module_hooks(model: torch.nn.Module) -> list:
    """Forward pre/post hooks keeping _SCOPE, the scoped names of the modules running (replays included)."""
    handles = []
    for module in model.modules():
        scope = getattr(module, "scope", None)
        if scope is None or isinstance(module, torch.nn.ModuleList | torch.nn.ModuleDict) or module is model:
            continue
        handles.append(module.register_forward_pre_hook(lambda m, a, s=scope: _SCOPE.append(s) and None))
        handles.append(module.register_forward_hook(lambda m, a, o: _SCOPE.pop() and None, always_call=True))
    return handles


# ---- one measured step ----------------------------------------------------------------------------------
@dataclass
class TorchStep:
    """What one PyTorch forward + backward kept: the meter (peak, live after forward, every storage kept),
    the loss and the seconds the step took."""

    meter: SavedBytes
    loss: float
    seconds: float

    @property
    def peak(self) -> int:
        return self.meter.peak

    @property
    def after_forward(self) -> int:
        return self.meter.after_forward

    def like_for_like(self, masks: str = "bits", at: str = "peak") -> dict:
        """PyTorch's step counted as the engine counts its own, term by term: the log replayed with each storage
        at what the engine would hold for it, at the moment that count peaks over the step (at="peak"), over the
        forward ("forward") or over what follows it ("backward"), or as the forward ends ("after_forward"). Each
        term is measured at that moment:

        - "held": the bytes PyTorch held then (distinct storages); "peak": PyTorch's own peak of the step (at
          "after_forward": its bytes then);
        - "dead_cache": what selective checkpointing cached that no autograd node kept and no replayed op read
          (outputs backward never needs, such as a Linear's before a residual add);
        - "stranded_cache": what it cached that backward did need, held then by the cache alone and never handed
          back (the replay stops after the last tensor the forward saved, before the ops that made these, so they
          stay until the region goes: a block's output, needed by the next layer's norm, is one);
        - "noise": float dropout noise (CPU dropout keeps it at the value dtype, see _is_noise), and
          "noise_masks": the same as the engine keeps it, a mask;
        - "regenerated": the masks the engine keeps where selective checkpointing regenerates the noise of a
          dropout the policy keeps, from the forward until the replay draws it again;
        - "comparable" = held - dead_cache - stranded_cache - noise + noise_masks + regenerated.

        Masks are of 1 bit per element (masks="bits", the engine's own saves) or of 1 byte (masks="bytes",
        PyTorch's CUDA dropout: the engine under saves_like("pytorch"))."""
        if masks not in ("bits", "bytes"):
            raise ValueError(f"like_for_like: masks must be 'bits' or 'bytes', got {masks!r}")
        if at not in ("peak", "forward", "backward", "after_forward"):
            raise ValueError(f"like_for_like: at must be 'peak', 'forward', 'backward' or 'after_forward', got {at!r}")
        mask_bytes = (lambda n: -(-n // 8)) if masks == "bits" else (lambda n: n)
        log, end = self.meter.log, self.meter.forward_events
        window = {"peak": range(1, len(log) + 1), "forward": range(1, end + 1),
                  "backward": range(end + 1, len(log) + 1), "after_forward": range(0)}[at]  # moments: events done
        count, best, moment = _EngineCount(mask_bytes), -1, end if at == "after_forward" else 0
        for i, event in enumerate(log[:window.stop - 1] if window else (), 1):
            count.step(event)
            if i in window and count.total > best:
                best, moment = count.total, i
        count = _EngineCount(mask_bytes)
        for event in log[:moment]:
            count.step(event)
        return {**count.terms(), "peak": self.meter.peak if at == "peak" else self.meter.after_forward}


_HOLDERS = ("saved", "entered", "recomputed", "cached")  # the kinds of holder a storage can have (Kept.how)


class _EngineCount:
    """A SavedBytes log replayed, each storage counted as the engine would hold it (TorchStep.like_for_like): an
    output selective checkpointing cached counts while its region's forward runs (the engine keeps a kept op's
    outputs until then), and after it only if backward reads it and a holder other than the cache (or a replay
    that takes it back) keeps it; dropout noise and the masks the engine keeps in its place count as masks."""

    TERMS = ("held", "dead_cache", "stranded_cache", "entering", "noise", "noise_masks", "regenerated")

    def __init__(self, mask_bytes):
        self.mask_bytes = mask_bytes
        self.holders: dict = defaultdict(lambda: defaultdict(int))  # id(Kept) -> {how: holders}
        self.records: dict = {}  # id(Kept) -> Kept
        self.by_region: dict = defaultdict(list)  # region number -> the Kept its cache held or it entered with
        self.done: set = set()  # regions whose forward has ended
        self.total = 0  # what the engine would hold now

    def term(self, k: Kept) -> str | None:
        live = {how for how, n in self.holders[id(k)].items() if n}
        if not live:
            return None
        if k.how == "regenerated":
            return "regenerated"
        if "entered" in live and k.entered not in self.done:  # the engine saves a checkpoint's input as it leaves
            live.discard("entered")
            if not live:
                return "entering"
        if k.how == "cached" and k.region in self.done:
            if not k.needed:
                return "dead_cache"
            if not k.taken and live == {"cached"}:
                return "stranded_cache"
        return "noise" if k.noise else "held"

    def counted(self, k: Kept) -> int:
        t = self.term(k)
        if t is None or t.endswith("_cache") or t == "entering":
            return 0
        return k.nbytes if t == "held" else self.mask_bytes(math.prod(k.shape))

    def step(self, event: tuple) -> None:
        k, how, delta = event
        if k is None:  # region `delta`'s forward has ended: the engine lets go of what it does not keep
            before = sum(self.counted(r) for r in self.by_region[delta])
            self.done.add(delta)
            self.total += sum(self.counted(r) for r in self.by_region[delta]) - before
            return
        if id(k) not in self.records:
            self.records[id(k)] = k
            for region in {k.region, k.entered} - {0}:  # its count changes when that region's forward ends
                self.by_region[region].append(k)
        before = self.counted(k)
        self.holders[id(k)][how] += delta
        self.total += self.counted(k) - before

    def terms(self) -> dict:
        out = dict.fromkeys(self.TERMS, 0)
        for k in self.records.values():
            t = self.term(k)
            if t == "regenerated":  # the engine's, not PyTorch's
                out[t] += self.mask_bytes(math.prod(k.shape))
            elif t is not None:
                out["held"] += k.nbytes
                out[t] += 0 if t == "held" else k.nbytes
                out["noise_masks"] += self.mask_bytes(math.prod(k.shape)) if t == "noise" else 0
        out["comparable"] = (out["held"] - out["dead_cache"] - out["stranded_cache"] - out["entering"]
                             - out["noise"] + out["noise_masks"] + out["regenerated"])
        return out


def timed_step(meter: SavedBytes, step) -> tuple:
    """`step()` (it returns the loss) and its backward under `meter`, with the cyclic collector off (slots are let
    go by reference counting, at the moment autograd drops them, not at gc's whim): (loss, seconds)."""
    import time

    gc.collect()
    gc.disable()
    try:
        t0 = time.perf_counter()
        with meter:
            loss = step()
            meter.forward_done()
            loss.backward()
        return loss, time.perf_counter() - t0
    finally:
        gc.enable()


def measure_step(model: torch.nn.Module, idx, targets, seed: int = 0) -> TorchStep:
    """One forward and backward of `model` (its .checkpoint as set), measured by SavedBytes; gradients land
    in the parameters' .grad."""
    idx, targets = (torch.as_tensor(np.asarray(a)) for a in (idx, targets))
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    for p in model.parameters():
        p.grad = None
    torch.manual_seed(seed)
    _SCOPE.clear()  # nothing runs now: a scope left by a step interrupted outside a region is stale
    handles = _module_hooks(model)
    meter = SavedBytes(exclude=params)
    try:
        loss, seconds = timed_step(meter, lambda: model(idx, targets)[1])
    finally:
        for h in handles:
            h.remove()
        _SCOPE.clear()
    return TorchStep(meter, loss.item(), seconds)

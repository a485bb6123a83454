"""Benchmarks of tinygrad_ckpt on a pre-LN GPT block stack (nn.Block), float32, CPU.

    python benchmarks/run.py            # full run (several minutes), rewrites docs/benchmarks.md + .png
    python benchmarks/run.py --quick    # small shapes, under a minute
    python benchmarks/run.py --out DIR  # write benchmarks.md / benchmarks.png into DIR instead

Measured side by side, in one process, with every library pinned to the same number of threads:
  1. tape overhead: our forward+backward step vs a hand-written NumPy forward+backward of the same
     stack (benchmarks/handwritten.py), and the gradients of both (and of PyTorch) compared;
  2. PyTorch CPU (benchmarks/torch_ref.py): step time; bytes saved for backward per layer
     (saved_tensors_hooks, one count per storage) vs the ledger's activation bytes;
  3. checkpointing: time and FLOPs ratios of every-layer and √n plans, beside torch.utils.checkpoint;
  4. scaling in layers, T and d, with fitted exponents;
  5. attention: bytes per layer of our explicit and chunked attention against PyTorch eager and SDPA,
     and step time as T grows to 4096;
  6. the ledger's cost: a step under a Ledger against the plain step, interleaved, and its bytes per event;
  plus the fast float32 erf against SciPy's, and a profile of our step with changes measured but not applied.

Threads: `--threads 1,2` measures every step at each count, interleaved in the same rounds (BLAS through
threadpoolctl, torch.set_num_threads, and the engine's own pool, tinygrad_ckpt.backend.threads).

Timing: medians over rounds; in each round every engine first runs untimed for --warm seconds (so
the BLAS/OpenMP worker threads of the previous engine stop spinning) and then a few timed steps.
"""

from __future__ import annotations

import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small shapes, a few repetitions (under a minute)")
    ap.add_argument("--out", default=os.path.join(ROOT, "docs"), help="folder for benchmarks.md and .png")
    ap.add_argument("--threads", default=str(os.cpu_count() or 1),
                    help="thread counts for every library, comma-separated (e.g. 1,2); each is measured")
    ap.add_argument("--rounds", type=int, default=None, help="timing rounds per engine (default 3, quick 2)")
    ap.add_argument("--warm", type=float, default=None, help="untimed seconds per engine before timing "
                    "(default 0.1, quick 0.03)")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                    help="wall: perf_counter; cpu: process CPU time (all threads summed: meaningful with --threads 1 "
                    "on a machine shared with other work)")
    ap.add_argument("--only", default="", help="comma-separated sections: erf,main,ckpt,scaling,attention,ledger,"
                    "profile")
    args = ap.parse_args(argv)
    try:
        args.thread_counts = [int(t) for t in str(args.threads).split(",")]
        assert all(t >= 1 for t in args.thread_counts)
    except (ValueError, AssertionError):
        ap.error(f"--threads takes positive integers separated by commas, got {args.threads!r}")
    args.threads = max(args.thread_counts)  # what the libraries are started with
    return args


ARGS = parse_args() if __name__ == "__main__" else None
if ARGS is not None:  # before NumPy (and its BLAS) or PyTorch load: their pools size themselves once
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "VECLIB_MAXIMUM_THREADS",
                "NUMEXPR_NUM_THREADS"):
        os.environ[var] = str(ARGS.threads)

import cProfile  # noqa: E402
import gc  # noqa: E402
import io  # noqa: E402
import math  # noqa: E402
import platform  # noqa: E402
import pstats  # noqa: E402
import resource  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from collections import defaultdict  # noqa: E402

if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import tinygrad_ckpt as tg  # noqa: E402  (before NumPy: it sets OpenBLAS's spin, see backend/threads.py)

# isort: split
import numpy as np  # noqa: E402
import scipy  # noqa: E402

from benchmarks import handwritten as hw  # noqa: E402
from tinygrad_ckpt import nn  # noqa: E402
from tinygrad_ckpt import ops as tgops  # noqa: E402
from tinygrad_ckpt.backend import threads  # noqa: E402
from tinygrad_ckpt.backend.erf import erf_float32, gelu_float32  # noqa: E402
from tinygrad_ckpt.engine.function import Context  # noqa: E402
from tinygrad_ckpt.recompute.replay_check import Observations  # noqa: E402
from tinygrad_ckpt.units import format_bytes  # noqa: E402

try:
    import torch  # noqa: E402
    import torch.utils.checkpoint as tcp  # noqa: E402

    from benchmarks import torch_ref  # noqa: E402
except ImportError:  # the benchmarks still run, without the PyTorch columns
    torch = None

try:
    import threadpoolctl  # noqa: E402
except ImportError:
    threadpoolctl = None

F32 = np.float32
MiB = 1024 * 1024


def pin_threads(n: int) -> None:
    """n threads for BLAS (threadpoolctl), PyTorch and the engine's elementwise pool."""
    if threadpoolctl is not None:
        threadpoolctl.threadpool_limits(n)
    if torch is not None:
        torch.set_num_threads(n)
    threads.set_threads(n)


def at_threads(n: int, step):
    """`step`, run with n threads (for interleaving thread counts inside one measure())."""
    def run():
        pin_threads(n)
        return step()
    return run


# ---- configuration ------------------------------------------------------------------------------
def config(quick: bool) -> dict:
    if quick:
        return dict(
            shapes=[(2, 64, 128, 4)], layers=[1, 2], rounds=1, warm=0.03, target_s=0.03,
            ckpt=dict(shape=(2, 64, 128, 4), layers=4),
            scale_layers=dict(shape=(2, 32, 64, 4), values=[1, 2]),
            scale_T=dict(B=2, d=64, H=4, L=1, values=[32, 64]),
            scale_d=dict(B=2, T=32, L=1, values=[32, 64]),
            erf_n=1 << 18, profile=dict(shape=(2, 64, 128, 4), layers=1), fix_shape=(2, 64, 128, 4),
            attention=dict(byte_shapes=[(2, 64, 128, 4)], T=dict(B=1, d=64, H=4, values=[32, 64, 128])),
            ledger=dict(shapes=[(2, 64, 128, 4)], layers=2, steps=3, rounds=2, bytes_steps=5),
        )
    return dict(
        shapes=[(4, 128, 256, 4), (8, 256, 256, 8), (4, 512, 512, 8)], layers=[1, 4, 12], rounds=3,
        warm=0.1, target_s=0.4,
        ckpt=dict(shape=(4, 128, 256, 4), layers=12),
        scale_layers=dict(shape=(4, 128, 256, 4), values=[1, 4, 12, 32]),
        scale_T=dict(B=4, d=256, H=4, L=1, values=[64, 128, 256, 512, 1024]),
        scale_d=dict(B=4, T=128, L=1, values=[128, 256, 512, 1024]),
        erf_n=1 << 22, profile=dict(shape=(8, 256, 256, 8), layers=2), fix_shape=(8, 256, 256, 8),
        attention=dict(byte_shapes=[(4, 128, 256, 4), (8, 256, 256, 8), (4, 512, 512, 8), (4, 1024, 256, 4)],
                       T=dict(B=1, d=256, H=4, values=[256, 512, 1024, 2048, 4096])),
        ledger=dict(shapes=[(4, 128, 256, 4), (8, 256, 256, 8), (4, 512, 512, 8)], layers=4, steps=3, rounds=5,
                    bytes_steps=50),
    )


# ---- timing -------------------------------------------------------------------------------------
def minflt() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


CLOCK = time.perf_counter


def measure(steps: dict, rounds: int, warm_s: float, target_s: float) -> dict:
    """Round-robin over engines: untimed warm-up, then timed steps. {name: (median s, faults/step, all)}."""
    clock = CLOCK
    times = defaultdict(list)
    faults = defaultdict(int)
    for r in range(rounds):
        for name, step in steps.items():
            gc.collect()
            if r and times[name] and times[name][-1] > 5 * warm_s:
                # a step many times the warm-up: one untimed step would double the cost for nothing; idling
                # warm_s lets the previous engine's BLAS/OpenMP workers stop spinning all the same
                time.sleep(warm_s)
                last = times[name][-1]
            else:
                t_end = time.perf_counter() + warm_s
                while True:
                    t0 = time.perf_counter()
                    step()
                    last = time.perf_counter() - t0
                    if time.perf_counter() >= t_end:
                        break
            k = max(1, min(5, round(target_s / max(last, 1e-6))))
            f0 = minflt()
            for _ in range(k):
                t0 = clock()
                step()
                times[name].append(clock() - t0)
            faults[name] += minflt() - f0
    return {name: (statistics.median(ts), faults[name] / len(ts), ts) for name, ts in times.items()}


# ---- the three engines on one stack ---------------------------------------------------------------
class Stack:
    """One block stack in all engines, same weights, same input and upstream gradient."""

    def __init__(self, B, T, d, H, L, seed=0, torch_attention=("math",), attention="explicit"):
        tg.manual_seed(seed)
        self.B, self.T, self.d, self.H, self.L = B, T, d, H, L
        self.module = nn.ModuleList([nn.Block(d, H, n_layer=L, attention=attention)  # ops named "3.attn..."
                                     for _ in range(L)])
        self.blocks = list(self.module)
        self.params = [hw.block_params(b) for b in self.blocks]
        rng = np.random.default_rng(seed)
        self.x = rng.standard_normal((B, T, d)).astype(F32)
        self.g = rng.standard_normal((B, T, d)).astype(F32)
        self.torch = {}
        if torch is not None:
            for att in torch_attention:
                self.torch[att] = torch_ref.from_engine(self.blocks, H, attention=att)
            self.tx = torch.from_numpy(self.x.copy()).requires_grad_(True)
            self.tg_ = torch.from_numpy(self.g.copy())

    # ours ---------------------------------------------------------------------------------------
    def ours_forward(self, plan=None, check="values"):
        xt = tg.Tensor(self.x, requires_grad=True)
        h = xt
        if plan is None:
            for b in self.blocks:
                h = b(h)
        elif plan == "every_layer":
            for b in self.blocks:
                h = tg.checkpoint(b, h, determinism_check=check)
        elif plan == "sqrt":
            h = tg.checkpoint_sequential(self.blocks, sqrt_segments(self.L), h, determinism_check=check)
        else:
            raise ValueError(plan)
        return xt, h

    def ours_step(self, plan=None, check="values"):
        for b in self.blocks:
            b.zero_grad()
        xt, h = self.ours_forward(plan, check)
        h.backward(self.g)
        return xt

    def ours_grads(self):
        xt = self.ours_step()
        return xt.grad, [{k: p.grad for k, p in b.named_parameters()} for b in self.blocks]

    # hand-written -------------------------------------------------------------------------------
    def hw_step(self):
        return hw.step(self.params, self.x, self.g, self.H)

    # torch --------------------------------------------------------------------------------------
    def torch_step(self, att="math", plan=None):
        tb = self.torch[att]
        for p in tb.parameters():
            p.grad = None
        self.tx.grad = None
        h = self.tx
        if plan is None:
            h = torch_ref.run_stack(tb, h)
        elif plan == "every_layer":
            for b in tb:
                h = tcp.checkpoint(b, h, use_reentrant=False)
        elif plan == "sqrt":
            h = tcp.checkpoint_sequential(tb, sqrt_segments(self.L), h, use_reentrant=False)
        h.backward(self.tg_)

    def torch_grads(self, att="math"):
        self.torch_step(att)
        return self.tx.grad.numpy(), torch_ref.grads_as_engine(self.torch[att])

    def torch_saved(self, att="math", plan=None):
        """Bytes autograd keeps at the end of the forward (storages counted once, parameters left out)."""
        tb = self.torch[att]

        def fwd():
            h = self.tx
            if plan is None:
                return torch_ref.run_stack(tb, h)
            if plan == "every_layer":
                for b in tb:
                    h = tcp.checkpoint(b, h, use_reentrant=False)
                return h
            return tcp.checkpoint_sequential(tb, sqrt_segments(self.L), h, use_reentrant=False)

        res = torch_ref.saved_bytes(fwd, list(tb.parameters()))
        res.pop("out").backward(self.tg_)  # release the graph
        return res

    # memory and FLOPs of ours -------------------------------------------------------------------
    def ours_ledger(self, plan=None, check="values"):
        for b in self.blocks:
            b.zero_grad()
        with tg.Ledger() as led:
            xt, h = self.ours_forward(plan, check)
            fwd_end = led.live_bytes("activation")
            h.backward(self.g)
        return dict(peak=led.peak_bytes("activation"), fwd_end=fwd_end, forward=led.flops("forward"),
                    backward=led.flops("backward"), recompute=led.flops("recompute"), total=led.flops(),
                    by_block=led.saved_breakdown(by="module", depth=1))


def sqrt_segments(n: int) -> int:
    return max(1, round(math.sqrt(n)))


def max_rel_err(ref_dx, ref_grads, dx, grads) -> float:
    worst = float(np.abs(dx - ref_dx).max() / (np.abs(ref_dx).max() + 1e-30))
    for r, g in zip(ref_grads, grads):
        for k, v in r.items():
            worst = max(worst, float(np.abs(np.asarray(g[k]) - v).max() / (np.abs(v).max() + 1e-30)))
    return worst


# ---- sections -----------------------------------------------------------------------------------
def environment(args) -> dict:
    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()  # /proc/cpuinfo, not an event name
                    break
    except OSError:
        pass
    blas = []
    if threadpoolctl is not None:
        for info in threadpoolctl.threadpool_info():
            blas.append(f"{info.get('internal_api')} {info.get('version') or ''} "
                        f"({info.get('architecture') or info.get('threading_layer') or ''}, "
                        f"{info.get('num_threads')} threads)".replace("  ", " "))
    env = {k: os.environ.get(k, "unset") for k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "OPENBLAS_THREAD_TIMEOUT")}
    return dict(
        python=platform.python_version(), numpy=np.__version__, scipy=scipy.__version__,
        torch=torch.__version__ if torch is not None else "not installed", cpu=cpu, cores=os.cpu_count(),
        threads=args.threads, thread_counts=args.thread_counts,
        torch_threads=torch.get_num_threads() if torch is not None else None,
        blas="; ".join(blas) or "threadpoolctl not installed", env=env, load_start=os.getloadavg(),
        uptime=_uptime(), simd=simd(),
    )


def simd() -> str:
    """The vector instructions each library uses here: NumPy's dispatch targets this CPU supports, PyTorch's CPU
    capability. One model name ("Intel(R) Xeon(R) Processor") has covered machines that differ in these."""
    try:
        from numpy._core._multiarray_umath import __cpu_dispatch__, __cpu_features__
        found = [t for t in __cpu_dispatch__ if __cpu_features__.get(t)]
        ours = f"NumPy {', '.join(found) or 'baseline only'}"
    except ImportError:
        ours = "NumPy unknown"
    return ours + (f"; PyTorch {torch.backends.cpu.get_cpu_capability()}" if torch is not None else "")


def _uptime() -> str:
    """`uptime`'s line (load averages over 1, 5 and 15 minutes), or the load averages alone."""
    import subprocess

    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "load average " + ", ".join(f"{v:.2f}" for v in os.getloadavg())


def bench_erf(cfg, args) -> dict:
    from scipy.special import erf

    pin_threads(1)
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(cfg["erf_n"]) * 2).astype(F32)
    out = np.empty_like(x)
    steps = {"scipy": lambda: erf(x),  # "fast" takes the engine's path: cache-sized blocks (threads.rows)
             "fast": lambda: threads.rows(lambda o, a: erf_float32(a, out=o), out, x),
             "gelu": lambda: threads.rows(lambda o, a: gelu_float32(a, o), out, x)}  # exact GELU, its own fit
    if torch is not None:
        tx = torch.from_numpy(x)
        steps["torch_erf"] = lambda: torch.erf(tx)
        steps["torch_gelu"] = lambda: torch.nn.functional.gelu(tx)
    res = measure(steps, rounds=3, warm_s=args.warm, target_s=0.2)
    ns = {k: v[0] / x.size * 1e9 for k, v in res.items()}
    sample = np.concatenate([np.linspace(-6, 6, 2_000_001, dtype=F32), x[:200_000],
                             np.array([0.0, -0.0, np.inf, -np.inf, 3.92, -3.92, 1e-30], F32)])
    err = float(np.abs(erf_float32(sample).astype(np.float64) - erf(sample.astype(np.float64))).max())
    return dict(ns=ns, n=x.size, max_err=err)


def bench_main(cfg, args) -> list:
    """One row per (shape, layers, thread count); the thread counts are interleaved in the same rounds."""
    rows = []
    first_L = min(cfg["layers"])
    counts = args.thread_counts
    for (B, T, d, H) in cfg["shapes"]:
        for L in cfg["layers"]:
            extras = L == first_L  # the SDPA column: a per-layer fact, measured on the 1-layer rows
            pin_threads(counts[0])
            st = Stack(B, T, d, H, L, torch_attention=("math", "sdpa") if extras else ("math",))
            chunked = Stack(B, T, d, H, L, torch_attention=(), attention="chunked")  # same weights (same seed)
            row = dict(shape=(B, T, d, H), L=L)
            t0 = time.perf_counter()
            st.ours_step()
            est = time.perf_counter() - t0
            if L <= 4:  # the gradients agree (sanity); deeper stacks run the same code
                ref_dx, ref_g = st.ours_grads()
                hw_dx, hw_g = st.hw_step()
                row["err_hw"] = max_rel_err(ref_dx, ref_g, hw_dx, hw_g)
                row["err_chunked"] = max_rel_err(ref_dx, ref_g, *chunked.ours_grads())
                if torch is not None:
                    row["err_torch"] = max_rel_err(ref_dx, ref_g, *st.torch_grads("math"))
                del ref_dx, ref_g, hw_dx, hw_g
            steps = {}
            for n in counts:
                steps[f"ours@{n}"] = at_threads(n, st.ours_step)
                steps[f"chunked@{n}"] = at_threads(n, chunked.ours_step)
                steps[f"hand@{n}"] = at_threads(n, st.hw_step)
                if torch is not None:
                    steps[f"torch@{n}"] = at_threads(n, lambda st=st: st.torch_step("math"))
                    if extras:
                        steps[f"torch_sdpa@{n}"] = at_threads(n, lambda st=st: st.torch_step("sdpa"))
            rounds = cfg["rounds"] if args.rounds is None else args.rounds
            if est > 2.0 and args.rounds is None:
                rounds = min(rounds, 2)
            res = measure(steps, rounds, args.warm, cfg["target_s"])
            pin_threads(counts[0])
            led = st.ours_ledger()
            _, saved = hw.forward(st.params, st.x, H)
            row["bytes"] = dict(ours=led["peak"] / L, chunked=chunked.ours_ledger()["peak"] / L,
                                hand=hw.saved_bytes(saved) / L)
            del saved
            if torch is not None:
                row["bytes"]["torch"] = st.torch_saved("math")["total"] / L
                if extras:
                    row["bytes"]["torch_sdpa"] = st.torch_saved("sdpa")["total"] / L
            for n in counts:
                mine = {k.rsplit("@", 1)[0]: v for k, v in res.items() if k.endswith(f"@{n}")}
                rows.append(dict(row, threads=n, time={k: v[0] for k, v in mine.items()},
                                 worst={k: max(v[2]) for k, v in mine.items()},
                                 faults={k: v[1] for k, v in mine.items()}))
                print(f"  main {(B, T, d, H)} L={L} threads={n}: "
                      + ", ".join(f"{k} {v[0] * 1e3:.1f} ms" for k, v in mine.items())
                      + f" | bytes/layer ours {row['bytes']['ours'] / MiB:.2f} MiB, chunked "
                      f"{row['bytes']['chunked'] / MiB:.2f} MiB", flush=True)
            del st, chunked
            gc.collect()
    return rows


def bench_attention(cfg, args) -> dict:
    """Bytes per layer, ours explicit and chunked against PyTorch eager and SDPA; step time in T (one layer)."""
    c = cfg["attention"]
    n = args.thread_counts[-1]
    pin_threads(n)
    out = dict(threads=n, bytes=[], T={})
    for (B, T, d, H) in c["byte_shapes"]:
        rec = dict(shape=(B, T, d, H))
        for att in ("explicit", "chunked"):
            rec[att] = Stack(B, T, d, H, 1, torch_attention=(), attention=att).ours_ledger()["peak"]
        if torch is not None:
            st = Stack(B, T, d, H, 1, torch_attention=("math", "sdpa"))
            rec["torch"] = st.torch_saved("math")["total"]
            rec["torch_sdpa"] = st.torch_saved("sdpa")["total"]
            del st
        out["bytes"].append(rec)
        print(f"  attention bytes {(B, T, d, H)}: " + ", ".join(f"{k} {v / MiB:.2f} MiB" for k, v in rec.items()
                                                                  if k != "shape"), flush=True)
        gc.collect()
    t = c["T"]
    rounds = (1 if args.quick else 2) if args.rounds is None else args.rounds
    for T in t["values"]:
        st = Stack(t["B"], T, t["d"], t["H"], 1, torch_attention=("math", "sdpa") if torch is not None else ())
        ch = Stack(t["B"], T, t["d"], t["H"], 1, torch_attention=(), attention="chunked")
        steps = {"explicit": st.ours_step, "chunked": ch.ours_step}
        if torch is not None:
            steps["torch"] = lambda st=st: st.torch_step("math")
            steps["torch_sdpa"] = lambda st=st: st.torch_step("sdpa")
        res = measure(steps, rounds, args.warm, cfg["target_s"] / 2)
        out["T"][T] = dict(time={k: v[0] for k, v in res.items()}, worst={k: max(v[2]) for k, v in res.items()},
                           explicit_bytes=st.ours_ledger()["peak"], chunked_bytes=ch.ours_ledger()["peak"])
        print(f"  attention T={T}: " + ", ".join(f"{k} {v[0] * 1e3:.1f} ms" for k, v in res.items()), flush=True)
        del st, ch
        gc.collect()
    return out


def bench_ckpt(cfg, args) -> dict:
    B, T, d, H = cfg["ckpt"]["shape"]
    L = cfg["ckpt"]["layers"]
    counts = args.thread_counts
    pin_threads(counts[-1])
    st = Stack(B, T, d, H, L)
    base = st.ours_ledger()
    probe = st.ours_ledger("every_layer")
    out = dict(shape=(B, T, d, H), L=L, segments=sqrt_segments(L), replays=probe["recompute"] > 0, plans={},
               threads=counts)
    if not out["replays"]:
        print("  ckpt: tg.checkpoint does not replay yet (no recompute FLOPs); section skipped", flush=True)
        return out
    from tinygrad_ckpt.recompute import planner

    plans = {"every_layer": L, "sqrt": sum(s.stop - s.start for s in
                                           planner.sequential_plan(L, sqrt_segments(L), last_plain=True).segments
                                           if s.checkpoint)}
    kinds = {"ours": st.ours_step}
    for plan in plans:
        kinds[f"ours_{plan}"] = lambda plan=plan: st.ours_step(plan)
        kinds[f"ours_{plan}_meta"] = lambda plan=plan: st.ours_step(plan, check="metadata")
    if torch is not None:
        kinds["torch"] = lambda: st.torch_step("math")
        for plan in plans:
            kinds[f"torch_{plan}"] = lambda plan=plan: st.torch_step("math", plan)
    steps = {f"{k}@{n}": at_threads(n, fn) for n in counts for k, fn in kinds.items()}
    # ratios of medians of ~0.5 s steps, each step its own sample: four times the rounds of the main table
    rounds = 4 * cfg["rounds"] if args.rounds is None else args.rounds
    res = measure(steps, rounds, args.warm, cfg["target_s"])
    pin_threads(counts[-1])
    times = {n: {k: res[f"{k}@{n}"][0] for k in kinds} for n in counts}
    out["time"], out["rounds"] = times, rounds
    torch_base = st.torch_saved("math")["total"] if torch is not None else None
    torch_flops = torch_matmul_flops(st) if torch is not None else {}
    for plan, n_ckpt in plans.items():
        led = st.ours_ledger(plan)
        check = {}
        for n in counts:
            pin_threads(n)
            check[n] = check_seconds(lambda check, plan=plan: st.ours_step(plan, check)) / times[n]["ours"]
        pin_threads(counts[-1])
        p = dict(
            check_share=check,
            time_ratio={n: t[f"ours_{plan}"] / t["ours"] for n, t in times.items()},
            time_ratio_meta={n: t[f"ours_{plan}_meta"] / t["ours"] for n, t in times.items()},
            flops_ratio=led["total"] / base["total"], recompute=led["recompute"],
            ckpt_blocks_forward=base["forward"] * n_ckpt / L, checkpointed_blocks=n_ckpt,
            peak=led["peak"], fwd_end=led["fwd_end"], base_peak=base["peak"],
        )
        if torch is not None:
            p["torch_time_ratio"] = {n: t[f"torch_{plan}"] / t["torch"] for n, t in times.items()}
            boundary = st.torch_saved("math", plan)["total"]
            per_layer = torch_base / L
            seg_len = 1 if plan == "every_layer" else max(1, L // sqrt_segments(L))
            # the plain tail is gone by the time a segment replays; then one segment's interior is held
            replay = boundary - (L - n_ckpt) * per_layer + seg_len * per_layer
            p["torch_fwd_end"] = boundary
            p["torch_peak_est"] = max(boundary, replay)
            p["torch_base"] = torch_base
            if torch_flops:
                p["torch_flops_ratio"] = torch_flops.get(plan, float("nan")) / torch_flops["none"]
        out["plans"][plan] = p
        for n in counts:
            print(f"  ckpt {plan} at {n} thread(s): ours x{p['time_ratio'][n]:.2f} time, x{p['flops_ratio']:.2f} FLOPs"
                  + (f"; torch x{p['torch_time_ratio'][n]:.2f}" if torch is not None else ""), flush=True)
    return out


def check_seconds(step, reps: int = 5) -> float:
    """Seconds per step the value check adds: the time inside `replay_check.Observations.on_op` (each op's
    observation, in the checkpointed forward and in the replay: fingerprints and their bookkeeping) with
    determinism_check="values" minus with "metadata", the two alternated. Timed directly: a difference of two
    noisy step times cannot resolve a few per cent on a shared machine. `step(check)` runs one checkpointed step."""
    spent = {"values": 0.0, "metadata": 0.0}
    original = Observations.on_op

    def timed(self, *args, **kwargs):
        t0 = time.perf_counter()
        try:
            return original(self, *args, **kwargs)
        finally:
            spent["values" if self.values else "metadata"] += time.perf_counter() - t0

    Observations.on_op = timed
    try:
        for check in spent:  # warm
            step(check)
        spent.update(values=0.0, metadata=0.0)
        for _ in range(reps):
            for check in ("values", "metadata"):
                step(check)
    finally:
        Observations.on_op = original
    return (spent["values"] - spent["metadata"]) / reps


def torch_matmul_flops(st) -> dict:
    """FLOPs PyTorch's FlopCounterMode sees (matmuls only) per plan, to cross-check the recompute ratio."""
    try:
        from torch.utils.flop_counter import FlopCounterMode
    except ImportError:
        return {}
    out = {}
    for plan in (None, "every_layer", "sqrt"):
        with FlopCounterMode(display=False) as fc:
            st.torch_step("math", plan)
        out[plan or "none"] = fc.get_total_flops()
    return out


def bench_ledger(cfg, args) -> dict:
    """A step under a Ledger against the plain step, interleaved in every round at every thread count: "steady",
    steps inside a ledger kept open across them (as a long run records, keep_iterations=2), and "fresh", a new
    Ledger entered and left around each step (entering walks the engine's weak registries of live tensors, optimizers
    and tapes, and the graphs they reach). Medians of the timed steps; then the Python heap per event (tracemalloc
    over `bytes_steps` steps under one ledger)."""
    import tracemalloc

    c = cfg["ledger"]
    rounds = c["rounds"] if args.rounds is None else args.rounds
    out = dict(layers=c["layers"], rounds=rounds, steps=c["steps"], rows=[])
    for (B, T, d, H) in c["shapes"]:
        st = Stack(B, T, d, H, c["layers"], torch_attention=())
        times = defaultdict(list)
        enter = []
        for _ in range(rounds):
            for n in args.thread_counts:
                pin_threads(n)
                gc.collect()
                st.ours_step()  # warm (and the BLAS workers of the last block awake)
                for _ in range(c["steps"]):
                    t0 = CLOCK()
                    st.ours_step()
                    times["plain", n].append(CLOCK() - t0)
                with tg.Ledger(keep_iterations=2) as led:
                    st.ours_step()
                    for _ in range(c["steps"]):
                        t0 = CLOCK()
                        st.ours_step()
                        times["steady", n].append(CLOCK() - t0)
                for _ in range(c["steps"]):
                    t0 = CLOCK()
                    fresh = tg.Ledger()
                    with fresh:
                        t1 = CLOCK()
                        st.ours_step()
                    times["fresh", n].append(CLOCK() - t0)
                    enter.append(t1 - t0)
        med = {key: statistics.median(ts) for key, ts in times.items()}
        row = dict(shape=(B, T, d, H), enter=statistics.median(enter), events=led.iterations()[-1].events,
                   objects=len(gc.get_objects()),
                   ratio={n: dict(steady=med["steady", n] / med["plain", n], fresh=med["fresh", n] / med["plain", n],
                                  plain=med["plain", n]) for n in args.thread_counts})
        out["rows"].append(row)
        print(f"  ledger {(B, T, d, H)}: " + ", ".join(
            f"{n} thread(s) plain {r['plain'] * 1e3:.1f} ms, steady x{r['steady']:.3f}, fresh x{r['fresh']:.3f}"
            for n, r in row["ratio"].items()) + f"; entering {row['enter'] * 1e3:.1f} ms", flush=True)
        del st, led, fresh
        gc.collect()
    B, T, d, H = c["shapes"][0]
    st = Stack(B, T, d, H, c["layers"], torch_attention=())
    st.ours_step()
    gc.collect()
    tracemalloc.start()
    try:
        with tg.Ledger() as led:
            st.ours_step()
            gc.collect()
            heap, events = tracemalloc.get_traced_memory()[0], len(led.events)
            for _ in range(c["bytes_steps"]):
                st.ours_step()
            gc.collect()
            out["bytes_per_event"] = (tracemalloc.get_traced_memory()[0] - heap) / (len(led.events) - events)
            out["bytes_events"] = len(led.events) - events
    finally:
        tracemalloc.stop()
    out["bytes_shape"] = (B, T, d, H)
    print(f"  ledger: {out['bytes_per_event']:.1f} B of Python heap per event over {c['bytes_steps']} steps",
          flush=True)
    return out


def ledger_text(lg: dict) -> str:
    lines = ["## The ledger's cost", "",
             f"A step of the {lg['layers']}-layer stack under a `tg.Ledger` against the plain step, interleaved in "
             f"each of {lg['rounds']} rounds at every thread count ({lg['steps']} timed steps of each kind a round; "
             "ratios of medians). *steady*: steps inside a ledger kept open across them, as a long run records "
             "(`keep_iterations=2`); *fresh*: a new Ledger entered and left around each step, which adds what "
             "entering costs: one walk over the engine's weak registries of live tensors, optimizers and tapes "
             "(state.py) and the graphs they reach, counting what exists already (it grows with the engine's live "
             "tensors, not with the process's Python objects, which the table lists for comparison) and a first "
             "step's interning of event origins. Target: both ≤ 1.10×.", "",
             "| shape (B, T, d, H) | threads | plain step ms | steady × | fresh × | entering ms | events/step | "
             "Python objects |", "|---|---|---|---|---|---|---|---|"]
    for row in lg["rows"]:
        for n, r in row["ratio"].items():
            lines.append(f"| {row['shape']} | {n} | {fmt_ms(r['plain'])} | {r['steady']:.3f} | {r['fresh']:.3f} | "
                         f"{row['enter'] * 1e3:.1f} | {row['events']} | {row['objects']:,} |")
    lines += ["", f"Python heap per event (tracemalloc, {lg['bytes_events']:,} events of the shape {lg['bytes_shape']} "
              f"under one ledger): **{lg['bytes_per_event']:.1f} B** (events as columns, origins interned; target "
              "≤ ~120 B).", ""]
    return "\n".join(lines)


def bench_scaling(cfg, args) -> dict:
    rounds = (1 if args.quick else 2) if args.rounds is None else args.rounds
    pin_threads(args.thread_counts[-1])
    out = {}

    def point(B, T, d, H, L):
        st = Stack(B, T, d, H, L)
        steps = {"ours": st.ours_step, "hand": st.hw_step}
        if torch is not None:
            steps["torch"] = lambda: st.torch_step("math")
        res = measure(steps, rounds, args.warm, cfg["target_s"] / 2)
        rec = dict(time={k: v[0] for k, v in res.items()}, ours_bytes=st.ours_ledger()["peak"])
        if torch is not None:
            rec["torch_bytes"] = st.torch_saved("math")["total"]
        return rec

    B, T, d, H = cfg["scale_layers"]["shape"]
    out["layers"] = {L: point(B, T, d, H, L) for L in cfg["scale_layers"]["values"]}
    print("  scaling: layers done", flush=True)
    c = cfg["scale_T"]
    out["T"] = {T: point(c["B"], T, c["d"], c["H"], c["L"]) for T in c["values"]}
    print("  scaling: T done", flush=True)
    c = cfg["scale_d"]
    out["d"] = {d: point(c["B"], c["T"], d, max(1, d // 64), c["L"]) for d in c["values"]}
    print("  scaling: d done", flush=True)
    return out


def slope(xs, ys) -> float:
    """Least-squares exponent k of y ∝ x^k."""
    return float(np.polyfit(np.log(np.asarray(xs, float)), np.log(np.asarray(ys, float)), 1)[0])


def quad_fit(Ts, ys):
    """y = a·T + b·T² (least squares): (a, b)."""
    T = np.asarray(Ts, float)
    A = np.stack([T, T * T], axis=1)
    (a, b), *_ = np.linalg.lstsq(A, np.asarray(ys, float), rcond=None)
    return float(a), float(b)


# ---- profile ------------------------------------------------------------------------------------
def bench_profile(cfg, args) -> dict:
    pin_threads(args.thread_counts[-1])
    B, T, d, H = cfg["profile"]["shape"]
    L = cfg["profile"]["layers"]
    st = Stack(B, T, d, H, L, torch_attention=())
    for _ in range(2):
        st.ours_step()
    step_s = measure({"ours": st.ours_step}, 2, args.warm, cfg["target_s"])["ours"][0]

    # per op kind: time inside forward/backward of the op itself; the rest is the tape's own work
    fwd, bwd, count = defaultdict(float), defaultdict(float), defaultdict(int)

    def timed(method, kind, acc, counter=None):
        """The op's forward or backward timed, as the same kind of method (static, or a class method: an op whose
        variants override what it keeps)."""
        fn = method.__func__

        def wrapper(*args, **kwargs):
            t0 = time.perf_counter()
            r = fn(*args, **kwargs)
            acc[kind] += time.perf_counter() - t0
            if counter is not None:
                counter[kind] += 1
            return r

        return type(method)(wrapper)

    patched = {}
    for name in tgops.__all__:
        cls = getattr(tgops, name)
        if isinstance(cls, type) and "forward" in cls.__dict__ and "backward" in cls.__dict__:
            patched[cls] = (cls.__dict__["forward"], cls.__dict__["backward"])
            cls.forward = timed(cls.__dict__["forward"], cls.kind(), fwd, count)
            cls.backward = timed(cls.__dict__["backward"], cls.kind(), bwd)
    reps = 3
    try:
        t0 = time.perf_counter()
        for _ in range(reps):
            st.ours_step()
        instrumented = (time.perf_counter() - t0) / reps
    finally:
        for cls, (f, b) in patched.items():
            cls.forward, cls.backward = f, b
    ops = {k: dict(fwd=fwd[k] / reps, bwd=bwd[k] / reps, n=count[k] // reps) for k in count}
    inside = sum(v["fwd"] + v["bwd"] for v in ops.values())

    # Python overhead per recorded op: a stack so small that the arithmetic is nothing
    tiny = Stack(1, 4, 8, 2, L, torch_attention=())
    tiny_s = measure({"tiny": tiny.ours_step}, 2, args.warm, 0.05)["tiny"][0]
    tiny_hw = measure({"tiny": tiny.hw_step}, 2, args.warm, 0.05)["tiny"][0]
    n_entries = sum(v["n"] for v in ops.values())

    prof = cProfile.Profile()
    prof.enable()
    st.ours_step()
    prof.disable()
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(14)
    text = s.getvalue().replace(ROOT + os.sep, "")  # paths relative to the repository
    text = text[text.find("ncalls"):].rstrip()

    return dict(shape=(B, T, d, H), L=L, step=step_s, instrumented=instrumented, ops=ops, inside=inside,
                entries=n_entries, tiny_step=tiny_s, tiny_hw=tiny_hw, cprofile=text,
                fixes=bench_fixes(cfg["fix_shape"], args))


def _t(fn, reps=None, min_s=0.15) -> float:
    """Median seconds of fn() (after one untimed call)."""
    fn()
    ts = []
    t_end = time.perf_counter() + min_s
    while len(ts) < 3 or (time.perf_counter() < t_end and len(ts) < (reps or 50)):
        t0 = CLOCK()
        fn()
        ts.append(CLOCK() - t0)
    return statistics.median(ts)


def bench_fixes(shape, args) -> list:
    """Engine changes measured but not applied, each timed on the real arrays of one layer: (current, proposed)
    seconds."""
    B, T, d, H = shape
    hd = d // H
    rng = np.random.default_rng(1)
    E = (B, T, d)
    xe = rng.standard_normal(E).astype(F32)
    ge = rng.standard_normal(E).astype(F32)
    w = rng.standard_normal(d).astype(F32)
    scores = rng.standard_normal((B, H, T, T)).astype(F32)
    gs = rng.standard_normal((B, H, T, T)).astype(F32)
    mask = np.triu(np.ones((T, T), bool), k=1)
    fixes = []

    def ctx(n=1, shapes=None):
        return Context(tuple([True] * n), shapes or (None,) * n, saving=True)

    # LayerNorm backward
    xhat = (xe - xe.mean(-1, keepdims=True)) / xe.std(-1, keepdims=True)
    rstd = (1 / xe.std(-1, keepdims=True)).astype(F32)

    bias = np.zeros(d, F32)
    ln_out = xhat * w + bias

    def ln_current():  # the engine's layer norm keeps its output and recovers x̂ from it
        c = ctx(3)
        c.saved.update(out=ln_out, rstd=rstd, weight=w, bias=bias)
        c.zero_columns = None
        tgops.LayerNormOp.backward(c, ge)

    fixes.append(dict(
        name="LayerNorm backward: einsum reductions, in-place updates", per_layer=2,
        current=_t(ln_current), proposed=_t(lambda: hw._layer_norm_backward(ge, xhat, rstd, w)),
        how="gw = einsum('ij,ij->j', g, x̂); Σ ĝ·x̂ by einsum (no ĝ·x̂ temporary); gx -= x̂·dot in place"))

    # masked_fill backward: the gradient is already 0 where the mask is (softmax output is 0 there)
    def masked_fill_current():
        c = ctx(2, shapes=(gs.shape, mask.shape))
        c.saved["mask"], c.scale = mask, 1 / math.sqrt(hd)
        tgops.MaskedFill.backward(c, gs)

    fixes.append(dict(
        name="masked_fill backward: only the scale when it feeds softmax", per_layer=1,
        current=_t(masked_fill_current), proposed=_t(lambda: gs * np.asarray(1 / math.sqrt(hd), F32)),
        how="after softmax the gradient is 0 where the mask is already (y = 0 there, so dy·y = 0)"))

    # tape gradient sums: a + b (new array) vs in place into an owned gradient
    fixes.append(dict(
        name="tape: add a second gradient in place when the first is a fresh array", per_layer=2,
        current=_t(lambda: xe + ge), proposed=_t(lambda: np.add(xe, ge, out=xe)),
        how="_summed allocates a+b each time; ops whose backward returns fresh arrays could mark them owned"))

    # softmax backward
    y = np.exp(scores - scores.max(-1, keepdims=True))
    y /= y.sum(-1, keepdims=True)

    def sm_current():
        c = ctx()
        c.saved["out"], c.axis = y, y.ndim - 1
        tgops.Softmax.backward(c, gs)

    def sm_inplace():
        dot = np.einsum("...i,...i->...", gs, y)[..., None]  # Σ g·y without a g·y temporary
        g = gs - dot
        g *= y

    fixes.append(dict(
        name="softmax backward: y·(g - Σg·y) with one temporary", per_layer=1,
        current=_t(sm_current), proposed=_t(sm_inplace),
        how="dot = einsum('...i,...i->...', g, y); gx = g - dot; gx *= y (one allocation instead of two)"))
    return fixes


# ---- report -------------------------------------------------------------------------------------
def fmt_ms(s) -> str:
    return f"{s * 1e3:.1f}" if s < 1 else f"{s * 1e3:.0f}"


def fmt_b(n) -> str:
    return "-" if n is None else format_bytes(n, digits=2)


def write_report(res: dict, args, out_dir: str, elapsed: float) -> str:
    env = res["env"]
    L = []
    w = L.append
    w("# Benchmarks")
    w("")
    flags = (" --quick" if args.quick else "") + (" --clock cpu" if args.clock == "cpu" else "")
    if args.thread_counts != [os.cpu_count()]:
        flags += f" --threads {','.join(map(str, args.thread_counts))}"
    w(f"Regenerated by `python benchmarks/run.py{flags}` "
      f"({time.strftime('%Y-%m-%d %H:%M')}, {elapsed:.0f} s). A pre-LN GPT block stack (`nn.Block`), float32, "
      "forward + backward from a fixed upstream gradient (no loss op), on the CPU. "
      f"Times ({'process CPU time' if args.clock == 'cpu' else 'wall clock'}) are medians over rounds; in each "
      f"round every engine runs untimed for {args.warm:g} s first (BLAS/OpenMP worker threads of the previous "
      "engine stop spinning; for steps over 5× that, later rounds idle that long instead).")
    w("")
    w(f"- Machine: {env['cpu']}, {env['cores']} cores. Thread counts measured: **{env['thread_counts']}**, each "
      "row says which; a count is set for all libraries at once (BLAS through threadpoolctl, "
      "torch.set_num_threads, and the engine's elementwise pool, tinygrad_ckpt.backend.threads), and the counts "
      "are interleaved inside the same rounds. The machine's default is "
      f"{len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else env['cores']}.")
    w(f"- Python {env['python']}, NumPy {env['numpy']}, SciPy {env['scipy']}, PyTorch {env['torch']}. "
      f"Vector instructions in use: {env['simd']}.")
    w(f"- BLAS: {env['blas']}. OPENBLAS_CORETYPE={env['env']['OPENBLAS_CORETYPE']}, "
      f"OPENBLAS_L2_SIZE={env['env']['OPENBLAS_L2_SIZE']}, "
      f"OPENBLAS_THREAD_TIMEOUT={env['env']['OPENBLAS_THREAD_TIMEOUT']} (how long its idle threads spin).")
    w(f"- Load average at start {env['load_start'][0]:.2f}, at end {env['load_end'][0]:.2f} "
      "(other processes on the machine add noise to every number below). `uptime` at start: "
      f"`{env['uptime']}`; at the end: `{env['uptime_end']}`.")
    w("")
    if "main" in res:
        w("## Step time, tape overhead and bytes saved per layer")
        w("")
        w("ours = the tape engine; hand = hand-written NumPy (benchmarks/handwritten.py, same math, same saves); "
          "torch = PyTorch CPU with the same explicit attention (nanoGPT without flash); torch sdpa = "
          "`F.scaled_dot_product_attention` (keeps no T×T matrix; for information); ours chunked = "
          "`nn.Block(attention=\"chunked\")` (no T×T matrix kept), same weights. Bytes per layer: ledger "
          "activation peak / layers (ours), arrays kept by the hand-written forward, PyTorch's saved tensors "
          "(hooks, one count per storage, parameters excluded). Faults: minor page faults per step.")
        w("")

        def ms(t, k):
            return fmt_ms(t[k]) if k in t else "-"

        head = ("| B, T, d, H | layers | threads | ours ms | hand ms | torch ms | torch sdpa ms | ours chunked ms "
                "| ours/hand | ours/torch | hand/torch | chunked/ours |")
        sep = "|---|---|---|---|---|---|---|---|---|---|---|---|"
        head += (" bytes/layer ours | ours chunked | torch | hand | torch sdpa | faults/step ours, hand, torch "
                 "| grad err vs hand, torch, chunked |")
        sep += "---|---|---|---|---|---|---|"
        w(head)
        w(sep)
        for r in res["main"]:
            t, b, f = r["time"], r["bytes"], r["faults"]
            tt = t.get("torch")
            cells = [", ".join(map(str, r["shape"])), str(r["L"]), str(r["threads"]), fmt_ms(t["ours"]),
                     fmt_ms(t["hand"]), ms(t, "torch"), ms(t, "torch_sdpa"), ms(t, "chunked"),
                     f"{t['ours'] / t['hand']:.2f}", f"{t['ours'] / tt:.2f}" if tt else "-",
                     f"{t['hand'] / tt:.2f}" if tt else "-", f"{t['chunked'] / t['ours']:.2f}"]
            cells += [fmt_b(b["ours"]), fmt_b(b["chunked"]), fmt_b(b.get("torch")), fmt_b(b["hand"]),
                      fmt_b(b.get("torch_sdpa")),
                      f"{f['ours']:.0f}, {f['hand']:.0f}, " + (f"{f['torch']:.0f}" if tt else "-"),
                      (f"{r['err_hw']:.1e}, " + (f"{r['err_torch']:.1e}" if "err_torch" in r else "-")
                       + f", {r['err_chunked']:.1e}") if "err_hw" in r else "(L ≤ 4 only)"]
            w("| " + " | ".join(cells) + " |")
        w("")
        w(summary_targets(res))
        w("")
    if "ckpt" in res:
        c = res["ckpt"]
        w("## Checkpointing cost")
        w("")
        if not c["replays"]:
            w("tg.checkpoint does not replay yet (the ledger shows no recompute FLOPs): section skipped.")
        else:
            w(f"Shape (B, T, d, H) = {c['shape']}, {c['L']} layers, at {c['threads']} thread(s), interleaved. "
              "every_layer: "
              "`tg.checkpoint(block, h)` per block "
              f"/ `torch.utils.checkpoint.checkpoint(block, h, use_reentrant=False)`; sqrt: "
              f"`checkpoint_sequential(blocks, {c['segments']}, x)` in both (the last segment runs plainly). "
              "Ratios are checkpointed / not. 'meta' = determinism_check='metadata' (PyTorch's kind of check; "
              "the default 'values' also fingerprints the bits of every array the replay recomputes and saves). "
              "Peak = ledger activation peak; PyTorch's "
              "peak is estimated from its measured saved bytes (hooks): max(at the end of the forward, checkpoint "
              "inputs + one segment's interior (per-layer saved bytes × layers per segment)), since its recomputed "
              "tensors are held by checkpoint's own hooks, out of sight of ours.")
            w("")
            w("| plan | threads | ours time × | ours time × (meta) | torch time × | ours FLOPs × "
              "| torch matmul FLOPs × | recompute FLOPs / forward of the ckpt blocks (early stop: < 1) "
              "| ours act. at fwd end | ours act. peak "
              "| torch saved at fwd end | torch peak (est.) | no-ckpt peak ours / torch |")
            w("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
            for plan, p in c["plans"].items():
                for n in c["threads"]:
                    w(f"| {plan} ({p['checkpointed_blocks']}/{c['L']} blocks ckpt) | {n} | {p['time_ratio'][n]:.2f} | "
                      f"{p['time_ratio_meta'][n]:.2f} | "
                      + (f"{p['torch_time_ratio'][n]:.2f}" if "torch_time_ratio" in p else "-")
                      + f" | {p['flops_ratio']:.3f} | "
                      + (f"{p['torch_flops_ratio']:.3f}" if "torch_flops_ratio" in p else "-")
                      + f" | {p['recompute'] / p['ckpt_blocks_forward']:.4f} | {fmt_b(p['fwd_end'])} | "
                      + f"{fmt_b(p['peak'])} | {fmt_b(p.get('torch_fwd_end'))} | {fmt_b(p.get('torch_peak_est'))} | "
                      + f"{fmt_b(p['base_peak'])} / {fmt_b(p.get('torch_base'))} |")
            w("")
            for n, t in c["time"].items():
                w(f"Step times at {n} thread(s) (ms, medians of {c['rounds']} rounds): "
                  + ", ".join(f"{k} {fmt_ms(v)}" for k, v in t.items()) + ".")
                w("")
            for plan, p in c["plans"].items():
                for n in c["threads"]:
                    w(f"- {plan}, {n} thread(s): the value check costs {p['check_share'][n]:.1%} of a step "
                      f"without checkpointing, timed inside each op's observation, 'values' minus 'metadata' "
                      f"(target ≤ 3%; the difference of the "
                      f"'values' and 'metadata' medians reads {(p['time_ratio'][n] - p['time_ratio_meta'][n]):.1%}, "
                      f"within this machine's noise); overhead ours ×{p['time_ratio'][n]:.2f} against PyTorch's "
                      + (f"×{p['torch_time_ratio'][n]:.2f}" if "torch_time_ratio" in p else "-")
                      + " (target: at most PyTorch's).")
        w("")
    if "scaling" in res:
        w("## Scaling")
        w("")
        w(f"At {args.thread_counts[-1]} thread(s), one layer unless the table varies it.")
        w("")
        w(scaling_text(res["scaling"]))
        w("")
    if "attention" in res:
        w(attention_text(res["attention"]))
    if "ledger" in res:
        w(ledger_text(res["ledger"]))
    if "erf" in res:
        e = res["erf"]
        w("## Fast float32 erf")
        w("")
        w(f"`tinygrad_ckpt.backend.erf.erf_float32` on {e['n']:,} float32 values, every library at 1 thread: "
          + ", ".join(f"{k} {v:.2f} ns/element" for k, v in e["ns"].items())
          + f". Speed-up over SciPy: **{e['ns']['scipy'] / e['ns']['fast']:.1f}×**. Max abs error vs "
          f"float64 erf on a dense sample of [-6, 6] plus specials: **{e['max_err']:.2e}** (over every float32: "
          "`python benchmarks/erf_every_float32.py`). 'gelu' is the engine's exact GELU (`gelu_float32`, "
          "x / (1 + e^(x·G(x²))), a fit of its own, not through erf), against torch_gelu.")
        w("")
    if "profile" in res:
        w(profile_text(res["profile"]))
    if os.path.exists(os.path.join(out_dir, "benchmarks.png")):
        w("![benchmarks](benchmarks.png)")
        w("")
    gpu_page = os.path.join(ROOT, "docs", "gpu.md")
    if os.path.exists(gpu_page):  # measured on a GPU machine by benchmarks/gpu_run.sh; kept in one file
        w("## GPU (from docs/gpu.md)")
        w("")
        with open(gpu_page) as f:
            body = f.read().split("\n", 1)[1].replace("\n## ", "\n### ")
        w(body.replace("](gpu_", "](" + os.path.relpath(os.path.join(ROOT, "docs"), out_dir) + "/gpu_"))
    text = "\n".join(L)
    with open(os.path.join(out_dir, "benchmarks.md"), "w") as f:
        f.write(text)
    return text


def torch_target(threads: int) -> float:
    """The step-time target ours/PyTorch (median over the table's rows) at a thread count."""
    return 1.10 if threads == 1 else 1.15


def summary_targets(res) -> str:
    lines = ["Targets (all rows of the table at one thread count; worst / median over the rows):", ""]

    def stat(vals):
        vals = [v for v in vals if v is not None]
        return f"worst {max(vals):.2f}, median {statistics.median(vals):.2f}" if vals else "-"

    for n in sorted({r["threads"] for r in res["main"]}):
        rows = [r for r in res["main"] if r["threads"] == n]
        lines.append(f"**{n} thread(s)**")
        lines.append("")
        lines.append(f"- tape overhead ours/hand ≤ 1.10: {stat([r['time']['ours'] / r['time']['hand'] for r in rows])}")
        if "torch" in rows[0]["time"]:
            lines.append(f"- step time ours/torch ≤ {torch_target(n):.2f}: "
                         f"{stat([r['time']['ours'] / r['time']['torch'] for r in rows])} (hand/torch: "
                         f"{stat([r['time']['hand'] / r['time']['torch'] for r in rows])}; by each engine's worst "
                         f"round instead of its median: "
                         f"{stat([r['worst']['ours'] / r['worst']['torch'] for r in rows])})")
        lines.append(f"- chunked / explicit attention step time: "
                     f"{stat([r['time']['chunked'] / r['time']['ours'] for r in rows])}")
        lines.append("")
    rows = [r for r in res["main"] if r["threads"] == res["main"][0]["threads"]]
    if "torch" in rows[0]["bytes"]:
        lines.append("- activation bytes per layer ours/torch ≤ 1: "
                     f"{stat([r['bytes']['ours'] / r['bytes']['torch'] for r in rows])}; chunked/torch: "
                     f"{stat([r['bytes']['chunked'] / r['bytes']['torch'] for r in rows])}")
    checked = [r for r in rows if "err_hw" in r]
    if checked:
        lines.append(f"- gradients (float32, max over parameters and dx of max|Δ|/max|g|): ours vs hand "
                     f"{max(r['err_hw'] for r in checked):.1e}"
                     + (f", ours vs torch {max(r['err_torch'] for r in checked):.1e}"
                        if "err_torch" in checked[0] else "")
                     + f", chunked vs ours {max(r['err_chunked'] for r in checked):.1e}")
    return "\n".join(lines)


def attention_text(a) -> str:
    out = ["## Attention without the T×T matrix", ""]
    out.append(f"At {a['threads']} thread(s). Bytes per layer (one layer; ledger activation peak for ours, saved "
               "tensors through hooks for PyTorch): our explicit attention keeps the [B, H, T, T] weights and the "
               "causal mask, like PyTorch eager; `attention=\"chunked\"` keeps q, k, v, its output and one "
               "log-sum-exp per row, like PyTorch's SDPA kernel.")
    out.append("")
    has_torch = "torch" in a["bytes"][0]
    out.append("| B, T, d, H | ours explicit | ours chunked | torch eager | torch sdpa | chunked / torch eager "
               "| chunked / torch sdpa |")
    out.append("|---|---|---|---|---|---|---|")
    for r in a["bytes"]:
        out.append(f"| {', '.join(map(str, r['shape']))} | {fmt_b(r['explicit'])} | {fmt_b(r['chunked'])} | "
                   f"{fmt_b(r.get('torch'))} | {fmt_b(r.get('torch_sdpa'))} | "
                   + (f"{r['chunked'] / r['torch']:.2f} | {r['chunked'] / r['torch_sdpa']:.2f} |" if has_torch
                      else "- | - |"))
    out.append("")
    pts = a["T"]
    xs = list(pts)
    engines = list(pts[xs[0]]["time"])
    out.append("Step time of one layer (forward + backward) as T grows, B = 1 (median ms; worst round in brackets):")
    out.append("")
    out.append("| T | " + " | ".join(f"{e} ms" for e in engines) + " | chunked / explicit | explicit bytes "
               "| chunked bytes |")
    out.append("|---|" + "---|" * (len(engines) + 3))
    for x in xs:
        p = pts[x]
        out.append(f"| {x} | " + " | ".join(f"{fmt_ms(p['time'][e])} ({fmt_ms(p['worst'][e])})" for e in engines)
                   + f" | {p['time']['chunked'] / p['time']['explicit']:.2f} | {fmt_b(p['explicit_bytes'])} | "
                   f"{fmt_b(p['chunked_bytes'])} |")
    out.append("")
    out.append("Fitted exponents (y ∝ T^k): time " + ", ".join(
        f"{e} {slope(xs, [pts[x]['time'][e] for x in xs]):.2f}" for e in engines)
        + f"; bytes explicit {slope(xs, [pts[x]['explicit_bytes'] for x in xs]):.2f}, chunked "
        f"{slope(xs, [pts[x]['chunked_bytes'] for x in xs]):.2f}.")
    out.append("")
    return "\n".join(out)


def scaling_text(s) -> str:
    out = []
    for key, label in (("layers", "layers"), ("T", "T"), ("d", "d")):
        pts = s[key]
        xs = list(pts)
        engines = list(pts[xs[0]]["time"])
        out.append(f"**vs {label}**")
        out.append("")
        out.append(f"| {label} | " + " | ".join(f"{e} ms" for e in engines) + " | ours bytes | torch bytes |")
        out.append("|---|" + "---|" * (len(engines) + 2))
        for x in xs:
            p = pts[x]
            out.append(f"| {x} | " + " | ".join(fmt_ms(p["time"][e]) for e in engines)
                       + f" | {fmt_b(p['ours_bytes'])} | {fmt_b(p.get('torch_bytes'))} |")
        exps = ", ".join(f"{e} {slope(xs, [pts[x]['time'][e] for x in xs]):.2f}" for e in engines)
        byte_exp = f"ours {slope(xs, [pts[x]['ours_bytes'] for x in xs]):.2f}"
        if "torch_bytes" in pts[xs[0]]:
            byte_exp += f", torch {slope(xs, [pts[x]['torch_bytes'] for x in xs]):.2f}"
        out.append("")
        out.append(f"Fitted exponents (y ∝ {label}^k over the whole range): time {exps}; bytes {byte_exp}.")
        if key == "T":
            a, b = quad_fit(xs, [pts[x]["ours_bytes"] for x in xs])
            tmax = xs[-1]
            local = slope(xs[-2:], [pts[x]["ours_bytes"] for x in xs[-2:]])
            out.append(f" Bytes = a·T + b·T² fit (ours): a = {a:.0f} B, b = {b:.1f} B; the T² term is "
                       f"{b * tmax * tmax / (a * tmax + b * tmax * tmax):.0%} of the bytes at T = {tmax} "
                       f"(local exponent {local:.2f} between the last two T).")
        out.append("")
    return "\n".join(out)


def profile_text(p) -> str:
    out = ["## Profile of our step", ""]
    B, T, d, H = p["shape"]
    out.append(f"Shape (B, T, d, H) = {p['shape']}, {p['L']} layers: step {fmt_ms(p['step'])} ms "
               f"({fmt_ms(p['instrumented'])} ms instrumented). Time inside ops' forward/backward "
               f"{fmt_ms(p['inside'])} ms ({p['inside'] / p['instrumented']:.0%}); the rest "
               f"({fmt_ms(p['instrumented'] - p['inside'])} ms) is the tape's own work (Function.apply, Tensor "
               f"wrapping, name scopes, gradient routing and sums, releases).")
    out.append("")
    per_op = (p["tiny_step"] - p["tiny_hw"]) / max(p["entries"], 1)
    out.append(f"Python overhead per recorded op (forward + backward, from a 1×4×8 stack where arithmetic "
               f"is nothing): {per_op * 1e6:.1f} µs; {p['entries']} ops per step → "
               f"{per_op * p['entries'] * 1e3:.2f} ms = {per_op * p['entries'] / p['step']:.1%} of this step.")
    out.append("")
    out.append("| op | count | forward ms | backward ms | share of step |")
    out.append("|---|---|---|---|---|")
    for k, v in sorted(p["ops"].items(), key=lambda kv: -(kv[1]["fwd"] + kv[1]["bwd"])):
        out.append(f"| {k} | {v['n']} | {v['fwd'] * 1e3:.2f} | {v['bwd'] * 1e3:.2f} | "
                   f"{(v['fwd'] + v['bwd']) / p['instrumented']:.1%} |")
    out.append("")
    out.append("Measured, not applied (each on the real arrays of one layer of the shape in the header; "
               "gain per step = (current - proposed) × occurrences per layer × layers):")
    out.append("")
    out.append("| change | current ms | proposed ms | gain per step | share of our step | how |")
    out.append("|---|---|---|---|---|---|")
    for f in p["fixes"]:
        gain = (f["current"] - f["proposed"]) * f["per_layer"] * p["L"]
        out.append(f"| {f['name']} | {f['current'] * 1e3:.2f} | {f['proposed'] * 1e3:.2f} | {gain * 1e3:.2f} ms | "
                   f"{gain / p['step']:.1%} | {f['how']} |")
    out.append("")
    out.append("cProfile of one step (top by own time):")
    out.append("")
    out.append("```")
    out.append(p["cprofile"])
    out.append("```")
    out.append("")
    return "\n".join(out)


def plot(res: dict, out_dir: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = []
    if "scaling" in res:
        panels += ["layers", "T", "bytes_T", "d"]
    if "ckpt" in res and res["ckpt"].get("plans"):
        panels.append("ckpt")
    if "main" in res:
        panels.append("main")
    if not panels:
        return
    cols = 3
    rows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 4 * rows), squeeze=False)
    colors = {"ours": "C0", "hand": "C1", "torch": "C2", "torch_sdpa": "C3"}
    for ax, panel in zip(axes.flat, panels):
        if panel in ("layers", "T", "d"):
            pts = res["scaling"][panel]
            xs = list(pts)
            for e in pts[xs[0]]["time"]:
                ys = [pts[x]["time"][e] * 1e3 for x in xs]
                ax.loglog(xs, ys, "o-", color=colors.get(e), label=f"{e} (k={slope(xs, ys):.2f})")
            ax.set_xlabel(panel)
            ax.set_ylabel("step ms")
            ax.set_title(f"step time vs {panel}")
        elif panel == "bytes_T":
            pts = res["scaling"]["T"]
            xs = list(pts)
            ys = [pts[x]["ours_bytes"] / MiB for x in xs]
            ax.loglog(xs, ys, "o-", color="C0", label=f"ours (k={slope(xs, ys):.2f})")
            if "torch_bytes" in pts[xs[0]]:
                yt = [pts[x]["torch_bytes"] / MiB for x in xs]
                ax.loglog(xs, yt, "s--", color="C2", label=f"torch (k={slope(xs, yt):.2f})")
            a, b = quad_fit(xs, [pts[x]["ours_bytes"] for x in xs])
            fine = np.geomspace(xs[0], xs[-1], 50)
            ax.loglog(fine, (a * fine + b * fine ** 2) / MiB, ":", color="k", label="a·T + b·T² fit")
            ax.set_xlabel("T")
            ax.set_ylabel("activation MiB (1 layer)")
            ax.set_title("saved bytes vs T")
        elif panel == "ckpt":
            c = res["ckpt"]
            names = list(c["plans"])
            xs = np.arange(len(names))
            n_ = c["threads"][-1]  # the machine's default count, the last one measured
            ax.bar(xs - 0.3, [c["plans"][n]["time_ratio"][n_] for n in names], 0.2, label="ours time ×")
            ax.bar(xs - 0.1, [c["plans"][n]["time_ratio_meta"][n_] for n in names], 0.2, label="ours time × (meta)")
            if "torch_time_ratio" in c["plans"][names[0]]:
                ax.bar(xs + 0.1, [c["plans"][n]["torch_time_ratio"][n_] for n in names], 0.2, label="torch time ×")
            ax.bar(xs + 0.3, [c["plans"][n]["flops_ratio"] for n in names], 0.2, label="ours FLOPs ×")
            ax.axhline(1, color="k", lw=0.5)
            top = max(bar.get_height() for bar in ax.patches)
            ax.set_ylim(0.8, 0.8 + (top - 0.8) * 1.5)  # room above the bars for the legend
            ax.set_xticks(xs, names)
            ax.set_title(f"checkpointing cost ({c['L']} layers, {n_} thread(s))")
        elif panel == "main":
            rows_ = [r for r in res["main"] if r["threads"] == res["main"][-1]["threads"]]
            labels = [f"{r['shape'][1]}/{r['shape'][2]}\nL{r['L']}" for r in rows_]
            xs = np.arange(len(rows_))
            ax.plot(xs, [r["time"]["ours"] / r["time"]["hand"] for r in rows_], "o-", label="ours / hand")
            if "torch" in rows_[0]["time"]:
                ax.plot(xs, [r["time"]["ours"] / r["time"]["torch"] for r in rows_], "s-", label="ours / torch")
                ax.plot(xs, [r["time"]["hand"] / r["time"]["torch"] for r in rows_], "^-", label="hand / torch")
            target = torch_target(rows_[0]["threads"])
            ax.axhline(target, color="C1", lw=0.8, ls="--", label=f"target: ours / torch median ≤ {target:.2f}")
            low, high = ax.get_ylim()
            ax.set_ylim(low, high + (high - low) * 0.4)  # room above the lines for the legend
            ax.set_xticks(xs, labels, fontsize=7)
            ax.set_title(f"time ratios (T/d, layers), {rows_[0]['threads']} thread(s)")
        ax.legend(fontsize=7, **({"loc": "upper center", "ncol": 2} if panel in ("ckpt", "main") else {}))
        ax.grid(True, which="both", alpha=0.3)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "benchmarks.png"), dpi=90)
    plt.close(fig)


# ---- main ---------------------------------------------------------------------------------------
def main(args) -> int:
    global CLOCK
    t_start = time.perf_counter()
    CLOCK = time.process_time if args.clock == "cpu" else time.perf_counter
    pin_threads(args.threads)
    os.makedirs(args.out, exist_ok=True)
    cfg = config(args.quick)
    if args.warm is None:
        args.warm = cfg["warm"]
    only = {s.strip() for s in args.only.split(",") if s.strip()} or {"erf", "main", "ckpt", "scaling", "attention",
                                                                              "ledger", "profile"}
    res = {"env": environment(args)}
    print(f"tinygrad_ckpt benchmarks ({'quick' if args.quick else 'full'}), threads={args.thread_counts}: "
          f"{res['env']['blas']}", flush=True)
    sections = (("erf", bench_erf), ("main", bench_main), ("ckpt", bench_ckpt), ("scaling", bench_scaling),
                ("attention", bench_attention), ("ledger", bench_ledger), ("profile", bench_profile))
    for name, fn in sections:
        if name in only:
            t0 = time.perf_counter()
            res[name] = fn(cfg, args)
            print(f"[{name}] {time.perf_counter() - t0:.1f} s", flush=True)
    res["env"]["load_end"] = os.getloadavg()
    res["env"]["uptime_end"] = _uptime()
    plot(res, args.out)
    text = write_report(res, args, args.out, time.perf_counter() - t_start)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(ARGS))

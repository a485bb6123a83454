"""The engine on a GPU: its ledger against CuPy's memory pool, and step times against NumPy and PyTorch.

    python benchmarks/gpu.py --out DIR            # needs an NVIDIA GPU, CuPy and PyTorch with CUDA
    bash benchmarks/gpu_run.sh DIR                # the whole check: install, tests with CuPy, this, lesson 5

1. pool: a 4-layer GPT training step (forward, backward, AdamW step) on CuPy under a Ledger. At every
   op boundary the ledger's live bytes are set beside `cupy.get_default_memory_pool().used_bytes()`.
   The ledger counts a CuPy buffer at the size of its pool block (requests round up to 512 bytes), so
   the two should agree exactly; every boundary where they differ is listed.
2. step: one training step (forward, backward, AdamW) of a 12-layer GPT, (B, T, d, H) = (8, 1024, 768,
   12), vocabulary 50304 (nanoGPT's GPT-2 small), float32, explicit attention: this engine on NumPy
   (the CPU, every core), on CuPy, and PyTorch on the same GPU (the same math: TorchBlock of
   benchmarks/torch_ref.py, cross-entropy, AdamW). Times are medians of timed steps after a warm-up
   step, from one run; the ratios are what to quote.

Writes DIR/gpu.json and DIR/gpu.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import tinygrad_ckpt as tg  # noqa: E402
from tinygrad_ckpt import backend, nn, optim  # noqa: E402
from tinygrad_ckpt.memory.ledger import Ledger  # noqa: E402
from tinygrad_ckpt.scale.measure import using_backend  # noqa: E402
from tinygrad_ckpt.units import format_bytes  # noqa: E402


# ---- 1. the ledger against the pool ----------------------------------------------------------------
class PoolLedger(Ledger):
    """A Ledger that also reads the CuPy pool's used bytes after every op (forward and backward)."""

    def __init__(self, pool):
        super().__init__()
        self.pool, self.rows = pool, []

    def _boundary(self, name: str) -> None:
        self.rows.append((self.step, self.current_phase, name, self.live_bytes(), int(self.pool.used_bytes())))

    def on_op(self, kind, name, ctx, outputs):
        super().on_op(kind, name, ctx, outputs)
        self._boundary(name)

    def on_backward_done(self, entry, grad_ins):
        super().on_backward_done(entry, grad_ins)
        self._boundary(entry.name)


def pool_check(steps: int = 2) -> dict:
    import cupy

    pool = cupy.get_default_memory_pool()
    with using_backend("cupy"):
        tg.manual_seed(0)
        model = nn.GPT(vocab_size=512, block_size=128, n_layer=4, n_head=4, d_model=256, dropout=0.1)
        opt = optim.AdamW(model.parameters(), lr=1e-3)
        idx = np.random.default_rng(0).integers(0, 512, (4, 128))
        model(idx, idx)[1].backward()  # a first step: AdamW's states, CuPy's kernels
        opt.step()
        opt.zero_grad()
        results = []
        for plan in (None, "every_layer"):
            model.checkpoint = plan
            for _ in range(steps):
                with PoolLedger(pool) as led:
                    start = (led.live_bytes(), int(pool.used_bytes()))
                    _, loss = model(idx, idx)
                    loss.backward()
                    opt.step()
                    opt.zero_grad()
                    del loss, _
                diffs = [(s, ph, n, lb, pb, pb - lb) for s, ph, n, lb, pb in led.rows]
                results.append(dict(
                    plan=plan or "none", boundaries=len(diffs), start_ledger=start[0], start_pool=start[1],
                    peak_ledger=led.peak_bytes(), peak_pool_seen=max(pb for *_, pb, _ in diffs),
                    equal=sum(d == 0 for *_, d in diffs), max_abs_diff=max(abs(d) for *_, d in diffs),
                    differing=[dict(step=s, phase=ph, op=n, ledger=lb, pool=pb, diff=d)
                               for s, ph, n, lb, pb, d in diffs if d][:40],
                ))
    return dict(results=results)


# ---- 2. step times ---------------------------------------------------------------------------------
SHAPE = dict(B=8, T=1024, d=768, H=12, L=12, vocab=50304)


def engine_step_times(backend_name: str, shape: dict, timed: int) -> dict:
    with using_backend(backend_name):
        be = backend.current()
        tg.manual_seed(0)
        model = nn.GPT(shape["vocab"], shape["T"], shape["L"], shape["H"], shape["d"])
        opt = optim.AdamW(model.parameters(), lr=1e-4)
        idx = np.random.default_rng(0).integers(0, shape["vocab"], (shape["B"], shape["T"]))

        def step():
            _, loss = model(idx, idx)
            loss.backward()
            opt.step()
            opt.zero_grad()
            be.synchronize()
            return float(loss.item())

        times, losses = [], []
        for i in range(1 + timed):
            t0 = time.perf_counter()
            losses.append(step())
            if i:
                times.append(time.perf_counter() - t0)
    return dict(median_s=statistics.median(times), times_s=times, losses=losses)


def torch_step_times(shape: dict, timed: int) -> dict:
    import torch
    import torch.nn.functional as TF

    from benchmarks.torch_ref import TorchBlock

    class TorchGPT(torch.nn.Module):
        def __init__(self):
            super().__init__()
            d = shape["d"]
            self.wte = torch.nn.Embedding(shape["vocab"], d)
            self.wpe = torch.nn.Embedding(shape["T"], d)
            self.h = torch.nn.ModuleList([TorchBlock(d, shape["H"]) for _ in range(shape["L"])])
            self.ln_f = torch.nn.LayerNorm(d)

        def forward(self, idx):
            pos = torch.arange(idx.shape[1], device=idx.device)
            x = self.wte(idx) + self.wpe(pos)
            for block in self.h:
                x = block(x)
            logits = self.ln_f(x) @ self.wte.weight.T  # lm_head tied to wte, as nanoGPT
            return TF.cross_entropy(logits.view(-1, logits.shape[-1]), idx.view(-1))

    torch.manual_seed(0)
    dev = torch.device("cuda")
    model = TorchGPT()
    for m in model.modules():  # nanoGPT's initialisation, as the engine's (PyTorch's N(0, 1) embeddings make the
        if isinstance(m, (torch.nn.Linear, torch.nn.Embedding)):  # tied logits of the input token huge: loss 0)
            torch.nn.init.normal_(m.weight, 0.0, 0.02)
        if isinstance(m, torch.nn.Linear):
            torch.nn.init.zeros_(m.bias)
    model = model.to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    idx = torch.from_numpy(np.random.default_rng(0).integers(0, shape["vocab"], (shape["B"], shape["T"]))).to(dev)
    times, losses = [], []
    for i in range(1 + timed):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss = model(idx)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        losses.append(float(loss.item()))
        if i:
            times.append(time.perf_counter() - t0)
    return dict(median_s=statistics.median(times), times_s=times, losses=losses,
                peak_allocated=int(torch.cuda.max_memory_allocated()), tf32=torch.backends.cuda.matmul.allow_tf32)


# ---- report -------------------------------------------------------------------------------------
def environment() -> dict:
    env = dict(python=platform.python_version(), numpy=np.__version__, cpus=os.cpu_count(), machine=platform.machine())
    try:
        import cupy

        env.update(cupy=cupy.__version__, gpu=cupy.cuda.runtime.getDeviceProperties(0)["name"].decode(),
                   cuda_runtime=cupy.cuda.runtime.runtimeGetVersion())
    except Exception as exc:  # noqa: BLE001  (reported, not hidden)
        env["cupy_error"] = repr(exc)
    try:
        import torch

        env["torch"] = torch.__version__
    except ImportError:
        pass
    return env


def write_report(res: dict, out: str) -> str:
    lines = ["# GPU check", "", f"Environment: {json.dumps(res['env'])}", ""]
    pool = res.get("pool")
    if pool and "results" in pool:
        lines += ["## The ledger against CuPy's memory pool (4-layer GPT step, op boundaries)", "",
                  "| plan | boundaries | equal | max abs difference | ledger peak | pool at its highest boundary |",
                  "|---|---|---|---|---|---|"]
        for r in pool["results"]:
            peaks = " | ".join(format_bytes(r[k], digits=2) for k in ("peak_ledger", "peak_pool_seen"))
            lines.append(f"| {r['plan']} | {r['boundaries']} | {r['equal']} | {r['max_abs_diff']:,} B | {peaks} |")
        lines.append("")
    elif pool:
        lines += [f"pool check failed: {pool['error']}", ""]
    step = res.get("step")
    if step:
        lines += [f"## Step time, 12-layer GPT {SHAPE}, float32 (forward, backward, AdamW)", "",
                  "| engine | median s | steps timed | losses |", "|---|---|---|---|"]
        for name, r in step.items():
            if "error" in r:
                lines.append(f"| {name} | failed: {r['error']} | | |")
            else:
                lines.append(f"| {name} | {r['median_s']:.3f} | {len(r['times_s'])} | "
                             f"{', '.join(f'{x:.4f}' for x in r['losses'])} |")
        ok = {k: v["median_s"] for k, v in step.items() if "median_s" in v}
        if {"cupy", "torch_cuda"} <= ok.keys():
            lines.append(f"\ncupy / torch_cuda = {ok['cupy'] / ok['torch_cuda']:.2f}")
        if {"numpy_cpu", "cupy"} <= ok.keys():
            lines.append(f"numpy_cpu / cupy = {ok['numpy_cpu'] / ok['cupy']:.1f}")
    text = "\n".join(lines) + "\n"
    with open(os.path.join(out, "gpu.md"), "w") as f:
        f.write(text)
    with open(os.path.join(out, "gpu.json"), "w") as f:
        json.dump(res, f, indent=1, default=str)
    return text


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--only", default="pool,cupy,torch_cuda,numpy_cpu",
                    help="comma-separated parts: pool, cupy, torch_cuda, numpy_cpu (results add to DIR/gpu.json)")
    ap.add_argument("--timed", type=int, default=3, help="timed steps on the GPU (NumPy: 1), after one warm-up step")
    ap.add_argument("--shape", default="", help="B,T,d,H,L,vocab instead of 8,1024,768,12,12,50304 (a quick try)")
    args = ap.parse_args(argv)
    if args.shape:
        SHAPE.update(zip(("B", "T", "d", "H", "L", "vocab"), map(int, args.shape.split(","))))
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "gpu.json")
    res = json.load(open(path)) if os.path.exists(path) else {}
    res["env"] = environment()
    runs = {"pool": pool_check, "cupy": lambda: engine_step_times("cupy", SHAPE, args.timed),
            "torch_cuda": lambda: torch_step_times(SHAPE, args.timed),
            "numpy_cpu": lambda: engine_step_times("numpy", SHAPE, 1)}
    for name in args.only.split(","):
        t0 = time.perf_counter()
        try:
            result = runs[name]()
        except Exception as exc:  # noqa: BLE001  (the other parts still run; the error is reported)
            result = dict(error=repr(exc))
        if name == "pool":
            res["pool"] = result
        else:
            res.setdefault("step", {})[name] = result
        print(f"{name}: {time.perf_counter() - t0:.0f} s", flush=True)
        write_report(res, args.out)
    print(write_report(res, args.out))

if __name__ == "__main__":
    main()

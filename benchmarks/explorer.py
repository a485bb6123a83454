"""Sizes and load times of memory explorer pages: the lessons' pages and a 50,000-event ledger.

    python benchmarks/explorer.py [--pages figures] [--layers 212] [--out DIR]

The large ledger is a real one: a steady-state AdamW training step of a 212-layer GPT (d_model 256,
T 64, B 2) on the meta backend, about 50,000 events. For it the script times Ledger.to_html and
Ledger.to_memory_viz and reports the files' sizes. Then every page (the lessons' *_explorer.html in
--pages, and the large one) is opened three times in headless Chromium (when it and Playwright are
installed): the time until the page is ready (from the start of navigation: reading the file, parsing
the data, the first drawing), and the median of 20 redraws of every panel, all steps shown and zoomed
to 1% of them. Times depend on the machine and its load; nothing here is asserted.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from tinygrad_ckpt.scale.estimate import GPTShape
from tinygrad_ckpt.scale.measure import SteadyStep
from tinygrad_ckpt.units import format_bytes

REDRAW = """([zoom]) => {
    const times = [];
    for (const v of explorer.views) {
        v.setView(0, v.run.xEnd * zoom);
        for (let k = 0; k < 20; k++) { const t = performance.now(); v.draw(); times.push(performance.now() - t); }
        v.setView(0, v.run.xEnd);
    }
    times.sort((a, b) => a - b);
    return times[times.length >> 1];
}"""


def large_ledger(n_layer: int):
    shape = GPTShape(n_layer=n_layer, d_model=256, n_head=4, seq_len=64, batch=2, vocab_size=1000, dtype="float32")
    return SteadyStep(shape, "adamw", np.float32).measure("none")[0]


def browser_times(pages):
    """{page: (median ready ms, median redraw ms all steps, zoomed)} or None without chromium/playwright."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        return None
    if not chromium:
        return None
    out = {}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        for path in pages:
            ready = []
            for _ in range(3):
                page.goto(Path(path).resolve().as_uri())
                page.wait_for_function("window.explorer && window.explorer.ready", timeout=60000)
                ready.append(page.evaluate("explorer.readyAt"))
            out[path] = (statistics.median(ready), page.evaluate(REDRAW, [1.0]), page.evaluate(REDRAW, [0.01]))
        browser.close()
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pages", default="figures", help="folder with the lessons' *_explorer.html (default figures)")
    parser.add_argument("--layers", type=int, default=212, help="layers of the large ledger's GPT (default 212)")
    parser.add_argument("--out", default=None, help="folder for the large page and snapshot (default: a temporary one)")
    args = parser.parse_args(argv)
    out = Path(args.out or tempfile.mkdtemp(prefix="explorer_bench_"))
    out.mkdir(parents=True, exist_ok=True)

    t0 = time.perf_counter()
    led = large_ledger(args.layers)
    measured = time.perf_counter() - t0
    t0 = time.perf_counter()
    big = led.to_html(out / "large_explorer.html", labels=[f"GPT, {args.layers} layers, one training step"])
    html_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    led.to_memory_viz(out / "large.pickle")
    viz_s = time.perf_counter() - t0
    print(f"large ledger: {len(led.events):,} events, {len(led.ops):,} ops, {len(led.lifetimes()):,} saved buffers "
          f"(measured in {measured:.1f} s)")
    print(f"  to_html        {html_s:6.2f} s  {format_bytes(os.path.getsize(big))}")
    print(f"  to_memory_viz  {viz_s:6.2f} s  {format_bytes(os.path.getsize(out / 'large.pickle'))}")

    pages = sorted(str(p) for p in Path(args.pages).glob("*_explorer.html")) + [big]
    times = browser_times(pages)
    print()
    print("| page | size | ready (ms) | redraw, all steps (ms) | redraw, 1% zoom (ms) |")
    print("|---|---|---|---|---|")
    for path in pages:
        cells = [f"{times[path][0]:.0f}", f"{times[path][1]:.1f}", f"{times[path][2]:.1f}"] if times else ["-"] * 3
        print(f"| {Path(path).name} | {format_bytes(os.path.getsize(path))} | " + " | ".join(cells) + " |")
    if times is None:
        print("(no chromium or no playwright: load times not measured)")


if __name__ == "__main__":
    main()

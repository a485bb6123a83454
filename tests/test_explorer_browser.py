"""The explorer page in a real browser: headless Chromium (the system's, driven by Playwright) opens a
plain-vs-checkpointed page and the pages lessons 4, 5 and 9 write. No console errors; hovering the peak
shows its op and bytes, hovering a bar the buffer's lifetime; clicking a layer, a bar or searching
highlights the right buffers in both views; zoom, pan and reset; screenshots are drawn.

Without chromium (or Playwright) these tests skip and say why; under CI (CI=true) they fail instead,
since .ci/run installs Debian's chromium. TINYGRAD_CKPT_CHROMIUM names another browser binary, and
TINYGRAD_CKPT_SCREENSHOTS a folder to keep the screenshots in (default: pytest's temporary folder).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import lesson_runs
import numpy as np
import pytest
from test_explorer import forward_backward

from tinygrad_ckpt.memory.palette import CATEGORY_COLORS

CHROMIUM = os.environ.get("TINYGRAD_CKPT_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")


def _missing() -> str | None:
    if not CHROMIUM:
        return "chromium is not installed (Debian: apt-get install chromium; .ci/run installs it)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright is not installed (pip install -e '.[test]')"
    return None


@pytest.fixture(scope="module")
def browser():
    reason = _missing()
    if reason:
        if os.environ.get("CI"):
            pytest.fail(f"CI runs the browser tests, but {reason}")
        pytest.skip(reason)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])  # CI runs as root
        yield chromium
        chromium.close()


@pytest.fixture(scope="module")
def shots(tmp_path_factory):
    folder = os.environ.get("TINYGRAD_CKPT_SCREENSHOTS")
    path = Path(folder) if folder else tmp_path_factory.mktemp("screenshots")
    path.mkdir(parents=True, exist_ok=True)
    return path


class Page:
    """One explorer page open in the browser, with the console errors it logged."""

    def __init__(self, browser, path):
        self.errors = []
        self.page = browser.new_page(viewport={"width": 1400, "height": 900})
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type in ("error", "warning") else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.goto(Path(path).resolve().as_uri())
        self.page.wait_for_function("window.explorer && window.explorer.ready", timeout=20000)

    def js(self, expression, arg=None):
        return self.page.evaluate(expression, arg)

    def hover(self, point) -> str:
        self.page.mouse.move(point["x"], point["y"])
        self.page.wait_for_selector("#tooltip", state="visible")
        return self.page.inner_text("#tooltip")

    def highlighted(self) -> list[int]:
        sections = "[...document.querySelectorAll('section.run')]"
        return [int(n) for n in self.js(f"{sections}.map(s => s.dataset.highlighted)")]

    def settle(self):
        self.js("() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")


def screenshot(page: Page, path) -> None:
    """Take a screenshot, and check it shows the categories' colors (the plots were drawn)."""
    import matplotlib.image

    page.page.mouse.move(2, 2)
    page.settle()
    page.page.screenshot(path=str(path), full_page=True)
    pixels = (matplotlib.image.imread(str(path))[..., :3] * 255).round().astype(int)
    colors = {tuple(int(c[i:i + 2], 16) for i in (1, 3, 5)) for c in CATEGORY_COLORS.values()}
    seen = {tuple(p) for p in np.unique(pixels.reshape(-1, 3), axis=0)}
    assert len(colors & seen) >= 3, f"the screenshot {path} shows few of the category colors"


# ---------------------------------------------------------------- a page whose ledgers the test holds

@pytest.fixture(scope="module")
def compared(browser, tmp_path_factory):
    plain, ckpt = (forward_backward(plan, n_layer=3, seq=32, batch=4) for plan in (None, "every_layer"))
    path = plain.to_html(tmp_path_factory.mktemp("pages") / "compare.html", compare=ckpt,
                         labels=["plain", "checkpointed"])
    page = Page(browser, path)
    yield (plain, ckpt), page
    page.page.close()


def memory_events(led):
    return [ev for ev in led.events if ev.action != "op"]


def test_loads_without_console_errors(compared):
    _, page = compared
    assert page.errors == []
    assert page.js("explorer.views.length") == 2


def test_hovering_the_peak_shows_its_op_and_bytes(compared):
    ledgers, page = compared
    for run, led in enumerate(ledgers):
        events = memory_events(led)
        total = led.timeline()["total"][[i for i, ev in enumerate(led.events) if ev.action != "op"]]
        peak = int(np.argmax(total))
        op = led.ops[events[peak].step]
        text = page.hover(page.js("([r, i]) => explorer.pointOf(r, i)", [run, peak]))
        assert f"op step {events[peak].step:,}" in text
        assert op["name"] in text and f"({op['op']}," in text
        assert f"{led.peak_bytes():,} B" in text and "total live" in text
        assert f"{events[peak].name}" in text
    assert page.errors == []


def test_hovering_a_bar_shows_the_buffer_lifetime(compared):
    (plain, _), page = compared
    life = next(lf for lf in plain.lifetimes() if lf.name == "transformer.h.0.mlp.gelu:x")
    text = page.hover(page.js("explorer.rowPoint(0, 'transformer.h.0.mlp.gelu:x')"))
    assert "transformer.h.0.mlp.gelu:x" in text and "layer transformer.h.0" in text
    assert f"{life.nbytes:,} B" in text
    assert f"saved at op step {life.created:,}" in text
    assert f"first read by backward at op step {life.first_used:,}" in text
    assert f"released at op step {life.released:,}" in text
    assert f"idle fraction {life.idle_fraction:.1%}" in text


def test_clicking_a_layer_highlights_its_buffers_in_both_views(compared):
    ledgers, page = compared
    page.page.click(".chip[data-layer='transformer.h.1']")
    page.settle()
    expected = [sum(lf.layer == "transformer.h.1" for lf in led.lifetimes()) for led in ledgers]
    assert page.highlighted() == expected and min(expected) > 0
    assert page.js("document.querySelector('.chip.selected').dataset.layer") == "transformer.h.1"
    # the memory plots draw the highlighted buffers' live bytes: at most what is live, more than nothing
    for run, led in enumerate(ledgers):
        most = page.js("r => Math.max(...explorer.views[r].selLive)", run)
        assert 0 < most <= led.peak_bytes()
    assert "transformer.h.1" in page.page.inner_text("#selection-info")
    page.page.keyboard.press("Escape")
    page.settle()
    assert page.highlighted() == [0, 0]


def test_clicking_a_bar_or_searching_highlights_those_buffers(compared):
    ledgers, page = compared
    point = page.js("explorer.rowPoint(0, 'transformer.h.2.attn.softmax:out')")
    page.page.mouse.click(point["x"], point["y"])
    page.settle()
    name = "transformer.h.2.attn.softmax:out"
    assert page.highlighted() == [sum(lf.name == name for lf in led.lifetimes()) for led in ledgers]
    page.page.fill("#search", "gelu:x")
    page.page.wait_for_function("document.getElementById('selection-info').textContent.includes('gelu:x')")
    page.settle()
    expected = []
    for led in ledgers:
        hit = {ev.buffer for ev in led.events if "gelu:x" in ev.name}
        expected.append(sum(lf.buffer in hit or "gelu:x" in lf.name for lf in led.lifetimes()))
    assert page.highlighted() == expected and min(expected) >= 3
    page.page.click("#clear")
    page.settle()
    assert page.highlighted() == [0, 0]


def test_zoom_pan_and_reset_along_the_op_axis(compared):
    ledgers, page = compared
    full = page.js("explorer.view(0)")
    assert full[0] == 0 and full[1] == ledgers[0].step + 1
    box = page.page.locator("canvas.timeline").first.bounding_box()
    page.page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    for _ in range(5):
        page.page.mouse.wheel(0, -200)
    page.settle()
    zoomed = page.js("explorer.view(0)")
    assert zoomed[1] - zoomed[0] < (full[1] - full[0]) / 3
    assert page.js("explorer.view(1)") == [0, ledgers[1].step + 1]  # each panel zooms on its own
    x, y = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
    page.page.mouse.move(x, y)
    page.page.mouse.down()
    page.page.mouse.move(x + 150, y, steps=5)
    page.page.mouse.up()
    page.settle()
    panned = page.js("explorer.view(0)")
    assert panned[0] < zoomed[0] and abs((panned[1] - panned[0]) - (zoomed[1] - zoomed[0])) < 1e-9
    page.page.click("#reset")
    page.settle()
    assert page.js("explorer.view(0)") == full
    assert page.errors == []


def test_compare_page_screenshot(compared, shots):
    _, page = compared
    page.page.click(".chip[data-layer='transformer.h.0']")
    screenshot(page, shots / "compare.png")
    page.page.keyboard.press("Escape")
    assert page.errors == []


# ---------------------------------------------------------------- the lessons' pages

LESSON_PAGES = {4: "04_the_ledger", 5: "05_the_checkpoint_segment", 9: "09_seed_at_full_scale"}


@pytest.fixture(scope="module")
def lessons(browser):
    results = lesson_runs.figures_command().results  # the session's one quick run of every lesson
    return {n: results[stem]["result"] for n, stem in LESSON_PAGES.items()}


def lesson_peaks(number, result) -> list[int]:
    """The peak of each panel of a lesson's page, as the lesson reports it."""
    if number == 4:
        return [result["peak_bytes"]]
    if number == 5:
        return [result["total_peak_plain"], result["total_peak_checkpointed"]]
    peaks = result["peaks"]
    return [peaks["adamw_fp32"]["none"], peaks["adamw_fp32"]["every_layer"], peaks["adamw_fp16"]["every_layer"]]


@pytest.mark.parametrize("number", sorted(LESSON_PAGES))
def test_lesson_page(number, lessons, browser, shots):
    result = lessons[number]
    assert result["explorer"].endswith(f"{LESSON_PAGES[number]}_explorer.html")
    page = Page(browser, result["explorer"])
    try:
        assert page.errors == []
        peaks = lesson_peaks(number, result)
        assert page.js("explorer.views.length") == len(peaks)
        for run, peak in enumerate(peaks):
            text = page.hover(page.js("r => explorer.pointOf(r, explorer.views[r].run.peak.event)", run))
            assert f"{peak:,} B" in text and "total live" in text
        page.page.click(".chip[data-layer='transformer.h.0']")
        page.settle()
        assert min(page.highlighted()) > 0
        screenshot(page, shots / f"{LESSON_PAGES[number]}_explorer.png")
        assert page.errors == []
    finally:
        page.page.close()


# ---------------------------------------------------------------- labels, and what a comparison must say

def test_labels_never_cover_each_other_and_each_layer_is_named_once(browser, tmp_path):
    """Equal peaks (a ledger beside itself twice), the phases' names and a checkpointed step's lifetimes, whose
    segments save one row each at the top before their replays save the rest; and the search box shows its hint."""
    led = forward_backward("every_layer", n_layer=3, seq=32, batch=4)
    page = Page(browser, led.to_html(tmp_path / "same.html", compare=[led, led], labels=["a", "b", "c"]))
    try:
        assert page.errors == []
        for boxes in page.js("explorer.views.map(v => v.labelBoxes)"):
            assert len(boxes) >= 3  # its peak, its marker and the two other peaks' labels (a phase's name or not)
            for i, a in enumerate(boxes):
                for b in boxes[i + 1:]:
                    assert not (a[0] < b[1] and b[0] < a[1] and a[2] < b[3] and b[2] < a[3]), (a, b)
        for names in page.js("explorer.views.map(v => v.gutterNames)"):
            assert len(names) == len(set(names)) and "transformer.h.1" in names
        hint, room = page.js("""() => { const s = document.getElementById("search"), st = getComputedStyle(s);
            const c = document.createElement("canvas").getContext("2d"); c.font = st.font;
            return [c.measureText(s.placeholder).width,
                    s.clientWidth - parseFloat(st.paddingLeft) - parseFloat(st.paddingRight)]; }""")
        assert hint <= room
    finally:
        page.page.close()


def test_a_comparison_says_when_the_ledgers_differ_in_untouched_bytes(browser, tmp_path):
    import gc

    from tinygrad_ckpt import nn

    gc.collect()
    plain = forward_backward()
    unused = nn.Linear(100, 100)  # alive, never run: 40,400 B untouched in the next ledger
    ckpt = forward_backward("every_layer")
    page = Page(browser, plain.to_html(tmp_path / "cmp.html", compare=ckpt, labels=["plain", "checkpointed"]))
    try:
        assert page.errors == []
        note = page.page.inner_text("#compare-note")
        assert note.startswith("Not the same untouched memory: plain: 0 B; checkpointed: 39.5 KiB, held before")
        assert "untouched (held before the ledger" in page.page.inner_text("#legend")
        assert "untouched 39.5 KiB" in page.page.inner_text("section.run:nth-of-type(2) .note")
        text = page.hover(page.js("explorer.pointOf(1, explorer.views[1].run.peak.event)"))
        assert f"{ckpt.peak_bytes():,} B" in text and "total live (what the run used)" in text
        assert f"{ckpt.peak_bytes() + unused.weight.nbytes + unused.bias.nbytes:,} B" in text  # held, untouched too
        screenshot(page, tmp_path / "untouched.png")
    finally:
        page.page.close()
    same = Page(browser, plain.to_html(tmp_path / "same.html", compare=plain, labels=["plain", "again"]))
    try:
        assert same.page.inner_text("#compare-note") == "" and "untouched" not in same.page.inner_text("#legend")
    finally:
        same.page.close()


def test_phases_are_shaded_by_the_ops_and_the_reserved_line_is_drawn(browser, tmp_path):
    """An AdamW step's ops run in the optimizer phase though they allocate nothing (their only memory events are
    zero_grad's releases after the last op): the shading follows the ops. A ledger with allocator= draws its
    reserved bytes, and the page's y axis holds their peak."""
    import tinygrad_ckpt as tg
    from tinygrad_ckpt import nn, optim

    tg.manual_seed(0)
    model = nn.GPT(64, 32, 2, 4, 64)
    opt = optim.AdamW(model.parameters())
    idx = np.random.default_rng(0).integers(0, 64, (4, 32))
    model(idx, idx)[1].backward()
    opt.step()
    opt.zero_grad()
    with tg.Ledger(allocator="pytorch-cuda") as led:
        model(idx, idx)[1].backward()
        opt.step()
        opt.zero_grad()
    page = Page(browser, led.to_html(tmp_path / "adamw.html"))
    try:
        assert page.errors == []
        runs = page.js("explorer.views[0].run.phaseRuns.map(([p, a, b]) => [DATA.phases[p].name, a, b])")
        phases = [o["phase"] for o in led.ops]
        assert [name for name, _, _ in runs][:3] == ["forward", "backward", "optimizer"]
        assert runs[2][1] == phases.index("optimizer") and runs[2][2] >= len(phases)
        assert page.js("explorer.views[0].run.reserved_peak") == led.placement.allocator.peak_reserved
        assert "reserved (PyTorch's caching allocator, simulated)" in page.page.inner_text("#legend")
    finally:
        page.page.close()

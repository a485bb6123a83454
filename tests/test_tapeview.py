"""print_saved lists exactly what a graph's entries saved, and the bytes a Ledger counts; draw_tape draws
them with graphviz or matplotlib, checkpoint entries grouped with the ops their block will replay."""

import numpy as np
import pytest

import tinygrad_ckpt as tg
from tinygrad_ckpt import functional as F
from tinygrad_ckpt.memory import tapeview


def _mlp_params(d=8, seed=0):
    rng = np.random.default_rng(seed)
    p = lambda *shape, name: tg.Parameter(rng.standard_normal(shape).astype(np.float32), name=name)
    return {"w1": p(4 * d, d, name="c_fc.weight"), "b1": p(4 * d, name="c_fc.bias"),
            "w2": p(d, 4 * d, name="c_proj.weight"), "b2": p(d, name="c_proj.bias"),
            "lw": p(d, name="ln.weight"), "lb": p(d, name="ln.bias")}


def _model(x, p, checkpointed):
    def mlp(h):
        with tg.name_scope("mlp"):
            return F.linear(F.gelu(F.linear(h, p["w1"], p["b1"])), p["w2"], p["b2"])

    with tg.name_scope("ln"):
        h = F.layer_norm(x, p["lw"], p["lb"])
    h = x + (tg.checkpoint(mlp, h, name="mlp") if checkpointed else mlp(h))
    return F.softmax(h, axis=-1).sum()


@pytest.fixture
def x():
    return tg.Tensor(np.random.default_rng(1).standard_normal((2, 4, 8)).astype(np.float32), requires_grad=True,
                     name="x")


@pytest.mark.parametrize("checkpointed", [False, True])
def test_rows_are_the_entries_saves_and_the_ledgers_activation_bytes(x, checkpointed, capsys):
    p = _mlp_params()
    with tg.Ledger() as led:
        rows = tg.print_saved(_model, x, p, checkpointed)
    printed = capsys.readouterr().out
    loss_tape = _model(x, p, checkpointed).tape()  # the same graph again, to compare entry by entry
    expected = [(i, e.name, k, tuple(a.shape), str(a.dtype)) for i, e in enumerate(loss_tape)
                for k, a in e.ctx.saved.items()]
    assert [(r.entry, r.name, r.saved, r.shape, r.dtype) for r in rows] == expected
    kinds = {(r.name, r.saved): r.kind for r in rows}
    assert kinds[("ln.layer_norm", "weight")] == "parameter"
    assert kinds[("softmax", "out")] == "activation"
    if checkpointed:
        assert [r.saved for r in rows if r.op == "checkpoint"] == ["input0"]  # the block keeps only its input
        assert not any(r.name.startswith("mlp.") and r.op != "checkpoint" for r in rows)
    else:
        assert kinds[("mlp.linear", "x")] == "activation" and kinds[("mlp.linear", "weight")] == "parameter"
    held = sum(r.nbytes for r in rows if r.same_as is None and r.kind != "parameter")
    assert held == led.peak_bytes("activation") > 0  # the graph died when print_saved returned: its peak
    for r in rows:
        assert f"#{r.entry}" in printed and r.saved in printed
    assert f"{len(rows)} saved arrays" in printed


def test_a_shared_buffer_is_counted_once_and_an_input_is_named(x):
    y = tg.Tensor(np.ones((2, 4, 8), np.float32), name="y")  # requires no grad: the graph does not point at it
    rows = tg.print_saved(lambda a, b: (a * a) * b, x, y)
    assert [(r.entry, r.saved, r.kind, r.same_as) for r in rows] == [
        (0, "b", "input", None), (0, "a", "input", 0),  # x * x saves x twice: listed twice, counted once
        (1, "b", "input", None),  # y: an argument, although no edge of the graph points at it
    ]
    rows = tg.print_saved(lambda a: (a * 2.0).exp(), x)
    assert [(r.entry, r.saved, r.kind) for r in rows] == [(1, "out", "activation")]


def test_after_backward_nothing_is_saved(x):
    loss = _model(x, _mlp_params(), checkpointed=True)
    assert tapeview.saved_arrays(loss) != []
    loss.backward()
    assert tapeview.saved_arrays(loss) == []


def test_matplotlib_drawing_groups_the_checkpoint_with_its_block(x, tmp_path):
    loss = _model(x, _mlp_params(), checkpointed=True)
    path = tmp_path / "tape.png"
    fig = tg.draw_tape(loss, path, engine="matplotlib")
    assert path.stat().st_size > 1000
    texts = [t.get_text() for t in fig.axes[0].texts]
    n = len(loss.tape())
    assert sum(t.startswith("#") for t in texts) == n  # one box per entry
    checkpoint_title = next(i for i, t in enumerate(texts) if "[checkpoint]" in t)
    after = texts[checkpoint_title:checkpoint_title + 6]
    assert any("replayed in backward: mlp.linear [linear] would save" in t for t in after)
    assert any("mlp.gelu [gelu] would save x [2, 4, 32]" in t for t in after)
    assert any("input0 [2, 4, 8] float32 256 B" in t for t in texts)


def test_graphviz_drawing_puts_the_block_in_the_checkpoints_cluster(x, tmp_path):
    if not tapeview._graphviz_available():
        pytest.skip("graphviz not installed (the graphviz Python package and the dot program)")
    loss = _model(x, _mlp_params(), checkpointed=True)
    path = tmp_path / "tape.png"
    dot = tg.draw_tape(loss, path, engine="graphviz")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tape.png"]  # no DOT source left behind
    src = dot.source
    cluster = src[src.index("subgraph cluster_"):]
    cluster = cluster[:cluster.index("}")]
    assert "[checkpoint]" in cluster and "mlp.gelu [gelu]" in cluster and "replayed in backward" in cluster
    assert src.count("subgraph cluster_") == 1
    assert "softmax" in src and "ln.weight [8]" in src  # entries outside; the leaf tensors each entry reads...
    assert "shape=ellipse" not in src and "from x [2, 4, 8]" in src  # ...named in its box, not a row of nodes


def test_auto_picks_what_is_installed(x, monkeypatch):
    loss = _model(x, _mlp_params(), checkpointed=False)
    monkeypatch.setattr(tapeview, "_graphviz_available", lambda: False)
    assert type(tg.draw_tape(loss)).__name__ == "Figure"
    with pytest.raises(RuntimeError, match="engine='graphviz' needs the graphviz Python package"):
        tg.draw_tape(loss, engine="graphviz")


def test_bad_arguments_say_what_to_pass(x):
    with pytest.raises(TypeError, match="draw_tape: expected a Tensor .* got ndarray"):
        tg.draw_tape(np.ones(3))
    with pytest.raises(ValueError, match="has no graph .*requires_grad=True"):
        tg.draw_tape(tg.Tensor(np.ones(3), name="plain") * 2)
    with pytest.raises(ValueError, match="tensor 'x' \\[2, 4, 8\\] has no graph .*leaf"):
        tg.draw_tape(x)
    with tg.no_grad():
        under_no_grad = x * 2
    with pytest.raises(ValueError, match="has no graph"):
        tg.draw_tape(under_no_grad)
    with pytest.raises(ValueError, match="engine must be 'auto', 'graphviz' or 'matplotlib', got 'svg'"):
        tg.draw_tape(x * 2, engine="svg")
    with pytest.raises(TypeError, match="print_saved: fn must be callable, got Tensor"):
        tg.print_saved(x, x)
    with pytest.raises(TypeError, match="returned float, not a Tensor"):
        tg.print_saved(lambda t: 1.0, x)
    loss = (x * x).sum()  # the engine works as before
    loss.backward()
    np.testing.assert_allclose(x.grad, 2 * x.data)

"""The tape: plain records, the bytes they hold, release after backward, freeing of unsaved
intermediates, error messages, anomaly detection, no_grad, pdb breakpoints, gradient accumulation."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import weakref

import numpy as np
import pytest
from helpers import owner, owner_nbytes, tiny_batch, tiny_gpt

import tinygrad_ckpt as tg
from tinygrad_ckpt import functional as F
from tinygrad_ckpt.engine.function import Context, Function


def _gpt_forward():
    model = tiny_gpt(vocab=11, block_size=8, n_layer=2, n_head=2, d_model=16)
    idx, targets = tiny_batch(vocab=11, batch=2, seq=8)
    logits, loss = model(idx, targets)
    return model, idx, targets, logits, loss


# ---- entries are plain, readable records ------------------------------------------------------


def test_entries_are_plain_records_with_readable_repr():
    model, _, _, _, loss = _gpt_forward()
    tape = loss.tape()
    assert isinstance(tape, tg.Tape) and len(tape) == len(tape.entries) > 0
    names = [e.name for e in tape.entries]
    for expected in ["transformer.wte.embedding", "transformer.wpe.embedding", "transformer.h.0.ln_1.layer_norm",
                     "transformer.h.0.attn.c_attn.linear", "transformer.h.0.attn.softmax",
                     "transformer.h.0.attn.c_proj.linear", "transformer.h.0.mlp.c_fc.linear",
                     "transformer.h.0.mlp.gelu", "transformer.h.1.mlp.gelu", "transformer.ln_f.layer_norm",
                     "lm_head.linear", "cross_entropy"]:
        assert expected in names, expected
    assert names[-1] == "cross_entropy" and names[0] == "transformer.wte.embedding"
    assert [e.seq for e in tape.entries] == sorted(e.seq for e in tape.entries)  # forward order
    for e in tape.entries:
        assert isinstance(e, tg.TapeEntry) and not hasattr(e, "__dict__")  # a plain record with fixed fields
        assert not e.released
        assert issubclass(e.fn, Function) and isinstance(e.ctx, Context)
        assert isinstance(e.ctx.saved, dict)
        assert all(s is None or isinstance(s, weakref.ref) or isinstance(s[0], tg.TapeEntry) for s in e.inputs)
        assert e.name.split(".")[-1] == e.op
        text = repr(e)
        assert "\n" not in text and text.startswith(f"{e.name} [{e.op}]")
    gelu = tape.entries[names.index("transformer.h.0.mlp.gelu")]
    text = repr(gelu)
    # input and output shapes, what is saved and its size: two [2, 8, 64] float32 = 2 x 4096 bytes
    assert "(transformer.h.0.mlp.c_fc.linear [2, 8, 64] float32) -> ([2, 8, 64] float32)" in text  # inputs by producer
    assert "saves x [2, 8, 64] float32, out [2, 8, 64] float32 (8.0 KiB)" in text
    assert gelu.saved_bytes() == 2 * (2 * 8 * 64 * 4)  # x, and out (c_proj keeps the same buffer)
    assert repr(tape).splitlines()[0].startswith(f"Tape with {len(tape)} entries")
    assert repr(tape).splitlines()[1].startswith(
        "  #0 transformer.wte.embedding [embedding] (transformer.wte.weight [11, 16]")
    qkv = repr(tape.entries[names.index("transformer.h.0.attn.c_attn.linear")])
    assert "(transformer.h.0.ln_1.layer_norm [2, 8, 16] float32, transformer.h.0.attn.c_attn.weight [48, 16] " \
           "float32, transformer.h.0.attn.c_attn.bias [48] float32)" in qkv
    assert sorted(p.name for p in model.parameters()) == sorted(dict(model.named_parameters()))
    assert "saves nothing (0 B)" in repr(tape.entries[names.index("transformer.h.0.add")])


def _declared_saves(tape):
    return [(e, a) for e in tape.entries for a in e.ctx.saved.values() if hasattr(a, "nbytes")]


def test_entry_saved_bytes_are_its_declared_arrays_by_buffer():
    _, _, _, _, loss = _gpt_forward()
    for e in loss.tape().entries:
        buffers = {id(owner(a)): owner_nbytes(a) for a in e.ctx.saved.values() if hasattr(a, "nbytes")}
        assert e.saved_bytes() == sum(buffers.values()), e
    # q, k, v are views of one c_attn output buffer: the first attention matmul (saves q and k) counts it once
    qk = next(e for e in loss.tape().entries if e.name == "transformer.h.0.attn.matmul")
    assert qk.saved_bytes() == 2 * 8 * 48 * 4


def test_simple_chain_tape_bytes_equal_declared_saves(rng):
    x = tg.Tensor(rng.standard_normal((4, 5)), requires_grad=True)
    y = F.log_softmax(F.gelu(x.exp() * 2.0))
    tape = y.tape()
    by_buffer = {id(owner(a)): owner_nbytes(a) for _, a in _declared_saves(tape)}
    # exp keeps its output (160 B), `* 2.0` (a Scale op) keeps nothing, gelu its input and output (2 x 160 B),
    # log_softmax its output (160 B)
    assert sum(by_buffer.values()) == 160 + 2 * 160 + 160
    assert tape.saved_bytes() == sum(by_buffer.values())


def test_tape_saved_bytes_count_each_buffer_once():
    _, _, _, _, loss = _gpt_forward()
    by_buffer = {id(owner(a)): owner_nbytes(a) for _, a in _declared_saves(loss.tape())}
    assert loss.tape().saved_bytes() == sum(by_buffer.values())


def test_after_backward_nothing_is_held():
    model, idx, targets, logits, loss = _gpt_forward()
    tape = loss.tape()
    param_buffers = {id(owner(p.data)) for p in model.parameters()}
    test_buffers = {id(owner(idx)), id(owner(targets)), id(owner(logits.data))}
    refs = [weakref.ref(a) for _, a in _declared_saves(tape)
            if id(owner(a)) not in param_buffers | test_buffers]
    assert len(refs) > 20
    logits_data = weakref.ref(owner(logits.data))  # its buffer: cross_entropy saved a view of it
    del logits
    assert logits_data() is not None
    loss.backward()
    assert all(e.ctx.saved == {} for e in tape.entries) and tape.entries[0].released
    assert tape.saved_bytes() == 0
    assert "released" in repr(tape.entries[0])
    assert [r() for r in refs if r() is not None] == []
    assert logits_data() is None


def test_unsaved_intermediate_is_freed_when_dropped(rng):
    x = tg.Tensor(rng.standard_normal((3, 4)), requires_grad=True)
    y = x + 1.0  # add saves nothing
    data = weakref.ref(y.data)
    s = y.sum()  # sum saves nothing either
    del y
    assert data() is None
    z = x.exp()  # exp keeps its output: dropping the tensor must not free it
    kept = weakref.ref(z.data)
    s2 = (z.sum() + s)
    del z
    assert kept() is not None
    s2.backward()
    assert kept() is None
    np.testing.assert_allclose(x.grad, 1 + np.exp(x.numpy()))


def test_tape_does_not_keep_inputs_alive_unless_saved(rng):
    w = tg.Tensor(rng.standard_normal((3, 4)), requires_grad=True)
    a = tg.Tensor(rng.standard_normal((3, 4)))  # no grad: a constant input
    a_data = weakref.ref(a.data)
    out = (a + w).sum()  # add saves nothing: the tape does not hold a
    del a
    assert a_data() is None
    b = tg.Tensor(rng.standard_normal((3, 4)))
    b_data = weakref.ref(b.data)
    out2 = (b * w).sum() + out  # mul keeps b, which w's gradient needs
    del b
    assert b_data() is not None
    out2.backward()
    assert b_data() is None
    leaf = tg.Tensor(rng.standard_normal(3), requires_grad=True)
    leaf_data = weakref.ref(leaf.data)
    y = (leaf * 2.0).sum()  # the tape reaches leaves by weak reference; mul saved the constant, not leaf
    del leaf
    assert leaf_data() is None
    y.backward()  # the gradient has nowhere to go, and that is not an error


# ---- errors ------------------------------------------------------------------------------------


def test_backward_on_non_scalar_says_what_to_do(rng):
    x = tg.Tensor(rng.standard_normal((2, 3)), requires_grad=True)
    y = x * 2.0
    with pytest.raises(RuntimeError, match=r"non-scalar tensor of shape \[2, 3\].*\.backward\(grad\).*\.sum\(\)"):
        y.backward()
    with pytest.raises(ValueError, match=r"grad has shape \[3\], the tensor \[2, 3\]"):
        y.backward(np.ones(3))
    y.backward(np.full((2, 3), 0.5))  # with a gradient it works
    np.testing.assert_allclose(x.grad, np.ones((2, 3)))
    with pytest.raises(RuntimeError, match="does not require grad"):
        tg.Tensor(np.ones(2)).sum().backward()


def test_second_backward_raises_and_retain_graph_allows_it(rng):
    x = tg.Tensor(rng.standard_normal(4), requires_grad=True)
    y = (x.exp() * x).sum()
    y.backward()
    once = x.grad.copy()
    with pytest.raises(RuntimeError, match="retain_graph"):
        y.backward()
    x2 = tg.Tensor(x.numpy(), requires_grad=True)
    y2 = (x2.exp() * x2).sum()
    y2.backward(retain_graph=True)
    assert not any(e.released for e in y2.tape().entries)
    y2.backward()
    np.testing.assert_allclose(x2.grad, 2 * once, rtol=1e-12)
    assert [e.released for e in y2.tape().entries] == [True, True, False]  # sum saved nothing to release
    with pytest.raises(RuntimeError, match="retain_graph"):
        y2.backward()


@pytest.mark.parametrize("make, pattern", [
    (lambda: tg.Tensor(np.ones((2, 3))) @ tg.Tensor(np.ones((4, 5))), r"matmul.*\[2, 3\].*\[4, 5\]"),
    (lambda: tg.Tensor(np.ones((2, 3))) + tg.Tensor(np.ones((4, 3))), r"add.*\[2, 3\].*\[4, 3\]"),
    (lambda: tg.Tensor(np.ones((2, 3))) * tg.Tensor(np.ones((2,))), r"mul.*\[2, 3\].*\[2\]"),
    (lambda: F.linear(tg.Tensor(np.ones((2, 3))), tg.Tensor(np.ones((5, 4)))), r"linear.*\[2, 3\].*\[5, 4\]"),
    (lambda: F.layer_norm(tg.Tensor(np.ones((2, 6))), tg.Tensor(np.ones(5)), tg.Tensor(np.zeros(5))),
     r"layer_norm.*\[5\].*\[2, 6\]"),
    (lambda: tg.Tensor(np.ones((2, 3))).reshape(4, 2), r"reshape.*\[2, 3\].*\[4, 2\]"),
    (lambda: F.cross_entropy(tg.Tensor(np.ones((4, 5))), np.zeros(3, dtype=np.int64)),
     r"cross_entropy.*\[4, 5\].*\[3\]"),
])
def test_shape_errors_name_the_op_and_both_shapes(make, pattern):
    with pytest.raises(ValueError, match=pattern):
        make()


def test_anomaly_names_the_first_op_producing_nan_in_forward(rng):
    x = tg.Tensor(np.array([1.0, 2.0, 3.0]), requires_grad=True)
    with np.errstate(all="ignore"):
        (x - 5.0).log().exp().sum()  # without detect_anomaly NaN passes silently
        with tg.detect_anomaly(), tg.name_scope("h.2"):
            with pytest.raises(FloatingPointError, match=r"forward of 'h\.2\.log'"):
                (x - 5.0).log().exp().sum()


def test_anomaly_names_the_op_producing_nan_in_backward():
    x = tg.Tensor(np.array([0.0, 1.0, 4.0]), requires_grad=True)
    with np.errstate(all="ignore"), tg.detect_anomaly():
        with tg.name_scope("mlp"):
            y = (x**0.5).sum()  # finite forward; d/dx sqrt(x) at 0 is inf
        with pytest.raises(FloatingPointError, match=r"backward of 'mlp\.pow' \(pow\)"):
            y.backward()
    x2 = tg.Tensor(np.array([0.0, 1.0]), requires_grad=True)
    with np.errstate(all="ignore"):
        (x2**0.5).sum().backward()  # anomaly mode is off again: no error
    assert np.isinf(x2.grad[0])


def test_no_grad_records_nothing(rng):
    x = tg.Tensor(rng.standard_normal((2, 3)), requires_grad=True)
    a = x * 3.0
    tape, n = a.tape(), len(a.tape())
    with tg.no_grad():
        b = F.gelu(a @ a.T).sum()
        c = x.exp()
    assert len(tape) == n
    assert not b.requires_grad and len(b.tape()) == 0 and len(c.tape()) == 0
    with pytest.raises(RuntimeError, match="does not require grad"):
        b.backward()
    d = (a * 2.0).sum()  # recording resumes after the block
    assert d.requires_grad and len(d.tape()) == n + 2


def test_backward_steps_visit_entries_in_reverse(rng):
    x = tg.Tensor(rng.standard_normal((2, 3)), requires_grad=True)
    with tg.name_scope("blk"):
        y = F.softmax(F.gelu(x) * 2.0).sum()
    names = [e.name for e in y.tape().entries]
    visited = [e.name for e in y.backward_steps()]
    assert visited == names[::-1] == ["blk.sum", "blk.softmax", "blk.scale", "blk.gelu"]
    assert x.grad is not None and all(e.released for e in y.tape().entries if e.op in ("gelu", "softmax"))


def _run_script(code, env_extra=None, stdin=""):
    env = {k: v for k, v in os.environ.items() if k != "TINYGRAD_CKPT_BREAK"}
    env.update(env_extra or {})
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], input=stdin, capture_output=True,
                          text=True, timeout=60, env=env)
    return proc.returncode, proc.stdout + proc.stderr


_GPT_SCRIPT = """
    import numpy as np
    import tinygrad_ckpt as tg
    from tinygrad_ckpt import nn
    tg.manual_seed(0)
    model = nn.GPT(11, 8, 2, 2, 16)
    idx = np.arange(16).reshape(2, 8) % 11
    _, loss = model(idx, idx)
    {before}
    loss.backward()
    print("DONE", model.transformer.h[0].attn.c_attn.weight.grad.shape)
"""


def test_break_before_opens_pdb_at_the_named_entry():
    code = _GPT_SCRIPT.format(before='tg.debug.break_before("softmax")')
    rc, out = _run_script(code, stdin="p entry.name\nc\n" * 4 + "q\n")
    assert rc == 0, out
    assert out.count("stopping before the backward of ") == 2  # one softmax per block
    assert "'transformer.h.1.attn.softmax'" in out and "'transformer.h.0.attn.softmax'" in out
    assert out.index("'transformer.h.1.attn.softmax'") < out.index("'transformer.h.0.attn.softmax'")  # backward order
    assert "DONE (48, 16)" in out


def test_break_from_environment_variable():
    rc, out = _run_script(_GPT_SCRIPT.format(before=""), {"TINYGRAD_CKPT_BREAK": "h.0.mlp.gelu"},
                          stdin="p entry.name\np [g.shape for g in grad_outs]\nc\n" * 3 + "q\n")
    assert rc == 0, out
    assert out.count("stopping before the backward of ") == 1
    assert "'transformer.h.0.mlp.gelu'" in out and "[(2, 8, 64)]" in out
    assert "DONE" in out


# ---- gradient accumulation ---------------------------------------------------------------------


def test_gradients_of_a_tensor_used_twice_accumulate(rng):
    x_np = rng.standard_normal(4)
    x = tg.Tensor(x_np, requires_grad=True)
    ((x * 2.0).sum() + (x * 3.0).sum()).backward()
    np.testing.assert_allclose(x.grad, np.full(4, 5.0))
    x = tg.Tensor(x_np, requires_grad=True)
    h = x.tanh()  # a non-leaf used in two places
    (h * 2.0 + h.exp()).sum().backward()
    t = np.tanh(x_np)
    np.testing.assert_allclose(x.grad, (2.0 + np.exp(t)) * (1 - t * t), rtol=1e-12)


def test_leaf_grad_accumulates_across_backward_calls(rng):
    x = tg.Tensor(rng.standard_normal(4), requires_grad=True)
    (x * 2.0).sum().backward()
    first = x.grad.copy()
    (x * 3.0).sum().backward()
    np.testing.assert_allclose(first, np.full(4, 2.0))
    np.testing.assert_allclose(x.grad, np.full(4, 5.0))
    x.sum().backward()  # a third graph; its gradient is a broadcast view that must not be written into
    np.testing.assert_allclose(x.grad, np.full(4, 6.0))
    x.zero_grad()
    assert x.grad is None


def test_model_gradients_accumulate_over_two_batches():
    model = tiny_gpt()
    idx, targets = tiny_batch()
    model(idx, targets)[1].backward()
    once = {n: p.grad.copy() for n, p in model.named_parameters()}
    model(idx, targets)[1].backward()
    for n, p in model.named_parameters():
        np.testing.assert_allclose(p.grad, 2 * once[n], rtol=1e-6, atol=1e-9, err_msg=n)


def test_independent_graphs_can_each_be_differentiated():
    x = tg.Tensor(np.ones(3), requires_grad=True)
    y1 = (x * x).sum()
    y2 = (x * 3.0).sum()
    y1.backward()
    y2.backward()
    np.testing.assert_allclose(x.grad, np.full(3, 5.0))


def test_leaf_grads_are_independent_writable_arrays():
    a = tg.Tensor(np.ones(3), requires_grad=True)
    b = tg.Tensor(np.ones(3), requires_grad=True)
    (a + b).sum().backward()
    assert a.grad is not b.grad
    a.grad *= 0.5
    np.testing.assert_allclose(b.grad, np.ones(3))

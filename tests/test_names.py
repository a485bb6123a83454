"""One naming scheme: ops, parameters, their gradients and optimizer states all under the module path,
as in state_dict(); checkpoint entries named after what they hold; readable reprs."""

import numpy as np
import pytest
from helpers import train_step

import tinygrad_ckpt as tg
from tinygrad_ckpt import nn, optim


def _step(checkpoint=None, opt_cls=optim.AdamW):
    tg.manual_seed(0)
    model = nn.GPT(32, 8, 2, 2, 16, checkpoint=checkpoint)
    opt = opt_cls(model.parameters())
    idx = np.random.default_rng(0).integers(0, 32, (2, 8))
    train_step(model, opt, idx)
    with tg.Ledger() as led:
        train_step(model, opt, idx)
    return model, opt, led


def test_ops_are_named_on_the_parameters_path():
    model, _, led = _step()
    op_names = {op["name"] for op in led.ops if op["phase"] == "forward"}
    params = dict(model.named_parameters())
    for op, param in [("transformer.h.0.attn.c_attn.linear", "transformer.h.0.attn.c_attn.weight"),
                      ("transformer.h.1.ln_2.layer_norm", "transformer.h.1.ln_2.weight"),
                      ("transformer.wte.embedding", "transformer.wte.weight"),
                      ("transformer.ln_f.layer_norm", "transformer.ln_f.weight")]:
        assert op in op_names and param in params
        assert op.rsplit(".", 1)[0] == param.rsplit(".", 1)[0]  # the same module path


def test_parameters_gradients_and_optimizer_states_under_the_full_path():
    model, _, led = _step()
    names = {(e.category, e.name) for e in led.events if e.action in ("existing", "allocated")}
    for path, _ in model.named_parameters():
        assert ("parameter", path) in names
        assert ("optimizer", f"{path}:adamw.m") in names and ("optimizer", f"{path}:adamw.v") in names
        assert ("gradient", f"{path}.grad") in names, path
    # the gradients of one linear's input, weight and bias are three names
    grads = {n for c, n in names if c == "gradient"}
    assert {"transformer.h.1.mlp.c_proj.weight.grad", "transformer.h.1.mlp.c_proj.bias.grad",
            "transformer.h.1.mlp.gelu.grad"} <= grads
    assert not any(n in ("m.grad", "weight.grad") or n.endswith("linear.grad.grad") for n in grads)
    assert not {n for c, n in names if c == "optimizer" and ":" not in n}  # no bare "m", "v"


def test_sgd_states_and_csv_carry_the_names(tmp_path):
    _, _, led = _step(opt_cls=lambda ps: optim.SGD(ps, lr=0.1, momentum=0.9))
    led.to_csv(tmp_path / "events.csv")
    text = (tmp_path / "events.csv").read_text()
    assert "transformer.h.0.mlp.c_fc.weight:sgd.velocity" in text
    assert "transformer.h.0.mlp.c_fc.weight.grad" in text


def test_checkpoint_entries_say_what_they_hold():
    model, _, led = _step(checkpoint="every_layer")
    assert "transformer.h.0.checkpoint" in {op["name"] for op in led.ops}
    tg.manual_seed(0)
    model = nn.GPT(32, 8, 4, 2, 16, checkpoint=2)
    idx = np.random.default_rng(0).integers(0, 32, (2, 8))
    _, loss = model(idx, idx)
    names = [e.name for e in loss.tape()]
    assert "transformer.h.0-1.checkpoint" in names
    x = tg.Tensor(np.ones(3), requires_grad=True, name="x")

    def square(a):
        return a * a

    assert square.__name__ in repr(tg.checkpoint(square, x).tape()[0])
    entry = tg.checkpoint(lambda a: a * 2, x, name="double").tape()[0]
    assert entry.name == "double.checkpoint"
    assert repr(entry.ctx.replay) == "<replay of double: 1 argument(s), its RNG state>"


def test_replay_leaves_are_named_after_the_arguments():
    x = tg.Tensor(np.ones(3), requires_grad=True, name="x")
    seen = []

    def f(a):
        seen.append(a.name)
        return (a * a).sum()

    tg.checkpoint(f, x).backward()
    assert seen == ["x", "x"]  # the forward, then the replay's leaf


@pytest.mark.parametrize("make", [
    lambda: tg.Tensor(np.ones(2), name="w"),
    lambda: optim.AdamW([tg.Tensor(np.ones(2), requires_grad=True, name="w")]),
    lambda: nn.Linear(2, 3),
    lambda: tg.Ledger(),
    lambda: tg.save_matmuls,
    lambda: tg.engine.tape._Gradients(None),
    lambda: tg.state.local,
])
def test_objects_a_learner_meets_have_short_readable_reprs(make):
    text = repr(make())
    assert " object at 0x" not in text and len(text) < 200, text

"""tinygrad_ckpt.torch_bridge: the engine's plans and policies applied to a PyTorch GPT, and what PyTorch keeps
for backward (measured per storage) against the engine's ledger, NumPy and meta."""

from __future__ import annotations

import numpy as np
import pytest
from needs import TORCH_MISSING

torch = pytest.importorskip("torch", reason=TORCH_MISSING)

import tinygrad_ckpt as tg  # noqa: E402
from tinygrad_ckpt import backend, nn  # noqa: E402
from tinygrad_ckpt import torch_bridge as tb  # noqa: E402
from tinygrad_ckpt.recompute import planner  # noqa: E402

VOCAB, T, B, L, H, D = 64, 32, 4, 4, 4, 64
PLANS = {"none": None, "every_layer": "every_layer", "sqrt": "sqrt", "korthikanti_selective": tg.korthikanti_selective}


def _engine_peak(dropout: float, spec, backend_name: str) -> int:
    """The ledger's activation peak of one forward + backward of the engine's GPT on a backend."""
    previous = backend.current().name
    backend.use_backend(backend_name)
    try:
        tg.manual_seed(0)
        model = nn.GPT(VOCAB, T, L, H, D, dropout=dropout, checkpoint=spec)
        idx = backend.current().asarray(np.random.default_rng(0).integers(0, VOCAB, (B, T)))
        with tg.Ledger() as led:
            _, loss = model(idx, idx)
            loss.backward()
        return led.peak_bytes("activation")
    finally:
        backend.use_backend(previous)


@pytest.mark.parametrize("dropout", [0.0, 0.1])
@pytest.mark.parametrize("plan", list(PLANS))
def test_pytorch_saved_bytes_agree_with_the_ledger_like_for_like(plan, dropout):
    spec = PLANS[plan]
    engine = _engine_peak(dropout, spec, "numpy")
    assert _engine_peak(dropout, spec, "meta") == engine  # the meta ledger counts the same bytes
    tg.manual_seed(0)
    torch_model = tb.TorchGPT.from_engine(nn.GPT(VOCAB, T, L, H, D, dropout=dropout), checkpoint=spec)
    idx = np.random.default_rng(0).integers(0, VOCAB, (B, T))
    step = tb.measure_step(torch_model, idx, idx)
    terms = step.like_for_like()
    # to the byte, but for the loss's term where the peak is the forward's end (see test_saves_profiles)
    assert terms["comparable"] == engine + (4 - B * T * 5 if spec is None else 0), (plan, dropout, engine, terms)
    # each adjustment is a measured term that exists only where its reason does
    assert (terms["noise"] > 0) == (dropout > 0)  # CPU dropout keeps float noise, 4 bytes an element
    assert terms["noise"] == 32 * terms["noise_masks"]
    after_forward = step.like_for_like(at="after_forward")
    assert (after_forward["dead_cache"] > 0) == (plan == "korthikanti_selective")  # only selective caches
    # ... and only it draws again the noise of a dropout its policy keeps
    assert (terms["regenerated"] > 0) == (plan == "korthikanti_selective" and dropout > 0)
    assert terms["comparable"] == (terms["held"] - terms["dead_cache"] - terms["stranded_cache"] - terms["entering"]
                                   - terms["noise"] + terms["noise_masks"] + terms["regenerated"])
    if dropout == 0 and plan != "korthikanti_selective":
        assert abs(step.peak / engine - 1) < 0.01  # raw, no adjustment needed
    with pytest.raises(ValueError, match="at must be 'peak', 'forward', 'backward' or 'after_forward', got 'end'"):
        step.like_for_like(at="end")


def test_the_like_for_like_count_is_the_sum_of_its_storages_at_every_event():
    """like_for_like's replay keeps a running count as holders come and go and regions' forwards end; at every
    event of a selective step with dropout it equals the count taken storage by storage afresh."""
    from tinygrad_ckpt.torch_bridge.saves import _EngineCount

    tg.manual_seed(0)
    torch_model = tb.TorchGPT.from_engine(nn.GPT(VOCAB, T, 2, H, D, dropout=0.1),
                                          checkpoint=tg.korthikanti_selective)
    idx = np.random.default_rng(0).integers(0, VOCAB, (B, T))
    log = tb.measure_step(torch_model, idx, idx).meter.log
    count = _EngineCount(lambda n: -(-n // 8))
    for event in log:
        count.step(event)
        assert count.total == sum(count.counted(k) for k in count.records.values())
    assert {e[1] for e in log} >= {"saved", "entered", "recomputed", "cached", "regenerated", "forward_done"}


def test_plans_change_memory_not_results():
    tg.manual_seed(0)
    engine = nn.GPT(VOCAB, T, L, H, D)
    idx = np.random.default_rng(1).integers(0, VOCAB, (B, T))
    _, loss = engine(idx, idx)
    loss.backward()
    grads = {n: p.grad for n, p in engine.named_parameters()}
    peaks = {}
    for name, spec in {**PLANS, "save_matmuls": tg.save_matmuls, "2 segments": 2,
                       "plan": planner.sequential_plan(L, 2, last_plain=True)}.items():
        model = tb.TorchGPT.from_engine(engine, checkpoint=spec)
        step = tb.measure_step(model, idx, idx)
        assert step.loss == pytest.approx(loss.item(), rel=1e-5)
        for n, p in model.named_parameters():
            np.testing.assert_allclose(p.grad.numpy(), grads[n], rtol=2e-4, atol=2e-6, err_msg=f"{name}: {n}")
        assert 0 < step.after_forward <= step.peak
        peaks[name] = step.like_for_like()["comparable"]  # raw, selective's dead cache puts it above "none"
    assert peaks["every_layer"] < peaks["sqrt"] < peaks["korthikanti_selective"] < peaks["none"]


def test_weights_copy_both_ways():
    tg.manual_seed(3)
    engine = nn.GPT(VOCAB, T, 2, H, D)
    model = tb.TorchGPT.from_engine(engine)
    state = model.engine_state()
    assert set(state) == set(engine.state_dict())
    with torch.no_grad():
        model.transformer.h[1].mlp.c_fc.weight.mul_(2)
    tg.manual_seed(4)
    other = nn.GPT(VOCAB, T, 2, H, D)
    other.load_state_dict(model.engine_state())
    np.testing.assert_array_equal(other.state_dict()["transformer.h.1.mlp.c_fc.weight"],
                                  2 * engine.state_dict()["transformer.h.1.mlp.c_fc.weight"])
    with pytest.raises(KeyError, match="missing"):
        model.load_engine_state({})


def test_aten_ops_get_the_engine_names_the_policies_decide_on():
    aten = torch.ops.aten
    assert tb.engine_op(aten.addmm.default, "transformer.h.0.attn.c_attn") == (
        "linear", "transformer.h.0.attn.c_attn.linear")
    assert tb.engine_op(aten.bmm.default, "transformer.h.0.attn") == ("matmul", "transformer.h.0.attn.matmul")
    assert tb.engine_op(aten._softmax.default, "transformer.h.2.attn") == ("softmax", "transformer.h.2.attn.softmax")
    assert tb.engine_op(aten.transpose.int, "transformer.h.0.attn") == ("reshape", "transformer.h.0.attn.reshape")
    assert tb.engine_op(aten.bernoulli_.float, "transformer.h.0.mlp.dropout")[0] == "dropout"
    assert not tg.korthikanti_selective.decide(*tb.engine_op(aten._softmax.default, "transformer.h.0.attn")).save
    assert tg.korthikanti_selective.decide(*tb.engine_op(aten.gelu.default, "transformer.h.0.mlp")).save
    assert tg.save_matmuls.decide(*tb.engine_op(aten.addmm.default, "transformer.h.0.mlp.c_fc")).save


@pytest.mark.parametrize("spec", ["every_other", 0, 9, True, planner.sequential_plan(2, 1)])
def test_a_bad_plan_is_refused_by_name(spec):
    tg.manual_seed(0)
    model = tb.TorchGPT.from_engine(nn.GPT(VOCAB, T, L, H, D), checkpoint=spec)
    idx = np.zeros((1, T), dtype=np.int64)
    with pytest.raises(ValueError, match="checkpoint"):
        tb.measure_step(model, idx, idx)
    model.checkpoint = "every_layer"  # works as before after the error
    assert tb.measure_step(model, idx, idx).peak > 0


def test_one_meter_at_a_time():
    with tb.SavedBytes(), pytest.raises(RuntimeError, match="one meter"):
        tb.SavedBytes().__enter__()
    assert tb.SavedBytes.active is None


@pytest.mark.parametrize("zero_weight", [False, True])
def test_output_saving_layer_norm_matches_pytorchs(zero_weight):
    """torch_bridge.LayerNorm keeps its output and 1/std, not its input; its gradients are torch.nn.LayerNorm's
    (float64 central differences too), a weight of exactly 0 included."""
    torch.manual_seed(0)
    ours, stock = tb.LayerNorm(6).double(), torch.nn.LayerNorm(6).double()
    with torch.no_grad():
        for m in (ours, stock):
            m.weight.copy_(torch.linspace(-1.5, 2.0, 6, dtype=torch.float64))
            m.bias.copy_(torch.linspace(0.3, -0.7, 6, dtype=torch.float64))
            if zero_weight:
                m.weight[2] = 0.0
    x = torch.randn(3, 4, 6, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, w, b: tb.output_saving_layer_norm(x, w, b, 1e-5)[0],
                                    (x, ours.weight, ours.bias))
    g = torch.randn(3, 4, 6, dtype=torch.float64)
    grads = [torch.autograd.grad(m(x), (x, m.weight, m.bias), g) for m in (ours, stock)]
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    with torch.autograd.graph.saved_tensors_hooks(lambda t: kept.append(t) or t, lambda t: t):
        kept = []
        ours(x)
    assert not any(t.data_ptr() == x.data_ptr() for t in kept)  # the input is not kept


def test_a_half_loaded_state_is_refused_naming_every_key_and_nothing_is_copied():
    tg.manual_seed(0)
    gpt = nn.GPT(VOCAB, T, 2, H, D)
    model = tb.TorchGPT.from_engine(gpt)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    state = {k: v + 1.0 for k, v in gpt.state_dict().items()}
    half = {k: v for k, v in state.items() if not k.startswith("transformer.h.1.")} | {"transformer.h.2.x": 1.0}
    with pytest.raises(KeyError, match=r"missing keys \['transformer\.h\.1\.attn\.c_attn\.bias', .*unexpected keys "
                                       r"\['transformer\.h\.2\.x'\]; nothing was loaded"):
        model.load_engine_state(half)
    wrong = {**state, "transformer.h.0.ln_1.weight": np.ones((1, D), np.float32),
             "lm_head.weight": state["transformer.wte.weight"] * 2}
    with pytest.raises(ValueError, match=r"'transformer\.h\.0\.ln_1\.weight' is \[1, 64\] float32, the model's is "
                                         r"\[64\] float32; .*'lm_head\.weight' name one tied parameter"):
        model.load_engine_state(wrong)  # a [1, d] would broadcast into [d]: refused
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k
    model.load_engine_state(state)
    name = "transformer.h.1.mlp.c_fc.weight"
    assert np.array_equal(model.engine_state()[name], state[name])

"""What the framework saves, as a switch the ops read (tg.saves_like): "engine" (this engine's own), "pytorch"
(PyTorch's autograd on CUDA) and "megatron" (Korthikanti et al. 2022, Table 2). The values are the same
whichever; what is kept differs, and the meta run measures it."""

import numpy as np
import pytest
from needs import TORCH_MISSING

import tinygrad_ckpt as tg
from tinygrad_ckpt import estimate as est
from tinygrad_ckpt import nn
from tinygrad_ckpt.measure import SteadyStep, saved_after_forward

IDX = np.random.default_rng(0).integers(0, 64, (2, 32))


@pytest.mark.parametrize("s,b,h,a", [(64, 2, 64, 4), (128, 1, 96, 8), (32, 3, 128, 8)])
def test_megatron_saves_korthikantis_table_2_to_the_byte(s, b, h, a):
    shape = est.GPTShape(n_layer=2, d_model=h, n_head=a, seq_len=s, batch=b, vocab_size=64, dtype="float16",
                         dropout=0.1)
    with tg.saves_like("megatron"):
        led, _ = SteadyStep(shape).measure()
    per_layer = sum(e.nbytes for e in saved_after_forward(led, "transformer.h.0").values())
    assert per_layer == sum(est.korthikanti_terms(s, b, h, a).values())  # sbh(34 + 5as/h), no term left


@pytest.mark.parametrize("model", ["gpt", "llama"])
def test_the_values_are_the_same_whichever_framework_saves(model):
    """The forward is bit for bit the same; the backward reads other saves (x̂ from the input or the output) and
    agrees to rounding."""
    results = {}
    for framework in ("engine", "pytorch", "megatron"):
        tg.manual_seed(0)
        m = (nn.GPT(64, 32, 2, 4, 32, dropout=0.1) if model == "gpt"
             else nn.Llama(64, 32, 2, 4, 32, n_kv_head=2, ffn_hidden=48)).to(np.float64)
        tg.manual_seed(1)
        with tg.saves_like(framework):
            _, loss = m(IDX, IDX)
            loss.backward()
        results[framework] = (loss.item(), [p.grad for p in m.parameters()])
    base_loss, base_grads = results["engine"]
    for framework, (loss, grads) in results.items():
        assert loss == base_loss, framework
        for g, e in zip(grads, base_grads):
            np.testing.assert_allclose(g, e, rtol=1e-9, atol=1e-12)


def test_each_framework_keeps_its_own_arrays():
    x = tg.Tensor(np.random.default_rng(0).standard_normal((2, 4, 8)).astype(np.float32), requires_grad=True)
    ln = nn.LayerNorm(8)
    saved = {}
    for framework in ("engine", "pytorch", "megatron"):
        with tg.saves_like(framework):
            y = tg.functional.dropout(ln(x), 0.5)
        saved[framework] = [sorted(e.ctx.saved) for e in y.tape()]
    assert saved["engine"] == [["bias", "out", "rstd", "weight"], ["mask_bits"]]
    assert saved["pytorch"] == [["bias", "mean", "rstd", "weight", "x"], ["mask"]]
    assert saved["megatron"] == [["bias", "weight", "x"], ["mask"]]
    with pytest.raises(ValueError, match=r"saves_like: framework must be one of 'engine', 'pytorch', 'megatron'"):
        tg.saves_like("jax")


@pytest.mark.parametrize("dropout", [0.0, 0.1])
@pytest.mark.parametrize("plan", [None, "every_layer", "sqrt", "selective"])
def test_pytorch_saves_what_pytorch_keeps(plan, dropout):
    """The engine under saves_like("pytorch") against PyTorch's own step (torch.nn.LayerNorm) measured storage by
    storage (torch_bridge.SavedBytes). Without dropout or a policy, within 1% after the forward and at the peak.
    Otherwise two named terms are set aside: CPU dropout keeps its noise in float32 (4 B an element) where CUDA
    keeps a bool mask (1 B), and selective checkpointing caches outputs nothing needs; the peaks then agree within
    2%, the rest being where inside a replay each frees what it no longer needs."""
    torch_bridge = pytest.importorskip("tinygrad_ckpt.torch_bridge", reason=TORCH_MISSING)
    spec = tg.korthikanti_selective if plan == "selective" else plan
    tg.manual_seed(0)
    gpt = nn.GPT(64, 32, 4, 4, 64, dropout=dropout, checkpoint=spec)
    with tg.saves_like("pytorch"), tg.Ledger() as led:
        _, loss = gpt(IDX, IDX)
        after_forward = led.live_bytes("activation")
        loss.backward()
    step = torch_bridge.measure_step(torch_bridge.TorchGPT.from_engine(gpt, checkpoint=spec, saves="pytorch"),
                                     IDX, IDX)
    terms = step.like_for_like(masks="bytes")
    if dropout == 0 and plan != "selective":  # nothing to set aside: storage for storage, within 1%
        assert terms["noise"] == terms["dead_cache"] == 0
        assert abs(step.after_forward - after_forward) <= 0.01 * after_forward
        assert abs(step.peak - led.peak_bytes("activation")) <= 0.01 * led.peak_bytes("activation")
    else:  # the two named terms set aside; what is left is where inside a replay each framework frees (<= 2%)
        assert terms["noise"] > 0 or terms["dead_cache"] > 0
        assert abs(terms["comparable"] - led.peak_bytes("activation")) <= 0.02 * led.peak_bytes("activation")


@pytest.mark.parametrize("plan", [None, "every_layer", "sqrt", 2])
def test_pytorch_saves_on_a_llama_differ_from_pytorchs_by_named_terms(plan):
    """The engine's Llama under saves_like("pytorch") against the bridge's TorchLlama (PyTorch on CPU), storage by
    storage after the forward. Every byte of difference is a named term from the shapes: CPU's rms_norm is composite
    (it keeps x·rsqrt(mean(x²) + eps) for the weight's multiply, B·T·d, beyond CUDA's fused kernel's input and
    1/rms), the bridge repeats k and v to every query head (the engine's grouped-query attention never does: 2·B·(H -
    Hkv)·T·hd per layer), and PyTorch's cross-entropy keeps its log-softmax and a 0-d weight where the engine keeps
    the logits, a log-sum-exp and a valid flag per row."""
    torch_bridge = pytest.importorskip("tinygrad_ckpt.torch_bridge", reason=TORCH_MISSING)
    B, T, d, H, Hkv, L, w = 2, 32, 64, 4, 2, 4, 4
    idx = np.random.default_rng(0).integers(0, 64, (B, T))
    tg.manual_seed(0)
    llama = nn.Llama(64, T, L, H, d, n_kv_head=Hkv, ffn_hidden=96, checkpoint=plan)
    with tg.saves_like("pytorch"), tg.Ledger() as led:
        _, loss = llama(idx, idx)
        after_forward = led.live_bytes("activation")
        loss.backward()
    step = torch_bridge.measure_step(torch_bridge.TorchLlama.from_engine(llama, checkpoint=plan), idx, idx)
    norm = B * T * d * w  # one composite rms_norm's x·rsqrt
    repeated = 2 * B * (H - Hkv) * T * (d // H) * w  # k and v repeated to H heads, beyond their Hkv
    loss_term = 4 - B * T * (w + 1)
    blocks = L * (2 * norm + repeated) if plan is None else 0  # a checkpointed block keeps only its input
    assert step.after_forward - after_forward == blocks + norm + loss_term  # model.norm's, the loss's
    if plan is None:
        by_layer, ours = step.meter.by_layer(), led.saved_breakdown(by="layer")
        for k in range(L):
            assert by_layer[f"model.layers.{k}"] - ours[f"model.layers.{k}"] == 2 * norm + repeated

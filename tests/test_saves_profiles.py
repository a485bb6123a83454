"""What the framework saves, as a switch the ops read (tg.saves_like): "engine" (this engine's own), "pytorch"
(PyTorch's autograd on CUDA) and "megatron" (Korthikanti et al. 2022, Table 2). The values are the same
whichever; what is kept differs, and the meta run measures it."""

import numpy as np
import pytest
from needs import TORCH_MISSING

import tinygrad_ckpt as tg
from tinygrad_ckpt import nn
from tinygrad_ckpt.scale import estimate as est
from tinygrad_ckpt.scale.measure import SteadyStep, saved_after_forward

IDX = np.random.default_rng(0).integers(0, 64, (2, 32))


@pytest.mark.parametrize("s,b,h,a", [(64, 2, 64, 4), (128, 1, 96, 8), (32, 3, 128, 8)])
def test_megatron_saves_korthikantis_table_2_to_the_byte(s, b, h, a):
    shape = est.GPTShape(n_layer=2, d_model=h, n_head=a, seq_len=s, batch=b, vocab_size=64, dtype="float16",
                         dropout=0.1)
    with tg.saves_like("megatron"):
        led, _ = SteadyStep(shape).measure()
    per_layer = sum(e.nbytes for e in saved_after_forward(led, "transformer.h.0").values())
    assert per_layer == sum(est.korthikanti_terms(s, b, h, a).values())  # sbh(34 + 5as/h), no term left


@pytest.mark.parametrize("model", ["gpt", "llama", "mixtral"])
def test_the_values_are_the_same_whichever_framework_saves(model):
    """The forward is bit for bit the same; the backward reads other saves (x̂ from the input or the output) and
    agrees to rounding."""
    results = {}
    for framework in ("engine", "pytorch", "megatron"):
        tg.manual_seed(0)
        m = (nn.GPT(64, 32, 2, 4, 32, dropout=0.1) if model == "gpt"
             else nn.Llama(64, 32, 2, 4, 32, n_kv_head=2, ffn_hidden=48,
                           n_experts=4 if model == "mixtral" else 0)).to(np.float64)
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
@pytest.mark.parametrize("plan", [None, "every_layer", "sqrt", 2, "selective"])
@pytest.mark.parametrize("model", ["gpt", "llama"])
def test_pytorch_saves_what_pytorch_keeps(model, plan, dropout):
    """The engine under saves_like("pytorch") against PyTorch's own step (torch.nn.LayerNorm; the bridge's Llama),
    measured storage by storage (torch_bridge.SavedBytes), after the forward and at the peak. Every byte of
    difference is a named term, each measured in PyTorch's step (TorchStep.like_for_like): CPU dropout's float
    noise (CUDA keeps a bool mask), what selective checkpointing caches that backward never reads or that the
    replay never takes back, the masks the engine keeps where it regenerates noise, a checkpoint's input saved as
    it enters (the engine saves it as it leaves), and the loss: PyTorch's cross-entropy keeps its log-softmax
    [N, V] and a 0-d total where the engine keeps the logits [N, V], a float32 log-sum-exp and a bool per row."""
    torch_bridge = pytest.importorskip("tinygrad_ckpt.torch_bridge", reason=TORCH_MISSING)
    spec = tg.korthikanti_selective if plan == "selective" else plan
    tg.manual_seed(0)
    if model == "gpt":
        engine = nn.GPT(64, 32, 4, 4, 64, dropout=dropout, checkpoint=spec)
    else:
        engine = nn.Llama(64, 32, 4, 4, 64, n_kv_head=2, ffn_hidden=96, dropout=dropout, checkpoint=spec)
    with tg.saves_like("pytorch"), tg.Ledger() as led:
        _, loss = engine(IDX, IDX)
        after_forward = led.live_bytes("activation")
        loss.backward()
    torch_model = (torch_bridge.TorchGPT.from_engine(engine, checkpoint=spec, saves="pytorch") if model == "gpt"
                   else torch_bridge.TorchLlama.from_engine(engine, checkpoint=spec))
    step = torch_bridge.measure_step(torch_model, IDX, IDX)
    loss_term = 4 - IDX.size * (4 + 1)
    forward, peak = step.like_for_like(masks="bytes", at="after_forward"), step.like_for_like(masks="bytes")
    assert forward["comparable"] == after_forward + loss_term
    assert peak["comparable"] == led.peak_bytes("activation") + (loss_term if plan is None else 0)  # else: freed
    # each named term is there only where its reason is
    assert (peak["noise"] > 0) == (dropout > 0)
    assert (forward["dead_cache"] > 0) == (plan == "selective")
    assert (peak["regenerated"] > 0) == (plan == "selective" and dropout > 0 and model == "gpt")  # resid dropout
    if dropout == 0 and plan != "selective":  # no term but the loss's: the raw bytes agree within 1%
        assert abs(step.peak - led.peak_bytes("activation")) <= 0.01 * led.peak_bytes("activation")


@pytest.mark.parametrize("dropout", [0.0, 0.1])
@pytest.mark.parametrize("plan", [None, "every_layer", 2, "selective"])
def test_pytorch_saves_on_a_mixtral_what_hugging_faces_block_keeps(plan, dropout):
    """A Mixtral block as Hugging Face writes it (softmax, topk, a division by the sum, per expert torch.where, an
    indexed weight times the expert's output, index_add) against the engine's three MoE ops under
    saves_like("pytorch"): to the byte after the forward, and at the peak of the forward and of the backward, but
    for the named terms. Under the selective policy the cache also holds, while a block's forward runs, what the
    engine's one-op routing and combine never make: the loop's E accumulators [N, d] (index_add out of place), its
    E masks chosen == e [N, k], and topk's values before the division [N, k]."""
    torch_bridge = pytest.importorskip("tinygrad_ckpt.torch_bridge", reason=TORCH_MISSING)
    spec = tg.korthikanti_selective if plan == "selective" else plan
    N, d, E, k = IDX.size, 64, 4, 2
    tg.manual_seed(0)
    engine = nn.Llama(64, 32, 2, 4, d, n_kv_head=2, ffn_hidden=48, n_experts=E, experts_per_token=k,
                      dropout=dropout, checkpoint=spec)
    with tg.saves_like("pytorch"), tg.Ledger() as led:
        _, loss = engine(IDX, IDX)
        after_forward = led.live_bytes("activation")
        loss.backward()
    step = torch_bridge.measure_step(torch_bridge.TorchLlama.from_engine(engine, checkpoint=spec), IDX, IDX)
    timeline = led.timeline()
    forward = timeline["phase"] == "forward"
    in_forward, in_backward = timeline["activation"][forward].max(), timeline["activation"][~forward].max()
    loss_term = 4 - N * (4 + 1)
    loop = E * N * d * 4 + E * N * k + N * k * 4 if plan == "selective" else 0
    assert step.like_for_like(masks="bytes", at="after_forward")["comparable"] == after_forward + loss_term
    # the forward peaks at its end, the loss's arrays held, but under the selective policy: inside the last block
    assert step.like_for_like(masks="bytes", at="forward")["comparable"] == in_forward + (
        loop if plan == "selective" else loss_term)
    if plan is not None:  # (without checkpoints the backward only lets go)
        assert step.like_for_like(masks="bytes", at="backward")["comparable"] == in_backward


def test_hugging_faces_eager_forms_keep_more_by_the_named_terms():
    """The two forms the bridge's Llama leaves out, measured: CPU's composite rms_norm keeps x·rstd beside x and
    rstd (B·T·d more than CUDA's fused kernel), and eager attention's repeat_kv keeps k and v at H heads (2·B·(H -
    Hkv)·T·hd more than grouped attention)."""
    torch_bridge = pytest.importorskip("tinygrad_ckpt.torch_bridge", reason=TORCH_MISSING)
    import torch

    B, T, d, H, Hkv = 2, 8, 16, 4, 2
    hd, w = d // H, 4
    g = torch.Generator().manual_seed(0)
    x = torch.randn(B, T, d, generator=g, requires_grad=True)
    weight = torch.nn.Parameter(torch.ones(d))
    q = torch.randn(B, Hkv, H // Hkv, T, hd, generator=g, requires_grad=True)
    k, v = (torch.randn(B, Hkv, T, hd, generator=g, requires_grad=True) for _ in range(2))

    def kept(f):  # what the graph of f() holds for backward while its output lives
        with torch_bridge.SavedBytes(exclude={weight.untyped_storage().data_ptr()}) as meter:
            out = f()
            held = meter.live
        del out
        return held

    composite = kept(lambda: weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5)))
    assert composite - kept(lambda: torch_bridge.rms_norm(x, weight, 1e-5)[0]) == B * T * d * w

    def repeated():
        kr, vr = (t.repeat_interleave(H // Hkv, dim=1) for t in (k, v))
        return torch.softmax(q.reshape(B, H, T, hd) @ kr.transpose(-2, -1), -1) @ vr

    def grouped():
        return torch.einsum("bkgts,bksd->bkgtd", torch.softmax(torch.einsum("bkgtd,bksd->bkgts", q, k), -1), v)

    torch.testing.assert_close(repeated(), grouped().reshape(B, H, T, hd))
    assert kept(repeated) - kept(grouped) == 2 * B * (H - Hkv) * T * hd * w


def test_one_saves_like_object_reenters_and_is_reused():
    """`ctx = tg.saves_like(...)` entered twice, and inside itself (as PyTorch's mode objects allow; issue 38)."""
    ctx = tg.saves_like("pytorch")
    for _ in range(2):
        with ctx:
            with ctx, tg.saves_like("megatron"):
                assert tg.state.local.saves == "megatron"
            assert tg.state.local.saves == "pytorch"
        assert tg.state.local.saves == "engine" and tg.state.local.op_variants == {}

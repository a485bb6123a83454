"""nn.Llama (Llama, Mistral, Mixtral): Hugging Face's names, exact against a PyTorch implementation in float64 (dense,
grouped-query, multi-query, mixture of experts, with and without checkpointing), checkpointed gradients bitwise equal
to plain under every plan, the selective policy, the meta backend's ledger equal to NumPy's, and the presets at full
size on the meta backend."""

from __future__ import annotations

import gc
import re
import time

import numpy as np
import pytest
from needs import TORCH_MISSING

import tinygrad_ckpt as tg
from tinygrad_ckpt import backend, nn, optim
from tinygrad_ckpt.recompute import planner
from tinygrad_ckpt.recompute.policies import korthikanti_selective
from tinygrad_ckpt.scale import estimate as est
from tinygrad_ckpt.scale.measure import estimate_step, layer_costs

V, BLOCK, L, H, D = 61, 16, 3, 4, 32
MODELS = {  # name: nn.Llama keyword arguments
    "dense": dict(ffn_hidden=40),
    "gqa": dict(ffn_hidden=40, n_kv_head=2),
    "mqa": dict(ffn_hidden=40, n_kv_head=1, tie_embeddings=True),
    "moe": dict(ffn_hidden=24, n_kv_head=2, n_experts=4, experts_per_token=2),
}


def make(name="dense", dtype=np.float64, seed=0, **kw):
    tg.manual_seed(seed)
    model = nn.Llama(V, BLOCK, L, H, D, **{**MODELS[name], **kw})
    if name == "moe":
        model.output_router_logits = True  # the load-balancing loss, in the loss and its gradient
    return model.to(dtype)


def batch(seed=1, B=2, T=12):
    rng = np.random.default_rng(seed)
    return rng.integers(0, V, (B, T)), rng.integers(0, V, (B, T))


def grads_of(model, idx, targets):
    model.zero_grad()
    tg.manual_seed(5)  # the same dropout masks each time
    logits, loss = model(idx, targets)
    loss.backward()
    return logits.numpy(), loss.item(), {n: p.grad.copy() for n, p in model.named_parameters()}


# ---- structure and names ----------------------------------------------------------------------------------------
def test_state_dict_names_and_shapes_are_hugging_faces():
    model = make("gqa", np.float32)
    sd = model.state_dict()
    hd, kv = D // H, 2
    expected = {"model.embed_tokens.weight": (V, D), "model.norm.weight": (D,), "lm_head.weight": (V, D)}
    for i in range(L):
        p = f"model.layers.{i}."
        expected |= {p + "input_layernorm.weight": (D,), p + "post_attention_layernorm.weight": (D,),
                     p + "self_attn.q_proj.weight": (H * hd, D), p + "self_attn.k_proj.weight": (kv * hd, D),
                     p + "self_attn.v_proj.weight": (kv * hd, D), p + "self_attn.o_proj.weight": (D, H * hd),
                     p + "mlp.gate_proj.weight": (40, D), p + "mlp.up_proj.weight": (40, D),
                     p + "mlp.down_proj.weight": (D, 40)}
    assert {k: v.shape for k, v in sd.items()} == expected
    assert model.num_parameters() == est.parameter_count(est.LlamaShape(L, D, H, 8, 1, V, BLOCK, n_kv_head=2,
                                                                         ffn_hidden=40))
    assert [n for n, _ in model.named_buffers()] == ["model.rotary_emb.table"]  # not a parameter, not in state_dict


def test_moe_names_and_tied_embeddings():
    sd = make("moe").state_dict()
    assert "model.layers.0.block_sparse_moe.gate.weight" in sd and sd["model.layers.0.block_sparse_moe.gate.weight"] \
        .shape == (4, D)
    for e in range(4):
        for w, shape in (("w1", (24, D)), ("w2", (D, 24)), ("w3", (24, D))):
            assert sd[f"model.layers.2.block_sparse_moe.experts.{e}.{w}.weight"].shape == shape
    assert not any(".mlp." in k for k in sd)
    tied = make("mqa")
    assert tied.lm_head.weight is tied.model.embed_tokens.weight
    assert {"lm_head.weight", "model.embed_tokens.weight"} <= set(tied.state_dict())  # both names, as PyTorch
    assert tied.num_parameters() == sum(p.size for p in tied.parameters())


def test_a_hugging_face_layout_loads_and_round_trips():
    model = make("moe")
    sd = {k: np.random.default_rng(0).standard_normal(v.shape) for k, v in model.state_dict().items()}
    model.load_state_dict(sd)
    assert all(np.array_equal(model.state_dict()[k], v) for k, v in sd.items())
    with pytest.raises(KeyError, match="missing keys"):
        model.load_state_dict({k: v for k, v in sd.items() if "experts.3.w2" not in k})


def test_ops_are_named_by_module_path():
    model = make("moe", np.float32)
    idx, targets = batch()
    _, loss = model(idx, targets)
    names = {e.name for e in loss.tape()}
    for name in ("model.layers.0.input_layernorm.rms_norm", "model.layers.0.self_attn.rotary",
                 "model.layers.1.self_attn.softmax", "model.layers.2.block_sparse_moe.topk_routing",
                 "model.layers.2.block_sparse_moe.dispatch", "model.layers.2.block_sparse_moe.experts.3.act_fn.silu",
                 "model.layers.2.block_sparse_moe.experts.3.w2.linear", "model.layers.2.block_sparse_moe.combine",
                 "model.norm.rms_norm", "lm_head.linear"):
        assert name in names, name
    dense = make("dense", np.float32)
    rows = tg.print_saved(lambda i: dense(i, i)[1], idx)
    saved = {f"{r.name}:{r.saved}" for r in rows}
    assert sum(r.nbytes for r in rows if r.saved == "table" and r.same_as is None) == 2 * BLOCK * (D // H) * 4
    assert {"model.layers.0.mlp.act_fn.silu:x", "model.layers.0.input_layernorm.rms_norm:rstd",
            "model.layers.2.self_attn.rotary:table"} <= saved


def test_default_ffn_is_metas_rule_and_bad_arguments_are_named():
    assert nn.llama_ffn_hidden(4096) == 11008
    assert est.llama_ffn_hidden(4096, 1024, 1.3) == 14336 and est.llama_ffn_hidden(8192, 4096, 1.3) == 28672
    assert nn.Llama(V, 8, 1, 4, 32).model.layers[0].mlp.gate_proj.weight.shape == (nn.llama_ffn_hidden(32), 32)
    for kwargs, match in [(dict(n_kv_head=3), "n_kv_head=3 must divide n_head=4"),
                          (dict(n_experts=2, experts_per_token=3), "experts_per_token=3 is more than n_experts=2"),
                          (dict(attention="flash"), "attention must be 'explicit' or 'chunked'"),
                          (dict(rope_theta=0), "rope_theta must be a base > 0")]:
        with pytest.raises(ValueError, match=re.escape(match)):
            nn.Llama(V, 8, 1, 4, 32, **kwargs)
    with pytest.raises(ValueError, match="head_dim = d_model/n_head = 3 must be even"):
        nn.Llama(V, 8, 1, 4, 12)
    with pytest.raises(ValueError, match="sequence length 9 exceeds block_size 8"):
        nn.Llama(V, 8, 1, 4, 32)(np.zeros((1, 9), np.int64))


# ---- against PyTorch ----------------------------------------------------------------------------------------------
torch_plans = pytest.mark.parametrize("plan", [None, "every_layer", 2])


def _relative(ours, theirs) -> float:
    theirs = np.asarray(theirs)
    return float(np.abs(np.asarray(ours) - theirs).max() / max(np.abs(theirs).max(), 1e-300))


def torch_worst(name: str, engine_plan=None, torch_plan=None, attention="explicit") -> float:
    """The worst relative difference, over the logits, the loss and every parameter gradient, between nn.Llama and
    TorchLlama (the same weights) in float64."""
    torch = pytest.importorskip("torch", reason=TORCH_MISSING)
    from tinygrad_ckpt import torch_bridge as tb

    model = make(name, attention=attention, checkpoint=engine_plan)
    reference = tb.TorchLlama.from_engine(model, checkpoint=torch_plan)
    idx, targets = batch()
    logits, loss, grads = grads_of(model, idx, targets)
    t_logits, t_loss = reference(torch.as_tensor(idx), torch.as_tensor(targets))
    t_loss.backward()
    worst = max(_relative(logits, t_logits.detach().numpy()), _relative(loss, t_loss.item()))
    params = dict(reference.named_parameters())
    for n, g in grads.items():
        worst = max(worst, _relative(g, params[n].grad.numpy()))
    if name == "moe":
        worst = max(worst, _relative(model.aux_loss.item(), reference.aux_loss.item()))
    return worst


@torch_plans
@pytest.mark.parametrize("name", list(MODELS))
def test_logits_loss_and_every_gradient_equal_pytorch(name, plan):
    worst = torch_worst(name, engine_plan=plan, torch_plan=plan)
    print(f"[{name}, plan {plan}] worst relative difference to PyTorch {worst:.2e}")
    assert worst < 1e-10


def test_chunked_attention_and_a_policy_equal_pytorch():
    assert torch_worst("gqa", attention="chunked") < 1e-10
    assert torch_worst("moe", engine_plan=korthikanti_selective, torch_plan="every_layer") < 1e-10


def test_weights_copy_both_ways():
    torch = pytest.importorskip("torch", reason=TORCH_MISSING)
    from tinygrad_ckpt import torch_bridge as tb

    model = make("moe", np.float32)
    reference = tb.TorchLlama.from_engine(model)
    assert reference.lm_head.weight.dtype == torch.float32
    with torch.no_grad():
        for p in reference.parameters():
            p.mul_(1.5)
    model.load_state_dict(reference.engine_state())
    assert all(np.array_equal(model.state_dict()[k], v) for k, v in reference.engine_state().items())
    with pytest.raises(KeyError, match="missing"):
        reference.load_engine_state({"lm_head.weight": model.lm_head.weight.numpy()})


def test_the_load_balancing_loss_is_mixtrals():
    """E·Σ_e f_e·P_e over every layer's tokens at once, computed from the router logits as Hugging Face does."""
    torch = pytest.importorskip("torch", reason=TORCH_MISSING)
    from tinygrad_ckpt import torch_bridge as tb

    model = make("moe")
    idx, targets = batch()
    _, loss = model(idx, targets)
    reference = tb.TorchLlama.from_engine(model)
    _, t_loss = reference(torch.as_tensor(idx), torch.as_tensor(targets))
    assert model.aux_loss.item() == pytest.approx(reference.aux_loss.item(), rel=1e-12)
    assert 1.0 <= model.aux_loss.item() <= 4.0  # 1 when balanced; at most E
    model.output_router_logits = False
    _, plain = model(idx, targets)
    assert model.aux_loss is None
    assert loss.item() == pytest.approx(plain.item() + 0.001 * reference.aux_loss.item(), rel=1e-12)


# ---- checkpointing: every plan, bitwise --------------------------------------------------------------------------
def _nested():
    inner = planner.Plan([planner.Segment(0, 1, True), planner.Segment(1, 2)])
    return planner.Plan([planner.Segment(0, 2, True, inner), planner.Segment(2, 3, True)])


PLANS = {"every_layer": "every_layer", "sqrt": "sqrt", "2 segments": 2, "nested": _nested(),
         "korthikanti_selective": korthikanti_selective, "save_matmuls": tg.save_matmuls}


@pytest.mark.parametrize("name", list(MODELS))
def test_checkpointed_gradients_are_bitwise_equal_to_plain(name):
    model = make(name, dropout=0.1)  # attention dropout: the replays must draw the same masks
    idx, targets = batch()
    logits, loss, grads = grads_of(model, idx, targets)
    for label, plan in PLANS.items():
        model.checkpoint = plan
        c_logits, c_loss, c_grads = grads_of(model, idx, targets)
        assert c_loss == loss and np.array_equal(c_logits, logits), label
        for n in grads:
            assert np.array_equal(c_grads[n], grads[n]), (label, n)


def test_the_planner_plans_a_llama_under_a_budget():
    model = make("gqa", np.float32)
    idx, targets = batch()
    _, loss, grads = grads_of(model, idx, targets)
    ledgers = {}
    for spec in (None, "every_layer"):
        model.checkpoint = spec
        gc.collect()
        with tg.Ledger() as led:
            model(idx, targets)[1].backward()
        ledgers[spec] = led
    layers = [f"model.layers.{i}" for i in range(L)]
    x_bytes = idx.size * D * 4
    costs = layer_costs(ledgers[None], ledgers["every_layer"], layers, x_bytes)
    assert all(c.saved_bytes > x_bytes and c.forward_flops > c.tail_flops > 0 for c in costs)
    least = planner.minimum_peak_bytes(costs)
    plan = planner.plan_chain(costs, (least + sum(c.saved_bytes for c in costs)) // 2)
    assert 0 < len(plan.checkpoint_boundaries()) < L
    model.checkpoint = plan
    _, c_loss, c_grads = grads_of(model, idx, targets)
    assert c_loss == loss and all(np.array_equal(c_grads[n], grads[n]) for n in grads)


def test_selective_recompute_keeps_no_attention_matrix_and_keeps_the_rotary_outputs():
    model = make("gqa", np.float32, checkpoint=korthikanti_selective)
    idx, targets = batch(B=2, T=12)
    gc.collect()
    with tg.Ledger() as led:
        model(idx, targets)[1].backward()
    forward_saves = [e for e in led.events if e.phase == "forward" and e.action == "saved"]
    assert not any(e.shape[-2:] == (12, 12) and len(e.shape) >= 4 for e in forward_saves)  # no [.., T, T] kept
    kept = {e.name.split("[")[0].split(":")[0] for e in forward_saves}
    assert "model.layers.0.self_attn.rotary" in kept and "model.layers.0.self_attn.o_proj.linear" in kept
    assert "model.layers.0.self_attn.softmax" not in kept
    replayed = {op["name"] for op in led.ops if op["phase"] == "recompute" and op["flops"]}
    assert {"model.layers.0.self_attn.matmul", "model.layers.0.self_attn.softmax"} <= replayed
    assert "model.layers.0.self_attn.rotary" not in replayed and "model.layers.0.mlp.act_fn.silu" not in replayed


def test_korthikanti_decides_as_before_for_gpt():
    policy = korthikanti_selective
    for name, op, save in [("transformer.h.3.attn.softmax", "softmax", False),
                           ("transformer.h.3.attn.matmul", "matmul", False),
                           ("transformer.h.3.attn.masked_fill", "masked_fill", False),
                           ("transformer.h.3.attn.c_attn.linear", "linear", True),
                           ("transformer.h.3.attn.reshape", "reshape", False),
                           ("transformer.h.3.mlp.gelu", "gelu", True), ("transformer.h.3.ln_1.layer_norm",
                                                                       "layer_norm", True)]:
        assert policy.decide(op, name).save is save, name


# ---- what the ledger sees -----------------------------------------------------------------------------------------
def _activation_names(model, idx, targets):
    gc.collect()
    with tg.Ledger() as led:
        model(idx, targets)[1].backward()
    return led


def test_the_explorer_names_saves_by_module_path(tmp_path):
    idx, targets = batch()
    led = _activation_names(make("moe", np.float32), idx, targets)
    page = (tmp_path / "llama.html")
    led.to_html(str(page))
    text = page.read_text()
    for name in ("model.layers.1.block_sparse_moe.experts.2.act_fn.silu:x", "model.layers.0.self_attn.rotary:table",
                 "model.layers.2.post_attention_layernorm.rms_norm:rstd"):
        assert name in text, name
    assert set(led.saved_breakdown(by="layer")) >= {"model.layers.0", "model.layers.1", "model.layers.2"}


def test_the_rotary_table_is_one_buffer_for_the_model():
    idx, targets = batch()
    led = _activation_names(make("dense", np.float32), idx, targets)
    tables = {e.buffer for e in led.events if e.name.endswith("rotary:table")}
    assert len(tables) == 1  # 2 rotary ops x 3 layers, one buffer
    table_bytes = 2 * BLOCK * (D // H) * 4
    assert {e.nbytes for e in led.events if e.name.endswith("rotary:table")} == {table_bytes}


def test_to_computes_the_rotary_table_again_at_the_precision_asked():
    """A float32 table converted to float64 would stay float32-accurate (4e-8 off): `to` makes it again, so a
    float64 Llama's table is cos and sin in float64, and a bfloat16 one is rounded once from them."""
    model = make("dense", np.float32).to(np.float64)
    table = model.model.rotary_emb.table.numpy()
    angles = np.outer(np.arange(BLOCK), 10000.0 ** (-np.arange(0, D // H, 2) / (D // H)))
    angles = np.concatenate([angles, angles], axis=-1)
    assert table.dtype == np.float64
    np.testing.assert_allclose(table, np.stack([np.cos(angles), np.sin(angles)]), rtol=0, atol=1e-15)
    half = model.to("bf16").model.rotary_emb.table.numpy()
    np.testing.assert_array_equal(half, np.stack([np.cos(angles), np.sin(angles)]).astype(half.dtype))


def test_grouped_queries_save_fewer_key_and_value_bytes():
    idx, targets = batch(B=2, T=12)
    peaks = {}
    for name in ("dense", "gqa", "mqa"):
        model = make(name, np.float32, tie_embeddings=False)
        led = _activation_names(model, idx, targets)
        peaks[name] = led.peak_bytes("activation")
    B, T, hd = 2, 12, D // H
    # per layer, each key/value head fewer saves two [B, T, hd] arrays less: its rotated keys (the scores' matmul
    # keeps them) and its values (A·V keeps them); the k projection's own output is kept by nobody (rotary saves
    # only its table)
    assert peaks["dense"] - peaks["gqa"] == L * (H - 2) * 2 * B * T * hd * 4
    assert peaks["dense"] - peaks["mqa"] == L * (H - 1) * 2 * B * T * hd * 4


# ---- the meta backend ---------------------------------------------------------------------------------------------
def _events(led):
    rows = [(e.action, e.nbytes, e.category, e.phase, e.name, e.shape, e.dtype, e.step, e.flops, e.from_category)
            for e in led.events]
    return sorted(r for r in rows if r[0] == "existing"), [r for r in rows if r[0] != "existing"]


def _train(backend_name, name, dtype=np.float32, steps=2, **kw):
    tg.use_backend(backend_name)
    try:
        tg.manual_seed(0)
        model = nn.Llama(V, BLOCK, L, H, D, **{**MODELS[name], **kw})
        if dtype != np.float32:
            model.to(dtype)
        for layer in model.model.layers:
            if "block_sparse_moe" in layer._modules:
                layer.block_sparse_moe.routing = "balanced"  # what meta assumes: then values decide no shape
        model.output_router_logits = name == "moe"
        opt = optim.AdamW(model.parameters())
        data = np.random.default_rng(0)
        idx = backend.current().asarray(data.integers(0, V, (2, 12)))
        gc.collect()
        with tg.Ledger() as led:
            for _ in range(steps):
                _, loss = model(idx, idx)
                loss.backward()
                opt.step()
                opt.zero_grad()
                del loss, _
        return led
    finally:
        tg.use_backend("numpy")


META = {"dense": ("dense", {}), "gqa_chunked": ("gqa", dict(attention="chunked")), "mqa_float64": ("mqa", dict(
    dtype=np.float64)), "moe": ("moe", {}), "moe_every_layer": ("moe", dict(checkpoint="every_layer")),
        "gqa_selective_dropout": ("gqa", dict(checkpoint=korthikanti_selective, dropout=0.1)),
        "dense_sqrt": ("dense", dict(checkpoint="sqrt"))}


@pytest.mark.parametrize("config", list(META))
def test_meta_ledger_equals_numpy_ledger(config):
    name, kw = META[config]
    real, fake = _train("numpy", name, **kw), _train("meta", name, **kw)
    assert _events(fake) == _events(real)
    assert fake.flops_by_phase == real.flops_by_phase and fake.peak_bytes() == real.peak_bytes()
    assert fake.saved_breakdown(by="name") == real.saved_breakdown(by="name")


def test_meta_routes_each_expert_a_balanced_share():
    tg.use_backend("meta")
    try:
        model = nn.Llama(V, BLOCK, 1, H, D, n_experts=3, experts_per_token=2, ffn_hidden=8)
        idx = backend.xp().zeros((2, 5), dtype=np.int64)
        _, loss = model(idx, idx)
        dispatch = next(e for e in loss.tape() if e.op == "dispatch")
        assert [shape for shape, _ in dispatch.out_meta] == [(7, D), (7, D), (6, D)]  # 20 choices: 7 + 7 + 6
    finally:
        tg.use_backend("numpy")


# ---- presets at full size -------------------------------------------------------------------------------------------
PUBLISHED = {"gpt2": 124_439_808, "gpt2-xl": 1_557_611_200, "llama-2-7b": 6_738_415_616,
             "llama-3-8b": 8_030_261_248, "llama-3-70b": 70_553_706_496, "mistral-7b": 7_241_732_096,
             "mixtral-8x7b": 46_702_792_704}


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_preset_parameter_counts(name):
    shape = est.preset(name)
    assert est.parameter_count(shape) == PUBLISHED[name]
    active = est.active_parameter_count(shape)
    assert active == (12_879_925_248 if name == "mixtral-8x7b" else PUBLISHED[name])


def test_preset_overrides_and_assumptions():
    shape = est.preset("llama-3-8b", seq_len=4096, batch=2, n_kv_head=32, dtype="float32")
    assert (shape.seq_len, shape.batch, shape.n_kv_head, shape.vocab_size) == (4096, 2, 32, 128256)
    assert est.preset("gpt2").seq_len == 1024 and est.preset("llama-2-7b").seq_len == 2048
    moe = est.preset("llama-2-7b", n_experts=8)  # a custom shape on a preset
    assert est.parameter_count(moe) > est.active_parameter_count(moe)
    assert est.preset("gpt2", arch="llama").arch == "llama"
    with pytest.raises(ValueError, match="not a GPT-2 setting"):
        est.preset("gpt2", n_kv_head=4)
    with pytest.raises(ValueError, match="unknown model 'llama-9'"):
        est.preset("llama-9")
    assert any("B·T·k/E = 2048·2/8" in a for a in est.assumptions(est.preset("mixtral-8x7b")))
    assert est.assumptions(est.preset("llama-2-7b")) == []
    assert "sliding-window" in est.assumptions(est.preset("mistral-7b"), "mistral-7b")[0]


@pytest.mark.slow
@pytest.mark.parametrize("name", list(PUBLISHED))
def test_presets_train_a_step_on_meta_in_seconds(name):
    t0 = time.perf_counter()
    run = estimate_step(est.preset(name, batch=1))
    seconds = time.perf_counter() - t0
    led = run.ledger
    assert led.peak_bytes("parameter") == 2 * PUBLISHED[name]  # float16
    assert led.peak_bytes("optimizer") == 8 * PUBLISHED[name]  # AdamW m, v in float32
    shape = run.shape
    if isinstance(shape, est.LlamaShape):
        flops = shape.n_layer * sum(est.llama_forward_flops_terms(shape).values()) \
            + 2 * shape.batch * shape.seq_len * shape.d_model * shape.vocab_size
        assert flops < led.flops("forward") < 1.03 * flops  # the experts a token uses, not all of them
    print(f"[{name}] setup {run.setup_seconds:.1f} s, step {run.seconds:.1f} s, peak "
          f"{led.peak_bytes() / 2**30:.1f} GiB")
    assert seconds < 60

"""Mixed precision in the engine: bfloat16 (ml_dtypes) on NumPy and meta, `tg.autocast` with PyTorch's CUDA rules,
optimizers with float32 master weights, and half-precision parameters updated in float32."""

import numpy as np
import pytest
from needs import TORCH_MISSING

import tinygrad_ckpt as tg
from tinygrad_ckpt import functional as F
from tinygrad_ckpt import nn, optim
from tinygrad_ckpt.checks import BFLOAT16


def _gpt(dtype=np.float32, **kwargs):
    tg.manual_seed(0)
    return nn.GPT(32, 16, 2, 2, 16, **kwargs).to(dtype)


IDX = np.random.default_rng(0).integers(0, 32, (2, 16))


def _bf16_step():
    model = _gpt(BFLOAT16, attention="chunked", dropout=0.1)
    with tg.Ledger() as led:
        _, loss = model(IDX, IDX)
        loss.backward()
    assert loss.dtype == BFLOAT16 and {p.grad.dtype for p in model.parameters()} == {BFLOAT16}
    return led.peak_bytes(), led.peak_bytes("activation"), [(e.action, e.nbytes, e.category) for e in led.events]


def test_a_bfloat16_gpt_trains_on_numpy_and_meta_with_equal_ledgers():
    real = _bf16_step()
    tg.use_backend("meta")
    try:
        assert _bf16_step() == real
    finally:
        tg.use_backend("numpy")


def test_autocast_runs_matmuls_in_half_and_softmax_norms_and_the_loss_in_float32():
    x = tg.Tensor(np.random.default_rng(1).standard_normal((2, 4, 8)).astype(np.float32), requires_grad=True)
    w = tg.Parameter(np.random.default_rng(2).standard_normal((8, 8)).astype(np.float32), name="w")
    ln_w, ln_b = tg.Parameter(np.ones(8, np.float32)), tg.Parameter(np.zeros(8, np.float32))
    with tg.autocast("bfloat16"):
        h = F.linear(x, w)
        assert h.dtype == BFLOAT16 and (h @ w.swapaxes(0, 1)).dtype == BFLOAT16
        assert F.softmax(h).dtype == np.float32 and F.log_softmax(h).dtype == np.float32
        assert F.layer_norm(h, ln_w, ln_b).dtype == np.float32
        assert F.gelu(h).dtype == BFLOAT16  # other ops: their input's dtype
        loss = F.cross_entropy(h.reshape(8, 8), np.zeros(8, np.int64))
        with tg.autocast(enabled=False):
            assert F.linear(x, w).dtype == np.float32
    assert loss.dtype == np.float32 and F.linear(x, w).dtype == np.float32  # outside: as before
    casts = [e for e in loss.tape() if e.op == "cast"]
    assert casts and all(not e.ctx.saved for e in casts)  # a cast saves nothing
    linear = next(e for e in loss.tape() if e.op == "linear")
    assert {a.dtype for a in linear.ctx.saved.values()} == {BFLOAT16}  # it keeps the half copies
    loss.backward()
    assert w.grad.dtype == np.float32 and x.grad.dtype == np.float32  # each gradient in its leaf's dtype


def test_autocast_refuses_a_dtype_that_is_not_half():
    with pytest.raises(ValueError, match=r"autocast: dtype must be 'bfloat16' or 'float16'.*got 'float32'"):
        tg.autocast("float32")
    with pytest.raises(TypeError, match="enabled"):
        tg.autocast("bfloat16", enabled=1)


def _torch_step(torch, model, idx, steps, lr=1e-2):
    from tinygrad_ckpt.torch_bridge import TorchGPT

    reference = TorchGPT.from_engine(model).train()
    opt = torch.optim.AdamW(reference.parameters(), lr=lr)
    ids = torch.tensor(idx)
    losses, grads = [], None
    for _ in range(steps):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            _, loss = reference(ids, ids)
        loss.backward()
        losses.append(loss.item())
        grads = grads or {n: p.grad.detach().numpy().copy() for n, p in reference.named_parameters()}
        opt.step()
        opt.zero_grad()
    return losses, grads  # the gradients of the first step


def test_an_amp_run_matches_pytorch_cpu_autocast_within_bfloat16_tolerance():
    """Five AdamW steps of the same GPT under autocast in both. PyTorch's CPU autocast runs softmax in bfloat16
    where this engine (PyTorch's CUDA rules) runs it in float32: the difference is bfloat16's rounding."""
    torch = pytest.importorskip("torch", reason=TORCH_MISSING)
    model = _gpt()
    expected, torch_grads = _torch_step(torch, model, IDX, 5)
    opt = optim.AdamW(model.parameters(), lr=1e-2)
    losses, grads = [], None
    for _ in range(5):
        with tg.autocast("bfloat16"):
            _, loss = model(IDX, IDX)
        loss.backward()
        losses.append(loss.item())
        grads = grads or {n: p.grad.copy() for n, p in model.named_parameters()}
        opt.step()
        opt.zero_grad()
    np.testing.assert_allclose(losses, expected, rtol=1e-2)
    for name, g in grads.items():
        scale = np.abs(torch_grads[name]).max()
        assert np.abs(g - torch_grads[name]).max() <= 0.03 * scale, name


def test_master_weights_keep_the_steps_a_half_weight_cannot_hold():
    w = tg.Parameter(np.ones(4, BFLOAT16), name="w")
    plain = tg.Parameter(np.ones(4, BFLOAT16), name="plain")
    master, alone = optim.AdamW([w], lr=1e-3, master_weights=True), optim.AdamW([plain], lr=1e-3)
    for _ in range(10):
        w.grad, plain.grad = np.full(4, 0.1, BFLOAT16), np.full(4, 0.1, BFLOAT16)
        master.step()
        alone.step()
    state = master.state[id(w)]
    assert state["master"].dtype == np.float32 and state["m"].dtype == np.float32
    np.testing.assert_allclose(state["master"], 1 - 10 * 1e-3 * (1 + 0.01 / 1) / 1.0, rtol=2e-3)  # ~0.99
    np.testing.assert_array_equal(w.data, state["master"].astype(BFLOAT16))  # refreshed from the master
    assert float(plain.data[0]) == 1.0  # each 1e-3 step is below bfloat16's spacing at 1 (2^-7): all lost


def test_master_weights_are_named_in_the_ledger():
    model = _gpt(BFLOAT16)
    opt = optim.AdamW(model.parameters(), lr=1e-3, master_weights=True)
    with tg.Ledger() as led:
        model(IDX, IDX)[1].backward()
        opt.step()
    names = {e.name for e in led.events if e.category == "optimizer"}
    assert "transformer.wte.weight:adamw.master" in names and "transformer.wte.weight:adamw.m" in names
    master_bytes = sum(e.nbytes for e in led.events if e.category == "optimizer" and e.name.endswith(".master")
                       and e.allocates)
    assert master_bytes == 4 * model.num_parameters()


@pytest.mark.parametrize("dtype", [np.float16, BFLOAT16])
def test_adamw_on_half_parameters_updates_in_float32(dtype):
    """eps = 1e-8 is 0 in float16: an update computed there divides by √v = 0 for a small gradient (v = g²
    underflows). The states keep the parameter's dtype (PyTorch's), the update is computed in float32."""
    w = tg.Parameter(np.ones(3, dtype), name="w")
    opt = optim.AdamW([w], lr=1e-3, weight_decay=0.0)
    w.grad = np.full(3, 1e-4, dtype)  # v = 1e-9 (then scaled): below float16's smallest step
    opt.step()
    np.testing.assert_allclose(w.data.astype(np.float32), 1 - 1e-3, rtol=2e-3)  # the whole step, not -inf or 0
    assert {a.dtype for a in opt.state[id(w)].values()} == {np.dtype(dtype)}
    fp16_math = np.float16(1e-4) * np.float16(1e-4)  # what the update would see computed in float16
    assert fp16_math == 0 and np.float16(1e-8) == 0


def test_master_weights_match_a_pytorch_reference():
    """A bfloat16 model with float32 master weights, against the same recipe written in PyTorch (bf16 parameters, a
    float32 copy stepped by torch.optim.AdamW and copied back)."""
    torch = pytest.importorskip("torch", reason=TORCH_MISSING)
    from tinygrad_ckpt.torch_bridge import TorchGPT

    model = _gpt()
    reference = TorchGPT.from_engine(model)
    model.to(BFLOAT16)
    reference.to(torch.bfloat16)
    masters = [p.detach().float().clone().requires_grad_() for p in reference.parameters()]
    topt = torch.optim.AdamW(masters, lr=1e-2)
    opt = optim.AdamW(model.parameters(), lr=1e-2, master_weights=True)
    ids = torch.tensor(IDX)
    ours, theirs = [], []
    for _ in range(4):
        _, loss = model(IDX, IDX)
        loss.backward()
        opt.step()
        opt.zero_grad()
        ours.append(float(loss.item()))
        _, tloss = reference(ids, ids)
        tloss.backward()
        for m, p in zip(masters, reference.parameters()):
            m.grad = p.grad.float()
        topt.step()
        with torch.no_grad():
            for m, p in zip(masters, reference.parameters()):
                p.copy_(m.bfloat16())
                p.grad = None
        theirs.append(tloss.item())
    np.testing.assert_allclose(ours, theirs, rtol=2e-2)


def test_a_main_gradient_accumulates_in_float32_for_a_half_parameter():
    w = nn.Parameter(np.full((3,), 1.0, dtype=BFLOAT16), name="w", grad_dtype=np.float32)
    x = tg.Tensor(np.full((3,), 1e-3, dtype=BFLOAT16))
    with tg.Ledger() as led:
        for _ in range(4):
            (w * x).sum().backward()
    assert w.grad.dtype == np.float32
    expected = 4 * np.float32(np.asarray(1e-3, dtype=BFLOAT16))
    assert np.allclose(w.grad, expected, rtol=0, atol=1e-9)  # 4 small bfloat16 gradients summed in float32
    released = {e.buffer for e in led.events if e.action == "released"}
    held = [e for e in led.events if e.category == "gradient" and e.tensor == "w" and e.buffer not in released]
    assert [(e.dtype, e.nbytes) for e in held] == [("float32", 12)]  # the bfloat16 ones in flight were let go
    with pytest.raises(ValueError, match="float32"):
        w.grad = np.zeros(3, dtype=BFLOAT16)  # .grad must keep the main gradient's dtype


@pytest.mark.parametrize("precision, weights, grads, states", [
    ("fp32", 4, 4, 8), ("bf16", 2, 2, 8), ("amp-bf16", 4, 4, 8), ("mixed-bf16", 2, 4, 12), ("mixed-fp16", 2, 4, 12)])
def test_each_precision_holds_its_bytes_a_parameter(precision, weights, grads, states):
    from tinygrad_ckpt.scale import estimate, measure

    shape = estimate.GPTShape(n_layer=2, d_model=64, n_head=4, seq_len=16, batch=2, vocab_size=100)
    step = measure.SteadyStep(shape, precision=precision, backend_name="numpy")
    led, _ = step.measure()
    n = step.model.num_parameters()
    assert led.peak_bytes("parameter") == weights * n
    assert led.peak_bytes("optimizer") == states * n
    grad_dtype = "float32" if grads == 4 else step.model.parameters()[0].dtype.name
    for p in step.model.parameters():  # each .grad is held in its main-gradient dtype
        kept = {(e.dtype, e.nbytes) for e in led.events if e.category == "gradient" and e.tensor == p.name}
        assert (grad_dtype, grads * p.size) in kept, (p.name, kept)


@pytest.mark.parametrize("saves", ["engine", "pytorch", "megatron"])
def test_a_checkpoint_replays_under_the_autocast_and_saves_its_forward_ran_under(saves):
    """Backward runs after the blocks closed; the replay must cast and save as the forward did (PyTorch's
    checkpoint restores autocast's state), else it diverges or its gradients differ."""
    def grads(checkpoint):
        tg.manual_seed(0)
        model = nn.GPT(64, 16, 2, 2, 32, dropout=0.1)
        idx = np.random.default_rng(0).integers(0, 64, (2, 16))
        model.checkpoint = checkpoint
        with tg.saves_like(saves):
            with tg.autocast("bfloat16"):
                _, loss = model(idx, idx)
        loss.backward()  # outside both blocks
        return loss.data, {n: p.grad for n, p in model.named_parameters()}

    plain_loss, plain = grads(None)
    ckpt_loss, ckpt = grads("every_layer")
    assert plain_loss == ckpt_loss
    for name in plain:
        assert np.array_equal(plain[name], ckpt[name]), name


@pytest.mark.parametrize("backend_name", ["numpy", "meta"])
def test_a_llama_trains_under_autocast_its_rotary_table_in_the_activations_dtype(backend_name):
    """q and k come out of autocast's matmuls in bfloat16 while the model's rotary table is float32: the table is
    used in their dtype (as Hugging Face's rotary embedding gives cos and sin), so a Llama runs AMP, on NumPy
    within bfloat16 tolerance of its float32 loss, and on the meta backend (estimate --precision amp-bf16)."""
    from tinygrad_ckpt.scale.measure import using_backend

    with using_backend(backend_name):
        tg.manual_seed(0)
        model = nn.Llama(64, 16, 2, 4, 32, n_kv_head=2, ffn_hidden=48)
        idx = np.random.default_rng(0).integers(0, 64, (2, 16))
        _, plain = model(idx, idx)
        with tg.autocast("bfloat16"):
            _, loss = model(idx, idx)
        loss.backward()
        assert loss.dtype == np.float32 and all(p.grad is not None for p in model.parameters())
        if backend_name == "numpy":
            assert abs(loss.item() - plain.item()) < 0.02 * abs(plain.item())
            assert all(np.isfinite(p.grad).all() for p in model.parameters())


@pytest.mark.parametrize("dtype", [BFLOAT16, np.float16])
def test_half_sums_and_means_accumulate_in_float32_and_keep_their_dtype(dtype):
    """bfloat16 holds 8 bits: summed in bfloat16, 1000 ones stop at 256 (256 + 1 rounds back). PyTorch's kernels
    accumulate half precision in float32 and round the result once; so do these, and the gradient keeps the
    input's dtype."""
    torch = pytest.importorskip("torch", reason=TORCH_MISSING)
    values = np.random.default_rng(3).uniform(0.5, 1.5, (40, 50)).astype(dtype)
    x = tg.Tensor(values, requires_grad=True)
    t = torch.from_numpy(values.astype(np.float32)).to(getattr(torch, np.dtype(dtype).name)).requires_grad_()
    for ours, theirs in [(x.sum(), t.sum()), (x.mean(), t.mean()), (x.sum(axis=0), t.sum(dim=0)),
                         (x.mean(axis=1, keepdims=True), t.mean(dim=1, keepdim=True))]:
        assert ours.dtype == dtype
        expected = theirs.detach().float().numpy()
        np.testing.assert_allclose(ours.numpy().astype(np.float32), expected, rtol=2 ** -7)
    assert tg.Tensor(np.ones(1000, dtype)).sum().item() == 1000 and tg.Tensor(np.ones(1000, dtype)).mean().item() == 1
    x.mean().backward()
    t.mean().backward()
    assert x.grad.dtype == dtype
    np.testing.assert_array_equal(x.grad.astype(np.float32), t.grad.float().numpy())


@pytest.mark.parametrize("dtype", [BFLOAT16, np.float16])
def test_a_half_cross_entropy_matches_pytorch_over_a_large_vocabulary(dtype):
    """Over 32000 classes a log-sum-exp summed in bfloat16 loses most terms (a Llama's loss came out 5.84 where
    PyTorch's is 10.31): the loss is worked in float32 and rounded once, its gradient in the logits' dtype."""
    torch = pytest.importorskip("torch", reason=TORCH_MISSING)
    rng = np.random.default_rng(4)
    logits, targets = rng.standard_normal((16, 32000)).astype(dtype), rng.integers(0, 32000, 16)
    x = tg.Tensor(logits, requires_grad=True)
    loss = F.cross_entropy(x, targets)
    t = torch.from_numpy(logits.astype(np.float32)).to(getattr(torch, np.dtype(dtype).name)).requires_grad_()
    expected = torch.nn.functional.cross_entropy(t, torch.from_numpy(targets))
    assert loss.dtype == dtype
    assert abs(loss.item() - expected.item()) <= 2 ** -7 * abs(expected.item())
    exact = torch.nn.functional.cross_entropy(torch.from_numpy(logits.astype(np.float64)), torch.from_numpy(targets))
    assert abs(loss.item() - exact.item()) <= 2 ** -8 * exact.item()  # one rounding of the float32 loss
    loss.backward()
    expected.backward()
    assert x.grad.dtype == dtype
    np.testing.assert_allclose(x.grad.astype(np.float32), t.grad.float().numpy(), atol=2 ** -8 * 1 / 16)


@pytest.mark.parametrize("name, dtype", [("bf16", BFLOAT16), ("bfloat16", BFLOAT16), ("fp16", np.float16),
                                         ("float16", np.float16), ("fp32", np.float32), ("float32", np.float32),
                                         ("fp64", np.float64), ("float64", np.float64)])
def test_tensor_to_and_module_to_take_autocasts_dtype_names(name, dtype):
    x = tg.Tensor(np.ones(3, np.float32), requires_grad=True)
    assert x.to(name).dtype == dtype
    model = nn.Linear(4, 2).to(name)
    assert {p.dtype for p in model.parameters()} == {np.dtype(dtype)}
    if np.dtype(dtype).itemsize == 2:
        with tg.autocast(name):
            assert (tg.Tensor(np.ones((2, 4), np.float32)) @ tg.Tensor(np.ones((4, 2), np.float32))).dtype == dtype


def test_master_weights_copy_only_half_parameters():
    """Mixed precision keeps float32 copies of the half weights; a float32 or float64 parameter (a norm kept in full
    precision) is updated in place, its states in its own dtype, no copy made and nothing rounded."""
    half = tg.Parameter(np.ones(4, BFLOAT16), name="half")
    single, double = tg.Parameter(np.full(4, 0.1, np.float32), name="single"), tg.Parameter(np.full(4, 0.1))
    opt = optim.AdamW([half, single, double], lr=1e-3, master_weights=True)
    plain_single, plain_double = tg.Parameter(single.data.copy()), tg.Parameter(double.data.copy())
    plain = optim.AdamW([plain_single, plain_double], lr=1e-3)
    for _ in range(3):
        for p in (half, single, double, plain_single, plain_double):
            p.grad = np.full(4, 1e-3, p.dtype)
        opt.step()
        plain.step()
    assert set(opt.state[id(half)]) == {"m", "v", "master"}
    for p, q in [(single, plain_single), (double, plain_double)]:
        assert set(opt.state[id(p)]) == {"m", "v"} and opt.state[id(p)]["m"].dtype == p.dtype
        np.testing.assert_array_equal(p.data, q.data)  # exactly the update without master weights


def test_a_broadcast_gradient_adds_up_in_float32():
    """The adjoint of broadcasting sums the gradient over the broadcast axes: in float32 for half precision (1000
    bfloat16 ones add up to 256 in bfloat16), rounded once, as PyTorch's reduction kernels; on meta too."""
    import ml_dtypes

    from tinygrad_ckpt import backend

    for dtype in (ml_dtypes.bfloat16, np.float16):
        g = np.ones((1000, 3), dtype)
        summed = backend.unbroadcast(g, (3,))
        assert summed.dtype == np.dtype(dtype) and summed.tolist() == [1000, 1000, 1000]
    b = tg.Tensor(np.zeros(3, ml_dtypes.bfloat16), requires_grad=True)
    (tg.Tensor(np.ones((1000, 3), ml_dtypes.bfloat16)) + b).sum().backward()
    assert b.grad.tolist() == [1000, 1000, 1000]
    be = tg.use_backend("meta")
    try:
        assert backend.unbroadcast(be.xp.zeros((1000, 3), ml_dtypes.bfloat16), (3,)).dtype == ml_dtypes.bfloat16
    finally:
        tg.use_backend("numpy")


def test_one_autocast_object_reenters_and_is_reused_as_pytorchs():
    """nanoGPT's `ctx = autocast(...)` entered once per step, and inside itself: each exit restores what its entry
    found (issue 38)."""
    ctx = tg.autocast("bfloat16")
    for _ in range(2):
        with ctx:
            assert tg.state.local.autocast == BFLOAT16
            with ctx, tg.autocast("bfloat16", enabled=False):
                assert tg.state.local.autocast is None
            with ctx:
                assert tg.state.local.autocast == BFLOAT16
            assert tg.state.local.autocast == BFLOAT16
        assert tg.state.local.autocast is None

"""tinygrad_ckpt.torch_bridge.weights: weights both ways between the engine's models and PyTorch models in nanoGPT's,
Hugging Face GPT-2's (Conv1D, [in, out]) and Hugging Face Llama's layouts, every key, shape and dtype checked."""

from __future__ import annotations

import numpy as np
import pytest
from needs import TORCH_MISSING

torch = pytest.importorskip("torch", reason=TORCH_MISSING)

import foreign_models as fm  # noqa: E402

import tinygrad_ckpt as tg  # noqa: E402
from tinygrad_ckpt import nn  # noqa: E402
from tinygrad_ckpt.torch_bridge import weights as tw  # noqa: E402

V, T, L, H, D = 64, 32, 2, 4, 64


def _engine(seed=0):
    """An engine GPT whose every weight, biases included, is random (a zero bias would hide a dropped one)."""
    tg.manual_seed(seed)
    gpt = nn.GPT(V, T, L, H, D)
    rng = np.random.default_rng(seed)
    state = {k: rng.standard_normal(v.shape).astype(v.dtype) * 0.05 for k, v in gpt.state_dict().items()}
    state["lm_head.weight"] = state["transformer.wte.weight"]  # tied
    gpt.load_state_dict(state)
    return gpt


def _randomise(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.05)


def _loss_engine(gpt, idx):
    _, loss = gpt(idx, idx)
    return loss.item()


@pytest.mark.parametrize("make, layout", [(lambda: fm.NanoGPTStyle(V, T, L, H, D), "nanogpt"),
                                          (lambda: fm.HFGPT2Style(V, T, L, H, D), "hf-gpt2")])
def test_engine_weights_into_a_gpt2_layout_and_back(make, layout):
    gpt, model = _engine(), make()
    assert tw.detect_layout(model).name == layout
    tw.to_torch(model, gpt)
    if layout == "hf-gpt2":  # Conv1D keeps [in, out]: the transpose of the engine's [out, in]
        assert model.transformer.h[0].attn.c_attn.weight.shape == (D, 3 * D)
        np.testing.assert_array_equal(model.transformer.h[1].mlp.c_fc.weight.detach().numpy(),
                                      gpt.state_dict()["transformer.h.1.mlp.c_fc.weight"].T)
    idx = np.random.default_rng(0).integers(0, V, (2, T))
    if layout == "nanogpt":  # the same math: the same loss
        assert model(torch.as_tensor(idx), torch.as_tensor(idx))[1].item() == pytest.approx(_loss_engine(gpt, idx),
                                                                                           rel=1e-5)
    _randomise(model, seed=5)  # and back: into a fresh engine GPT, every array as the model holds it
    back = tw.to_engine(model, nn.GPT(V, T, L, H, D))
    state = tw.engine_state(model)
    for k, v in back.state_dict().items():
        np.testing.assert_array_equal(v, state[k], err_msg=k)
    assert np.array_equal(back.state_dict()["lm_head.weight"], back.state_dict()["transformer.wte.weight"])  # tied


def test_a_bias_free_model_takes_zero_biases_and_gives_zeros_back():
    tg.manual_seed(0)
    gpt = nn.GPT(V, T, L, H, D)  # biases start at zero
    model = fm.NanoGPTStyle(V, T, L, H, D, bias=False)
    tw.to_torch(model, gpt)
    idx = np.random.default_rng(1).integers(0, V, (2, T))
    assert model(torch.as_tensor(idx), torch.as_tensor(idx))[1].item() == pytest.approx(_loss_engine(gpt, idx),
                                                                                       rel=1e-5)
    _randomise(model, seed=2)
    back = tw.to_engine(model, nn.GPT(V, T, L, H, D))
    biases = [k for k in back.state_dict() if k.endswith(".bias")]
    assert biases and all(not back.state_dict()[k].any() for k in biases)
    with pytest.raises(tw.WeightsMismatch) as caught:  # a nonzero bias has nowhere to go
        tw.to_torch(model, _engine())
    assert "transformer.h.0.attn.c_attn.bias (a nonzero bias: the target has none)" in str(caught.value)


def test_one_error_names_every_missing_unexpected_and_mismatched_key():
    model = fm.NanoGPTStyle(V, T, 3, H, D)  # one block more than the engine GPT
    state = _engine().state_dict()
    state["transformer.wte.weight"] = state["transformer.wte.weight"][:-1]  # a row short
    state["lm_head.weight"] = state["transformer.wte.weight"]
    state["transformer.h.0.extra.weight"] = np.ones(3, np.float32)
    state["transformer.h.1.ln_1.weight"] = state["transformer.h.1.ln_1.weight"].astype(np.float64)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(tw.WeightsMismatch) as caught:
        tw.to_torch(model, state)
    e, text = caught.value, str(caught.value)
    assert len(e.missing) == 12 and all(k.startswith("transformer.h.2.") for k in e.missing)
    assert e.unexpected == ["transformer.h.0.extra.weight"]
    assert any("transformer.wte.weight: the target's [64, 64] float32, the weights' [63, 64] float32" in m
               for m in e.mismatched)
    assert any("transformer.h.1.ln_1.weight" in m and "float64" in m for m in e.mismatched)
    assert "12 missing, 1 unexpected, 3 mismatched" in text  # wte and the lm_head tied to it, and the ln
    for k, v in model.state_dict().items():  # nothing was copied
        assert torch.equal(v, before[k]), k


def test_llama_names_are_the_engines_and_buffers_are_not_weights():
    model = fm.LlamaStyle()
    assert tw.detect_layout(model).name == "hf-llama"
    state = tw.engine_state(model)
    assert "model.layers.0.self_attn.q_proj.weight" in state and "lm_head.weight" in state
    assert "inv_freq" not in state  # a buffer
    other = fm.LlamaStyle()
    _randomise(other, seed=3)
    tw.to_torch(model, tw.engine_state(other))  # and a dict of engine names goes in
    for (n, p), q in zip(model.named_parameters(), other.parameters()):
        assert torch.equal(p, q), n
    nano = fm.NanoGPTStyle(V, T, L, H, D, fused=False)
    assert not any(k.endswith(".attn.bias") for k in tw.engine_state(nano))  # nanoGPT's causal-mask buffer
    with pytest.raises(ValueError, match="unknown layout 'hf-bert'"):
        tw.to_torch(model, state, layout="hf-bert")


def test_untied_weights_into_a_tied_model_are_refused_naming_both_tensors():
    """As the engine's load_state_dict: two names of one tied parameter given different values is an error (the
    last copy would silently overwrite the embedding), and nothing is copied."""
    model = fm.NanoGPTStyle(V, T, L, H, D)  # lm_head tied to transformer.wte
    state = _engine().state_dict()
    state["lm_head.weight"] = state["transformer.wte.weight"] + 1.0  # an untied engine model's
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(tw.WeightsMismatch, match=r"lm_head\.weight and transformer\.wte\.weight name one tied "
                                                 r"parameter of NanoGPTStyle.*different values") as caught:
        tw.to_torch(model, state)
    assert len(caught.value.mismatched) == 1
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k
    state["lm_head.weight"] = state["transformer.wte.weight"].copy()  # equal values: one weight, copied
    tw.to_torch(model, state)
    assert np.array_equal(model.lm_head.weight.detach().numpy(), state["lm_head.weight"])

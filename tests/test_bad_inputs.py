"""Bad input gets a clear error at the call the user made, and nothing is left broken.

Every case below is run between two identical training steps of the same GPT (seeded, dropout on,
every block checkpointed). Each must raise the stated exception type with a message that names the
op or argument and the offending value or shape; afterwards the thread's recording state is clean
and the second step's loss and gradients are bit-equal to the first's.
"""

from __future__ import annotations

import importlib.util
import signal

import numpy as np
import pytest

import tinygrad_ckpt as tg
from tinygrad_ckpt import functional as F
from tinygrad_ckpt import nn, optim, state
from tinygrad_ckpt.app import cli


@pytest.fixture(scope="module")
def gpt():
    tg.manual_seed(0)
    model = nn.GPT(vocab_size=32, block_size=8, n_layer=2, n_head=2, d_model=16, dropout=0.1,
                   checkpoint="every_layer")
    idx = np.random.default_rng(0).integers(0, 32, (2, 8))
    return model, idx


def training_step(model, idx):
    """Forward and backward from a fixed RNG state: (loss, {name: gradient})."""
    tg.manual_seed(7)
    model.zero_grad()
    _, loss = model(idx, idx)
    loss.backward()
    return loss.item(), {k: p.grad.copy() for k, p in model.named_parameters()}


def leaf(*shape, dtype=np.float64):
    return tg.Tensor(np.random.default_rng(1).standard_normal(shape).astype(dtype), requires_grad=True)


def _replay_changes_ops():
    calls = {"n": 0}

    def fn(t):
        calls["n"] += 1
        return t.exp() if calls["n"] == 1 else t.tanh()  # another op on the replay

    tg.checkpoint(fn, leaf(3), determinism_check="none").sum().backward()


def _replay_changes_values():
    calls = {"n": 0}

    def fn(t):
        calls["n"] += 1
        # Scale saves nothing: only its output shows the change (exp reads it, so the replay runs it; a scale at
        # the very end would be served from the forward's record, not run: test_checkpoint's early-stop tests)
        return (t * float(calls["n"])).exp()

    tg.checkpoint(fn, leaf(3)).sum().backward()


def _nested_ledger():
    with tg.Ledger(), tg.Ledger():
        pass


def _reused_ledger():
    led = tg.Ledger()
    with led:
        pass
    with led:
        pass


def _anomaly_inf_weight(model, idx):
    w = model.transformer.h[1].mlp.c_fc.weight
    saved = w.data.copy()
    w.data[0, 0] = np.inf
    try:
        with tg.detect_anomaly():
            model(idx, idx)
    finally:
        w.data[...] = saved


def _anomaly_log_negative():
    with tg.detect_anomaly():
        (leaf(3) - 5.0).log()


def _named_block(x, name="inner"):
    """A block with a parameter of its own called `name` (which checkpoint's `name=` would shadow)."""
    return x * 2.0


def _mixed_backends():
    a = tg.Tensor(np.ones(3))
    tg.use_backend("meta")
    try:
        b = tg.Tensor(np.ones(3))
    finally:
        tg.use_backend("numpy")
    return a + b


def _shifted_state_dict(model, **changes):
    """model's state_dict with every value moved by 1 (a load that copies any of it changes the next step), and
    `changes` ({"dotted__name": value}, "__" for ".") on top: the last key is the bad one."""
    sd = {k: v + 1 for k, v in model.state_dict().items()}
    sd["lm_head.weight"] = sd["transformer.wte.weight"]
    sd.update({k.replace("__", "."): v for k, v in changes.items()})
    return sd


def _recorded_ledger():
    with tg.Ledger() as led:
        leaf(3).exp().sum().backward()
    return led


NOT_OPEN = 987  # a file descriptor nothing here has open: open(987, "w") is what an unchecked export would do

# (id, call(model, idx), exception type, a pattern naming the op/argument and the value/shape)
CASES = [
    # ---- dtypes and requires_grad
    ("int_requires_grad", lambda m, i: tg.Tensor(np.arange(4), requires_grad=True), TypeError,
     r"requires_grad=True\): only floating-point.*int64 \(shape \[4\]\)"),
    ("bool_requires_grad", lambda m, i: tg.Tensor(np.ones(2, bool), requires_grad=True), TypeError,
     r"only floating-point.*dtype bool"),
    ("int_requires_grad_", lambda m, i: tg.Tensor(np.arange(3)).requires_grad_(), TypeError,
     r"requires_grad_\(True\).*int64 \(shape \[3\]\)"),
    ("int_parameter", lambda m, i: nn.Parameter(np.arange(3)), TypeError, r"only floating-point.*int64"),
    ("non_leaf_requires_grad_false", lambda m, i: (leaf(3) * 2.0).requires_grad_(False), RuntimeError,
     r"requires_grad_\(False\).*made by 'scale' \[scale\].*detach"),
    ("grad_wrong_shape", lambda m, i: setattr(leaf(3), "grad", np.ones(2)), ValueError,
     r"\.grad of .*\[3\] float64, got \[2\] float64"),
    ("grad_wrong_dtype", lambda m, i: setattr(leaf(3), "grad", np.ones(3, np.float32)), ValueError,
     r"\.grad of .*\[3\] float64, got \[3\] float32"),
    ("grad_not_an_array", lambda m, i: setattr(leaf(3), "grad", [1.0, 2.0, 3.0]), TypeError,
     r"\.grad of .*numpy array.*got list"),
    ("param_grad_wrong_shape", lambda m, i: setattr(m.lm_head.weight, "grad", np.ones((2, 2), np.float32)),
     ValueError, r"\.grad of 'transformer\.wte\.weight'.*\[32, 16\].*got \[2, 2\]"),
    # ---- token ids and targets
    ("negative_token_id", lambda m, i: m(i - 1, i), IndexError, r"embedding: id -1 at position \[0, \d+\].*\[0, 32\)"),
    ("token_id_past_vocab", lambda m, i: m(i + 32, i), IndexError, r"embedding: id \d+ .*outside \[0, 32\)"),
    ("ids_1d", lambda m, i: m(i[0], i[0]), ValueError, r"GPT: idx .*\[B, T\], got \[8\].*idx\[None\]"),
    ("ids_float", lambda m, i: m(i.astype(float), i), ValueError, r"GPT: idx .*got \[2, 8\] float64"),
    ("targets_transposed", lambda m, i: m(i, i.T.copy()), ValueError, r"GPT: targets .*\[2, 8\].*got \[8, 2\]"),
    ("sequence_too_long", lambda m, i: m(np.zeros((1, 9), np.int64)), ValueError,
     r"GPT: sequence length 9 exceeds block_size 8"),
    ("negative_target", lambda m, i: F.cross_entropy(leaf(3, 5), np.array([0, -3, 1])), IndexError,
     r"cross_entropy: target -3 at position \[1\].*\[0, 5\)"),
    ("target_past_classes", lambda m, i: F.cross_entropy(leaf(3, 5), np.array([0, 5, 1])), IndexError,
     r"cross_entropy: target 5 .*\[0, 5\)"),
    ("float_targets", lambda m, i: F.cross_entropy(leaf(3, 5), np.zeros(3)), TypeError,
     r"cross_entropy: targets must be integer.*float64"),
    ("targets_shape", lambda m, i: F.cross_entropy(leaf(3, 5), np.zeros(4, np.int64)), ValueError,
     r"cross_entropy: .*logits \[3, 5\] and targets \[4\]"),
    ("embedding_out_of_range", lambda m, i: F.embedding(np.array([0, 7]), leaf(5, 2)), IndexError,
     r"embedding: id 7 .*\[0, 5\)"),
    ("embedding_float_ids", lambda m, i: F.embedding(np.array([0.0, 1.0]), leaf(5, 2)), TypeError,
     r"embedding: ids must be an integer array.*float64"),
    # ---- tensor methods and ops
    ("max_of_empty", lambda m, i: tg.Tensor(np.zeros((0,))).max(), ValueError, r"max: .*\[0\] has no elements"),
    ("max_two_axes", lambda m, i: leaf(2, 3).max(axis=(0, 1)), ValueError, r"max: axis .*\(0, 1\)"),
    ("sum_axis_out_of_range", lambda m, i: leaf(2, 3).sum(axis=5), ValueError, r"sum: axis 5 .*2 dimensions"),
    ("reshape_count", lambda m, i: leaf(2, 3).reshape(4, 2), ValueError, r"reshape: .*\[2, 3\].*\[4, 2\]"),
    ("reshape_float_size", lambda m, i: leaf(2, 3).reshape(2.0, 3), TypeError,
     r"reshape: sizes must be integers, got 2.0 \(float\) in \[2.0, 3\]; pass ints, e.g. x.reshape\(2, 3\)"),
    ("view_float_size", lambda m, i: leaf(2, 3).view((6.5,)), TypeError, r"view: sizes must be integers, got 6.5"),
    ("item_of_many", lambda m, i: leaf(2, 3).item(), RuntimeError,
     r"item\(\): a Tensor with 6 elements \(shape \[2, 3\]\) cannot be converted.*t.sum\(\).item\(\)"),
    ("checkpoint_name_shadows_fn_name", lambda m, i: tg.checkpoint(_named_block, leaf(3), name="blk"), TypeError,
     r"checkpoint: name='blk' is checkpoint's own .* fn '_named_block' takes a parameter 'name' too.*"
     r"functools.partial\(_named_block, name='blk'\)"),
    ("permute_not_a_permutation", lambda m, i: leaf(2, 3).permute(0, 0), ValueError, r"permute: \[0, 0\].*\[2, 3\]"),
    ("matmul_shapes", lambda m, i: leaf(2, 3) @ leaf(4, 5), ValueError, r"matmul: .*\[2, 3\] by \[4, 5\]"),
    ("broadcast_shapes", lambda m, i: leaf(2, 3) + leaf(4, 3), ValueError, r"add: shapes \[2, 3\] and \[4, 3\]"),
    ("pow_tensor_exponent", lambda m, i: leaf(3) ** leaf(3), TypeError, r"pow: only a constant .*Tensor"),
    ("index_out_of_range", lambda m, i: leaf(3)[np.array([0, 5])], IndexError, r"getitem: .*\[3\].*5"),
    ("split_sizes_do_not_add_up", lambda m, i: leaf(2, 5).split([2, 2], dim=1), ValueError,
     r"split: sizes \[2, 2\] must be non-negative and add up to 5, the length of axis 1 of a tensor of shape \[2, 5\]"),
    ("split_size_zero", lambda m, i: leaf(4).split(0), ValueError, r"split: split_size must be a positive int, got 0"),
    ("split_size_type", lambda m, i: leaf(4).split(1.5), TypeError, r"split: split_size_or_sections .* got 1.5"),
    ("split_axis_out_of_range", lambda m, i: leaf(2, 3).split(1, dim=2), IndexError,
     r"split: axis 2 is out of range for a tensor of shape \[2, 3\]"),
    ("split_0d", lambda m, i: leaf().split(1), ValueError, r"split: a 0-d tensor has no axis"),
    ("backward_non_scalar", lambda m, i: (leaf(2, 3) * 2.0).backward(), RuntimeError,
     r"non-scalar tensor of shape \[2, 3\]"),
    ("backward_grad_shape", lambda m, i: (leaf(2, 3) * 2.0).backward(np.ones(3)), ValueError,
     r"grad has shape \[3\], the tensor \[2, 3\]"),
    ("backward_without_grad", lambda m, i: tg.Tensor(np.ones(2)).sum().backward(), RuntimeError,
     r"shape \[\] that does not require grad"),
    # ---- dtypes: complex values refused where they enter, Module.to only to floating point, dtype names checked
    ("complex_tensor", lambda m, i: tg.Tensor(np.array([1 + 2j])), TypeError,
     r"Tensor\(data\): complex values \(complex128\) are not supported.*x\.real"),
    ("complex_tensor_to_real_dtype", lambda m, i: tg.Tensor(np.array([1 + 2j]), dtype=np.float32), TypeError,
     r"Tensor\(data\): complex values \(complex128\)"),
    ("complex_parameter", lambda m, i: nn.Parameter([1j, 2.0]), TypeError, r"Tensor\(data\): complex values"),
    ("complex_to", lambda m, i: leaf(3).to(np.complex64), TypeError,
     r"Tensor\.to: dtype complex64 is not supported .*'bf16'"),
    ("complex_copy_", lambda m, i: tg.Tensor(np.ones(2)).copy_(np.array([1j, 2j])), TypeError,
     r"copy_: complex values \(complex128\)"),
    ("complex_backward_grad", lambda m, i: (leaf(2) * 2.0).backward(np.array([1j, 1j])), TypeError,
     r"backward\(grad\): complex values"),
    ("module_to_int", lambda m, i: m.to(np.int64), TypeError,
     r"Module\.to: dtype int64 is not floating point.*'bfloat16', 'bf16'.*'fp64'"),
    ("module_to_unknown_name", lambda m, i: m.to("half precision"), TypeError,
     r"Module\.to: 'half precision' is not a dtype.*'bf16'"),
    ("tensor_to_unknown_name", lambda m, i: leaf(3).to("bf17"), TypeError,
     r"Tensor\.to: 'bf17' is not a dtype.*'bf16'"),
    ("tensor_to_none", lambda m, i: leaf(3).to(None), TypeError, r"Tensor\.to: None is not a dtype"),
    ("in_place_on_recorded", lambda m, i: leaf(3).add_(1.0), RuntimeError, r"add_: 'tensor' \[3\] .*no_grad"),
    ("in_place_other_requires_grad", lambda m, i: tg.Tensor(np.ones(3)).mul_(leaf(3)), RuntimeError,
     r"mul_: 'tensor' \[3\] .*other operand requires grad"),
    ("second_backward", lambda m, i: [y := leaf(3).exp().sum(), y.backward(), y.backward()], RuntimeError,
     r"'exp' \[exp\] a second time.*retain_graph=True"),
    ("gelu_approximate", lambda m, i: F.gelu(leaf(3), approximate="fast"), ValueError,
     r"gelu: approximate must be 'none' .* got 'fast'"),
    ("dropout_p", lambda m, i: F.dropout(leaf(3), p=1.5), ValueError, r"dropout: p must be in \[0, 1\), got 1.5"),
    ("layer_norm_weight", lambda m, i: F.layer_norm(leaf(2, 6), leaf(5), leaf(5)), ValueError,
     r"layer_norm: weight \[5\] and bias \[5\].*\[2, 6\]"),
    ("linear_shapes", lambda m, i: F.linear(leaf(2, 3), leaf(5, 4)), ValueError, r"linear: .*\[2, 3\].*\[5, 4\]"),
    ("attention_rank", lambda m, i: F.scaled_dot_product_attention(leaf(2, 3), leaf(2, 3), leaf(2, 3)), ValueError,
     r"scaled_dot_product_attention: q must be \[B, H, T, head_dim\], got \[2, 3\]"),
    ("mixed_backends", lambda m, i: _mixed_backends(), TypeError, r"add: inputs live on different backends.*meta"),
    ("unknown_backend", lambda m, i: tg.use_backend("tpu"), ValueError, r"unknown backend 'tpu'"),
    # ---- modules
    ("heads_do_not_divide", lambda m, i: nn.CausalSelfAttention(30, 4), ValueError, r"d_model=30 .*n_heads=4"),
    ("state_dict_shape", lambda m, i: m.load_state_dict({**m.state_dict(), "lm_head.weight": np.ones((2, 2))}),
     ValueError, r"load_state_dict: 'lm_head\.weight' has shape \[2, 2\].*\[32, 16\]"),
    ("state_dict_missing", lambda m, i: m.load_state_dict({"nonsense": np.ones(2)}), KeyError,
     r"missing keys .*transformer.*unexpected keys \['nonsense'\]"),
    ("state_dict_tied_differ", lambda m, i: m.load_state_dict(_shifted_state_dict(
        m, lm_head__weight=m.state_dict()["lm_head.weight"])), ValueError,
     r"'transformer\.wte\.weight' and 'lm_head\.weight' name one tied parameter but hold different values"),
    ("state_dict_one_bad_shape_loads_nothing", lambda m, i: m.load_state_dict(_shifted_state_dict(
        m, transformer__ln_f__bias=np.ones(3, np.float32))), ValueError,
     r"GPT\.load_state_dict: 'transformer\.ln_f\.bias' has shape \[3\] but the parameter is \[16\]; nothing "
     r"was loaded"),
    ("state_dict_every_problem", lambda m, i: m.load_state_dict(_shifted_state_dict(
        m, transformer__ln_f__bias=np.ones(3), transformer__ln_f__weight=np.ones(16, complex), extra=np.ones(1))),
     KeyError, r"unexpected keys \['extra'\]; 'transformer\.ln_f\.weight' has dtype complex128, which does not "
               r"cast to the parameter's float32; 'transformer\.ln_f\.bias' has shape \[3\]"),
    ("state_dict_object_values", lambda m, i: m.load_state_dict(_shifted_state_dict(
        m, transformer__ln_f__bias=[None] * 16)), ValueError, r"'transformer\.ln_f\.bias' has dtype object"),
    ("state_dict_not_a_dict", lambda m, i: m.load_state_dict(list(m.state_dict().items())), TypeError,
     r"GPT\.load_state_dict: expected a dict \{name: array\}.*got list"),
    ("state_dict_key_type", lambda m, i: m.load_state_dict({**m.state_dict(), 3: np.ones(2)}), TypeError,
     r"GPT\.load_state_dict: keys must be parameter names \(str\), got \[3\]"),
    ("state_dict_strict_type", lambda m, i: m.load_state_dict(m.state_dict(), strict="no"), TypeError,
     r"strict must be True or False, got 'no'"),
    ("gpt_checkpoint_switch", lambda m, i: nn.GPT(8, 4, 1, 2, 8, checkpoint="sometimes")(np.zeros((1, 4), np.int64)),
     ValueError, r"GPT\(checkpoint='sometimes'\)"),
    ("gpt_vocab_float", lambda m, i: nn.GPT(32.0, 8, 1, 2, 16), TypeError,
     r"GPT: vocab_size must be an int, got 32\.0"),
    ("gpt_n_layer_string", lambda m, i: nn.GPT(32, 8, "2", 2, 16), TypeError, r"GPT: n_layer must be an int, got '2'"),
    ("gpt_n_layer_negative", lambda m, i: nn.GPT(32, 8, -1, 2, 16), ValueError,
     r"GPT: n_layer must be at least 0, got -1"),
    ("gpt_block_size_zero", lambda m, i: nn.GPT(32, 0, 1, 2, 16), ValueError, r"GPT: block_size must be at least 1"),
    ("gpt_heads_do_not_divide", lambda m, i: nn.GPT(32, 8, 1, 3, 16), ValueError,
     r"GPT: d_model=16 is not divisible by n_head=3"),
    ("gpt_zero_heads", lambda m, i: nn.GPT(32, 8, 1, 0, 16), ValueError, r"GPT: n_head must be at least 1, got 0"),
    ("gpt_dropout_negative", lambda m, i: nn.GPT(32, 8, 1, 2, 16, dropout=-0.1), ValueError,
     r"GPT: dropout must be a probability in \[0, 1\), got -0\.1"),
    ("gpt_dropout_string", lambda m, i: nn.GPT(32, 8, 1, 2, 16, dropout="0.1"), TypeError,
     r"GPT: dropout must be a number .*got '0\.1'"),
    ("gpt_attention_unknown", lambda m, i: nn.GPT(32, 8, 1, 2, 16, attention="flash"), ValueError,
     r"GPT: attention must be 'explicit' or 'chunked', got 'flash'"),
    ("block_heads_float", lambda m, i: nn.Block(16, 2.0), TypeError, r"Block: n_heads must be an int, got 2\.0"),
    ("block_n_layer_zero", lambda m, i: nn.Block(16, 2, n_layer=0), ValueError, r"Block: n_layer must be at least 1"),
    ("block_input_2d", lambda m, i: m.transformer.h[0](leaf(4, 16, dtype=np.float32)), ValueError,
     r"Block: x must be \[B, T, 16\] .*got \[4, 16\]"),
    ("block_input_array", lambda m, i: m.transformer.h[0](np.ones((1, 4, 16), np.float32)), TypeError,
     r"Block: x must be a Tensor \[B, T, 16\], got ndarray"),
    ("attention_input_width", lambda m, i: m.transformer.h[0].attn(leaf(1, 4, 8, dtype=np.float32)), ValueError,
     r"CausalSelfAttention: x must be \[B, T, 16\] .*got \[1, 4, 8\]"),
    ("linear_float_features", lambda m, i: nn.Linear(3.5, 2), TypeError,
     r"Linear: in_features must be an int, got 3\.5"),
    ("linear_negative_features", lambda m, i: nn.Linear(3, -1), ValueError, r"Linear: out_features must be at least 0"),
    ("linear_bias_string", lambda m, i: nn.Linear(3, 2, bias="no"), TypeError, r"Linear: bias must be True or False"),
    ("linear_int_dtype", lambda m, i: nn.Linear(3, 2, dtype=np.int32), TypeError,
     r"Linear: dtype must be a floating-point dtype .*int32"),
    ("layer_norm_eps_string", lambda m, i: nn.LayerNorm(3, eps="1e-5"), TypeError, r"LayerNorm: eps must be a number"),
    ("embedding_float_size", lambda m, i: nn.Embedding(3.0, 2), TypeError,
     r"Embedding: num_embeddings must be an int, got 3\.0"),
    ("dropout_module_p", lambda m, i: nn.Dropout(2), ValueError,
     r"Dropout: p must be a probability in \[0, 1\), got 2"),
    ("mlp_approximate", lambda m, i: nn.MLP(8, approximate="fast"), ValueError,
     r"MLP: approximate must be 'none' or 'tanh', got 'fast'"),
    ("ids_3d", lambda m, i: m(i[None]), ValueError, r"GPT: idx .*\[B, T\], got \[1, 2, 8\]"),
    ("ids_no_positions", lambda m, i: m(i[:, :0]), ValueError, r"GPT: idx \[2, 0\] holds no positions"),
    ("ids_float_hint", lambda m, i: m(i.astype(np.float32)), ValueError, r"float32; convert: idx\.astype"),
    # ---- optimizers
    ("adamw_tied_parameter_twice", lambda m, i: optim.AdamW([m.lm_head.weight, m.transformer.wte.weight]),
     ValueError, r"AdamW: parameter 'transformer\.wte\.weight' \[32, 16\] appears twice \(positions 0 and 1\).*"
                 r"model\.parameters\(\)"),
    ("sgd_same_parameter_twice", lambda m, i: optim.SGD(m.parameters() + m.parameters()[:1]), ValueError,
     r"SGD: parameter 'transformer\.wte\.weight' .*appears twice"),
    ("sgd_params_module", lambda m, i: optim.SGD(m), TypeError,
     r"SGD: params must be .*got GPT .*model\.parameters\(\)"),
    ("sgd_params_one_tensor", lambda m, i: optim.SGD(m.lm_head.weight), TypeError,
     r"SGD: params must be an iterable of Tensors, got one Tensor 'transformer\.wte\.weight'"),
    ("sgd_params_set", lambda m, i: optim.SGD(set(m.parameters())), TypeError, r"SGD: params .*got set \(a set has no"),
    ("sgd_params_none", lambda m, i: optim.SGD(None), TypeError, r"SGD: params .*got NoneType"),
    ("sgd_param_groups", lambda m, i: optim.SGD([{"params": m.parameters()}]), TypeError,
     r"SGD: parameter groups \(dicts\) are not supported"),
    ("sgd_non_leaf", lambda m, i: optim.SGD([leaf(3) * 2.0]), ValueError, r"SGD: can't optimize a non-leaf Tensor"),
    ("adamw_lr_nan", lambda m, i: optim.AdamW(m.parameters(), lr=float("nan")), ValueError, r"AdamW: invalid lr nan"),
    ("adamw_lr_bool", lambda m, i: optim.AdamW(m.parameters(), lr=True), ValueError, r"AdamW: invalid lr True"),
    ("adamw_lr_numpy_negative", lambda m, i: optim.AdamW(m.parameters(), lr=np.float32(-0.5)), ValueError,
     r"AdamW: invalid lr .*-0\.5"),
    ("adamw_state_dtype", lambda m, i: optim.AdamW(m.parameters(), state_dtype=np.int32), ValueError,
     r"AdamW: invalid state_dtype .*int32.*floating-point dtype"),
    ("adamw_negative_lr", lambda m, i: optim.AdamW(m.parameters(), lr=-1), ValueError, r"AdamW: invalid lr -1"),
    ("adamw_beta_one", lambda m, i: optim.AdamW(m.parameters(), betas=(1.0, 0.999)), ValueError,
     r"AdamW: invalid betas \(1\.0, 0\.999\).*\[0, 1\)"),
    ("adamw_one_beta", lambda m, i: optim.AdamW(m.parameters(), betas=(0.9,)), ValueError, r"invalid betas \(0\.9,\)"),
    ("adamw_eps_zero", lambda m, i: optim.AdamW(m.parameters(), eps=0), ValueError, r"AdamW: invalid eps 0"),
    ("adamw_weight_decay", lambda m, i: optim.AdamW(m.parameters(), weight_decay=-0.1), ValueError,
     r"invalid weight_decay -0\.1"),
    ("sgd_momentum", lambda m, i: optim.SGD(m.parameters(), momentum=-1), ValueError, r"SGD: invalid momentum -1"),
    ("sgd_lr_string", lambda m, i: optim.SGD(m.parameters(), lr="fast"), ValueError, r"SGD: invalid lr 'fast'"),
    ("optimizer_no_params", lambda m, i: optim.SGD([]), ValueError, r"SGD: got an empty parameter list"),
    ("optimizer_array_param", lambda m, i: optim.SGD([np.ones(3)]), TypeError, r"SGD: every parameter .*array"),
    # ---- checkpoint
    ("policy_string", lambda m, i: tg.checkpoint(lambda t: t.exp(), leaf(3), policy="save_matmuls"), TypeError,
     r"policy='save_matmuls' is a string; pass tg\.save_matmuls"),
    ("policy_number", lambda m, i: tg.checkpoint(lambda t: t.exp(), leaf(3), policy=2), TypeError,
     r"policy=2 is not a policy"),
    ("policy_bad_answer", lambda m, i: tg.checkpoint(lambda t: t.exp(), leaf(3), policy=lambda op, name: 3),
     TypeError, r"policy <lambda>\('exp', 'exp'\) returned 3"),
    ("policy_class", lambda m, i: tg.checkpoint(lambda t: t.exp(), leaf(3), policy=tg.Policy), TypeError,
     r"policy=Policy is a class"),
    ("use_reentrant_true", lambda m, i: tg.checkpoint(lambda t: t.exp(), leaf(3), use_reentrant=True), ValueError,
     r"use_reentrant=True is not implemented"),
    ("determinism_check_value", lambda m, i: tg.checkpoint(lambda t: t, leaf(3), determinism_check="sometimes"),
     ValueError, r"determinism_check must be .* got 'sometimes'"),
    ("checkpoint_returns_number", lambda m, i: tg.checkpoint(lambda t: 3.0, leaf(3)), TypeError,
     r"returned float, not a Tensor"),
    ("replay_runs_other_ops", lambda m, i: _replay_changes_ops(), tg.CheckpointError,
     r"diverged at op 0: the forward ran 'exp' \(exp\), the replay 'tanh' \(tanh\)"),
    ("replay_other_values", lambda m, i: _replay_changes_values(), tg.CheckpointError,
     r"diverged at op 'scale' \(scale\): output '0' \[3\] float64 has checksum"),
    # ---- ledger
    ("ledger_negative_capacity", lambda m, i: tg.Ledger(capacity_bytes=-1), ValueError, r"capacity_bytes .*got -1"),
    ("ledger_zero_capacity", lambda m, i: tg.Ledger(capacity_bytes=0), ValueError, r"capacity_bytes .*got 0"),
    ("ledger_capacity_unit", lambda m, i: tg.Ledger(capacity_bytes="80XB"), ValueError, r"capacity_bytes .*'80XB'"),
    ("ledger_capacity_type", lambda m, i: tg.Ledger(capacity_bytes=[80]), TypeError, r"capacity_bytes .*\[80\]"),
    ("ledger_nested", lambda m, i: _nested_ledger(), RuntimeError, r"already observed by <.*Ledger.*nesting"),
    ("ledger_reused", lambda m, i: _reused_ledger(), RuntimeError, r"this Ledger has recorded already"),
    ("ledger_infinite_capacity", lambda m, i: tg.Ledger(capacity_bytes=float("inf")), ValueError,
     r"capacity_bytes .*None for no limit.*got inf"),
    ("ledger_fraction_of_a_byte", lambda m, i: tg.Ledger(capacity_bytes=0.5), ValueError, r"capacity_bytes .*got 0\.5"),
    ("ledger_trace_numpy", lambda m, i: tg.Ledger(trace_numpy="yes"), TypeError, r"trace_numpy must be True or False"),
    ("ledger_to_csv_fd", lambda m, i: _recorded_ledger().to_csv(NOT_OPEN), TypeError,
     r"to_csv: path must be a file name \(str or os\.PathLike\), got int 987"),
    ("ledger_to_jsonl_fd", lambda m, i: _recorded_ledger().to_jsonl(NOT_OPEN), TypeError, r"to_jsonl: path .*got int"),
    ("ledger_to_chrome_trace_fd", lambda m, i: _recorded_ledger().to_chrome_trace(NOT_OPEN), TypeError,
     r"to_chrome_trace: path .*got int"),
    ("ledger_to_memory_viz_fd", lambda m, i: _recorded_ledger().to_memory_viz(NOT_OPEN), TypeError,
     r"to_memory_viz: path .*got int"),
    ("ledger_to_html_fd", lambda m, i: _recorded_ledger().to_html(NOT_OPEN), TypeError, r"to_html: path .*got int"),
    ("ledger_flops_by_layer_phase", lambda m, i: _recorded_ledger().flops_by_layer("fwd"), ValueError,
     r"flops_by_layer: phase must be 'forward', 'backward', 'recompute' or 'optimizer', got 'fwd' \(did you mean "
     r"'forward'\?\)"),
    ("ledger_flops_phase", lambda m, i: _recorded_ledger().flops("bwd"), ValueError,
     r"flops: phase must be .*'optimizer', or None \(all phases\), got 'bwd' \(did you mean 'backward'\?\)"),
    ("ledger_peak_bytes_category", lambda m, i: _recorded_ledger().peak_bytes("act"), ValueError,
     r"peak_bytes: category must be 'parameter', .*got 'act' \(did you mean 'activation'\?\)"),
    ("ledger_live_bytes_category", lambda m, i: _recorded_ledger().live_bytes("params"), ValueError,
     r"live_bytes: category must be .*got 'params' \(did you mean 'parameter'\?\)"),
    ("ledger_peak_bytes_type", lambda m, i: _recorded_ledger().peak_bytes(0), ValueError,
     r"peak_bytes: category must be 'parameter', 'optimizer', 'gradient', 'activation', 'other' or 'untouched', or "
     r"None \(every category but 'untouched'\), got 0$"),
    ("ledger_peak_bytes_untouched_and_category", lambda m, i: _recorded_ledger().peak_bytes("other", untouched=True),
     ValueError, r"peak_bytes: untouched=True adds the untouched bytes to the total of every category; give it "
     r"without a category \(or ask for peak_bytes\('untouched'\)\)"),
    ("ledger_live_bytes_untouched_type", lambda m, i: _recorded_ledger().live_bytes(untouched="yes"), TypeError,
     r"live_bytes: untouched must be True or False, got 'yes'"),
    ("ledger_saved_breakdown_by", lambda m, i: _recorded_ledger().saved_breakdown("lyr"), ValueError,
     r"saved_breakdown: by must be 'layer', 'module', 'op' or 'name', got 'lyr' \(did you mean 'layer'\?\)"),
    ("ledger_saved_breakdown_depth", lambda m, i: _recorded_ledger().saved_breakdown("module", depth="2"), TypeError,
     r"saved_breakdown: depth must be None or a positive int.*got '2'"),
    ("ledger_phase_name", lambda m, i: _recorded_ledger().phase("warmup").__enter__(), ValueError,
     r"phase: name must be 'forward', 'backward', 'recompute' or 'optimizer', got 'warmup'$"),
    # ---- debug
    ("break_before_number", lambda m, i: tg.debug.break_before(3), TypeError,
     r"break_before: a pattern must be a string .*got 3 \(int\)"),
    ("break_before_bad_one_adds_none", lambda m, i: tg.debug.break_before("never_an_op", ["gelu", None]), TypeError,
     r"break_before: a pattern must be a string .*got None"),
    ("break_before_empty", lambda m, i: tg.debug.break_before(""), ValueError, r"break_before: pattern '' is empty"),
    # ---- chunked attention
    ("chunked_attention_dtypes", lambda m, i: F.scaled_dot_product_attention(
        leaf(1, 1, 4, 2, dtype=np.float32), leaf(1, 1, 4, 2), leaf(1, 1, 4, 2), impl="chunked"), ValueError,
     r"chunked_attention: expected query, key, and value to have the same dtype, got q float32, k float64, "
     r"v float64"),
    # ---- anomaly detection
    ("anomaly_inf_weight", _anomaly_inf_weight, FloatingPointError,
     r"forward of 'transformer\.h\.1\.mlp\.c_fc\.linear' produced NaN/Inf in output 0 of shape \[2, 8, 64\]"),
    ("anomaly_log_negative", lambda m, i: _anomaly_log_negative(), FloatingPointError,
     r"forward of 'log' produced NaN/Inf in output 0 of shape \[3\]"),
]
if importlib.util.find_spec("cupy") is None:
    CASES.append(("cupy_not_installed", lambda m, i: tg.use_backend("cupy"), ImportError,
                  r'the "cupy" backend needs CuPy, which is not installed: pip install -e "\.\[gpu\]"'))


@pytest.mark.parametrize("call, kind, pattern", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_raises_clearly_and_breaks_nothing(gpt, call, kind, pattern):
    model, idx = gpt
    loss, grads = training_step(model, idx)
    with pytest.raises(kind, match=pattern), np.errstate(all="ignore"):
        call(model, idx)
    st = state.local
    assert (st.grad_enabled, st.prefix, st.observers, st.segments) == (True, "", [], 0)  # no stray observer
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert tg.backend.current().name == "numpy"
    loss2, grads2 = training_step(model, idx)
    assert loss2 == loss
    for k in grads:
        assert np.array_equal(grads2[k], grads[k]), k


def test_there_are_at_least_sixty_cases():
    assert len(CASES) >= 130 and len({c[0] for c in CASES}) == len(CASES)


@pytest.mark.parametrize("argv, words", [
    (["estimate", "--layers", "0"], "--layers: '0' must be at least 1"),
    (["estimate", "--layers", "-1"], "--layers: '-1' must be at least 1"),
    (["estimate", "--seq", "0"], "--seq: '0' must be at least 1"),
    (["estimate", "--heads", "0"], "--heads: '0' must be at least 1"),
    (["estimate", "--heads", "7"], "7 heads do not divide d_model 4096"),
    (["estimate", "--capacity", "80"], "'80' has no unit: write e.g. 80GB"),
    (["estimate", "--dropout", "1.5"], "dropout must be in [0, 1), got 1.5"),
    (["estimate", "--checkpoint", "sometimes"], "unknown checkpoint 'sometimes'"),
    (["figures", "--only", "99"], "no lesson numbered [99]"),
    (["estimate", "--layers", "1000000"], "this estimate would run 2,000,000 blocks on the meta backend"),
    (["estimate", "--layers", "9000", "--optimizer", "none"], "1 step(s) × 9000 layers"),
    (["explore", "--layers", "3000"], "a first step, then one per plan: 3 × 3000 layers"),
    (["estimate", "--layers", "4096", "--pipeline-parallel", "2", "--microbatches", "4"],
     "2 step(s) × 4 microbatch(es) × 2048 layers of one stage"),
    (["estimate", "--layers", "4", "--checkpoint", "100"], "--checkpoint 100: more segments than the 4 layers"),
    (["estimate", "--arch", "llama", "--experts", "10000"],
     "--layers 32 --experts 10000: this estimate would run 128,064 blocks"),
    (["estimate", "--model", "mixtral-8x7b", "--experts", "10000"], "each layer's 10,000 experts running like 2,000"),
    (["explore", "--arch", "llama", "--layers", "2", "--experts", "20000"], "--layers 2 --experts 20000: this explore"),
    (["estimate", "--seq", "10000000", "--batch", "1000"],
     "--seq 10000000 --batch 1000 --vocab 32000: this step would count about 2.1e+23 FLOPs and bytes, more than the "
     "ledger's 64-bit counters hold"),
    (["explore", "--vocab", "100000000000000"], "--vocab 100000000000000: this step would count"),
    (["explore", "--layers", "2", "--checkpoint", "none", "7"], "--checkpoint 7: more segments than the 2 layers"),
])
def test_cli_answers_a_bad_argument_with_one_line(argv, words, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(argv)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2
    assert err.count("\n") == 1 and words in err and "Traceback" not in err


def test_python_numbers_promote_integer_tensors_as_pytorch_does():
    ints = tg.Tensor(np.arange(4))
    assert (ints * 0.5).dtype == np.float32 and np.array_equal((ints * 0.5).numpy(), [0, 0.5, 1, 1.5])
    assert (ints + 0.5).dtype == np.float32 and np.array_equal((ints + 0.5).numpy(), [0.5, 1.5, 2.5, 3.5])
    assert (ints / 2).dtype == np.float32 and np.array_equal((ints / 2).numpy(), [0, 0.5, 1, 1.5])
    assert (ints * 2).dtype == ints.dtype  # int with int stays int
    flags = tg.Tensor(np.array([True, False]))
    assert (flags + 1).dtype == np.int64 and np.array_equal((flags + 1).numpy(), [2, 1])
    assert (tg.Tensor(np.ones(2, np.float32)) * 0.5).dtype == np.float32  # float32 stays float32


def test_tensor_indices_inside_a_tuple_index_by_their_data():
    x = tg.Tensor(np.arange(12.0).reshape(3, 4), requires_grad=True)
    y = x[tg.Tensor(np.array([0, 2])), tg.Tensor(np.array([1, 3]))]
    assert np.array_equal(y.numpy(), [1.0, 11.0])
    y.sum().backward()
    assert x.grad[0, 1] == 1 and x.grad[2, 3] == 1 and x.grad.sum() == 2


def test_policies_from_a_function_or_a_collection_of_names():
    tg.manual_seed(0)
    block = nn.Block(8, 2).to(np.float64)
    x = np.random.default_rng(0).standard_normal((2, 4, 8))
    block(tg.Tensor(x)).sum().backward()
    plain = {k: p.grad.copy() for k, p in block.named_parameters()}
    for policy in ({"linear", "matmul"}, ["h.0.attn", "gelu"], lambda op, name: op == "linear",
                   lambda op, name: tg.Decision(op == "softmax", "keep the softmax")):
        block.zero_grad()
        y = tg.checkpoint(block, tg.Tensor(x), policy=policy)
        assert any(k.startswith("kept") for k in y.tape()[0].ctx.saved)  # the policy kept something
        y.sum().backward()
        for k, p in block.named_parameters():
            assert np.array_equal(p.grad, plain[k]), (policy, k)


def test_detect_anomaly_is_quiet_on_a_healthy_gpt(gpt):
    model, idx = gpt
    with tg.detect_anomaly():
        model(idx, idx)[1].backward()  # the causal mask's -inf is deliberate: no alarm


def test_cross_entropy_over_all_ignored_targets_is_zero_not_nan():
    logits = leaf(3, 5)
    loss = F.cross_entropy(logits, np.full(3, -1))
    loss.backward()
    assert loss.item() == 0.0 and not logits.grad.any()


def test_numpy_scalars_are_hyperparameters_like_python_numbers():
    """np.float32(0.1) was refused as a learning rate; any real number is taken now, as a Python float (so the
    update's arithmetic is the one a Python float gives), and bools, NaN and negatives are still refused."""
    def one_step(**hyper):
        p = leaf(4, 3)
        p.grad = np.ones((4, 3))
        opt = optim.AdamW([p], **hyper)
        opt.step()
        return opt, p.data

    opt, numpy_data = one_step(lr=np.float32(0.1), betas=(np.float32(0.9), np.float64(0.999)), eps=np.float64(1e-8),
                               weight_decay=np.int64(0))
    assert all(type(v) is float for v in (opt.lr, *opt.betas, opt.eps, opt.weight_decay))
    _, python_data = one_step(lr=float(np.float32(0.1)), betas=(float(np.float32(0.9)), 0.999), eps=1e-8,
                              weight_decay=0.0)
    assert np.array_equal(numpy_data, python_data)
    sgd = optim.SGD([leaf(2)], lr=np.float16(0.5), momentum=np.float64(0.9), weight_decay=np.int32(1))
    assert (type(sgd.lr), type(sgd.momentum), type(sgd.weight_decay)) == (float, float, float)
    assert optim.SGD([leaf(2)], lr=1).lr == 1  # a Python number stays as it was given
    for bad in (np.bool_(True), np.float64("nan"), np.float32(-1)):
        with pytest.raises(ValueError, match="invalid lr"):
            optim.SGD([leaf(2)], lr=bad)


def test_a_failed_load_changes_nothing_and_a_good_one_loads_everything(gpt):
    model, idx = gpt
    before = model.state_dict()
    sd = _shifted_state_dict(model, transformer__h__1__mlp__c_proj__weight=np.ones((2, 2)))
    with pytest.raises(ValueError, match="nothing was loaded"):
        model.load_state_dict(sd)
    for k, v in model.state_dict().items():
        assert np.array_equal(v, before[k]), k
    good = _shifted_state_dict(model)
    good["transformer.ln_f.bias"] = tg.Tensor(good["transformer.ln_f.bias"])  # a Tensor value loads too
    good["transformer.wpe.weight"] = good["transformer.wpe.weight"].astype(np.float64)  # cast, as PyTorch
    try:
        model.load_state_dict(good)
        for k, v in model.state_dict().items():
            assert np.array_equal(v, before[k] + 1), k
        assert model.lm_head.weight is model.transformer.wte.weight  # still tied
    finally:
        model.load_state_dict(before)


def test_a_tied_pair_given_equal_values_loads():
    tg.manual_seed(0)
    model = nn.GPT(32, 8, 1, 2, 16)
    sd = model.state_dict()
    sd["transformer.wte.weight"] = sd["transformer.wte.weight"] * 2
    sd["lm_head.weight"] = sd["transformer.wte.weight"].astype(np.float64)  # the same values, another dtype
    model.load_state_dict(sd)
    assert np.array_equal(model.lm_head.weight.numpy(), sd["transformer.wte.weight"])


def test_to_html_checks_every_argument_before_it_opens_the_page(tmp_path):
    """to_html(path, title=3) used to truncate an existing page, then fail."""
    led = _recorded_ledger()
    page = tmp_path / "page.html"
    page.write_text("the page from yesterday")
    for bad in ({"title": 3}, {"compare": [led, "not a ledger"]}, {"labels": ["a", "b"]}):
        with pytest.raises((TypeError, ValueError), match="to_html: "):
            led.to_html(page, **bad)
        assert page.read_text() == "the page from yesterday", bad
    assert led.to_html(page, title="today") == str(page) and "today" in page.read_text()


def test_ledger_queries_take_every_valid_name_and_none():
    led = _recorded_ledger()
    for c in ("parameter", "optimizer", "gradient", "activation", "other", "untouched", None):
        assert led.peak_bytes(c) >= led.live_bytes(c) >= 0
    assert led.peak_bytes(untouched=True) >= led.live_bytes(untouched=True) >= led.live_bytes()
    assert sum(led.flops(p) for p in ("forward", "backward", "recompute", "optimizer")) == led.flops() > 0
    assert sum(led.flops_by_layer("backward").values()) == led.flops("backward")
    assert led.saved_breakdown("module", depth=1) == led.saved_breakdown("module", depth=np.int64(1))
    assert tg.Ledger(capacity_bytes=np.int64(10**9)).capacity_bytes == 10**9
    assert tg.Ledger(capacity_bytes=np.float32(1e6)).capacity_bytes == 10**6


def test_checkpoint_passes_name_to_fn_through_partial_and_names_the_entry():
    """The fix the name clash error gives works: fn gets its `name`, the entry its own (issue 38)."""
    import functools
    seen = []
    y = tg.checkpoint(functools.partial(lambda x, name: seen.append(name) or x * 2.0, name="fn's"), leaf(3), name="blk")
    assert seen == ["fn's"] and y._entry.name == "blk.checkpoint"
    assert tg.checkpoint(lambda x, **kw: x * 2.0, leaf(3), name="blk")._entry.name == "blk.checkpoint"  # no clash

"""Chapter "Attention as a recurrence"'s recurrences as properties: linear attention and the (gated) delta rule give the
same outputs and states in their parallel, recurrent and chunked forms; the delta rule computes what
transformers' Qwen3-Next kernels compute, and GatedDeltaNet what Qwen3NextGatedDeltaNet computes, with
and without a cache; a cache of constant size decodes as the full forward; plain linear attention's
state grows without bound, the normalised outputs and the delta rule's state do not."""

import math

import pytest
import torch
from _gpu import requires_cuda
from hypothesis import given, settings
from hypothesis import strategies as st

import transformer_lib as tl
from transformer_lib.blocks import DecoderLayer
from transformer_lib.delta_net import (
    GatedDeltaNet,
    RecurrentState,
    decay_init,
    keep_per_token,
)
from transformer_lib.inspect_heads import capture_attention
from transformer_lib.kv_cache import DecoderCache
from transformer_lib.linear_attention import (
    delta_rule,
    delta_rule_weights,
    elu_feature_map,
    l2_normalize,
    linear_attention,
    linear_attention_weights,
)
from transformer_lib.parts import part_weights
from transformer_lib.pretrained_qwen3_next import gated_delta_net_from_qwen3_next

transformers = pytest.importorskip("transformers")
from transformers.cache_utils import DynamicCache  # noqa: E402
from transformers.models.qwen3_next import modeling_qwen3_next as qn  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

F64 = torch.float64
TIGHT = dict(atol=1e-12, rtol=0)
FORMS_AGREE = dict(atol=1e-10, rtol=0)
FLOAT32_SIZED = dict(atol=1e-5, rtol=0)  # transformers' float32 steps: about 1e-7 here

# (B, h, T, d_k, d_v, chunk_size): lengths that the chunk does not divide, one token, one chunk of all
SHAPES = [(1, 1, 1, 3, 2, 4), (2, 3, 13, 4, 5, 4), (1, 2, 37, 8, 3, 16), (2, 1, 20, 3, 3, 7), (1, 2, 9, 2, 4, 9)]


def _inputs(B, h, T, d_k, d_v, seed=0):
    """``q, k (B, h, T, d_k)``, ``v (B, h, T, d_v)``, ``beta`` in (0, 1), ``gate`` <= 0 ``(B, h, T)``, a state."""
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(2, B, h, T, d_k, dtype=F64, generator=g)
    v = torch.randn(B, h, T, d_v, dtype=F64, generator=g)
    beta, gate = torch.rand(B, h, T, dtype=F64, generator=g), -torch.rand(B, h, T, dtype=F64, generator=g)
    return q, k, v, beta, gate, torch.randn(B, h, d_k, d_v, dtype=F64, generator=g)


def _all_forms(fn, *args, chunk_size, **kw):
    """``fn`` in its three forms (two chunk sizes for the chunked one), each compared with the recurrent one."""
    out, state = fn(*args, form="recurrent", **kw)
    for form, size in (("parallel", 64), ("chunked", chunk_size), ("chunked", 1)):
        got, got_state = fn(*args, form=form, chunk_size=size, **kw)
        torch.testing.assert_close(got, out, **FORMS_AGREE)
        torch.testing.assert_close(got_state, state, **FORMS_AGREE)
    return out, state


@pytest.mark.parametrize("shape", SHAPES)
def test_the_three_forms_of_linear_attention_agree(shape):
    B, h, T, d_k, d_v, chunk = shape
    q, k, v, _, gate, state = _inputs(*shape[:5])
    z = torch.rand(B, h, d_k, 1, dtype=F64) + 1  # a positive normaliser to start from
    for gated in (False, True):
        for start in (None, state):
            kw = dict(gate=gate if gated else None, initial_state=start)
            _all_forms(linear_attention, q, k, v, chunk_size=chunk, **kw)
            kw["initial_state"] = None if start is None else torch.cat([start, z], -1)  # (d_v + 1): z last
            _all_forms(linear_attention, q, k, v, chunk_size=chunk, feature_map=elu_feature_map, normalize=True, **kw)


@pytest.mark.parametrize("shape", SHAPES)
def test_the_three_forms_of_the_delta_rule_agree(shape):
    q, k, v, beta, gate, state = _inputs(*shape[:5], seed=1)
    k = l2_normalize(k)
    for g in (None, gate):
        for start in (None, state):
            _all_forms(delta_rule, q, k, v, beta, chunk_size=shape[-1], gate=g, initial_state=start)
    _all_forms(delta_rule, q, k, v, beta, chunk_size=shape[-1], gate=gate, scale=0.7)


def test_a_state_carried_over_equals_one_pass():
    # splitting a sequence and starting the second part from the first part's state changes nothing
    q, k, v, beta, gate, _ = _inputs(2, 2, 11, 4, 3, seed=2)
    k = l2_normalize(k)
    full, end = delta_rule(q, k, v, beta, gate=gate, form="chunked", chunk_size=4)
    first, mid = delta_rule(q[:, :, :6], k[:, :, :6], v[:, :, :6], beta[..., :6], gate=gate[..., :6])
    rest, got_end = delta_rule(q[:, :, 6:], k[:, :, 6:], v[:, :, 6:], beta[..., 6:], gate=gate[..., 6:],
                               initial_state=mid, form="parallel")  # fmt: skip
    torch.testing.assert_close(torch.cat([first, rest], 2), full, **FORMS_AGREE)
    torch.testing.assert_close(got_end, end, **FORMS_AGREE)


def test_the_attention_matrices_reproduce_the_outputs():
    q, k, v, beta, gate, _ = _inputs(2, 3, 10, 4, 5, seed=3)
    k = l2_normalize(k)
    # linear attention is causal attention without the softmax: (q k^T masked) v
    weights = linear_attention_weights(q, k)
    torch.testing.assert_close(weights, (q @ k.transpose(-1, -2)).tril(), **TIGHT)
    torch.testing.assert_close(weights @ v, linear_attention(q, k, v, form="recurrent")[0], **FORMS_AGREE)
    kw = dict(feature_map=elu_feature_map, normalize=True, gate=gate)
    weights = linear_attention_weights(q, k, **kw)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 3, 10, dtype=F64), **TIGHT)  # a weighted mean
    torch.testing.assert_close(weights @ v, linear_attention(q, k, v, form="recurrent", **kw)[0], **FORMS_AGREE)
    for g in (None, gate):
        weights = delta_rule_weights(q, k, beta, gate=g)
        assert torch.equal(weights.triu(1), torch.zeros_like(weights))  # nothing from the future
        torch.testing.assert_close(weights @ v, delta_rule(q, k, v, beta, gate=g)[0], **FORMS_AGREE)


def test_a_full_write_makes_the_state_return_the_value_for_its_key():
    # beta = 1 and a unit key: the state then maps k_t to v_t exactly, whatever it held; linear attention adds
    q, k, v, _, _, state = _inputs(1, 2, 6, 4, 3, seed=4)
    k, ones = l2_normalize(k, eps=0.0), torch.ones(1, 2, 6, dtype=F64)
    for form in ("recurrent", "chunked"):
        S = delta_rule(q, k, v, ones, form=form, chunk_size=4, initial_state=state)[1]
        torch.testing.assert_close((S * k[:, :, -1, :, None]).sum(-2), v[:, :, -1], **FORMS_AGREE)
    S = linear_attention(q, k, v, initial_state=state)[1]
    assert ((S * k[:, :, -1, :, None]).sum(-2) - v[:, :, -1]).abs().amax() > 0.1  # the old ones interfere


def test_the_plain_linear_state_grows_without_bound_and_the_others_do_not():
    q, k, v, beta, gate, _ = _inputs(1, 2, 1600, 8, 4, seed=5)
    v = v + 0.5  # values of mostly one sign, as often
    sizes = {}
    for T in (100, 400, 1600):
        cut = lambda t, T=T: t[:, :, :T]
        plain = linear_attention(cut(q), cut(k), cut(v), form="chunked", feature_map=elu_feature_map)[1]
        delta = delta_rule(cut(q), l2_normalize(cut(k)), cut(v), cut(beta), form="chunked")[1]
        gated = delta_rule(cut(q), l2_normalize(cut(k)), cut(v), cut(beta), gate=cut(gate), form="chunked")[1]
        sizes[T] = [s.norm(dim=(-2, -1)).amax() for s in (plain, delta, gated)]
    assert sizes[1600][0] > 10 * sizes[100][0]  # about linear in T: the sum only adds
    for i in (1, 2):  # a write replaces what the state holds for its key: the size levels off
        assert sizes[1600][i] < 2 * sizes[100][i] and sizes[1600][i] < 10
    # normalised with positive features, each output is a weighted mean: within the values seen so far
    out = linear_attention(q, k, v, form="chunked", feature_map=elu_feature_map, normalize=True)[0]
    low, high = v.cummin(dim=2).values, v.cummax(dim=2).values
    assert bool(((out >= low - 1e-12) & (out <= high + 1e-12)).all())
    raw = linear_attention(q, k, v, form="chunked", feature_map=elu_feature_map)[0]
    assert raw[:, :, -100:].abs().mean() > 100 * raw[:, :, :10].abs().mean()  # unnormalised: outputs grow too


class _Float64Torch:
    """``torch`` as transformers' Qwen3-Next module sees it, except that ``torch.float32`` is float64."""

    float32 = torch.float64

    def __getattr__(self, name):
        return getattr(torch, name)


@pytest.fixture
def qwen_in_float64(monkeypatch):
    """transformers computes the gated delta rule in float32 (``.to(torch.float32)`` of every input,
    and a float32 state), the gated RMSNorm in float32, and the decay from ``A_log.float()`` and
    ``a.float()``, even for float64 weights: the same steps in float64, for comparisons at 1e-12."""
    monkeypatch.setattr(qn, "torch", _Float64Torch())
    to_float32 = torch.Tensor.float
    monkeypatch.setattr(torch.Tensor, "float", lambda t, *a, **kw: t if t.dtype == F64 else to_float32(t, *a, **kw))


def _theirs_delta_rule(kernel, q, k, v, beta, gate, state, **kw):
    """transformers' kernel on the book's layout ``(B, h, T, d)``, normalising q and k itself."""
    flip = lambda t: t.transpose(1, 2)
    out, end = kernel(flip(q), flip(k), flip(v), g=flip(gate), beta=flip(beta), initial_state=state,
                      output_final_state=True, use_qk_l2norm_in_kernel=True, **kw)  # fmt: skip
    return flip(out), end


@pytest.mark.parametrize("with_state", [False, True])
@pytest.mark.parametrize("kernel", ["chunk", "recurrent"])
def test_the_delta_rule_equals_qwen3_next_kernels(kernel, with_state, monkeypatch, qwen_in_float64):
    q, k, v, beta, gate, state = _inputs(2, 3, 13, 5, 4, seed=6)
    state = state if with_state else None
    if kernel == "chunk":  # their chunk size of 8 does not divide T = 13; ours differs on purpose
        theirs, form = (lambda *a: _theirs_delta_rule(qn.torch_chunk_gated_delta_rule, *a, chunk_size=8)), "chunked"
    else:
        theirs, form = (lambda *a: _theirs_delta_rule(qn.torch_recurrent_gated_delta_rule, *a)), "recurrent"
    ours = delta_rule(l2_normalize(q), l2_normalize(k), v, beta, gate=gate, initial_state=state, form=form,
                      chunk_size=5)  # fmt: skip
    for got, expected in zip(ours, theirs(q, k, v, beta, gate, state), strict=True):
        torch.testing.assert_close(got, expected, **TIGHT)
    monkeypatch.undo()  # transformers as it is: computed in float32, the state returned in float32
    out, end = theirs(q, k, v, beta, gate, state)
    assert (out.dtype, end.dtype) == (F64, torch.float32)  # outputs cast back, the state left in float32
    torch.testing.assert_close(ours[0], out, **FLOAT32_SIZED)
    torch.testing.assert_close(ours[1], end.double(), **FLOAT32_SIZED)


def _config(n_k=2, n_v=4, kernel=4):
    """A small Qwen3-Next of one linear layer: two value heads per query-key head by default."""
    return transformers.Qwen3NextConfig(
        hidden_size=32, linear_num_key_heads=n_k, linear_num_value_heads=n_v, linear_key_head_dim=8,
        linear_value_head_dim=6, linear_conv_kernel_dim=kernel, num_hidden_layers=1, layer_types=["linear_attention"],
        vocab_size=10, num_attention_heads=2, num_key_value_heads=2, head_dim=8,
    )  # fmt: skip


def _qwen(config=None, seed=0):
    """A Qwen3NextGatedDeltaNet on random weights, float64."""
    torch.manual_seed(seed)
    layer = qn.Qwen3NextGatedDeltaNet(config or _config(), layer_idx=0).double().eval()
    with torch.no_grad():  # the norm's gain away from 1, so that a gain read into the wrong place shows
        for name, p in layer.named_parameters():
            p.copy_(1 + 0.2 * torch.randn_like(p) if name == "norm.weight" else 0.3 * torch.randn_like(p))
    return layer


def _x(B=2, T=9, d=32, seed=1):
    return torch.randn(B, T, d, dtype=F64, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("n_k, n_v, kernel", [(2, 4, 4), (2, 2, 3)])
def test_the_layer_equals_qwen3_next_gated_delta_net(n_k, n_v, kernel, monkeypatch, qwen_in_float64):
    theirs = _qwen(_config(n_k, n_v, kernel))
    ours = gated_delta_net_from_qwen3_next(theirs)
    ours.chunk_size = 4  # ours in blocks of 4, theirs of 64
    assert (ours.n_heads, ours.n_qk_heads, ours.d_k, ours.d_v, ours.conv_kernel) == (n_v, n_k, 8, 6, kernel)
    x = _x()
    with torch.no_grad():
        got = ours(x, x, x)[0]
        torch.testing.assert_close(got, theirs(x), **TIGHT)
        monkeypatch.undo()  # transformers as it is: its float32 steps show at about 1e-6
        torch.testing.assert_close(got, theirs(x), **FLOAT32_SIZED)


def test_the_cache_holds_what_transformers_caches(qwen_in_float64):
    config = _config()
    theirs = _qwen(config)
    ours, x = gated_delta_net_from_qwen3_next(theirs), _x()
    their_cache, cache, expected, got = DynamicCache(config=config), RecurrentState(), [], []
    with torch.no_grad():
        for start, stop in ((0, 4), (4, 5), (5, 7), (7, 8), (8, 9)):  # a prefill, then tokens and pairs
            part = x[:, start:stop]
            expected.append(theirs(part, cache=their_cache))
            got.append(ours(part, part, part, cache=cache)[0])
    torch.testing.assert_close(torch.cat(got, 1), torch.cat(expected, 1), **TIGHT)
    held = their_cache.layers[0]
    torch.testing.assert_close(cache.state, held.recurrent_states[0], **TIGHT)  # (B, h, d_k, d_v), as theirs
    torch.testing.assert_close(cache.conv, held.conv_states[0][..., 1:], **TIGHT)  # they keep one input more
    assert cache.position == cache.length == 9


def _layer(mode="gated", seed=0, **kw):
    torch.manual_seed(seed)
    layer = GatedDeltaNet(32, 4, n_qk_heads=2, d_k=6, d_v=5, mode=mode, chunk_size=3, **kw).double().eval()
    with torch.no_grad():
        layer.norm.weight.add_(0.2 * torch.randn_like(layer.norm.weight))
    return layer


def _decode(layer, x, steps):
    cache, outs = layer.new_cache(), []
    for part in x.split(steps, dim=1):
        outs.append(layer(part, part, part, is_causal=True, cache=cache)[0])
    return torch.cat(outs, dim=1), cache


@pytest.mark.parametrize("mode", ["gated", "delta", "linear"])
@pytest.mark.parametrize("steps", [[1] * 7, [4, 1, 2], [7]])
def test_cached_decoding_equals_the_full_forward(steps, mode):
    layer, x = _layer(mode), _x(T=7)
    with torch.no_grad():
        expected = layer(x, x, x)[0]
        got, cache = _decode(layer, x, steps)
    torch.testing.assert_close(got, expected, **TIGHT)
    assert (cache.position, cache.length) == (7, 7)


def test_the_modes_are_one_layer_with_parts_switched_off():
    layer, x = _layer(), _x(T=7)
    with torch.no_grad():
        outs = {}
        for mode in ("gated", "delta", "linear"):
            layer.mode = mode
            outs[mode] = layer(x, x, x)[0]
        assert (outs["gated"] - outs["delta"]).abs().amax() > 1e-3  # three different functions
        assert (outs["delta"] - outs["linear"]).abs().amax() > 1e-3
        layer.log_rate.fill_(float("-inf"))  # a rate of 0: no decay, the gated rule is the delta rule
        layer.mode = "gated"
        torch.testing.assert_close(layer(x, x, x)[0], outs["delta"], **TIGHT)
    for mode, unused in (("gated", set()), ("delta", {"decay_proj.weight", "log_rate", "step_bias"}),
                         ("linear", {"decay_proj.weight", "log_rate", "step_bias", "beta_proj.weight"})):  # fmt: skip
        layer = _layer(mode)
        layer(x, x, x)[0].pow(2).sum().backward()
        assert {n for n, p in layer.named_parameters() if p.grad is None or not p.grad.abs().sum()} == unused


def test_gradients_flow_through_a_cache_too():
    layer, x = _layer(), _x(T=5)
    expected = torch.autograd.grad(layer(x, x, x)[0].sum(), layer.in_proj.weight)[0]
    got = torch.autograd.grad(_decode(layer, x, [2, 1, 2])[0].sum(), layer.in_proj.weight)[0]
    torch.testing.assert_close(got, expected, **TIGHT)


@pytest.mark.parametrize("mode", ["gated", "delta", "linear"])
def test_the_weights_mix_the_values_and_the_inspection_tools_read_them(mode):
    layer, x = _layer(mode), _x(T=6)
    heads = []
    hook = layer.norm.register_forward_pre_hook(lambda _m, args: heads.append(args[0]))  # (B, T, h, d_v)
    with torch.no_grad():
        out, weights = layer(x, x, x, need_weights=True)
        with capture_attention(layer) as captured:
            plain, none = layer(x, x, x)
        v = layer._inputs(x, None)[2]  # the convolved values (B, h, T, d_v)
    hook.remove()
    assert none is None and weights.shape == (2, 4, 6, 6) and torch.equal(out, plain)
    assert torch.equal(weights.triu(1), torch.zeros_like(weights))
    torch.testing.assert_close(weights @ v, heads[0].transpose(1, 2), **FORMS_AGREE)
    assert torch.equal(layer.attention_weights(x, x, x, is_causal=True), weights)
    assert torch.equal(captured[""], weights)


def test_a_decoder_layer_keeps_a_state_of_constant_size():
    torch.manual_seed(0)
    block = DecoderLayer(32, 4, cross_attention=False, norm_first=True).double().eval()
    block.self_attn = _layer()
    x = _x(B=3, T=9)
    with torch.no_grad():
        expected, cache = block(x), DecoderCache([block.new_cache()])
        state, sizes, outs = cache.layers[0].self_attn, [], []
        assert isinstance(state, RecurrentState) and repr(state) == "RecurrentState(shapes=None, position=0)"
        for i in range(9):
            outs.append(block(x[:, i : i + 1], cache=cache.layers[0]))
            sizes.append(cache.nbytes())
    torch.testing.assert_close(torch.cat(outs, 1), expected, **TIGHT)
    channels = 2 * 2 * 6 + 4 * 5
    assert sizes == [3 * (4 * 6 * 5 + channels * 3) * 8] * 9  # the state and 3 inputs per channel, whatever T
    assert cache.position == 9 and repr(state) == "RecurrentState(shapes=((3, 4, 6, 5), (3, 44, 3)), position=9)"
    state.reset()
    assert (state.position, state.nbytes(), state.filled) == (0, 0, False)


def test_defaults_and_parts():
    layer = GatedDeltaNet(32, 4)
    assert (layer.n_qk_heads, layer.d_k, layer.d_v, layer.conv_kernel, layer.mode) == (4, 8, 8, 4, "gated")
    assert part_weights(layer, "attention") == [
        "in_proj.weight", "beta_proj.weight", "decay_proj.weight", "gate_proj.weight", "out_proj.weight",
    ]  # fmt: skip
    assert layer.out_proj.in_features == 4 * 8 and layer.conv.weight.shape == (3 * 32, 1, 4)
    x = _x().float()
    assert layer(x, x, x)[0].shape == (2, 9, 32)


BAD_SETTINGS = [
    (dict(n_qk_heads=3), ValueError, r"n_qk_heads \(3\) must divide n_heads \(4\)"),
    (dict(n_qk_heads=0), ValueError, "n_qk_heads must be positive"),
    (dict(d_k=2.0), TypeError, "d_k must be an int"),
    (dict(conv_kernel=0), ValueError, "conv_kernel must be positive"),
    (dict(mode="mamba"), ValueError, "mode must be one of"),
    (dict(chunk_size=True), TypeError, "chunk_size must be an int"),
    (dict(eps=0), ValueError, "eps"),
]


@pytest.mark.parametrize("settings, error, message", BAD_SETTINGS)
def test_bad_settings_are_refused_by_name(settings, error, message):
    with pytest.raises(error, match=message):
        GatedDeltaNet(32, 4, **settings)


def test_bad_calls_are_refused_by_name():
    q, k, v, beta, gate, state = _inputs(1, 2, 5, 3, 4)
    layer, x = _layer(), _x(T=5)
    xf, narrow = x.float(), x[..., :8]
    bad = [
        (lambda: linear_attention(q, k, v, form="fast"), ValueError, "form must be one of"),
        (lambda: linear_attention(q, k, v, chunk_size=0), ValueError, "chunk_size must be positive"),
        (lambda: linear_attention(q, k[..., :2], v), ValueError, "q and k must have one shape"),
        (lambda: linear_attention(q[0], k[0], v[0]), ValueError, r"shape \(B, h, T, d\)"),
        (lambda: linear_attention(q, k, v.float()), TypeError, "must share one dtype"),
        (lambda: linear_attention(q, k, v.long()), TypeError, "v must be a floating-point tensor"),
        (lambda: linear_attention(q, k, v, feature_map="elu"), TypeError, "feature_map must be a function"),
        (lambda: linear_attention(q, k, v, normalize=1), TypeError, "normalize must be True or False"),
        (lambda: linear_attention(q, k, v, normalize=True, initial_state=state), ValueError, r"\(1, 2, 3, 5\)"),
        (lambda: linear_attention(q, k, v, gate=gate[..., :3]), ValueError, "gate must have shape"),
        (lambda: delta_rule(q, k, v, beta[0]), ValueError, r"beta must have shape \(B, h, T\)"),
        (lambda: delta_rule(q, k, v, beta, scale=0.0), ValueError, "scale must be a finite number > 0"),
        (lambda: delta_rule(q, k, v, beta, initial_state=state[0]), ValueError, "initial_state must have shape"),
        (lambda: delta_rule(q, k, v, beta, initial_state=[0]), TypeError, "initial_state must be a torch.Tensor"),
        (lambda: delta_rule_weights(q, k[..., :2], beta), ValueError, "q and k must have one shape"),
        (lambda: layer(x, x.clone(), x), ValueError, "self-attention only"),
        (lambda: layer(xf, xf, xf), TypeError, "float32 but the layer's weights are torch.float64"),
        (lambda: layer(narrow, narrow, narrow), ValueError, r"shape \(B, T, d_model=32\)"),
        (lambda: layer(x, x, x, is_causal=False), ValueError, "is_causal must be True"),
        (lambda: layer(x, x, x, mask=torch.ones(5, 5, dtype=torch.bool)), ValueError, "takes no mask"),
        (lambda: layer(x, x, x, window=3, _trusted=True), ValueError, "no sliding window"),
        (lambda: layer.new_cache(4), ValueError, "no sliding window"),
        (lambda: layer(x, x, x, cache=object()), TypeError, "cache must be a RecurrentState"),
        (lambda: layer.attention_weights(x, x, x, mask=torch.ones(5, 5)), ValueError, "takes no mask"),
        (lambda: gated_delta_net_from_qwen3_next(layer), TypeError, "Qwen3NextGatedDeltaNet"),
    ]
    for call, error, message in bad:
        with pytest.raises(error, match=message):
            call()
    with torch.no_grad():
        cache = layer.new_cache()
        layer(x, x, x, cache=cache)
        one = x[:1]
        with pytest.raises(ValueError, match="start a new cache"):
            layer(one, one, one, cache=cache)  # another batch
        with pytest.raises(ValueError, match="needs an empty cache"):
            layer(x, x, x, cache=cache, need_weights=True)
    theirs = _qwen()
    theirs.activation = "gelu"
    with pytest.raises(ValueError, match="hidden_act='gelu'"):
        gated_delta_net_from_qwen3_next(theirs)


RECIPE_BAD = [
    ({"attention": "gated_delta", "window": 8}, "is a recurrence whose state sums every token"),
    ({"attention": "gated_delta", "qk_norm": True}, "qk_norm=True is multi_head or sparse attention.s"),
    ({"attention": "delta", "n_kv_heads": 1}, "grouped-query attention's"),
    ({"full_every": 4}, "full_every=4 is linear or delta or gated_delta attention's"),
    ({"attention": "linear", "full_every": -1}, "full_every"),
    # 2 layers: every 5th layer would be multi-head attention, and none is
    ({"attention": "gated_delta", "full_every": 5}, "a model of n_layers=2 would have none"),
]


@pytest.mark.parametrize("settings, message", RECIPE_BAD)
def test_a_recurrent_recipe_refuses_what_it_cannot_do(settings, message):
    with pytest.raises(ValueError, match=message):
        tl.GPT(tl.GPTConfig(20, 16, 2, 2, 16, **settings))


def test_a_hybrid_keeps_multi_head_attention_every_full_every_layers():
    model = tl.GPT(tl.GPTConfig(20, 16, 8, 2, 16, recipe="hybrid"))
    kinds = [type(layer.self_attn).__name__ for layer in model.decoder.layers]
    assert kinds == ["GatedDeltaNet"] * 3 + ["MultiHeadAttention"] + ["GatedDeltaNet"] * 3 + ["MultiHeadAttention"]
    modes = {layer.self_attn.mode for layer in model.decoder.layers if isinstance(layer.self_attn, GatedDeltaNet)}
    assert modes == {"gated"}
    cache = model.new_cache()
    model(torch.randint(0, 20, (1, 10)), cache=cache)
    sizes = [c.self_attn.nbytes() for c in cache.layers]
    model(torch.randint(0, 20, (1, 5)), cache=cache)
    grown = [c.self_attn.nbytes() for c in cache.layers]  # the states keep their size, the caches grow
    assert [a == b for a, b in zip(sizes, grown, strict=True)] == [kind == "GatedDeltaNet" for kind in kinds]
    with pytest.raises(ValueError, match="cross-attention is not"):
        tl.DecoderLayer(16, 2, parts=tl.RECIPES["gated_delta"])


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_chunked_delta_rule_on_a_gpu_equals_the_recurrence_in_float64(dtype):
    q, k, v, beta, gate, state = _inputs(2, 3, 200, 16, 8, seed=9)
    k = l2_normalize(k)
    ref = delta_rule(q, k, v, beta, gate=gate, initial_state=state, form="recurrent")
    cuda = [t.to("cuda", dtype) for t in (q, k, v, beta, gate, state)]
    out = delta_rule(*cuda[:4], gate=cuda[4], initial_state=cuda[5], form="chunked", chunk_size=64)
    tol = 1e-4 if dtype == torch.float32 else 0.1
    for got, expected in zip(out, ref, strict=True):
        assert got.dtype == dtype and (got.double().cpu() - expected).abs().max() < tol


@requires_cuda
def test_a_hybrid_trains_and_decodes_on_a_gpu():
    torch.manual_seed(0)
    model = tl.GPT(tl.GPTConfig(50, 32, 4, 4, 64, recipe="hybrid")).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    x = torch.randint(0, 50, (8, 33), device="cuda")
    losses = []
    for _ in range(20):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            _, loss = model(x[:, :-1], x[:, 1:])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert all(math.isfinite(v) for v in losses) and losses[-1] < losses[0]
    model.eval()
    prompt = x[:1, :5]
    assert torch.equal(model.generate(prompt, 20, top_k=1), model.generate(prompt, 20, top_k=1, use_cache=False))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_16_bit_recurrence_runs_in_float32_and_keeps_a_float32_state(dtype):
    q, k, v, beta, gate, _ = _inputs(1, 2, 40, 8, 4, seed=11)
    low = [t.to(dtype) for t in (q, l2_normalize(k), v, beta, gate)]
    out, state = delta_rule(*low[:4], gate=low[4], form="chunked", chunk_size=16)
    ref_out, ref_state = delta_rule(*(t.float() for t in low[:4]), gate=low[4].float(), form="chunked", chunk_size=16)
    assert (out.dtype, state.dtype) == (dtype, torch.float32)
    assert torch.equal(out, ref_out.to(dtype)) and torch.equal(state, ref_state)
    more = delta_rule(*low[:4], gate=low[4], form="recurrent", initial_state=state)[1]  # the float32 state goes on
    assert more.dtype == torch.float32
    with pytest.raises(TypeError, match="initial_state must have q's dtype"):
        delta_rule(*low[:4], initial_state=state.double())


@pytest.mark.parametrize("recipe", ["gated_delta", "hybrid"])
def test_a_recurrent_model_trains_under_autocast_and_decodes_in_16_bits(recipe):
    torch.manual_seed(0)
    model = tl.GPT(tl.GPTConfig(30, 24, 4, 2, 16, recipe=recipe))
    x = torch.randint(0, 30, (4, 25), generator=torch.Generator().manual_seed(1))
    with torch.autocast("cpu", dtype=torch.bfloat16):  # the decay leaves softplus in float32, the rest in 16 bits
        _, loss = model(x[:, :-1], x[:, 1:])
    loss.backward()
    assert math.isfinite(loss.item()) and all(p.grad is not None for p in model.parameters())
    low = model.to(torch.bfloat16).eval()
    prompt = x[:1, :5]
    cached = low.generate(prompt, 10, top_k=1)
    assert torch.equal(cached, low.generate(prompt, 10, top_k=1, use_cache=False))
    cache = low.new_cache()
    low(prompt, cache=cache)
    states = [c.self_attn.state for c in cache.layers if isinstance(c.self_attn, RecurrentState)]
    assert states and all(s.dtype == torch.float32 for s in states)


def test_a_nan_in_one_value_reaches_the_outputs_the_module_docstring_says_in_each_form():
    # equal for finite inputs; a NaN spreads by each form's arithmetic (0 * NaN is NaN)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 1, 8, 4, generator=g, dtype=torch.float64) for _ in range(3))
    v[0, 0, 5] = float("nan")
    reached = {}
    for form in ("recurrent", "chunked", "parallel"):
        out, _ = tl.linear_attention(q, k, v, form=form, chunk_size=2)
        reached[form] = torch.isnan(out[0, 0]).any(-1).nonzero().flatten().tolist()
    assert reached == {"recurrent": [5, 6, 7], "chunked": [4, 5, 6, 7], "parallel": list(range(8))}


# ----- the decay's starting values -----


@given(seed=st.integers(0, 2**31 - 1))
@settings(max_examples=20, deadline=None)
def test_the_reference_init_keeps_most_of_the_state_and_transformers_init_almost_none(seed):
    torch.manual_seed(seed)
    reference = keep_per_token(GatedDeltaNet(32, 256, d_k=4))  # 256 heads: the median is stable
    fresh = keep_per_token(GatedDeltaNet(32, 256, d_k=4, init="transformers"))
    assert reference.median() > 0.5 and fresh.median() < 0.01
    assert reference.max() < 1 and reference.min() >= math.exp(-16 * 0.1)  # A <= 16, dt <= 0.1


def test_the_reference_init_inverts_softplus_and_draws_log_uniform_steps():
    torch.manual_seed(0)
    layer = GatedDeltaNet(32, 4096, d_k=4)
    dt = torch.nn.functional.softplus(layer.step_bias.detach().double())
    assert dt.min() >= 1e-3 * (1 - 1e-5) and dt.max() <= 0.1 * (1 + 1e-5)
    assert dt.log().median().item() == pytest.approx(math.log(1e-2), abs=0.1)  # the middle of the logs
    rates = layer.log_rate.detach().exp()
    assert rates.min() >= 0 and rates.max() <= 16 and rates.mean().item() == pytest.approx(8, abs=0.3)


def test_a_gpt_builds_its_recurrences_from_the_init_decay_init_names():
    config = tl.GPTConfig(10, 16, 2, 4, 32, attention="gated_delta")
    with decay_init("transformers"):
        inside = tl.GPT(config)
    after = tl.GPT(config)
    assert {layer.self_attn.init for layer in inside.decoder.layers} == {"transformers"}
    assert {layer.self_attn.init for layer in after.decoder.layers} == {"reference"}
    assert all((layer.self_attn.step_bias == 1).all() for layer in inside.decoder.layers)


@pytest.mark.parametrize("init", ["mamba", "Reference", 1])
def test_an_unknown_init_is_refused_by_name(init):
    with pytest.raises(ValueError, match="init must be one of"):
        GatedDeltaNet(32, 4, init=init)
    with pytest.raises(ValueError, match="init must be one of"):
        with decay_init(init):
            pass

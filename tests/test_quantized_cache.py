"""Tests of the quantised key-value cache (chapter "Longer than trained"): keys per channel over
groups of tokens, values per token, a full-precision residual, in 8 and 4 bits.

The dequantised keys and values equal PyTorch's own quantisation with PyTorch's own scales
(``torch.quantize_per_channel`` at 8 bits, ``torch.fake_quantize_per_channel_affine`` at 4), so
each is within half a step of what went in; how the tokens are appended (a prompt at once, one by
one, in uneven chunks) changes nothing; a model decoding from an 8-bit cache picks the same tokens
as from the full cache, by a margin the test measures; the bytes held are the formula's; and a key
scale fixed at the prompt clips the later keys, an error that grows as they outgrow it.

``transformers``' ``QuantizedCache`` is not compared here: it needs ``optimum-quanto`` or ``hqq``
as its backend and neither is installed in this project's environment (checked with
``transformers.utils.is_optimum_quanto_available()`` and ``is_hqq_available()``, both False). Its
scheme also differs: it re-quantises the whole cache each time the residual fills, with a zero
point (asymmetric), where this one quantises each group once, symmetrically, as KIVI does.
"""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.ao.quantization import PerChannelMinMaxObserver

import transformer_lib as tl

pytestmark = [
    pytest.mark.usefixtures("one_thread"),
    pytest.mark.filterwarnings("ignore:torch.quantize_per_tensor:UserWarning"),  # deprecated, still the reference
]

RANGE = {8: (-128, 127), 4: (-8, 7)}
EPS32 = torch.finfo(torch.float32).eps


def keys_values(seed, B=2, h=3, T=24, d_k=8, dtype=torch.float32):
    """Keys with a few large channels (as trained keys have) and plain values, ``(B, h, T, d_k)`` each."""
    g = torch.Generator().manual_seed(seed)
    channel_size = torch.logspace(-2, 1, d_k)[torch.randperm(d_k, generator=g)]  # 0.01 .. 10
    k = torch.randn(B, h, T, d_k, generator=g) * channel_size + torch.randn(d_k, generator=g)
    v = torch.randn(B, h, T, d_k, generator=g)
    return k.to(dtype), v.to(dtype)


def filled(k, v, chunks=None, **settings):
    """A QuantizedKVCache with ``k, v`` appended in ``chunks`` (sizes; default: all at once)."""
    cache = tl.QuantizedKVCache(**settings)
    start = 0
    for size in chunks or [k.shape[2]]:
        cache.append(k[:, :, start : start + size], v[:, :, start : start + size])
        start += size
    return cache


def torch_quantised(rows, bits):
    """PyTorch's symmetric per-row quantisation of ``rows (N, n)`` float32: its observer's scales, then
    its per-channel quantiser; ``(dequantised (N, n), scales (N,))``."""
    lo, hi = RANGE[bits]
    observer = PerChannelMinMaxObserver(
        ch_axis=0, dtype=torch.qint8, qscheme=torch.per_channel_symmetric, quant_min=lo, quant_max=hi
    )
    observer(rows)
    scales, zero_points = observer.calculate_qparams()
    if bits == 8:
        return torch.quantize_per_channel(rows, scales, zero_points, 0, torch.qint8).dequantize(), scales
    return torch.fake_quantize_per_channel_affine(rows, scales, zero_points.int(), 0, lo, hi), scales


def torch_keys(k, group, bits):
    """Keys ``(B, h, T, d_k)`` quantised by PyTorch, one scale per channel of each group of tokens."""
    B, h, T, d_k = k.shape
    rows = k.float().view(B, h, T // group, group, d_k).transpose(3, 4).reshape(-1, group)  # a channel's group
    deq, scales = torch_quantised(rows, bits)
    deq = deq.view(B, h, T // group, d_k, group).transpose(3, 4).reshape(B, h, T, d_k)
    return deq, scales.view(B, h, T // group, d_k)


def torch_values(v, bits):
    """Values ``(B, h, T, d_k)`` quantised by PyTorch, one scale per token."""
    B, h, T, d_k = v.shape
    deq, scales = torch_quantised(v.float().reshape(-1, d_k), bits)
    return deq.view(B, h, T, d_k), scales.view(B, h, T)


# --- equal to PyTorch's quantisation, and within half a step ---------------------------------


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_dequantised_keys_and_values_equal_pytorchs(bits, dtype):
    k, v = keys_values(0, T=24, dtype=dtype)
    cache = filled(k, v, bits=bits, group=8)  # 24 tokens: three groups, the residual empty
    assert (cache.quantised_length, cache.residual) == (24, 0)
    k_torch, _ = torch_keys(k, 8, bits)
    v_torch, _ = torch_values(v, bits)
    assert cache.k.dtype == dtype and cache.v.dtype == dtype
    assert torch.equal(cache.k, k_torch.to(dtype))  # bit for bit: float32 codes times float32 scales
    assert torch.equal(cache.v, v_torch.to(dtype))
    assert not torch.equal(cache.k, k)  # something was rounded


def test_eight_bit_codes_are_chapter_16s_int8_weights():
    """A group of keys, channel by channel, is a weight matrix row by row: quantize_int8's codes and scales."""
    k, v = keys_values(1, B=1, h=1, T=16, d_k=8)
    cache = filled(k, v, bits=8, group=16)
    codes, scales = tl.quantize_int8(k[0, 0].T)  # (d_k, group): a row per channel
    assert torch.equal(cache.k[0, 0], tl.dequantize_int8(codes, scales).T)
    codes, scales = tl.quantize_int8(v[0, 0])  # (T, d_k): a row per token
    assert torch.equal(cache.v[0, 0], tl.dequantize_int8(codes, scales))


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    bits=st.sampled_from([8, 4]),
    group=st.integers(1, 6),
    extra=st.integers(0, 5),
    T=st.integers(1, 30),
    d_k=st.integers(1, 7),
    scale=st.sampled_from([1e-30, 1e-3, 1.0, 1e4]),
)
def test_every_number_is_within_half_a_step(seed, bits, group, extra, T, d_k, scale):
    k, v = keys_values(seed, B=1, h=2, T=T, d_k=d_k, dtype=torch.float64)
    k, v = k * scale, v * scale
    cache = filled(k, v, bits=bits, group=group, residual_length=group + extra)
    n = cache.quantised_length
    assert n % group == 0 and cache.length == T == cache.position
    k_held, v_held = cache.k, cache.v
    assert torch.equal(k_held[:, :, n:], k[:, :, n:]) and torch.equal(v_held[:, :, n:], v[:, :, n:])  # the residual
    if n == 0:
        return
    _, k_scales = torch_keys(k[:, :, :n], group, bits)
    _, v_scales = torch_values(v[:, :, :n], bits)
    k_step = k_scales.double().repeat_interleave(group, dim=2)  # (B, h, n, d_k)
    v_step = v_scales.double()[..., None]  # (B, h, n, 1)
    for held, x, step in ((k_held, k, k_step), (v_held, v, v_step)):
        x = x[:, :, :n].float().double()  # what is quantised: float32
        # half a step, and the float32 rounding of the reciprocal, the product and the dequantised value
        bound = step / 2 + 4 * EPS32 * x.abs()
        assert ((held[:, :, :n] - x).abs() <= bound).all()


def test_four_bits_err_more_than_eight():
    k, v = keys_values(2, T=32)
    errors = {bits: (filled(k, v, bits=bits, group=8).k - k).abs().mean().item() for bits in (8, 4)}
    # a step of 4 bits is 127.5 / 7.5 = 17 times 8 bits': the mean error follows
    assert 10 < errors[4] / errors[8] < 30


# --- the residual -------------------------------------------------------------------------------


@pytest.mark.parametrize("group, residual_length", [(4, 4), (4, 6), (3, 9), (1, 1)])
def test_the_residual_keeps_the_newest_tokens_and_groups_fill_in_order(group, residual_length):
    k, v = keys_values(3, T=23)
    cache = tl.QuantizedKVCache(bits=4, group=group, residual_length=residual_length)
    for t in range(23):
        got_k, got_v = cache.append(k[:, :, t : t + 1], v[:, :, t : t + 1])
        T = t + 1
        n, r = cache.quantised_length, cache.residual
        assert n + r == T == cache.length == cache.position and n % group == 0
        assert r < residual_length and (r >= residual_length - group or n == 0)
        assert torch.equal(got_k, cache.k) and torch.equal(got_v, cache.v)  # what append returns is what is held
        assert torch.equal(got_k[:, :, n:], k[:, :, n:T])  # the residual: as it came, the newest last


@pytest.mark.parametrize("fixed_scale", [False, True])
def test_how_the_tokens_arrive_changes_nothing(fixed_scale):
    """Groups start at position 0 whatever the chunks; each group's scale is its own tokens'.
    With a fixed scale the prompt (the first chunk) is the same in both, so the scale is too."""
    k, v = keys_values(4, T=30)
    settings = dict(bits=4, group=4, residual_length=8, fixed_scale=fixed_scale)
    prompt = 5
    one_by_one = filled(k, v, [prompt] + [1] * 25, **settings)
    uneven = filled(k, v, [prompt, 7, 1, 9, 3, 5], **settings)
    assert torch.equal(one_by_one.k, uneven.k) and torch.equal(one_by_one.v, uneven.v)
    assert one_by_one.nbytes() == uneven.nbytes()
    if not fixed_scale:
        at_once = filled(k, v, **settings)
        assert torch.equal(at_once.k, uneven.k) and torch.equal(at_once.v, uneven.v)


def test_reset_empties_and_keeps_the_settings():
    k, v = keys_values(5, T=10)
    cache = filled(k, v, bits=4, group=4)
    cache.reset()
    assert (cache.length, cache.position, cache.nbytes(), cache.k, cache.filled) == (0, 0, 0, None, False)
    assert (cache.bits, cache.group) == (4, 4)
    again = filled(k, v, bits=4, group=4)
    cache.append(k, v)
    assert torch.equal(cache.k, again.k)


# --- decoding with it ---------------------------------------------------------------------------


def gpt(**shape):
    torch.manual_seed(0)
    config = dict(vocab_size=17, context_len=64, n_layers=2, n_heads=4, d_model=32)
    return tl.GPT(tl.GPTConfig(**{**config, **shape})).double().eval()


def last_logits(model, idx, cache, path):
    """The last position's logits at each step of decoding ``path (B, n)`` after the prompt ``idx``:
    ``(B, n + 1, vocab_size)``, the prefill's first."""
    with torch.no_grad():
        logits, _ = model(idx, cache=cache)
        steps = [logits[:, -1]]
        for t in range(path.shape[1]):
            logits, _ = model(path[:, t : t + 1], cache=cache)
            steps.append(logits[:, -1])
    return torch.stack(steps, dim=1)


def greedy(model, idx, cache, n):
    with torch.no_grad():
        logits, _ = model(idx, cache=cache)
        tokens = []
        for _ in range(n):
            tokens.append(logits[:, -1].argmax(-1, keepdim=True))  # (B, 1)
            logits, _ = model(tokens[-1], cache=cache)
    return torch.cat(tokens, dim=1)


SHAPES = {
    "learned positions": {},
    "rotary, grouped-query": dict(positions="rotary", n_kv_heads=2),
    "llama, window": dict(recipe="llama", window=12),
}


@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
def test_eight_bit_cache_decodes_the_full_caches_tokens(shape):
    """The full cache's greedy path; along it, the 8-bit cache's logits move by less than half the
    gap between the best token and the next at every step, so its argmax, and its greedy path, are
    the same (then checked directly). The gap is measured, so a tie would fail loudly, not pass."""
    model = gpt(**shape)
    idx = torch.randint(0, 17, (2, 7), generator=torch.Generator().manual_seed(1))
    n = 40
    path = greedy(model, idx, model.new_cache(), n)
    full = last_logits(model, idx, model.new_cache(), path[:, :-1])  # (B, n, vocab)
    quantised = last_logits(model, idx, tl.new_quantized_cache(model, bits=8, group=8), path[:, :-1])
    top2 = full.topk(2, dim=-1).values
    gap = top2[..., 0] - top2[..., 1]  # (B, n)
    moved = (quantised - full).abs().amax(dim=-1)  # (B, n)
    assert (moved < gap / 2).all(), f"largest move {moved.max():.3g}, smallest gap {gap.min():.3g}"
    assert 0 < moved.max() < 1e-2  # the 8-bit keys and values did change the logits, a little
    assert torch.equal(greedy(model, idx, tl.new_quantized_cache(model, bits=8, group=8), n), path)


def test_an_encoder_decoder_keeps_its_cross_attention_in_full():
    torch.manual_seed(0)
    config = tl.TransformerConfig(
        src_vocab_size=11,
        tgt_vocab_size=11,
        d_model=16,
        n_heads=2,
        n_encoder_layers=1,
        n_decoder_layers=2,
        context_len=16,
        dropout=0.0,
    )
    model = tl.Transformer(config).double().eval()
    cache = tl.new_quantized_cache(model, bits=8, group=4)
    assert all(type(c.cross_attn) is tl.KVCache and c.cross_attn.static for c in cache.layers)
    src = torch.randint(0, 11, (2, 9), generator=torch.Generator().manual_seed(0))
    tgt = torch.randint(0, 11, (2, 10), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        memory, keep = model.encode(src)
        want = model.decode(tgt, memory, keep)
        got = torch.cat([model.decode(tgt[:, : t + 1], memory, keep, cache=cache) for t in range(10)], dim=1)
    assert cache.layers[0].self_attn.quantised_length == 8
    assert (got - want).abs().max() < 1e-2


# --- bytes --------------------------------------------------------------------------------------


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("group, residual_length, fixed_scale", [(4, None, False), (4, 10, False), (8, None, True)])
def test_bytes_are_the_formulas(bits, group, residual_length, fixed_scale):
    model = gpt(n_kv_heads=2)  # d_k = 8, two key-value heads, float64
    settings = dict(bits=bits, group=group, residual_length=residual_length, fixed_scale=fixed_scale)
    cache = tl.new_quantized_cache(model, **settings)
    idx = torch.randint(0, 17, (3, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        model(idx[:, :5], cache=cache)
        for t in range(5, 40):
            model(idx[:, t : t + 1], cache=cache)
            want = tl.quantized_kv_bytes(2, 2, 8, t + 1, batch=3, dtype=torch.float64, **settings)
            assert cache.nbytes() == want, f"after {t + 1} tokens"


def test_bytes_per_token_far_past_the_residual():
    """Per token, per layer and key-value head: ``2 d_k bits / 8`` of codes, ``4 d_k / group`` of key
    scales, 4 of a value scale; against ``2 d_k 4`` in float32. At d_k = 64 and groups of 32: 76
    bytes at 4 bits, 140 at 8, 512 in full."""
    T, group = 32 * 1000, 32
    for bits, per_token in ((4, 64 + 8 + 4), (8, 128 + 8 + 4)):
        got = tl.quantized_kv_bytes(1, 1, 64, T, bits=bits, group=group)
        assert got == per_token * T  # T a multiple of the group (the default residual): no residual left
    assert tl.kv_cache_bytes(1, 1, 64, T) == 512 * T
    odd = tl.quantized_kv_bytes(1, 1, 3, 32, bits=4, group=32)  # 96 codes of 4 bits: 48 bytes each for k and v
    assert odd == 2 * 48 + 4 * 3 + 4 * 32


# --- the mistake: a key scale fixed at the prefill ----------------------------------------------


def test_a_scale_fixed_at_the_prompt_clips_every_key_that_outgrows_it():
    """Keys that grow along the sequence: the prompt's scale is PyTorch's for the prompt, every later
    key is quantised with it (PyTorch's fake quantiser with those scales: clipped at the last code),
    and the error grows key by key once they pass the prompt's largest."""
    g = torch.Generator().manual_seed(6)
    T, prompt = 48, 8
    direction = torch.randn(1, 2, 1, 8, generator=g)
    k = direction * torch.linspace(1, 4, T)[:, None]  # (1, 2, T, 8): each key larger than the one before
    v = torch.randn(1, 2, T, 8, generator=g)
    fixed = filled(k, v, [prompt] + [1] * (T - prompt), bits=8, group=8, fixed_scale=True)
    rows = k[0, :, :prompt].transpose(1, 2).reshape(-1, prompt)  # (h * d_k, prompt): a channel's prompt
    _, scales = torch_quantised(rows, 8)
    every = k[0].transpose(1, 2).reshape(-1, T)  # (h * d_k, T)
    clipped = torch.fake_quantize_per_channel_affine(every, scales, torch.zeros(16, dtype=torch.int32), 0, -128, 127)
    n = fixed.quantised_length
    assert n == T and torch.equal(fixed.k[0], clipped.view(2, 8, T).transpose(1, 2))
    error = (fixed.k - k).abs().amax(dim=(0, 1, 3))  # (T,) the worst channel
    step = scales.max()
    assert (error[:prompt] <= step / 2 * (1 + 1e-6)).all()  # the prompt: within half a step
    assert (error[prompt:].diff() > 0).all() and error[-1] > 100 * step  # then clipped, more at each key
    own = filled(k, v, bits=8, group=8)  # a scale per group: every key within its own half step
    assert (own.k - k).abs().max() < error[-1] / 100


def test_rotary_keys_outgrow_the_prompts_scale():
    """Rotary positions turn each pair of channels: a channel small over the prompt grows later, and
    the fixed scale clips it. The mean error over the prompt is the per-group cache's; later it grows
    to many times that, most at the end, while the per-group cache's stays the same."""
    g = torch.Generator().manual_seed(0)
    T, prompt, d = 512, 16, 16
    k = tl.apply_rotary(torch.randn(1, 4, 1, d, generator=g).expand(1, 4, T, d).contiguous())
    v = torch.randn(1, 4, T, d, generator=g)
    chunks = [prompt] + [1] * (T - prompt)
    errors = {}
    for fixed in (False, True):
        cache = filled(k, v, chunks, bits=8, group=16, fixed_scale=fixed)
        mean = (cache.k - k).abs().mean(dim=(0, 1, 3))  # (T,)
        errors[fixed] = [mean[i : i + 64].mean().item() for i in range(0, T, 64)]  # by 64 positions
        errors[fixed, "prompt"] = mean[:prompt].mean().item()
    assert errors[True, "prompt"] == errors[False, "prompt"]
    assert max(errors[False]) < 1.2 * min(errors[False])  # a scale per group: the same error everywhere
    assert errors[True][-1] > 20 * errors[False][-1] and errors[True][-1] > 2 * errors[True][0]


# --- bad input ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "settings, error, word",
    [
        (dict(bits=3), ValueError, "bits"),
        (dict(bits=8.0), ValueError, "bits"),
        (dict(bits=True), ValueError, "bits"),
        (dict(group=0), ValueError, "group"),
        (dict(group="32"), TypeError, "group"),
        (dict(group=8, residual_length=4), ValueError, "residual_length"),
        (dict(residual_length=2.5), TypeError, "residual_length"),
        (dict(fixed_scale="yes"), TypeError, "fixed_scale"),
    ],
)
def test_bad_settings_are_refused_by_name(settings, error, word):
    with pytest.raises(error, match=word):
        tl.QuantizedKVCache(**settings)
    with pytest.raises(error, match=word):
        tl.new_quantized_cache(gpt(), **settings)
    with pytest.raises(error, match=word):
        tl.quantized_kv_bytes(1, 1, 8, 10, **settings)


def test_bad_appends_are_refused():
    k, v = keys_values(7, T=4)
    cache = filled(k, v, bits=8, group=4)
    with pytest.raises(ValueError, match="shape"):
        cache.append(k[0], v[0])  # 3-D
    with pytest.raises(ValueError, match="one shape"):
        cache.append(k, v[:, :, :2])
    with pytest.raises(ValueError, match="floating point"):
        cache.append(k.int(), v.int())
    with pytest.raises(ValueError, match="start a new cache"):
        cache.append(k[:1], v[:1])  # another batch
    with pytest.raises(ValueError, match="start a new cache"):
        cache.append(k.double(), v.double())
    with pytest.raises(ValueError, match="append"):
        cache.set(k, v)
    with pytest.raises(AttributeError, match="append"):
        cache.k = k
    assert cache.length == 4  # nothing refused was added


def test_models_and_layers_it_cannot_quantise_are_refused():
    with pytest.raises(TypeError, match="GPT"):
        tl.new_quantized_cache(torch.nn.Linear(2, 2))
    latent = gpt(recipe="llama", attention="latent")
    with pytest.raises(ValueError, match="layer 0.*LatentAttention"):
        tl.new_quantized_cache(latent)
    with pytest.raises(TypeError, match="n_kv_heads"):
        tl.quantized_kv_bytes(1, 0.5, 8, 10)
    with pytest.raises(ValueError, match="T"):
        tl.quantized_kv_bytes(1, 1, 8, -1)
    with pytest.raises(TypeError, match="dtype"):
        tl.quantized_kv_bytes(1, 1, 8, 10, dtype=torch.int8)

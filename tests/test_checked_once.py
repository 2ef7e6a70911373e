"""Each setting is checked once, where it enters, and the cache's position is counted in one place."""

import collections
import sys

import pytest
import torch

import transformer_lib as tl
from transformer_lib import _checks


@pytest.fixture
def int_checks(monkeypatch):
    """How many times each name goes through ``check_int``, in every module of the package."""
    counts = collections.Counter()
    original = _checks.check_int

    def counting(value, name, *args, **kwargs):
        counts[name] += 1
        return original(value, name, *args, **kwargs)

    for module in list(sys.modules.values()):
        if (
            getattr(module, "__name__", "").startswith("transformer_lib")
            and getattr(module, "check_int", None) is original
        ):
            monkeypatch.setattr(module, "check_int", counting)
    return counts


def test_window_and_n_kv_heads_are_checked_once_along_a_model(int_checks):
    config = tl.GPTConfig(vocab_size=11, context_len=32, n_layers=3, n_heads=4, n_kv_heads=2, window=5, d_model=16)
    assert int_checks["window"] == 1 and int_checks["n_kv_heads"] == 1  # the config's own checks
    int_checks.clear()
    model = tl.GPT(config)
    idx = torch.randint(0, 11, (2, 3), generator=torch.Generator().manual_seed(0))
    model.generate(idx, 6, top_k=1)  # a cached generation: a prefill and five one-token steps
    assert int_checks["window"] == 0 and int_checks["n_kv_heads"] == 0


def test_public_layers_still_check_once(int_checks):
    tl.Decoder(16, 4, 3, cross_attention=False, n_kv_heads=2, window=3)
    assert int_checks["window"] == 1 and int_checks["n_kv_heads"] == 1
    with pytest.raises(ValueError, match="window must be positive.*got 0"):
        tl.DecoderLayer(16, 4, window=0)
    with pytest.raises(ValueError, match=r"n_kv_heads \(3\) must divide n_heads \(4\)"):
        tl.Decoder(16, 4, 2, n_kv_heads=3)
    with pytest.raises(ValueError, match=r"n_kv_heads \(3\) must divide n_heads \(4\)"):
        tl.MultiHeadAttention(16, 4, n_kv_heads=3)
    with pytest.raises(TypeError, match="window must be an int, got 1.5"):
        tl.KVCache(window=1.5)
    x = torch.zeros(1, 2, 16)
    with pytest.raises(ValueError, match="window must be positive.*got 0"):
        tl.MultiHeadAttention(16, 4)(x, x, x, is_causal=True, window=0)


@pytest.mark.parametrize("n_layers", [0, 2])
def test_decoder_cache_position_has_one_source(n_layers):
    model = tl.GPT(tl.GPTConfig(vocab_size=11, context_len=16, n_layers=n_layers, n_heads=2, d_model=16))
    cache = model.new_cache()
    idx = torch.randint(0, 11, (1, 5), generator=torch.Generator().manual_seed(0))
    model(idx, cache=cache)
    model(idx[:, :1], cache=cache)
    assert cache.position == 6
    if n_layers:
        assert all(c.self_attn.position == 6 for c in cache.layers)
        cache.layers[0].self_attn.reset()  # the layers' caches hold the count: the stack reads it
        assert cache.position == 0
    with pytest.raises(AttributeError):
        cache.position = 3


def test_a_model_checks_its_input_once_per_call_not_at_every_layer(monkeypatch):
    """The model makes x and the cache itself: its attentions never re-check them, while a layer
    or an attention called directly still checks everything."""
    from transformer_lib import multihead

    calls = collections.Counter()
    original = multihead.MultiHeadAttention._check_inputs

    def counting(self, *args, **kwargs):
        calls["attention"] += 1
        return original(self, *args, **kwargs)

    monkeypatch.setattr(multihead.MultiHeadAttention, "_check_inputs", counting)
    model = tl.GPT(tl.GPTConfig(vocab_size=11, context_len=16, n_layers=3, n_heads=2, d_model=16))
    idx = torch.randint(0, 11, (2, 5), generator=torch.Generator().manual_seed(0))
    model(idx)
    model.generate(idx, 4)
    assert calls["attention"] == 0
    with pytest.raises(TypeError, match="float64"):  # the layers themselves still check their input
        model.decoder.layers[0](torch.zeros(1, 3, 16, dtype=torch.float64))
    x = torch.zeros(1, 3, 16)
    model.decoder.layers[0].self_attn(x, x, x)
    assert calls["attention"] == 1
    with pytest.raises(ValueError, match="vocab_size=11"):  # and the model checks its own, once
        model(idx + 11)


def test_generate_returns_a_plain_tensor_that_training_can_use():
    """Generation runs in inference mode; what it returns is an ordinary tensor."""
    model = tl.GPT(tl.GPTConfig(vocab_size=11, context_len=16, n_layers=1, n_heads=2, d_model=16))
    out = model.generate(torch.zeros(1, 2, dtype=torch.long), 5)
    assert not out.is_inference() and out.shape == (1, 7)
    _, loss = model(out[:, :-1], out[:, 1:])
    loss.backward()  # autograd accepts it
    assert model.tok_embed.weight.grad is not None

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

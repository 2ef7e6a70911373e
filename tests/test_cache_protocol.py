"""Every cache of the book answers one protocol (transformer_lib/kv_cache.py's module docstring):
``crop(n)`` goes back to what the cache held after its first ``n`` tokens, ``select(rows)`` keeps batch
rows, ``nbytes()`` counts what is held. Run on every recipe of the compose test: decoding ``n`` tokens,
cropping to ``m`` and decoding on equals decoding ``m`` and then the same tokens, to 1e-12 in
float64, with the same bytes held; a crop that needs a position the cache no longer has (a window
dropped it, a recurrence mixed it into its state, a quantised cache rounded it) is refused by name."""

import re

import pytest
import torch
from test_recipes_compose import RECIPES, ids, make

import transformer_lib as tl

RECURRENT = {"linear", "delta", "gated-delta", "hybrid", "hybrid-gpt2"}
WINDOWED = {"window", "sinks-window-keep-first"}  # window 4: it drops a position from the 4th token on


def feed(model, cache, tokens, chunks):
    """Logits of ``tokens (B, T)`` fed through ``cache`` in chunks of these sizes, ``(B, T, vocab)``."""
    out, start = [], 0
    for size in chunks:
        out.append(model(tokens[:, start : start + size], cache=cache)[0])
        start += size
    assert start == tokens.shape[1]
    return torch.cat(out, dim=1)


def held(cache):
    """Every tensor the caches of a DecoderCache hold, layer by layer, for an exact comparison."""
    found = []
    for layer in cache.layers:
        c = layer.self_attn
        for name in ("k", "v", "c", "k_rope", "index_keys", "state", "conv"):
            t = getattr(c, name, None)
            if t is not None:
                found.append(t)
    return found


@pytest.mark.parametrize("name", [n for n in RECIPES if n not in RECURRENT])
def test_crop_then_continue_equals_decoding_the_shorter_prefix(name):
    model = make(RECIPES[name]).eval()
    tokens = ids(2, 12)
    n, m = (3, 1) if name in WINDOWED else (9, 5)  # a window of 4 holds its first 3 tokens whole
    with torch.no_grad():
        cropped = model.new_cache()
        feed(model, cropped, tokens[:, :n], [4, 1, 1, 1, 1, 1] if n == 9 else [2, 1])
        cropped.crop(m)
        assert cropped.position == m
        fresh = model.new_cache()
        feed(model, fresh, tokens[:, :m], [m])
        assert cropped.nbytes() == fresh.nbytes()
        pairs = zip(held(cropped), held(fresh), strict=True)
        assert all(a.shape == b.shape and torch.allclose(a, b, rtol=0, atol=1e-12) for a, b in pairs)
        rest = tokens.shape[1] - m if name not in WINDOWED else 6
        after_crop = feed(model, cropped, tokens[:, m : m + rest], [2, 1] + [1] * (rest - 3))
        straight = feed(model, fresh, tokens[:, m : m + rest], [rest])
    assert torch.allclose(after_crop, straight, rtol=0, atol=1e-12)
    assert cropped.nbytes() == fresh.nbytes()


@pytest.mark.parametrize("name", sorted(WINDOWED))
def test_a_window_that_dropped_a_position_refuses_to_go_back_before_it(name):
    model = make(RECIPES[name]).eval()
    with torch.no_grad():
        cache = model.new_cache()
        feed(model, cache, ids(1, 8), [8])
        with pytest.raises(ValueError, match=r"cannot crop .* to n=6: its window of 4 already dropped position 3"):
            cache.crop(6)
        cache.crop(8)  # where it is: nothing to drop
        assert cache.position == 8


@pytest.mark.parametrize("name", [n for n in RECIPES if n not in RECURRENT])
def test_selecting_rows_equals_decoding_those_rows_alone(name):
    model = make(RECIPES[name]).eval()
    tokens = ids(3, 8)
    rows = [2, 0, 2]  # beam search keeps a beam twice and drops one
    with torch.no_grad():
        cache = model.new_cache()
        feed(model, cache, tokens[:, :2], [2])
        cache.select(rows)
        together = feed(model, cache, tokens[rows, 2:], [1] * 6)
        alone = model.new_cache()
        feed(model, alone, tokens[rows, :2], [2])
        separately = feed(model, alone, tokens[rows, 2:], [1] * 6)
    assert torch.allclose(together, separately, rtol=0, atol=1e-12)
    assert cache.nbytes() == alone.nbytes()


def test_the_quantised_cache_crops_only_its_residual():
    model = make(RECIPES["llama"]).eval()
    tokens = ids(1, 12)
    with torch.no_grad():
        cache = tl.new_quantized_cache(model, bits=8, group=4)
        feed(model, cache, tokens[:, :10], [10])  # 8 positions in codes, 2 waiting in full precision
        layer = cache.layers[0].self_attn
        assert (layer.quantised_length, layer.residual) == (8, 2)
        with pytest.raises(ValueError, match=r"n=7: it would need positions 4 to 6 in full precision"):
            cache.crop(7)
        cache.crop(9)
        fresh = tl.new_quantized_cache(model, bits=8, group=4)
        feed(model, fresh, tokens[:, :9], [9])
        assert cache.nbytes() == fresh.nbytes()
        a, b = feed(model, cache, tokens[:, 9:], [3]), feed(model, fresh, tokens[:, 9:], [3])
    assert torch.equal(a, b)
    assert all(layer.quantised_after(m) == (0 if m < 4 else 4 * ((m - 4) // 4 + 1)) for m in range(40))


@pytest.mark.parametrize(
    ("n", "message"),
    [(-1, r"n must be"), (13, r"cannot crop .* to n=13: it holds 12 tokens"), (2.5, r"n must be")],
)
def test_a_crop_past_the_end_or_not_a_count_is_refused(n, message):
    model = make(RECIPES["gpt2"]).eval()
    with torch.no_grad():
        cache = model.new_cache()
        feed(model, cache, ids(1, 12), [12])
    with pytest.raises((ValueError, TypeError), match=message):
        cache.crop(n)


@pytest.mark.parametrize(("rows", "message"), [([3], r"holds a batch of 2 rows, got rows \[3\]"), ([0.5], r"integers")])
def test_rows_outside_the_batch_are_refused(rows, message):
    model = make(RECIPES["latent"]).eval()
    with torch.no_grad():
        cache = model.new_cache()
        feed(model, cache, ids(2, 4), [4])
    with pytest.raises(ValueError, match=re.escape(message) if "[" not in message else message):
        cache.select(rows)


@pytest.mark.parametrize("name", sorted(RECURRENT))
def test_a_recurrence_goes_back_only_to_the_start_and_selects_rows(name):
    model = make(RECIPES[name]).eval()
    tokens = ids(3, 8)
    with torch.no_grad():
        cache = model.new_cache()
        feed(model, cache, tokens[:, :5], [5])
        with pytest.raises(ValueError, match=r"to n=3: its state mixed all 5 tokens into one matrix"):
            cache.crop(3)
        cache.crop(5)  # where it is
        cache.select([2, 0])
        together = feed(model, cache, tokens[[2, 0], 5:], [1, 1, 1])
        alone = model.new_cache()
        separately = feed(model, alone, tokens[[2, 0]], [5, 1, 1, 1])[:, 5:]
        assert torch.allclose(together, separately, rtol=0, atol=1e-12)
        cache.crop(0)
        assert cache.position == 0 and cache.nbytes() == 0

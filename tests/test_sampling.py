"""Tests for transformer_lib/sampling.py: top-k, temperature, and generation from a prompt (chapter 9)."""

import pytest
import torch

import transformer_lib as tl


def test_top_k_filter_keeps_the_k_largest_of_each_row(gen):
    logits = torch.randn(5, 20, generator=gen)
    for k in (1, 3, 20, 50):
        kept = torch.isfinite(tl.top_k_filter(logits, k))
        assert (kept.sum(-1) == min(k, 20)).all()
        smallest_kept = torch.where(kept, logits, torch.inf).min(-1).values
        largest_dropped = torch.where(kept, -torch.inf, logits).max(-1).values
        assert (smallest_kept > largest_dropped).all()


@pytest.mark.parametrize(("k", "error"), [(0, ValueError), (-1, ValueError), (2.0, TypeError), (True, TypeError),
                                          (None, TypeError)])  # fmt: skip
def test_top_k_must_be_a_positive_int(k, error):
    with pytest.raises(error, match="top_k"):
        tl.top_k_filter(torch.zeros(1, 4), k)


def test_sample_next_draws_only_among_the_top_k(gen):
    logits = torch.randn(2000, 10, generator=gen)
    ids = tl.sample_next(logits, temperature=2.0, top_k=3, generator=gen)  # (B, 1)
    top3 = logits.topk(3, dim=-1).indices
    assert ids.shape == (2000, 1) and (ids == top3).any(-1).all()


def test_low_temperature_is_greedy(gen):
    logits = torch.randn(50, 10, generator=gen)
    ids = tl.sample_next(logits, temperature=1e-4, generator=gen)[:, 0]
    assert torch.equal(ids, logits.argmax(-1))


@pytest.mark.parametrize("temperature", [0.0, -1.0, float("nan"), float("inf")])
def test_temperature_must_be_finite_and_positive(temperature):
    with pytest.raises(ValueError, match="temperature"):
        tl.sample_next(torch.zeros(1, 4), temperature=temperature)


def test_generate_text_continues_the_prompt_and_restores_the_mode():
    tok = tl.CharTokenizer.from_text("abc\n")
    model = tl.GPT(tl.GPTConfig(vocab_size=tok.vocab_size, context_len=8, n_layers=1, n_heads=1, d_model=8)).train()
    g = torch.Generator().manual_seed(0)
    text = tl.generate_text(model, tok, "ab", 20, temperature=1.0, top_k=2, generator=g)
    assert text.startswith("ab") and len(text) == 22 and set(text) <= set("abc\n") and model.training
    with pytest.raises(ValueError, match="prompt"):
        tl.generate_text(model, tok, "")

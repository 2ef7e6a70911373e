"""Tests for transformer_lib/sampling.py: top-k, temperature, and generation from a prompt (chapter "A GPT from
scratch")."""

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


# --- nucleus (top-p) sampling, chapter "Generation" ---


def nucleus_mass(logits, kept):
    probs = torch.softmax(logits.double(), dim=-1)
    return (probs * kept).sum(-1), probs


@pytest.mark.parametrize("p", [0.05, 0.3, 0.5, 0.9, 0.999])
def test_top_p_keeps_the_smallest_set_that_reaches_p(gen, p):
    logits = torch.randn(200, 30, generator=gen) * 2
    kept = torch.isfinite(tl.top_p_filter(logits, p))
    mass, probs = nucleus_mass(logits, kept)
    assert (mass >= p - 1e-6).all(), "the kept mass must reach p"
    smallest_kept = torch.where(kept, probs, torch.inf).min(-1).values
    largest_dropped = torch.where(kept, -torch.inf, probs).max(-1).values
    assert (smallest_kept >= largest_dropped).all(), "kept tokens are the most likely ones"
    # minimal: without its least likely member the set falls short of p
    assert (mass - smallest_kept < p + 1e-6).all()
    assert kept.gather(-1, logits.argmax(-1, keepdim=True)).all(), "the top token is always kept"


def test_top_p_one_changes_nothing_and_a_tiny_p_keeps_the_top_token(gen):
    logits = torch.randn(50, 17, generator=gen)
    logits[0, 3] = -torch.inf  # already removed (by top-k, say): stays removed
    assert torch.equal(tl.top_p_filter(logits, 1.0), logits)
    kept = torch.isfinite(tl.top_p_filter(logits, 1e-9))
    assert torch.equal(kept, logits == logits.amax(-1, keepdim=True))


def test_top_p_keeps_ties_whatever_the_sort_order():
    logits = torch.log(torch.tensor([[0.4, 0.2, 0.2, 0.2], [0.25, 0.25, 0.25, 0.25]]))
    kept = torch.isfinite(tl.top_p_filter(logits, 0.5))
    assert kept.tolist() == [[True, True, True, True], [True, True, True, True]]
    kept = torch.isfinite(tl.top_p_filter(logits, 0.4))
    assert kept[0].tolist() == [True, False, False, False]
    assert torch.equal(tl.top_p_filter(logits.flip(-1), 0.5), tl.top_p_filter(logits, 0.5).flip(-1))


@pytest.mark.parametrize(("p", "error"), [(0.0, ValueError), (-0.1, ValueError), (1.01, ValueError),
                                          (float("nan"), ValueError), ("0.9", TypeError), (True, TypeError),
                                          (None, TypeError)])  # fmt: skip
def test_top_p_must_be_a_mass_in_0_1(p, error):
    with pytest.raises(error, match="top_p"):
        tl.top_p_filter(torch.zeros(1, 4), p)
    if p is not None:
        with pytest.raises(error, match="top_p"):
            tl.sample_next(torch.zeros(1, 4), top_p=p)


def test_sample_next_draws_only_inside_the_nucleus(gen):
    logits = torch.randn(3000, 12, generator=gen) * 3
    ids = tl.sample_next(logits, temperature=1.5, top_p=0.6, generator=gen)
    kept = torch.isfinite(tl.top_p_filter(logits / 1.5, 0.6))
    assert kept.gather(-1, ids).all()
    assert (kept.sum(-1) > 1).any()  # the test can fail: some rows have a choice


def test_generate_text_forwards_top_p():
    tok = tl.CharTokenizer.from_text("abc\n")
    model = tl.GPT(tl.GPTConfig(vocab_size=tok.vocab_size, context_len=8, n_layers=1, n_heads=1, d_model=8))
    texts = {tl.generate_text(model, tok, "a", 30, top_p=1e-9, generator=torch.Generator().manual_seed(s))
             for s in range(3)}  # fmt: skip
    assert len(texts) == 1  # a tiny nucleus is greedy: every seed gives the same text
    model.eval()
    greedy = model.generate(torch.tensor([tok.encode("a")]), 30, top_k=1)
    assert texts == {tok.decode(greedy[0])}


def test_the_sample_command_passes_top_p(monkeypatch, capsys):
    from transformer_lib import cli

    tok = tl.CharTokenizer.from_text("abc\n")
    torch.manual_seed(0)
    model = tl.GPT(tl.GPTConfig(vocab_size=tok.vocab_size, context_len=8, n_layers=1, n_heads=1, d_model=8))
    monkeypatch.setattr(cli.sample, "read_checkpoint", lambda ckpt: {})
    monkeypatch.setattr(cli.sample, "checkpoint_file", lambda ckpt: ckpt)
    monkeypatch.setattr(cli.sample, "start_model", lambda ckpt, file, adapter, device: (model, tok))
    assert cli.main(["sample", "--prompt", "ab", "--max-new-tokens", "5", "--top-p", "1e-9", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    greedy = model.eval().generate(torch.tensor([tok.encode("ab")]), 5, top_k=1)
    assert out.rstrip("\n") == tok.decode(greedy[0]).rstrip("\n")
    with pytest.raises(SystemExit):
        cli.main(["sample", "--top-p", "1.5", "--device", "cpu"])
    assert "top_p" in capsys.readouterr().err

"""Tests for transformer_lib/token_rows.py (chapter "Fine-tuning"): trainable token rows start equal to the
base bit for bit, train only their rows (every other row and weight unchanged), keep a tied head
tied, start afresh when asked, find the tokens pretraining never used, compose with LoRA, equal
peft's ``trainable_token_indices`` on GPT-2, and refuse bad input by name."""

import copy
import warnings

import pytest
import torch

import transformer_lib as tl


def model(tie=True, seed=0):
    torch.manual_seed(seed)
    return tl.GPT(tl.GPTConfig(20, 16, 1, 2, 16, tie_embeddings=tie)).double()


def ids(seed=1):
    return torch.randint(0, 20, (2, 12), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("tie", [True, False])
def test_rows_start_equal_and_train_only_themselves(tie):
    gpt, x = model(tie), ids()
    x[0, :3] = torch.tensor([3, 5, 7])  # every row read as an input, tied or not
    before = copy.deepcopy(gpt)
    gpt.requires_grad_(False)
    assert tl.add_token_rows(gpt, [3, 5, 7]) == 3 * 16
    assert torch.equal(gpt(x)[0], before(x)[0])  # delta starts at zero
    trainable = [n for n, p in gpt.named_parameters() if p.requires_grad]
    assert trainable == ["tok_embed.parametrizations.weight.0.delta"]
    opt = torch.optim.SGD([p for p in gpt.parameters() if p.requires_grad], lr=1.0)
    gpt(x, ids(2))[1].backward()
    opt.step()
    moved = (gpt.tok_embed.weight - before.tok_embed.weight).abs().sum(-1) > 0
    assert moved.nonzero().flatten().tolist() == [3, 5, 7]
    if tie:  # the head reads the same rows: still one matrix
        assert torch.equal(gpt.lm_head.weight, gpt.tok_embed.weight)
    else:
        assert torch.equal(gpt.lm_head.weight, before.lm_head.weight)
    trained = gpt(x)[0].detach()
    tl.remove_token_rows(gpt, merge=True)
    assert torch.equal(gpt(x)[0], trained)  # merged: the same model, the rows added once
    assert (gpt.lm_head.weight is gpt.tok_embed.weight) == tie and tl.token_rows(gpt) is None
    assert not torch.equal(gpt.tok_embed.weight, before.tok_embed.weight)


def test_reinit_starts_the_rows_afresh_and_removal_without_merge_restores_the_base():
    gpt = model()
    old = gpt.tok_embed.weight.detach().clone()
    tl.add_token_rows(gpt, [2, 4], reinit=True, seed=3)
    new = gpt.tok_embed.weight.detach()
    assert torch.equal(new[[0, 1, 3]], old[[0, 1, 3]]) and not torch.allclose(new[[2, 4]], old[[2, 4]])
    again = model()
    tl.add_token_rows(again, [2, 4], reinit=True, seed=3)
    assert torch.equal(again.tok_embed.weight, new)  # the seed decides the fresh rows
    assert 0.005 < new[[2, 4]].std().item() < 0.05  # GPT-2's N(0, 0.02)
    tl.remove_token_rows(gpt, merge=False)
    assert torch.equal(gpt.tok_embed.weight, old) and gpt.lm_head.weight is gpt.tok_embed.weight


def test_unseen_token_rows_finds_what_the_text_never_produces():
    tokenizer = tl.train_bpe("the cat sat on the mat " * 20, 270)
    seen = set(tokenizer.encode("the cat sat"))
    unseen = tl.unseen_token_rows(tokenizer, "the cat sat")
    assert set(unseen) == set(range(tokenizer.vocab_size)) - seen and unseen == sorted(unseen)
    among = tl.unseen_token_rows(tokenizer, "the cat sat", among="on the mat 7")
    assert among == sorted(set(tokenizer.encode("on the mat 7")) - seen)
    assert ord("7") in among  # a byte pretraining never had


def test_rows_compose_with_lora_and_only_adapters_and_rows_train():
    gpt, x = model(), ids()
    tl.add_lora(gpt, tl.lora_targets(gpt), rank=2, alpha=4.0)
    tl.add_token_rows(gpt, [1, 2])
    trainable = {n.rsplit(".", 1)[-1] for n, p in gpt.named_parameters() if p.requires_grad}
    assert trainable == {"A", "B", "delta"}
    gpt(x, ids(2))[1].backward()
    assert tl.token_rows(gpt).delta.grad.abs().sum() > 0


def test_equal_to_peft_trainable_token_indices_on_gpt2():
    peft = pytest.importorskip("peft")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=30, n_positions=16)
    hf = transformers.GPT2LMHeadModel(config).double().eval()
    ours = tl.gpt_from_hf(hf)
    rows = [3, 11, 29]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # peft's notes about the tied head, not ours
        lora = peft.LoraConfig(target_modules=["c_fc"], trainable_token_indices={"wte": rows}, r=2)
        theirs = peft.get_peft_model(hf, lora).eval()
    original = ours.tok_embed.weight.detach()[rows].clone()
    tl.add_token_rows(ours, rows)
    g = torch.Generator().manual_seed(1)
    new_rows = torch.randn(len(rows), 16, generator=g, dtype=torch.float64)
    with torch.no_grad():
        deltas = [m for n, m in theirs.named_modules() if hasattr(m, "trainable_tokens_delta")]
        for layer in deltas:
            if "default" in layer.trainable_tokens_delta:
                layer.trainable_tokens_delta["default"].copy_(new_rows)  # peft holds the rows' values
        tl.token_rows(ours).delta.copy_(new_rows - original)  # ours holds the change
    x = torch.randint(0, 30, (2, 10), generator=g)
    with torch.no_grad():
        diff = (ours(x)[0] - theirs(input_ids=x).logits).abs().max().item()
    assert diff < 1e-12  # the new rows reach both the input and the tied output


BAD = [
    (lambda g: tl.add_token_rows(g, []), ValueError, "non-empty list of token ids"),
    (lambda g: tl.add_token_rows(g, [1, 20]), ValueError, r"outside \[0, 20\)"),
    (lambda g: tl.add_token_rows(g, [1, 1]), ValueError, "repeated ids"),
    (lambda g: tl.add_token_rows(g, [1.5]), ValueError, "token ids"),
    (lambda g: tl.add_token_rows(g, [1], reinit="yes"), TypeError, "reinit"),
    (lambda g: (tl.add_token_rows(g, [1]), tl.add_token_rows(g, [2])), ValueError, "already has trainable rows"),
    (lambda g: tl.remove_token_rows(g), ValueError, "has no trainable rows"),
    (lambda g: tl.add_token_rows(torch.nn.Linear(2, 2), [0]), ValueError, "no single token embedding"),
    (lambda g: tl.unseen_token_rows(None, b"bytes"), TypeError, "must be strings"),
]


@pytest.mark.parametrize("call, error, words", BAD)
def test_bad_input_is_refused_by_name(call, error, words):
    with pytest.raises(error, match=words):
        call(model())

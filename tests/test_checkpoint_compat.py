"""Checkpoints written before the library's refactor into kv_cache / cost / student still load:
the files under tests/data were saved by the earlier layout, with the outputs it computed."""

import json
from pathlib import Path

import torch

import transformer_lib as tl

DATA = Path(__file__).resolve().parent / "data"
EXPECTED = json.loads((DATA / "checkpoint_v0_expected.json").read_text())


def test_an_old_gpt_checkpoint_loads_and_computes_what_it_computed():
    model, tokenizer, ckpt = tl.load_checkpoint(DATA / "gpt_checkpoint_v0.pt")
    assert isinstance(model, tl.GPT) and model.config.n_kv_heads == 2 and model.config.window == 4
    assert tokenizer is not None and tokenizer.vocab_size == model.config.vocab_size
    idx = torch.tensor(EXPECTED["gpt_idx"])
    logits, _ = model(idx)
    torch.testing.assert_close(logits[0, -1], torch.tensor(EXPECTED["gpt_logits_last"]), atol=1e-5, rtol=0)
    generated = model.generate(idx, 6, temperature=0.8, top_k=5, generator=torch.Generator().manual_seed(1))
    assert generated.tolist() == EXPECTED["gpt_generated"]


def test_an_old_transformer_checkpoint_loads_and_decodes_as_before():
    model, tokenizer, _ = tl.load_checkpoint(DATA / "transformer_checkpoint_v0.pt")
    assert isinstance(model, tl.Transformer) and tokenizer is None
    src = torch.tensor(EXPECTED["t_src"])
    assert model.greedy_decode(src, max_new_tokens=5).tolist() == EXPECTED["t_greedy"]
    assert model.greedy_decode(src, max_new_tokens=5, use_cache=False).tolist() == EXPECTED["t_greedy"]
    logits, _ = model(src, torch.tensor([[1, 3, 4]]))
    torch.testing.assert_close(logits[0, -1], torch.tensor(EXPECTED["t_logits_last"]), atol=1e-5, rtol=0)

"""Tests for transformer_lib/run.py (chapters "A GPT from scratch" and "Fine-tuning"): load_run gives back what the
commands wrote (a pretraining run and a LoRA run, the same logits), a run's record round-trips through
the checkpoint's meta, an old checkpoint's meta reads as a record, and the resume rules refuse a
changed setting by name."""

import pytest
import torch

import transformer_lib as tl
from tests.test_cli import offline_one_thread  # noqa: F401 (autouse: offline, one thread)
from tests.test_cli_finetune import BASE, TEXT, TINY, WORDS
from transformer_lib import cli
from transformer_lib.resume import resume_record
from transformer_lib.run import KINDS, RunFolder, RunRecord

SHIPPED = tl.checkpoint_file(tl.PRETRAINED_PATH)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A BPE pretraining run and a LoRA fine-tuning run of it, written by the commands: their folders."""
    folder = tmp_path_factory.mktemp("runs")
    (folder / "text.txt").write_text(TEXT)
    base, lora = folder / "base", folder / "lora"
    args = ["train", *BASE, "--data", str(folder / "text.txt"), "--tokenizer", "bpe", "--vocab-size", "300"]
    assert cli.main([*args, "--out-dir", str(base)]) == 0
    pairs = tl.write_pairs([(w, w[::-1].upper()) for w in WORDS], folder / "pairs.jsonl")
    args = ["finetune", "--ckpt", str(base), "--data", str(pairs), "--out-dir", str(lora), *TINY, "--lora-rank", "2"]
    assert cli.main(args) == 0
    return base, lora


def logits(model, tokenizer, text="ROMEO: light"):
    with torch.no_grad():
        return model(torch.tensor([tokenizer.encode(text)]))[0]


def test_load_run_of_a_pretraining_run_is_its_checkpoints_model(runs):
    base, _ = runs
    model, tokenizer, adapters = tl.load_run(base)
    expected, expected_tok, _ = tl.load_checkpoint(base)
    assert adapters == {} and tokenizer == expected_tok
    assert torch.equal(logits(model, tokenizer), logits(expected, expected_tok))


def test_load_run_of_a_lora_run_equals_the_base_with_the_adapter_file(runs):
    base, lora = runs
    model, tokenizer, adapters = tl.load_run(lora)
    assert adapters and all(a.rank == 2 and a.alpha == 4.0 for a in adapters.values())
    expected, expected_tok, _ = tl.load_checkpoint(base)  # what `sample --ckpt BASE --adapter ...` builds
    tl.load_adapter(expected, RunFolder(lora).adapter)
    assert torch.equal(logits(model, tokenizer), logits(expected, expected_tok))
    assert not torch.equal(logits(model, tokenizer), logits(tl.load_checkpoint(base)[0], expected_tok))


def test_a_lora_runs_record_says_what_the_run_is(runs):
    base, lora = runs
    record = tl.read_record(lora)
    assert (record.kind, record.method, record.lora_rank, record.lora_alpha) == ("finetune", "lora", 2, 4.0)
    assert record.base_sha256 == tl.read_checkpoint(base)["checksum"] and record.seed == 1337
    assert record.model_config["vocab_size"] == 300
    assert tl.read_checkpoint(lora)["meta"] == record.to_meta()


@pytest.mark.parametrize("path", [tl.PRETRAINED_PATH, "transformer_lib/data/ch12/shakespeare_ckpt.pt"])
def test_the_record_round_trips_through_the_meta(path):
    ckpt = tl.read_checkpoint(path)
    record = RunRecord.from_checkpoint(ckpt)
    assert RunRecord.from_meta(record.to_meta(), ckpt["model_config"]) == record

    def recorded(meta):
        return {k: v for k, v in meta.items() if v is not None}

    assert recorded(record.to_meta()) == recorded(ckpt["meta"])  # what it holds, no more


def test_an_old_checkpoints_meta_is_a_record():
    old = tl.read_checkpoint("transformer_lib/data/ch12/shakespeare_ckpt.pt")  # no tokenizer recorded
    record = RunRecord.from_checkpoint(old)
    assert (record.kind, record.tokenizer, record.seed, record.preset) == ("pretrain", None, 1337, "cpu")
    assert record.data_sha256 == old["meta"]["text_sha256"] and record.model_config["context_len"] == 128
    none = RunRecord.from_checkpoint(tl.read_checkpoint("tests/data/gpt_checkpoint_v0.pt"))  # no meta at all
    assert none.kind == "pretrain" and none.seed is None
    # resuming it: what was not recorded takes the default, the split must be given
    assert resume_record(record, {}, "f").tokenizer == "char"
    with pytest.raises(ValueError, match="does not record which fraction"):
        resume_record(none, {}, "f")
    with pytest.raises(ValueError, match="kind 'preference'"):
        RunRecord.from_meta({"kind": "preference"})


def test_resume_refuses_a_changed_setting_by_name():
    pretrain = RunRecord(seed=1, val_fraction=0.1, tokenizer="bpe", vocab_size=300, preset="cpu")
    assert resume_record(pretrain, {"seed": 1, "vocab_size": None}, "f") == pretrain
    with pytest.raises(ValueError, match=r"--resume cannot change --vocab-size: the run in f uses 300, not 400"):
        resume_record(pretrain, {"vocab_size": 400}, "f")
    full = RunRecord(kind="finetune", seed=1, val_fraction=0.1)
    with pytest.raises(ValueError, match=r"cannot change --lora-rank: .* uses none \(full fine-tuning\), not 4"):
        resume_record(full, {"lora_rank": 4}, "f")
    assert set(KINDS["finetune"].fixed) == {"lora_rank", "lora_alpha", "seed", "val_fraction", "token_rows"}


def test_the_folder_refuses_another_runs_files(tmp_path):
    folder = RunFolder(tmp_path)
    assert (folder.checkpoint.name, folder.lock.name, folder.tokenizer.name, folder.adapter.name) == (
        "ckpt.pt", "ckpt.pt.lock", "tokenizer.json", "adapter.pt")  # fmt: skip
    folder.check_fresh(force=False)
    folder.checkpoint.write_bytes(b"x")
    with pytest.raises(ValueError, match="holds another run's checkpoint"):
        folder.check_fresh(force=False)
    tok = tl.CharTokenizer.from_text("ab")
    tl.save_tokenizer(tl.CharTokenizer.from_text("abc"), folder.tokenizer)
    with pytest.raises(ValueError, match="holds a different tokenizer"):
        folder.checked_tokenizer(tok)

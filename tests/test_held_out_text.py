"""The held-out part of the shipped Tiny Shakespeare (chapter "Measuring a model") holds no character that a shipped
model trained on: each model's training split is found through its own tokenizer, not typed."""

from pathlib import Path

import pytest
import torch

import transformer_lib as tl
from transformer_lib.data.corpus import sha256_of
from transformer_lib.data.mc_tasks import HELD_OUT_START, held_out_text
from transformer_lib.experiments.tokens import split_text

DATA = Path(tl.__file__).parent / "data"
TEXT = tl.data.SHIPPED_PATH.read_text(encoding="utf-8")
HELD = held_out_text(TEXT)
HELD_FROM = len(TEXT) - len(HELD)  # the first held-out character


def shakespeare_checkpoints() -> list[Path]:
    """Every shipped checkpoint whose settings say it was trained on the shipped Tiny Shakespeare."""
    found = []
    for path in sorted(DATA.rglob("*.pt")):
        ckpt = torch.load(path, map_location="cpu", weights_only=False)
        meta = ckpt.get("meta") if isinstance(ckpt, dict) else None
        if isinstance(meta, dict) and meta.get("text_sha256") == sha256_of(TEXT.encode()):
            found.append(path)
    return found


def trained_up_to(path: Path) -> int:
    """How many leading characters of the text the checkpoint at ``path`` trained on, whichever way
    its split was made: the first ``1 - val_fraction`` of the characters (today's ``train``) or of
    the whole text's tokens (how chapter "Fine-tuning"'s BPE model was split), through its own tokenizer."""
    _, tokenizer, _ = tl.load_checkpoint(path)
    fraction = 1.0 - torch.load(path, map_location="cpu", weights_only=False)["meta"]["val_fraction"]
    ids = tokenizer.encode(TEXT)
    by_tokens = len(tokenizer.decode(ids[: int(len(ids) * fraction)]))
    return max(int(len(TEXT) * fraction), by_tokens)


def test_the_shipped_pretrained_models_are_found():
    # chapter "What attention learns"'s character model and chapter "Fine-tuning"'s BPE model, at least
    names = {p.relative_to(DATA).as_posix() for p in shakespeare_checkpoints()}
    assert {"ch12/shakespeare_ckpt.pt", "ch15/pretrained.pt"} <= names


@pytest.mark.parametrize("path", shakespeare_checkpoints(), ids=lambda p: p.parent.name)
def test_no_shipped_model_trained_on_the_held_out_text(path):
    seen = trained_up_to(path)
    assert seen <= HELD_FROM, f"{path.name} trained on {seen - HELD_FROM} characters of the held-out text"
    assert TEXT[HELD_FROM:] == HELD and TEXT[HELD_FROM - 1] == "\n"  # it starts at a line's start


def test_the_character_experiments_split_before_the_held_out_text():
    # the Experts and Longer-than-trained models train on chapter "Tokens"'s split
    train_text, _ = split_text()
    assert TEXT.startswith(train_text) and len(train_text) <= HELD_FROM


def test_the_old_start_overlapped_chapter_15s_training_split():
    # the last 10 % of the characters starts inside the BPE model's training split: the reason for
    # HELD_OUT_START
    old_from = len(TEXT) - len(held_out_text(TEXT, 0.9))
    assert old_from < trained_up_to(tl.PRETRAINED_PATH) <= HELD_FROM
    assert 0.9 < HELD_OUT_START < 0.95

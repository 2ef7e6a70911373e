"""The record of chapter "Generation" (``transformer_lib.experiments.generation``) and the small GPT it ships, which
chapters "Generation" and "Long context and precision" load: the record holds every part and seed at the current
settings, the checkpoint is the recorded model, and seed 0, trained again, reproduces both (slow)."""

import pytest
import torch

from transformer_lib.experiments import generation, recorded


def test_chapter_10s_record_holds_every_part_and_seed_at_the_current_settings():
    sweep = recorded("generation")
    assert sweep["settings"] == generation.SETTINGS
    model = sweep["model"]
    assert model["steps"] == generation.MODEL_STEPS and model["windows"] == generation.WINDOWS
    assert [r["seed"] for r in model["runs"]] == [generation.MODEL_SEED]
    gqa = sweep["gqa"]
    assert gqa["steps"] == generation.GQA_STEPS
    assert [row["n_kv_heads"] for row in gqa["rows"]] == generation.KV_HEADS
    for row in gqa["rows"]:
        assert [r["seed"] for r in row["runs"]] == generation.SEEDS
        assert all(0 < r["val_loss"] < 4 for r in row["runs"])


def test_the_shipped_checkpoint_is_the_recorded_model_small_and_in_float64():
    assert generation.CHECKPOINT.stat().st_size < 1_000_000
    model = generation.checkpoint_model()
    assert all(p.dtype == torch.float64 for p in model.parameters())
    _, _, val_ids = generation.data()
    shipped = recorded("generation")["model"]["runs"][0]
    assert generation.window_loss(model, val_ids) == pytest.approx(shipped["window_loss"], abs=1e-9)


def test_the_language_is_the_one_the_chapters_print():
    text = generation.language()
    assert text.startswith("a cat that a bird fears sings.\nthe hen that the hens like hides.\n")
    assert len(text) == 293_898


@pytest.mark.slow
@pytest.mark.cpu_rounding
def test_a_re_run_of_seed_0_reproduces_the_record_and_the_checkpoint(one_thread):
    # float64 on one thread, as recorded: the same numbers up to the last bits
    sweep = recorded("generation")
    tokenizer, train_ids, val_ids = generation.data()
    model, val_loss = generation.train_small(train_ids, val_ids, tokenizer.vocab_size, seed=0)
    assert val_loss == pytest.approx(sweep["model"]["runs"][0]["val_loss"], abs=1e-9)
    shipped = generation.checkpoint_model().state_dict()
    for name, value in model.state_dict().items():
        torch.testing.assert_close(value, shipped[name], rtol=0, atol=1e-9)
    for row in sweep["gqa"]["rows"]:
        _, loss = generation.train_small(
            train_ids, val_ids, tokenizer.vocab_size, row["n_kv_heads"], 0, generation.GQA_STEPS
        )
        assert loss == pytest.approx(row["runs"][0]["val_loss"], abs=1e-9)

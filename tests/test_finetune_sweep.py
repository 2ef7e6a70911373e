"""The recorded results chapter 15 reads: the fine-tuning sweep (``scripts/finetune_sweep.py``),
checked for completeness and re-run in part."""

import json
from pathlib import Path

import pytest
from _scripts import load_script

import transformer_lib as tl

ROOT = Path(__file__).resolve().parents[1]
SWEEP = ROOT / "transformer_lib" / "data" / "ch15" / "finetune_sweep.json"


def test_the_sweep_holds_every_run_at_the_current_settings():
    script, sweep = load_script("finetune_sweep"), json.loads(SWEEP.read_text())
    assert sweep["settings"] == script.SETTINGS
    tasks = script.tasks()
    for name, task in tasks.items():
        part = sweep["classification"][name]
        assert part["classes"] == task.classes and part["n_test"] == len(task.test)
        got = sorted((r["method"], r["seed"]) for r in part["runs"])
        assert got == sorted((m, s) for m in script.METHODS for s in script.SEEDS)
        assert all(r["n"] == len(task.test) and 0 <= r["correct"] <= r["n"] for r in part["runs"])
        for kind in ("control", "saw the test texts"):
            assert [r["seed"] for r in sweep["contamination"][kind][name]] == script.THREE_SEEDS
    for kind in ("control", "saw the test texts"):
        assert [r["seed"] for r in sweep["contamination"][kind]["runs"]] == script.THREE_SEEDS
    runs = sweep["instructions"]["runs"]
    want = [("full", v, s) for v in tl.INSTRUCTION_VARIANTS for s in script.THREE_SEEDS]
    want += [("lora", "right", s) for s in script.THREE_SEEDS]
    assert sorted((r["method"], r["variant"], r["seed"]) for r in runs) == sorted(want)


def test_the_majority_baseline_is_the_most_frequent_training_class():
    script, sweep = load_script("finetune_sweep"), json.loads(SWEEP.read_text())
    for name, task in script.tasks().items():
        _, y = task.split("train")
        _, yt = task.split("test")
        majority = max(set(y), key=y.count)
        assert sweep["classification"][name]["majority"]["correct"] == yt.count(majority)


@pytest.mark.slow
@pytest.mark.parametrize("method", ["head", "lora"])
def test_seed_0_of_the_word_order_task_reproduces(method):
    script, sweep = load_script("finetune_sweep"), json.loads(SWEEP.read_text())
    model, tokenizer = script.base()
    r = tl.classifier_run(model, tokenizer, script.tasks()["word_order"], method, 0,
                          steps=script.SETTINGS["classifier_steps"], batch_size=script.SETTINGS["classifier_batch"],
                          rank=script.SETTINGS["lora_rank"], dtype=script.DTYPE)  # fmt: skip
    recorded = next(
        x for x in sweep["classification"]["word_order"]["runs"] if x["method"] == method and x["seed"] == 0
    )
    assert abs(r["correct"] - recorded["correct"]) <= 4  # float32 sums round differently on other CPUs
    assert r["trainable"] == recorded["trainable"]

"""The recorded results chapter 14 reads: the block sweep (``scripts/block_sweep.py``), checked for
completeness and re-run in part."""

import json
from pathlib import Path

import pytest
from _scripts import load_script

import transformer_lib as tl

ROOT = Path(__file__).resolve().parents[1]
SWEEP = ROOT / "transformer_lib" / "data" / "ch14" / "block_sweep.json"


def test_the_sweep_holds_every_row_and_seed_at_the_current_settings():
    script, sweep = load_script("block_sweep"), json.loads(SWEEP.read_text())
    assert sweep["settings"] == tl.TOKEN_RUN
    rows = sweep["ablation"]["rows"]
    assert [r["name"] for r in rows] == [name for name, _ in script.ABLATION]
    for i, row in enumerate(rows):
        assert row["options"] == script.options(i)
        assert [r["seed"] for r in row["runs"]] == script.SEEDS
        assert all(("bits_per_byte_2x" in r) == (row["options"].get("positions") == "rotary") for r in row["runs"])
    params = [row["runs"][0]["params"] for row in rows]
    assert max(params) / min(params) < 1.06  # the 2/3 rule rounds up; rotary drops the position table
    runs = sweep["lr"]["runs"]
    assert sorted((r["qk_norm"], r["seed"]) for r in runs) == [(q, s) for q in (False, True) for s in script.SEEDS]


def test_the_first_row_is_chapter_13s_character_model():
    # the same run, recorded by two scripts: GPT-2's block on characters
    blocks = json.loads(SWEEP.read_text())["ablation"]["rows"][0]["runs"]
    tokens = json.loads((ROOT / "transformer_lib" / "data" / "ch13" / "token_sweep.json").read_text())["runs"]
    chars = {r["seed"]: r for r in tokens if r["tokenizer"] == "char"}
    for r in blocks:
        assert r["bits_per_byte"] == pytest.approx(chars[r["seed"]]["bits_per_byte"], abs=1e-9)


@pytest.mark.slow
def test_a_re_run_of_the_llama_block_reproduces_the_recorded_numbers(one_thread):
    """The Llama-style row, seed 0, re-run (float32: the last digits may move on another CPU)."""
    script = load_script("block_sweep")
    row = next(r for r in json.loads(SWEEP.read_text())["ablation"]["rows"] if r["name"] == "+ no biases")
    fresh = script.one_run(row["options"], 0)
    old = row["runs"][0]
    assert fresh["params"] == old["params"]
    assert fresh["bits_per_byte"] == pytest.approx(old["bits_per_byte"], abs=0.05)
    assert fresh["bits_per_byte_2x"] == pytest.approx(old["bits_per_byte_2x"], abs=0.05)

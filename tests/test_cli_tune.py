"""Tests for the ``dpo`` and ``grpo`` commands (transformer_lib/cli/tune.py, chapter "Preferences and rewards") on a
tiny BPE base: the first-step invariants (DPO's loss ln 2, GRPO's 0), resume (after Ctrl-C too) equal
to an uninterrupted run bit for bit for LoRA and full tuning, the other tools on their runs, and a
one-line refusal with exit status 2 for every bad input. Offline, tiny models, a few steps."""

import math
import signal
import sys

import pytest
import torch

import transformer_lib as tl
from tests.test_cli import offline_one_thread  # noqa: F401 (autouse: offline, one thread)
from tests.test_cli_finetune import TINY, WORDS
from tests.test_cli_finetune import base as base  # the tiny BPE base's folder (a fixture)
from tests.test_run_ownership import same_state, state
from transformer_lib import cli

GRPO = ["--group-size", "4", "--max-new-tokens", "6", "--reward", "chars", "--temperature", "1.5"]


def write_preferences(path, rows):
    return tl.data.write_preferences(rows, path)


@pytest.fixture
def data(tmp_path):
    prefs = write_preferences(tmp_path / "prefs.jsonl", [(w, w[::-1].upper(), w[::-1].lower()) for w in WORDS])
    pairs = tl.write_pairs([(w, w[:3]) for w in WORDS], tmp_path / "pairs.jsonl")
    return {"dpo": prefs, "grpo": pairs}


def tune(kind, base, data, out, *extra):
    flags = GRPO if kind == "grpo" else []
    return cli.main([kind, "--ckpt", str(base / "bpe"), "--data", str(data[kind]), "--out-dir", str(out), *TINY,
                     *flags, *map(str, extra)])  # fmt: skip


@pytest.mark.parametrize("kind", ["dpo", "grpo"])
def test_the_first_step_loss_is_ln2_for_dpo_and_0_for_grpo(kind, base, data, tmp_path):
    for lora in ([], ["--lora-rank", "2"]):
        out = tmp_path / f"{kind}{len(lora)}"
        assert tune(kind, base, data, out, *lora, "--max-iters", 2) == 0
        history = tl.read_checkpoint(out)["history"]
        if kind == "dpo":
            assert history["step_loss"][0] == pytest.approx(math.log(2), abs=1e-6)
            assert history["val_loss"][0] == pytest.approx(math.log(2), abs=1e-6)  # before any step
        else:
            assert abs(history["step_loss"][0]) < 1e-6  # group-centred advantages, the policy at the reference
        assert tl.read_record(out).kind == kind


@pytest.mark.parametrize("kind", ["dpo", "grpo"])
@pytest.mark.parametrize("lora", [[], ["--lora-rank", "2"]], ids=["full", "lora"])
def test_resume_equals_an_uninterrupted_run(kind, lora, base, data, tmp_path):
    straight, out = tmp_path / "straight", tmp_path / "run"
    assert tune(kind, base, data, straight, *lora) == 0
    assert tune(kind, base, data, out, *lora, "--max-iters", 4) == 0
    assert cli.main([kind, "--resume", "--out-dir", str(out), "--max-iters", "6", "--no-progress"]) == 0
    assert same_state(state(straight), state(out))
    a, b = (tl.read_checkpoint(p)["history"] for p in (straight, out))
    assert a["step_loss"] == b["step_loss"] and a["val_loss"] == b["val_loss"]


def test_ctrl_c_saves_a_grpo_run_that_resumes_exactly(base, data, tmp_path, monkeypatch, capsys):
    straight, out = tmp_path / "straight", tmp_path / "run"
    assert tune("grpo", base, data, straight, "--lora-rank", 2) == 0

    def point(run, name):
        if name == "counter" and run.step == 3:
            signal.raise_signal(signal.SIGINT)

    with monkeypatch.context() as m:
        m.setattr(sys.modules["transformer_lib.train"]._Run, "point", point)
        assert tune("grpo", base, data, out, "--lora-rank", 2) == 130
    assert "grpo --resume --out-dir" in capsys.readouterr().out
    assert tl.read_checkpoint(out)["step"] == 4
    assert cli.main(["grpo", "--resume", "--out-dir", str(out), "--no-progress"]) == 0
    assert same_state(state(straight), state(out))


@pytest.mark.parametrize("kind", ["dpo", "grpo"])
def test_the_other_tools_read_a_tuned_run(kind, base, data, tmp_path, capsys):
    out = tmp_path / "run"
    assert tune(kind, base, data, out, "--lora-rank", 2) == 0
    model, tokenizer, adapters = tl.load_run(out)
    assert len(adapters) > 0 and tokenizer.eos_id is not None
    batches_model = tl.read_checkpoint(out)["model"]
    assert model.state_dict().keys() == batches_model.keys()
    capsys.readouterr()
    assert cli.main(["sample", "--ckpt", str(out), "--prompt", "ROMEO", "--greedy", "--max-new-tokens", "5"]) == 0
    code = cli.main(["export", "--ckpt", str(out), "--out-dir", str(tmp_path / "hf"), "--merge-adapter"])
    assert code == 0, capsys.readouterr().err


def test_the_lora_reference_is_the_start_with_the_adapters_off(base):
    model, tokenizer, _ = tl.load_run(base / "bpe")
    start = tl.load_run(base / "bpe")[0]
    reference = tl.make_policy(model, "lora", rank=2, alpha=4.0, seed=0)
    with torch.no_grad():
        for p in tl.lora_weights(model).values():
            p.B.add_(0.5)  # the adapters move the policy away from the start
    ids = torch.tensor([tokenizer.encode("ROMEO: But soft")])
    assert torch.equal(reference.token_logprobs(ids), tl.token_logprobs(start, ids))
    assert not torch.allclose(tl.token_logprobs(model, ids), tl.token_logprobs(start, ids))


def bad(tmp_path, name, text):
    (tmp_path / name).write_text(text)
    return str(tmp_path / name)


REFUSALS = {
    "dpo --beta 0": ("dpo", ["--beta", "0"], ["--beta must be a number > 0, got 0"]),
    "grpo --beta -1": ("grpo", ["--beta", "-1"], ["--beta must be a number >= 0, got -1"]),
    "grpo --group-size 1": ("grpo", ["--group-size", "1"], ["--group-size must be an int >= 2, got 1"]),
    "grpo --temperature 0": ("grpo", ["--temperature", "0"], ["--temperature must be a number > 0, got 0"]),
    "grpo --reward nope": ("grpo", ["--reward", "nope"], ["invalid choice: 'nope'"]),
    "a line without rejected": ("dpo", ["--data", "{tmp}/keys.jsonl"], ["keys.jsonl, line 1", "'rejected'"]),
    "chosen equals rejected": (
        "dpo",
        ["--data", "{tmp}/same.jsonl"],
        ["same.jsonl, line 1", "the same answer as chosen"],
    ),
    "too long to sample": ("grpo", ["--max-new-tokens", "40"], ["40 new ones exceed the model's context of 32"]),
    "a missing adapter": ("dpo", ["--adapter", "{tmp}/none.pt"], ["no adapter at", "none.pt"]),
    "--lora-alpha alone": ("grpo", ["--lora-alpha", "4"], ["--lora-alpha is for --lora-rank"]),
}


@pytest.mark.parametrize("case", REFUSALS)
def test_every_bad_input_is_one_line_and_exit_2(case, base, data, tmp_path, capsys):
    bad(tmp_path, "keys.jsonl", '{"prompt": "a", "chosen": "b"}\n{"prompt": "c", "chosen": "d"}\n')
    bad(tmp_path, "same.jsonl", '{"prompt": "a", "chosen": "b", "rejected": "b"}\n' * 2)
    kind, flags, words = REFUSALS[case]
    flags = [f.format(tmp=tmp_path) for f in flags]
    out = tmp_path / "never"
    capsys.readouterr()
    try:
        code = tune(kind, base, data, out, *flags)
    except SystemExit as e:  # argparse's own refusals (a choice that is not one) exit here
        code = e.code
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert all(w in err for w in words), err
    assert not (out / "ckpt.pt").exists()


def test_a_changed_resume_and_another_kind_of_run_are_refused(base, data, tmp_path, capsys):
    out = tmp_path / "run"
    assert tune("grpo", base, data, out, "--max-iters", 2) == 0
    resume = ["grpo", "--resume", "--out-dir", str(out), "--no-progress"]
    cases = [
        ([*resume, "--beta", "0.5"], "--resume cannot change --beta: the run in"),
        ([*resume, "--reward", "exact"], "--resume cannot change --reward"),
        ([*resume, "--lora-rank", "2"], "--resume cannot change --lora-rank"),
        (["dpo", "--resume", "--out-dir", str(out)], "holds a grpo run, not a dpo run"),
        ([*resume, "--data", str(data["dpo"])], "is not the data the run in"),
    ]
    for args, words in cases:
        capsys.readouterr()
        assert cli.main(args) == 2, args
        err = capsys.readouterr().err
        assert words in err and err.count("\n") == 1, err

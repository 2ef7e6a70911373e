"""Tests for the evaluation command (transformer_lib/cli/evaluate.py, chapter "Measuring a model"): a report card
for every kind of run the book writes (character and BPE pretraining, GPT-2's block, a Llama block
and a gated-DeltaNet hybrid, full and LoRA fine-tuning, a base with --adapter, the shipped
checkpoints), two runs side by side with the difference and "told apart", the quantised copy
beside the run, the cards as JSON, and a one-line refusal with exit status 2 for every bad input.
Offline, tiny models trained for two steps by the commands themselves, few items."""

import json
import os
import subprocess
import sys

import pytest
import torch

import transformer_lib as tl
from tests.test_cli import offline_one_thread  # noqa: F401 (autouse: offline, one thread)
from transformer_lib import cli
from transformer_lib import evaluate as tl_evaluate
from transformer_lib.cli import evaluate as ev
from transformer_lib.data.mc_tasks import HELD_OUT_START, held_out_text
from transformer_lib.evaluate import format_cards

SHAPE = "--n-layers 1 --n-heads 2 --d-model 16 --context-len 64 --batch-size 4 --eval-iters 1".split()
QUICK = "--device cpu --no-progress --max-iters 2 --eval-interval 2".split()
BPE = ["--tokenizer", "bpe", "--vocab-size", "300"]
FEW = ["--items", "10"]  # each task's items; --dates 10 where exact match is scored
SHIPPED_TEXT = tl.data.SHIPPED_PATH.read_text(encoding="utf-8")
CHAR_CKPT = tl.data.SHIPPED_PATH.parent / "ch12" / "shakespeare_ckpt.pt"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The runs, trained and fine-tuned by the commands: a folder holding one folder per run."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    folder = tmp_path_factory.mktemp("runs")
    text = folder / "text.txt"
    text.write_text(tl.data.SHIPPED_PATH.read_text(encoding="utf-8")[:20000])  # the held-out 10 %: 2,000 characters
    (folder / "tiny.txt").write_text("To be, or not to be.\n")
    (folder / "short.txt").write_text(tl.data.SHIPPED_PATH.read_text(encoding="utf-8")[-3000:])
    data = ["--data", str(text)]
    hybrid = ["--n-layers", "2", "--context-len", "32", "--attention", "gated_delta", "--full-every", "2",
              "--positions", "rotary"]  # fmt: skip
    trained = {
        "bpe": [*SHAPE, *BPE, *data],
        "char": [*SHAPE, "--val-fraction", "0.05"],  # the shipped Tiny Shakespeare (no --data), 5 % held out
        "hybrid": [*SHAPE, *hybrid, *BPE, *data],  # context 32: the speaker task's choices do not fit
        "llama": ["--preset", "llama-cpu", *SHAPE, *BPE, *data],
    }
    for name, args in trained.items():
        assert cli.main(["train", *args, *QUICK, "--out-dir", str(folder / name)]) == 0
    tl.write_pairs(tl.date_pairs(40, formats=list(ev.DATE_FORMATS)), folder / "pairs.jsonl")
    tuned = {"lora": ("bpe", ["--lora-rank", "2", "--new-token-rows"]), "full": ("hybrid", []),
             "llama_lora": ("llama", ["--lora-rank", "2"])}  # fmt: skip
    for name, (base, args) in tuned.items():
        finetune = ["finetune", "--ckpt", str(folder / base), "--data", str(folder / "pairs.jsonl"), *args]
        assert (
            cli.main([*finetune, *QUICK, "--batch-size", "4", "--eval-iters", "1", "--out-dir", str(folder / name)])
            == 0
        )
    torch.set_num_threads(threads)
    return folder


def evaluate(capsys, *args) -> tuple[int, str, str]:
    """``evaluate ARGS`` in this process: (exit status, stdout, stderr)."""
    capsys.readouterr()
    try:
        code = cli.main(["evaluate", *map(str, args)])
    except SystemExit as e:  # a usage error of the parser
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def table(out: str) -> list[list[str]]:
    """The Markdown table's rows, split into cells."""
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in out.splitlines() if line.startswith("|")]
    rows = [r for r in rows if r[0] != "---"]
    # the second column says which way each row is better: checked here, then left out
    assert rows[0][1] == "better" and all(r[1] in ("higher", "lower") for r in rows[1:]), rows
    return [r[:1] + r[2:] for r in rows]


def row(out: str, label: str) -> list[str]:
    return next(r for r in table(out) if r[0] == label)


KINDS = {  # run -> (extra flags, kind, the text it is scored on by default, exact match)
    "bpe": ([], "pretraining run, BPE tokenizer of 300", "the last 10% of {runs}/text.txt", False),
    "char": ([], "pretraining run, character tokenizer of 65", "the last 5% of the shipped Tiny Shakespeare", False),
    "hybrid": (["--tasks", "cloze"], "pretraining run, BPE", "the last 10% of {runs}/text.txt", False),
    "lora": (["--dates", "10"], "LoRA fine-tuning run, BPE", "the last 10% of {runs}/text.txt", True),
    "full": (["--dates", "10", "--tasks", "cloze"], "full fine-tuning run", "of {runs}/text.txt", True),
    "llama": (["--adapter", "{runs}/llama_lora/adapter.pt", "--dates", "10"], "run + LoRA adapter", "text.txt", True),
}


@pytest.mark.parametrize("name", KINDS)
def test_every_kind_of_run_gets_a_card(runs, capsys, name):
    extra, kind, text, exact = KINDS[name]
    code, out, err = evaluate(capsys, "--ckpt", runs / name, *FEW, *(a.format(runs=runs) for a in extra))
    assert code == 0, err
    assert kind in out and text.format(runs=runs) in out
    labels = [r[0] for r in table(out)[1:]]
    tasks = ["cloze"] if "--tasks" in extra else ["speaker", "cloze"]
    expected = ["loss (nats/token)", "perplexity", "bits per byte"] + [
        f"{t} {a}" for t in tasks for a in ("acc", "acc_norm")
    ]
    assert labels == expected + (["exact match"] if exact else [])
    assert "told apart" not in out and "scoring" in err  # one column; progress on stderr
    if exact:  # by default 200 dates, here 10, none of them a date the run was fine-tuned on
        dates = (
            '10 dates in the formats of chapter "Fine-tuning" (seed 16), '
            'none in the training pairs of chapter "Fine-tuning" or pairs.jsonl'
        )
        assert f"exact match: {dates}" in out
        assert float(row(out, "exact match")[1].split()[0]) >= 0


def test_a_fine_tuned_run_gets_200_dates_by_default_and_a_base_none(runs, capsys):
    code, out, _ = evaluate(capsys, "--ckpt", runs / "lora", "--tasks", "none", "--text", runs / "text.txt")
    assert code == 0 and "exact match: 200 dates" in out and "no multiple choice" in out
    assert [r[0] for r in table(out)[1:]][-1] == "exact match"
    pairs, _ = ev._dates(300, [ev._load(str(runs / "lora"), None)])
    trained_on = {r for _, r in tl.read_pairs(runs / "pairs.jsonl") + tl.date_pairs(2400, formats=ev.DATE_FORMATS)}
    assert len(pairs) == 300 and not trained_on & {r for _, r in pairs}


def test_two_runs_side_by_side_on_the_same_items(runs, capsys):
    code, out, err = evaluate(capsys, "--ckpt", runs / "lora", "--compare", runs / "bpe", *FEW, "--dates", "10",
                              "--samples", "3", "--k", "2")  # fmt: skip
    assert code == 0, err
    head = table(out)[0]
    assert head == ["", "lora", "bpe", "difference", "told apart"]
    for label in ("speaker acc", "cloze acc_norm", "exact match", "pass@1 (T=0.3, n=3)", "pass@2 (T=0.3, n=3)"):
        cells = row(out, label)
        assert cells[4] in ("yes", "no") and cells[3].startswith(("+", "-")) and "[" in cells[3]
    bpb = row(out, "bits per byte")  # a bootstrap over the text's windows, paired: one tokenizer
    assert bpb[4] in ("yes", "no") and bpb[3].endswith("] paired")
    assert "lora: " in out and "bpe: " in out and 'told apart "yes"' in out
    # a LoRA run is its base with its adapter: the same card, told apart nowhere
    code, out, err = evaluate(capsys, "--ckpt", runs / "bpe", "--adapter", runs / "lora" / "adapter.pt",
                              "--compare", runs / "lora", *FEW, "--dates", "10")  # fmt: skip
    assert code == 0, err
    assert table(out)[0][1:3] == ["bpe + lora", "lora"]
    rows = table(out)[1:]
    assert all(r[1] == r[2] for r in rows) and {r[4] for r in rows} <= {"no", ""}


def test_the_shipped_checkpoints_side_by_side(runs, capsys):
    char = tl.data.SHIPPED_PATH.parent / "ch12" / "shakespeare_ckpt.pt"
    code, out, err = evaluate(capsys, "--ckpt", tl.PRETRAINED_PATH, "--compare", char, "--items", "5", "--text",
                              runs / "short.txt")  # fmt: skip
    assert code == 0, err
    assert table(out)[0] == ["", "pretrained", "shakespeare_ckpt", "difference", "told apart"]
    assert "BPE tokenizer of 512" in out and "character tokenizer of 65" in out and "short.txt (all of it)" in out
    assert "exact match" not in out  # neither is fine-tuned


def test_the_shipped_base_with_chapter_16s_adapter(runs, capsys):
    adapter = getattr(tl_evaluate, "DATES_ADAPTER_PATH", None)
    if adapter is None or not adapter.is_file():
        pytest.skip('chapter "Measuring a model"\'s shipped dates adapter is not there')
    code, out, err = evaluate(capsys, "--ckpt", tl.PRETRAINED_PATH, "--adapter", adapter, "--tasks", "none",
                              "--text", runs / "short.txt", "--dates", "20", "--samples", "2")  # fmt: skip
    assert code == 0, err
    assert "pretrained + dates_lora: " in out and "pretraining run + LoRA adapter" in out
    assert [r[0] for r in table(out)[-3:]] == ["exact match", "pass@1 (T=0.3, n=2)", "pass@2 (T=0.3, n=2)"]


def test_json_round_trips_and_is_never_overwritten_unasked(runs, capsys, tmp_path):
    path = tmp_path / "card.json"
    code, out, err = evaluate(capsys, "--ckpt", runs / "lora", *FEW, "--dates", "10", "--json", path)
    assert code == 0, err
    doc = json.loads(path.read_text())
    assert format_cards(doc["cards"]) in out and f"wrote the cards to {path}" in out
    card = doc["cards"]["lora"]
    assert len(card["items"]["exact_match"]) == 10 and len(card["items"]["speaker acc"]) == 10
    assert isinstance(card["speaker"]["acc_interval"], list) and doc["runs"]["lora"]["kind"] == "LoRA fine-tuning run"
    before = path.read_text()
    code, _, err = evaluate(capsys, "--ckpt", runs / "lora", "--json", path)
    assert code == 2 and err.count("\n") == 1 and "exists: give --force" in err and path.read_text() == before
    assert not [p for p in tmp_path.iterdir() if p.name != "card.json"]  # no temporary file is left
    code, out, err = evaluate(capsys, "--ckpt", runs / "bpe", "--tasks", "cloze", *FEW, "--json", "-")
    assert code == 0, err
    assert json.loads(out)["cards"]["bpe"]["cloze"]["n"] == 10 and "| cloze acc |" in err  # the table on stderr
    code, _, err = evaluate(capsys, "--ckpt", runs / "bpe", "--tasks", "cloze", *FEW, "--json", path, "--force")
    assert code == 0 and json.loads(path.read_text())["cards"]["bpe"]["cloze"]["n"] == 10


@pytest.mark.parametrize("flag", ["--limit", "--items"])
def test_limit_is_lm_evals_name_of_items(runs, capsys, flag):
    code, out, err = evaluate(capsys, "--ckpt", runs / "bpe", "--tasks", "cloze", flag, "7", "--json", "-")
    assert code == 0, err
    card = json.loads(out)["cards"]["bpe"]
    assert card["cloze"]["n"] == 7 and len(card["items"]["cloze acc"]) == 7


@pytest.mark.parametrize("flag", ["--output_path", "--output-path"])
def test_output_path_writes_the_card_and_replaces_only_a_card_it_wrote(runs, capsys, tmp_path, flag):
    path = tmp_path / "card.json"
    few = ["--ckpt", runs / "bpe", "--tasks", "cloze", *FEW]
    code, out, err = evaluate(capsys, *few, flag, path)
    assert code == 0, err
    doc = json.loads(path.read_text())
    assert doc["written_by"] == ev.STAMP and doc["cards"]["bpe"]["cloze"]["n"] == 10
    assert format_cards(doc["cards"]) in out and f"wrote the cards to {path}" in out
    code, _, err = evaluate(capsys, *few[:-1], "12", flag, path)  # its own card: replaced, unasked
    assert code == 0, err
    assert json.loads(path.read_text())["cards"]["bpe"]["cloze"]["n"] == 12
    for other in ('{"cards": {}}', "not JSON", "[1, 2]"):  # any other file: refused, left as it was
        path.write_text(other)
        code, out, err = evaluate(capsys, *few, flag, path)
        assert code == 2 and err.count("\n") == 1 and "is not a report card of this command: give --force" in err
        assert path.read_text() == other and out == ""
    code, _, err = evaluate(capsys, *few, flag, path, "--force")
    assert code == 0, err
    assert json.loads(path.read_text())["written_by"] == ev.STAMP
    assert sorted(p.name for p in tmp_path.iterdir()) == ["card.json"]  # no temporary file is left
    code, _, err = evaluate(capsys, *few, flag, tmp_path)  # a folder: the card is written in it
    assert code == 0, err
    assert json.loads((tmp_path / ev.CARD_NAME).read_text())["cards"]["bpe"]["cloze"]["n"] == 10


def test_the_quantised_copy_beside_the_run(runs, capsys):
    code, out, err = evaluate(capsys, "--ckpt", runs / "lora", *FEW, "--dates", "10", "--quantize", "int8")
    assert code == 0, err
    assert table(out)[0] == ["", "lora", "lora int8", "difference", "told apart"]
    assert "lora int8: the weights take" in out and "bytes instead of" in out and "merged into the weights" in out
    code, out, err = evaluate(capsys, "--ckpt", runs / "hybrid", "--tasks", "cloze", *FEW, "--quantize", "int8",
                              "--quantize", "nf4,int8")  # fmt: skip
    assert code == 0, err
    assert table(out)[0] == ["", "hybrid", "hybrid int8", "hybrid nf4"]
    assert "hybrid nf4: the weights take" in out and "4.50 bits a weight" in out


def test_the_default_text_says_when_the_runs_text_is_gone(runs):
    run = ev._load(str(runs / "bpe"), None)
    run.pretraining = tl.RunRecord(data=str(runs / "gone.txt"), val_fraction=0.1)
    text, label = ev._text(None, [run], ev._held_out_start([run]))
    # the shipped text from HELD_OUT_START (91 %) on: the last 9 % of its characters
    assert (
        label
        == f"the last 9% of the shipped Tiny Shakespeare ({runs / 'gone.txt'}, which bpe trained on, is not there)"
    )
    assert text == held_out_text(SHIPPED_TEXT)


@pytest.mark.parametrize("path", [tl.PRETRAINED_PATH, CHAR_CKPT], ids=["bpe", "char"])
def test_a_shipped_model_is_scored_on_the_text_no_shipped_model_trained_on(path):
    # the shipped checkpoints name no text file: their text and tasks are the shipped text from
    # HELD_OUT_START on, after chapter "Fine-tuning"'s BPE model's training split (which ends past 90 %)
    run = ev._load(str(path), None)
    start = ev._held_out_start([run])
    assert start == HELD_OUT_START
    text, label = ev._text(None, [run], start)
    assert text == held_out_text(SHIPPED_TEXT) and label == "the last 9% of the shipped Tiny Shakespeare"
    items = ev._items(["speaker", "cloze"], 20, start)
    assert items["speaker"] == tl.data.speaker_choice_task(SHIPPED_TEXT, 20, start_fraction=HELD_OUT_START)
    assert all(it.context.strip() in text for task in items.values() for it in task)


def test_a_run_that_kept_less_of_the_shipped_text_moves_the_start_later(runs):
    run = ev._load(str(runs / "char"), None)  # trained on the shipped text, 5 % kept for validation
    assert ev._held_out_start([run]) == pytest.approx(0.95)
    assert ev._held_out_start([ev._load(str(tl.PRETRAINED_PATH), None), run]) == pytest.approx(0.95)


# (arguments, with {runs} and {tmp} filled in; what the one line on stderr says)
REFUSED = {
    "no checkpoint": (["--ckpt", "{tmp}/nothing"], "--ckpt: no checkpoint at"),
    "unknown task": (
        ["--ckpt", "{runs}/bpe", "--tasks", "speaker,poem"],
        "unknown name 'poem'; the choices: speaker, cloze",
    ),
    "k above samples": (["--ckpt", "{runs}/lora", "--samples", "2", "--k", "4"], "--k 4 needs at least k answers"),
    "k without samples": (["--ckpt", "{runs}/lora", "--k", "4"], "--k 4 needs at least k answers"),
    "temperature 0": (["--ckpt", "{runs}/lora", "--temperature", "0"], "--temperature must be a number > 0"),
    "temperature < 0": (["--ckpt", "{runs}/lora", "--temperature=-1"], "--temperature must be a number > 0"),
    "another base's adapter": (
        ["--ckpt", "{runs}/hybrid", "--adapter", "{runs}/lora/adapter.pt"],
        "was trained on the base",
    ),
    "a character run with --dates": (["--ckpt", "{runs}/char", "--dates", "5"], "is a character run, which has none"),
    "char run compared, --dates": (
        ["--ckpt", "{runs}/lora", "--compare", "{runs}/char", "--dates", "5"],
        "character run",
    ),
    "no adapter file": (["--ckpt", "{runs}/bpe", "--adapter", "{tmp}/a.pt"], "--adapter: no adapter file at"),
    "an adapter as the run": (
        ["--ckpt", "{runs}/lora/adapter.pt"],
        "is a LoRA adapter file: give its base with --ckpt",
    ),
    "an adapter on a LoRA run": (["--ckpt", "{runs}/lora", "--adapter", "{runs}/lora/adapter.pt"], "is a LoRA run"),
    "compare-adapter alone": (
        ["--ckpt", "{runs}/bpe", "--compare-adapter", "{runs}/lora/adapter.pt"],
        "give --compare",
    ),
    "unknown method": (["--ckpt", "{runs}/bpe", "--quantize", "int4"], "unknown name 'int4'; the choices: int8, nf4"),
    "json in no folder": (["--ckpt", "{runs}/bpe", "--json", "{tmp}/no/card.json"], "there is no folder"),
    "samples without prompts": (["--ckpt", "{runs}/bpe", "--samples", "4"], "give --pairs FILE.jsonl or --dates N"),
    "too many items": (["--ckpt", "{runs}/bpe", "--items", "5000"], "--items 5000: the held-out text has"),
    "no items": (["--ckpt", "{runs}/bpe", "--items", "0"], "--items must be an int >= 1"),
    "choices beyond the context": (["--ckpt", "{runs}/hybrid"], "speaker task's choices are up to"),
    "a text too short": (["--ckpt", "{runs}/bpe", "--text", "{runs}/tiny.txt", "--tasks", "none"], "too short"),
    "no text file": (["--ckpt", "{runs}/bpe", "--text", "{tmp}/t.txt"], "--text: no file at"),
    "pairs and dates": (["--ckpt", "{runs}/lora", "--pairs", "{runs}/pairs.jsonl", "--dates", "3"], "not allowed with"),
    "a GPU": (["--ckpt", "{runs}/bpe", "--device", "cuda"], "cuda"),
    # lm-eval's names: those that mean the same here, given a bad value
    "a share as --limit": (["--ckpt", "{runs}/bpe", "--limit", "0.5"], "--limit must be a whole number of items >= 1"),
    "no items by --limit": (["--ckpt", "{runs}/bpe", "--limit", "0"], "--limit must be a whole number of items >= 1"),
    "too many by --limit": (["--ckpt", "{runs}/bpe", "--limit", "5000"], "--limit 5000: the held-out text has"),
    "--limit and --items": (["--ckpt", "{runs}/bpe", "--limit", "5", "--items", "5"], "not allowed with"),
    "output_path in no folder": (["--ckpt", "{runs}/bpe", "--output_path", "{tmp}/no/c.json"], "there is no folder"),
    "output_path, no such folder": (["--ckpt", "{runs}/bpe", "--output-path", "{tmp}/no/"], "there is no folder"),
    "json and output_path": (["--ckpt", "{runs}/bpe", "--json", "-", "--output_path", "{tmp}/c.json"], "not allowed"),
    "unknown task, lm-eval's": (["--ckpt", "{runs}/bpe", "--tasks", "hellaswag"], "the choices: speaker, cloze"),
    # lm-eval's flags that mean something else here: the flag to use instead
    "--model": (["--ckpt", "{runs}/bpe", "--model", "hf"], "the book scores its own runs: give the run's folder"),
    "--model_args": (["--model_args", "pretrained={runs}/bpe"], "give it with --ckpt"),
    "--num_fewshot": (["--ckpt", "{runs}/bpe", "--num_fewshot", "5"], "the book's tasks are zero-shot"),
    "--batch_size": (["--ckpt", "{runs}/bpe", "--batch_size=8"], "batches each item's choices"),
    "--gen_kwargs": (["--ckpt", "{runs}/lora", "--gen_kwargs", "temperature=0.5"], "give --temperature"),
    "--log_samples": (["--ckpt", "{runs}/bpe", "--log_samples"], "always holds them"),
    "--include_path": (["--ckpt", "{runs}/bpe", "--include_path", "{tmp}"], "write_lm_eval_task"),
}


@pytest.mark.parametrize("case", REFUSED)
def test_bad_input_is_one_line_and_exit_status_2(runs, capsys, tmp_path, case):
    args, words = REFUSED[case]
    code, out, err = evaluate(capsys, *(a.format(runs=runs, tmp=tmp_path) for a in args))
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err and words in err, err
    assert out == "" and list(tmp_path.iterdir()) == []


def test_no_traceback_from_the_real_command_and_help_lists_it(capsys):
    env = {**os.environ, tl.OFFLINE_ENV: "1"}
    done = subprocess.run([sys.executable, "-m", "transformer_lib", "evaluate", "--ckpt", "nothing/here"],
                          capture_output=True, text=True, env=env, timeout=120)  # fmt: skip
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "no checkpoint at nothing/here" in done.stderr
    assert cli.main(["help"]) == 0 and "\n  evaluate  a run's report card" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["evaluate", "--help"])
    shown = capsys.readouterr().out
    assert exit_info.value.code == 0 and "--compare" in shown and "(default: None)" not in shown
    # the shared parser's: --threads, underscore spellings; and lm-eval's names, kept and refused
    flat = " ".join(shown.split())
    assert "--threads N" in shown and "--limit N" in shown and "--output-path PATH" in shown
    assert "may be spelt with underscores (--output_path" in flat and "no flag is abbreviated" in flat
    assert all(f"--{flag[2:].replace('-', '_')}" in flat for flag in ev.LM_EVAL_REFUSED)

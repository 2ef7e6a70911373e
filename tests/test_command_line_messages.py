"""The command line's exact one-line messages, table by table: a device this machine lacks, a seed
out of range, no samples asked for, a Ctrl-C outside the training loop and a full disk during a
checkpoint write each end with one line on stderr and no traceback; nothing is lost."""

import shutil

import pytest
import torch

import transformer_lib as tl
from transformer_lib import cli

TINY = ["--n-layers", "1", "--n-heads", "1", "--d-model", "8", "--batch-size", "2", "--context-len", "8",
        "--eval-iters", "1", "--eval-interval", "2", "--device", "cpu", "--no-progress"]  # fmt: skip
DEBUG = " (run with --debug for the traceback)"


@pytest.fixture
def run(tmp_path, monkeypatch):
    """A finished two-step run in tmp_path/run, trained on tmp_path/text.txt."""
    monkeypatch.setenv(tl.OFFLINE_ENV, "1")
    text = tmp_path / "text.txt"
    text.write_text("to be or not to be, that is the question\n" * 40)
    assert cli.main(["train", *TINY, "--data", str(text), "--out-dir", str(tmp_path / "run"), "--max-iters", "2"]) == 0
    return tmp_path / "run", text


def one_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err.strip()


NO_CUDA = "device 'cuda' is not available: this PyTorch sees no CUDA GPU (use 'cpu' or 'auto')"
BIG = str(2**70)

# (arguments after the command, with {out} and {text} filled in; the exact line on stderr)
MESSAGE_CASES = {
    "train --device cuda": (["train", "--out-dir", "{out}2", "--data", "{text}", "--device", "cuda"], NO_CUDA),
    "sample --device cuda": (["sample", "--ckpt", "{out}", "--device", "cuda"], NO_CUDA),
    "train --seed 2**70": (
        ["train", "--out-dir", "{out}2", "--data", "{text}", "--seed", BIG],
        f"--seed must be an int in [0, 4294967295], got {BIG}",
    ),
    "sample --seed -1": (
        ["sample", "--ckpt", "{out}", "--seed", "-1"],
        "--seed must be an int in [0, 4294967295], got -1",
    ),
    "sample --num-samples 0": (
        ["sample", "--ckpt", "{out}", "--num-samples", "0"],
        "--num-samples must be a positive int, got 0",
    ),
    "sample --num-samples -3": (
        ["sample", "--ckpt", "{out}", "--num-samples", "-3"],
        "--num-samples must be a positive int, got -3",
    ),
}


@pytest.mark.parametrize("case", MESSAGE_CASES)
def test_the_exact_one_line_message(case, run, capsys):
    if "cuda" in case and torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU")
    args, message = MESSAGE_CASES[case]
    out, text = run
    before = (out / "ckpt.pt").read_bytes()
    capsys.readouterr()
    assert cli.main([a.format(out=out, text=text) for a in args]) == 2
    assert one_line(capsys) == f"error: {message}{DEBUG}"
    assert (out / "ckpt.pt").read_bytes() == before and not (out.parent / "run2" / "ckpt.pt").exists()


def interrupt(*args, **kwargs):
    raise KeyboardInterrupt


# (command, the function that meets the Ctrl-C as MODULE.NAME in transformer_lib.cli, the exact line on stderr)
CTRL_C_CASES = {
    "sample while generating": (["sample", "--ckpt", "{out}"], "sample.generate_tokens", "interrupted (Ctrl-C)"),
    "train while reading its text": (
        ["train", *TINY, "--out-dir", "{out}2", "--data", "{text}"],
        "train.load_corpus",
        "interrupted (Ctrl-C); no checkpoint was written",
    ),
    "train --resume while reading its text": (
        ["train", "--resume", "--out-dir", "{out}", "--max-iters", "4"],
        "train.load_corpus",
        "interrupted (Ctrl-C); no checkpoint was written",
    ),
}


@pytest.mark.parametrize("case", CTRL_C_CASES)
def test_a_ctrl_c_outside_the_training_loop_is_one_line(case, run, capsys, monkeypatch):
    args, where, message = CTRL_C_CASES[case]
    out, text = run
    before = (out / "ckpt.pt").read_bytes()
    module, name = where.split(".")
    monkeypatch.setattr(getattr(cli, module), name, interrupt)
    capsys.readouterr()
    assert cli.main([a.format(out=out, text=text) for a in args]) == 130
    assert one_line(capsys) == message
    assert (out / "ckpt.pt").read_bytes() == before
    assert not list(out.parent.rglob("ckpt.pt.lock"))  # the folder is free again


def test_a_full_disk_names_the_file_and_keeps_the_previous_checkpoint(run, capsys, monkeypatch):
    out, text = run
    before = (out / "ckpt.pt").read_bytes()
    real_save = torch.save

    def full_disk_save(obj, f, *args, **kwargs):  # what torch.save does when the disk fills mid-write
        real_save(obj, f, *args, **kwargs)
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 52864 vs 52756")

    monkeypatch.setattr(torch, "save", full_disk_save)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(10**9, 10**9, 0))
    capsys.readouterr()
    code = cli.main(["train", "--resume", "--out-dir", str(out), "--max-iters", "4", "--no-progress"])
    assert code == 2
    assert one_line(capsys) == (
        f"error: no space left on the device to write {out / 'ckpt.pt'}: the previous ckpt.pt is intact{DEBUG}"
    )
    assert (out / "ckpt.pt").read_bytes() == before and not list(out.glob("*.tmp"))


def exit_status(args) -> int:
    """The command's exit status, whether it returns it or argparse exits."""
    try:
        return cli.main(args)
    except SystemExit as e:
        return e.code


# (arguments, with {out} and {text} filled in; words the one line on stderr must hold). Each is
# refused before any training: nothing is written, in the out-dir or in the working folder.
REFUSED_CASES = {
    "an empty --out-dir": (["train", *TINY, "--data", "{text}", "--out-dir", ""], ["--out-dir", "empty", "''"]),
    "a blank --out-dir": (["train", *TINY, "--data", "{text}", "--out-dir", "  "], ["--out-dir", "empty"]),
    "--out-dir without its value": (["train", *TINY, "--data", "{text}", "--out-dir"], ["--out-dir", "argument"]),
    "--resume with --force": (
        ["train", "--resume", "--force", "--out-dir", "{out}"],
        ["--resume", "--force", "contradict"],
    ),
    "--force with --resume, fresh folder": (
        ["train", *TINY, "--data", "{text}", "--out-dir", "{out}2", "--force", "--resume"],
        ["--resume", "--force", "contradict"],
    ),
    "--lr-decay-iters before the warm-up ends": (
        ["train", *TINY, "--data", "{text}", "--out-dir", "{out}2", "--warmup-iters", "10", "--lr-decay-iters", "5"],
        ["lr_decay_iters (5)", "warmup_iters (10)"],
    ),
    "train --device meta": (
        ["train", *TINY[:-3], "--data", "{text}", "--out-dir", "{out}2", "--device", "meta"],
        ["device 'meta'"],
    ),
    "train --resume --device meta": (
        ["train", "--resume", "--out-dir", "{out}", "--device", "meta"],
        ["device 'meta'"],
    ),
    "train --device gpu": (
        ["train", *TINY[:-3], "--data", "{text}", "--out-dir", "{out}2", "--device", "gpu"],
        ["device 'gpu'", "PyTorch knows"],
    ),
    "sample --device meta": (["sample", "--ckpt", "{out}", "--device", "meta"], ["device 'meta'"]),
}


@pytest.mark.parametrize("case", REFUSED_CASES)
def test_refused_before_training_in_one_line(case, run, capsys, monkeypatch):
    args, words = REFUSED_CASES[case]
    out, text = run
    before = (out / "ckpt.pt").read_bytes()
    workdir = out.parent / "workdir"
    workdir.mkdir()
    monkeypatch.chdir(workdir)
    capsys.readouterr()
    assert exit_status([a.format(out=out, text=text) for a in args]) == 2
    line = one_line(capsys)
    assert all(word in line for word in words), line
    assert (out / "ckpt.pt").read_bytes() == before
    assert not (out.parent / "run2").exists() and not list(workdir.iterdir())


def test_resuming_with_tiny_shakespeare_set_to_another_text_names_the_variable_and_the_file(
    tmp_path, capsys, monkeypatch
):
    monkeypatch.setenv(tl.OFFLINE_ENV, "1")
    first, other = tmp_path / "first.txt", tmp_path / "other.txt"
    first.write_text("to be or not to be, that is the question\n" * 40)
    other.write_text("all the world's a stage, and all the men and women merely players\n" * 40)
    monkeypatch.setenv("TINY_SHAKESPEARE", str(first))
    out = tmp_path / "run"
    with pytest.warns(UserWarning, match="checksum"):
        assert cli.main(["train", *TINY, "--out-dir", str(out), "--max-iters", "2"]) == 0
    before = (out / "ckpt.pt").read_bytes()
    monkeypatch.setenv("TINY_SHAKESPEARE", str(other))
    capsys.readouterr()
    assert cli.main(["train", "--resume", "--out-dir", str(out), "--max-iters", "4"]) == 2
    line = one_line(capsys)
    assert "TINY_SHAKESPEARE" in line and str(other) in line and "is not the text" in line, line
    assert (out / "ckpt.pt").read_bytes() == before
    monkeypatch.setenv("TINY_SHAKESPEARE", str(first))  # the right text again: the run goes on
    with pytest.warns(UserWarning, match="checksum"):
        assert cli.main(["train", "--resume", "--out-dir", str(out), "--max-iters", "4"]) == 0
    assert tl.read_checkpoint(out)["step"] == 4


# (python -m MODULE ARGS: the module forms a user may try, each like python -m transformer_lib)
MODULE_FORMS = {
    "transformer_lib.cli train": ["transformer_lib.cli", "train"],
    "transformer_lib.cli (flags, no command)": ["transformer_lib.cli"],
    "transformer_lib.train": ["transformer_lib.train"],
    "transformer_lib.train train": ["transformer_lib.train", "train"],
}


@pytest.mark.slow  # four training processes
@pytest.mark.parametrize("form", MODULE_FORMS)
def test_every_module_form_of_the_command_trains_or_refuses_like_it(form, tmp_path):
    import os
    import subprocess
    import sys

    env = {**os.environ, tl.OFFLINE_ENV: "1"}
    text = tmp_path / "text.txt"
    text.write_text("to be or not to be, that is the question\n" * 40)
    base = [sys.executable, "-m", *MODULE_FORMS[form], *TINY, "--data", str(text)]
    bad = subprocess.run([*base, "--out-dir", ""], capture_output=True, text=True, env=env, timeout=120)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--out-dir is empty" in bad.stderr, bad.stderr
    good = subprocess.run([*base, "--out-dir", str(tmp_path / "run"), "--max-iters", "2"], capture_output=True,
                          text=True, env=env, timeout=120)  # fmt: skip
    assert good.returncode == 0 and good.stderr == "", good.stderr
    assert "checkpoint in" in good.stdout and tl.read_checkpoint(tmp_path / "run")["step"] == 2

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


# (command, the function that meets the Ctrl-C, the exact line on stderr)
CTRL_C_CASES = {
    "sample while generating": (["sample", "--ckpt", "{out}"], "generate_text", "interrupted (Ctrl-C)"),
    "train while reading its text": (
        ["train", *TINY, "--out-dir", "{out}2", "--data", "{text}"],
        "load_corpus",
        "interrupted (Ctrl-C); no checkpoint was written",
    ),
    "train --resume while reading its text": (
        ["train", "--resume", "--out-dir", "{out}", "--max-iters", "4"],
        "load_corpus",
        "interrupted (Ctrl-C); no checkpoint was written",
    ),
}


@pytest.mark.parametrize("case", CTRL_C_CASES)
def test_a_ctrl_c_outside_the_training_loop_is_one_line(case, run, capsys, monkeypatch):
    args, where, message = CTRL_C_CASES[case]
    out, text = run
    before = (out / "ckpt.pt").read_bytes()
    monkeypatch.setattr(cli, where, interrupt)
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

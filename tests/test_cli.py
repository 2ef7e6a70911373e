"""Tests for the command line (transformer_lib/train.py's main and transformer_lib/sample.py):
a few-step training run writes a checkpoint that the sample command loads; --resume continues
it; --help works. Offline and on a small temporary text, so they are fast."""

import os
import subprocess
import sys

import pytest
import torch

from transformer_lib import data as D
from transformer_lib import train as T

TINY = (
    "--preset cpu --n-layers 1 --n-heads 2 --d-model 16 --block-size 8 --batch-size 4 "
    "--eval-interval 5 --eval-iters 1 --device cpu --no-progress"
).split()


@pytest.fixture(autouse=True)
def offline_one_thread(monkeypatch, tmp_path):
    monkeypatch.setenv(D.OFFLINE_ENV, "1")
    monkeypatch.setenv(D.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.delenv(D.PATH_ENV, raising=False)
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture
def text_file(tmp_path):
    f = tmp_path / "play.txt"
    f.write_text("ROMEO: But soft, what light through yonder window breaks?\nJULIET: Ay me!\n" * 30)
    return f


def run_module(*args):
    env = {**os.environ, D.OFFLINE_ENV: "1"}
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, env=env, timeout=120)


def test_help(capsys):
    out = run_module("transformer_lib.train", "--help")
    assert out.returncode == 0, out.stderr
    for flag in ("--preset", "--resume", "--max-iters", "--n-layers", "--data", "--compile", "sample"):
        assert flag in out.stdout
    with pytest.raises(SystemExit) as exit_info:
        T.main(["sample", "--help"])
    assert exit_info.value.code == 0
    assert "--temperature" in capsys.readouterr().out


def test_train_then_sample_then_resume(tmp_path, text_file, capsys):
    out_dir = tmp_path / "run"
    assert T.main([*TINY, "--data", str(text_file), "--max-iters", "10", "--out-dir", str(out_dir)]) == 0
    assert "final val loss" in capsys.readouterr().out
    model, tok, ckpt = T.load_checkpoint(out_dir)
    assert ckpt["step"] == 10 and ckpt["meta"]["settings"]["n_layers"] == 1 and model.config.d_model == 16

    assert T.main(["sample", "--ckpt", str(out_dir), "--prompt", "ROMEO:", "--max-new-tokens", "30",
                   "--temperature", "0.8", "--top-k", "5", "--device", "cpu"]) == 0  # fmt: skip
    sample = capsys.readouterr().out
    assert sample.startswith("ROMEO:") and len(sample.rstrip("\n")) >= 6 + 25
    assert set(sample) <= set(tok.chars) | {"\n"}

    assert T.main(["--resume", "--out-dir", str(out_dir), "--max-iters", "15", "--no-progress"]) == 0
    assert T.load_checkpoint(out_dir)[2]["step"] == 15
    with pytest.raises(SystemExit):  # the model's shape is fixed by the checkpoint
        T.main(["--resume", "--out-dir", str(out_dir), "--n-layers", "3"])
    with pytest.raises(SystemExit):
        T.main(["--resume", "--out-dir", str(tmp_path / "nothing")])


def test_offline_fallback_corpus_run(tmp_path, capsys):
    with pytest.warns(UserWarning, match="offline fallback"):
        assert T.main([*TINY, "--max-iters", "2", "--out-dir", str(tmp_path / "run")]) == 0
    assert capsys.readouterr().out.startswith("python_stdlib:")


def test_sample_errors(tmp_path, text_file):
    with pytest.raises(SystemExit):
        T.main(["sample", "--ckpt", str(tmp_path / "missing")])
    T.main([*TINY, "--data", str(text_file), "--max-iters", "1", "--out-dir", str(tmp_path / "r")])
    with pytest.raises(SystemExit):  # "Z" never occurs in the training text
        T.main(["sample", "--ckpt", str(tmp_path / "r"), "--prompt", "Zebra", "--device", "cpu"])

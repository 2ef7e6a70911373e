"""A run owns its out-dir and resumes with every setting it was started with, table by table:
two real processes never share a folder, a killed run leaves no stuck lock, settings changed on
resume are applied from the next step (or refused) and recorded, a diverged model is never saved,
an edited or incomplete checkpoint is refused, and files get the mode the umask allows."""

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

import transformer_lib as tl
from transformer_lib import checkpoint as ckpt_module
from transformer_lib import cli
from transformer_lib.run import LOCK_NAME, RunFolder

TINY = ["--n-layers", "1", "--n-heads", "2", "--d-model", "8", "--batch-size", "2", "--context-len", "8",
        "--eval-iters", "1", "--eval-interval", "2", "--device", "cpu", "--no-progress", "--warmup-iters", "0",
        "--lr-decay-iters", "6"]  # fmt: skip
TEXT = "to be or not to be, that is the question\n" * 40


@pytest.fixture
def text(tmp_path, monkeypatch):
    monkeypatch.setenv(tl.OFFLINE_ENV, "1")
    file = tmp_path / "text.txt"
    file.write_text(TEXT)
    return file


def train(*args):
    return cli.main(["train", *TINY, *map(str, args)])


def state(out):
    ckpt = tl.read_checkpoint(out)
    return ckpt["step"], ckpt["model"], ckpt["optimizer"]["state"]


def same_state(a, b):
    return (
        a[0] == b[0]
        and a[1].keys() == b[1].keys()
        and all(torch.equal(a[1][k], b[1][k]) for k in a[1])
        and all(torch.equal(a[2][i][k], b[2][i][k]) for i in a[2] for k in a[2][i])
    )


# ---- two real processes and one folder ----


def start(out, text, *extra):
    cmd = [sys.executable, "-m", "transformer_lib", "train", *TINY, "--data", str(text), "--out-dir", str(out),
           "--max-iters", "100000", "--eval-interval", "5", *extra]  # fmt: skip
    env = {**os.environ, tl.OFFLINE_ENV: "1", "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def wait_for_checkpoint(out, proc, timeout=120):
    end = time.monotonic() + timeout
    while not (out / "ckpt.pt").is_file():
        assert proc.poll() is None and time.monotonic() < end, proc.communicate()
        time.sleep(0.2)


def test_two_processes_never_share_an_out_dir_and_a_killed_run_leaves_no_lock(tmp_path, text):
    out = tmp_path / "run"
    first, second = start(out, text, "--force"), start(out, text, "--force")  # the same moment, the same folder
    try:
        end = time.monotonic() + 180
        while first.poll() is None and second.poll() is None:  # the one refused ends; the owner trains on
            assert time.monotonic() < end
            time.sleep(0.2)
        loser, winner = (first, second) if first.poll() is not None else (second, first)
        err = loser.communicate(timeout=60)[1].strip()
        assert loser.returncode == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
        assert f"{out} is in use by another training run (pid {winner.pid} on " in err
        wait_for_checkpoint(out, winner)
        assert winner.poll() is None  # still training, its checkpoint its own
        holder = json.loads((out / LOCK_NAME).read_text())
        assert holder["pid"] == winner.pid

        # a resumed run and a fresh one with --force respect the lock too
        for args in (["--resume"], ["--force"]):
            code = cli.main(["train", *args, "--out-dir", str(out), "--data", str(text), "--device", "cpu"])
            assert code == 2
        assert winner.poll() is None

        winner.send_signal(signal.SIGKILL)  # killed: the kernel drops its lock
        winner.wait(timeout=60)
    finally:
        for p in (first, second):
            if p.poll() is None:
                p.kill()
            p.communicate()
    step = tl.read_checkpoint(out)["step"]
    assert train("--resume", "--out-dir", out, "--max-iters", step + 2) == 0  # not stuck
    assert tl.read_checkpoint(out)["step"] == step + 2
    assert not (out / LOCK_NAME).exists()  # removed by the run that ended normally


def test_the_lock_is_reentrant_in_one_process_and_refuses_a_second_holder(tmp_path):
    with RunFolder(tmp_path).own() as folder, RunFolder(tmp_path).own():
        assert folder == tmp_path
        code = "import sys; from transformer_lib.run import RunFolder\nwith RunFolder(sys.argv[1]).own(): pass"
        env = {**os.environ, "PYTHONPATH": str(Path(tl.__file__).parents[1])}
        done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, env=env,
                              timeout=120)  # fmt: skip
        assert done.returncode != 0 and f"pid {os.getpid()}" in done.stderr
    assert not (tmp_path / LOCK_NAME).exists()


# ---- resume with every setting the run was started with ----


def ckpt_of(out):
    return tl.read_checkpoint(out)


def check_split_kept(out, straight):
    assert ckpt_of(out)["meta"]["val_fraction"] == 0.3
    assert same_state(state(out), state(straight))


def check_lr_applied(out, straight):
    ckpt = ckpt_of(out)
    lr = ckpt["history"]["lr"]
    assert lr[:2] == ckpt_of(straight)["history"]["lr"][:2]  # the first two steps at the old rate
    config = tl.TrainConfig(**{**ckpt["train_config"], "device": "cpu"})
    assert config.lr == 5e-4 and lr[2:] == pytest.approx([tl.lr_at(s, config) for s in (2, 3)], rel=1e-12)
    assert {"step": 2, "setting": "lr", "from": 1e-3, "to": 5e-4} in ckpt["changes"]  # with max_iters 2 -> 4
    assert all(g["lr"] == pytest.approx(tl.lr_at(4, config)) for g in ckpt["optimizer"]["param_groups"])


def check_betas_applied(out, straight):
    ckpt = ckpt_of(out)
    assert [g["betas"] for g in ckpt["optimizer"]["param_groups"]] == [(0.8, 0.99)] * 2
    assert {"step": 2, "setting": "beta1", "from": 0.9, "to": 0.8} in ckpt["changes"]


# (flags of the first run, flags of the resumed one, a word of the refusal or a check of the result)
RESUME_CASES = {
    "a non-default split is kept": (["--val-fraction", "0.3"], [], check_split_kept),
    "the split cannot change": (["--val-fraction", "0.3"], ["--val-fraction", "0.5"], "cannot change --val-fraction"),
    "the seed cannot change": ([], ["--seed", "7"], "cannot change --seed"),
    "the preset cannot change": (["--preset", "cpu"], ["--preset", "gpu"], "cannot change --preset"),
    "the shape cannot change": ([], ["--n-heads", "1"], "has --n-heads 2, not 1"),
    "a new lr from the next step": ([], ["--lr", "5e-4"], check_lr_applied),
    "new AdamW betas from the next step": ([], ["--beta1", "0.8"], check_betas_applied),
}


@pytest.mark.parametrize("case", RESUME_CASES)
def test_resume_keeps_or_refuses_every_setting(case, text, tmp_path, capsys):
    first, again, expect = RESUME_CASES[case]
    out, straight = tmp_path / "run", tmp_path / "straight"
    assert train("--data", text, "--out-dir", straight, "--max-iters", 4, *first) == 0
    assert train("--data", text, "--out-dir", out, "--max-iters", 2, *first) == 0
    before = (out / "ckpt.pt").read_bytes()
    capsys.readouterr()
    code = cli.main(["train", "--resume", "--out-dir", str(out), "--max-iters", "4", "--no-progress", *again])
    if isinstance(expect, str):
        err = capsys.readouterr().err.strip()
        assert code == 2 and expect in err and len(err.splitlines()) == 1
        assert (out / "ckpt.pt").read_bytes() == before
    else:
        assert code == 0
        expect(out, straight)


def test_resume_refuses_another_text(text, tmp_path, capsys):
    out = tmp_path / "run"
    assert train("--data", text, "--out-dir", out, "--max-iters", 2) == 0
    other = tmp_path / "other.txt"
    other.write_text(TEXT.upper())
    assert cli.main(["train", "--resume", "--out-dir", str(out), "--data", str(other), "--max-iters", "4"]) == 2
    assert f"{other} is not the text the run in {out / 'ckpt.pt'} was trained on" in capsys.readouterr().err
    text.unlink()
    assert cli.main(["train", "--resume", "--out-dir", str(out), "--max-iters", "4"]) == 2
    assert "which is no longer there: give the same text with --data FILE" in capsys.readouterr().err


@pytest.mark.skipif(not os.path.isdir("/dev/fd"), reason="needs /dev/fd")
def test_a_run_whose_text_came_from_a_pipe_says_how_to_resume(text, tmp_path, capsys):
    read, write = os.pipe()
    feeder = threading.Thread(target=lambda: (os.write(write, TEXT.encode()), os.close(write)))
    feeder.start()
    try:
        assert train("--data", f"/dev/fd/{read}", "--out-dir", tmp_path / "run", "--max-iters", 2) == 0
    finally:
        feeder.join()
        os.close(read)
    assert tl.read_checkpoint(tmp_path / "run")["meta"]["data"] is None
    capsys.readouterr()
    assert cli.main(["train", "--resume", "--out-dir", str(tmp_path / "run"), "--max-iters", "4"]) == 2
    err = capsys.readouterr().err
    assert f"read its training text from a pipe (/dev/fd/{read}), which cannot be read again" in err
    assert "--data FILE" in err and "/proc" not in err
    assert cli.main(["train", "--resume", "--out-dir", str(tmp_path / "run"), "--max-iters", "4", "--data",
                     str(text), "--no-progress"]) == 0  # fmt: skip


# ---- a diverged model is never saved ----


def test_a_diverging_run_saves_no_diverged_model(text, tmp_path, capsys):
    out = tmp_path / "run"
    assert train("--data", text, "--out-dir", out, "--max-iters", 4, "--lr", "1e20", "--eval-interval", 1) == 2
    err = capsys.readouterr().err
    assert "diverged" in err or "became" in err
    assert "no checkpoint was written" in err and not (out / "ckpt.pt").exists()

    assert train("--data", text, "--out-dir", out, "--max-iters", 2) == 0
    good = (out / "ckpt.pt").read_bytes()
    capsys.readouterr()
    code = cli.main(["train", "--resume", "--out-dir", str(out), "--max-iters", "6", "--lr", "1e20",
                     "--eval-interval", "1", "--no-progress"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and "holds step 2, the last good state" in err
    assert (out / "ckpt.pt").read_bytes() == good
    ckpt = tl.read_checkpoint(out)
    assert all(bool(torch.isfinite(t).all()) for t in ckpt["model"].values())


# ---- edited or incomplete checkpoints ----


def resave(out, change):
    ckpt = tl.read_checkpoint(out)
    change(ckpt)
    torch.save(ckpt, out / "ckpt.pt")


def rewrite(out, change):
    """As another version of the library would write it: changed, with a matching checksum."""
    ckpt = tl.read_checkpoint(out)
    change(ckpt)
    ckpt.pop("checksum")
    ckpt_module.save_checkpoint(ckpt, out / "ckpt.pt")


# (how the checkpoint is changed, a word of the one-line error of both commands)
EDIT_CASES = {
    "n_heads edited": (lambda out: resave(out, lambda c: c["model_config"].update(n_heads=1)), "was edited"),
    "the tokenizer edited": (lambda out: resave(out, lambda c: c["tokenizer"].update(chars="ab")), "was edited"),
    "n_heads missing": (lambda out: rewrite(out, lambda c: c["model_config"].pop("n_heads")), "model_config.n_heads"),
    "model_class missing": (lambda out: rewrite(out, lambda c: c.pop("model_class")), "model_class"),
    "an unknown model setting": (lambda out: rewrite(out, lambda c: c["model_config"].update(rope=True)), "'rope'"),
    "lr missing": (lambda out: rewrite(out, lambda c: c["train_config"].pop("lr")), "--lr"),
    "the random states missing": (lambda out: rewrite(out, lambda c: c.pop("rng")), "rng"),
}


@pytest.mark.parametrize("case", EDIT_CASES)
def test_an_edited_or_incomplete_checkpoint_is_one_clear_error(case, text, tmp_path, capsys):
    out = tmp_path / "run"
    assert train("--data", text, "--out-dir", out, "--max-iters", 2) == 0
    change, word = EDIT_CASES[case]
    change(out)
    capsys.readouterr()
    resume = cli.main(["train", "--resume", "--out-dir", str(out), "--max-iters", "4", "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert resume == 2 and word in err and len(err.splitlines()) == 1, err
    if case not in ("lr missing", "the random states missing"):  # sampling needs neither
        assert cli.main(["sample", "--ckpt", str(out), "--device", "cpu", "--max-new-tokens", "3"]) == 2
        err = capsys.readouterr().err.strip()
        assert word in err and len(err.splitlines()) == 1, err


# ---- the umask decides who may read a checkpoint ----


@pytest.mark.skipif(os.name != "posix", reason="POSIX file modes")
@pytest.mark.parametrize(("umask", "mode"), [(0o022, 0o644), (0o027, 0o640), (0o077, 0o600), (0o002, 0o664)])
def test_checkpoints_get_the_mode_the_umask_allows(umask, mode, text, tmp_path):
    old = os.umask(umask)
    try:
        assert train("--data", text, "--out-dir", tmp_path / "run", "--max-iters", 2) == 0
    finally:
        os.umask(old)
    assert (tmp_path / "run" / "ckpt.pt").stat().st_mode & 0o777 == mode


def test_resume_keeps_the_device_dtype_and_compilation_it_started_with(text, tmp_path, monkeypatch):
    out = tmp_path / "run"
    assert train("--data", text, "--out-dir", out, "--max-iters", 2, "--dtype", "float32") == 0
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # "auto" would now pick a GPU
    args = cli.build_parser().parse_args(["--resume", "--out-dir", str(out)])
    _, _, config = cli.model_settings(args, tl.read_checkpoint(out), out / "ckpt.pt")
    assert (str(config.device), config.dtype, config.compile) == ("cpu", "float32", False)
    args = cli.build_parser().parse_args(["--resume", "--out-dir", str(out), "--no-compile", "--device", "cuda"])
    assert cli.model_settings(args, tl.read_checkpoint(out), out / "ckpt.pt")[2].device == "cuda"  # a flag moves it


def test_resume_on_a_machine_without_the_runs_device_says_how_to_continue(tmp_path):
    with pytest.raises(ValueError, match=r"trained on device 'cuda:64'.*--device cpu"):
        tl.resume.recorded_process({"train_config": {"device": "cuda:64"}}, {"device": None}, tmp_path / "ckpt.pt")

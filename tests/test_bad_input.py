"""Bad input, table by table: each case expects an exact error class and a word of its message
(the training settings, the command line), or that nothing a user has is lost (an out-dir holding
a checkpoint, a run whose loss diverges)."""

import importlib
import io
import os
import random
import signal
import struct
import subprocess
import sys
import zipfile

import pytest
import torch

import transformer_lib as tl
from transformer_lib import cli

train_module = importlib.import_module("transformer_lib.train")  # the name tl.train is the function

# (TrainConfig keyword arguments, error class, a word of the message)
TRAIN_CONFIG_CASES = [
    (dict(batch_size=0), ValueError, "batch_size"),
    (dict(batch_size=-3), ValueError, "batch_size"),
    (dict(batch_size="12"), TypeError, "batch_size"),
    (dict(batch_size=True), TypeError, "batch_size"),
    (dict(batch_size=2.5), TypeError, "batch_size"),
    (dict(max_iters=-5), ValueError, "max_iters"),
    (dict(max_iters=1.0), TypeError, "max_iters"),
    (dict(lr=0), ValueError, "lr"),
    (dict(lr=-1e-3), ValueError, "lr"),
    (dict(lr=float("nan")), TypeError, "lr"),
    (dict(lr=float("inf")), TypeError, "lr"),
    (dict(lr="fast"), TypeError, "lr"),
    (dict(min_lr=-1e-4), ValueError, "min_lr"),
    (dict(lr=1e-4, min_lr=1e-3), ValueError, "min_lr"),
    (dict(warmup_iters=-1), ValueError, "warmup_iters"),
    (dict(lr_decay_iters=-10), ValueError, "lr_decay_iters"),
    (dict(weight_decay=-0.1), ValueError, "weight_decay"),
    (dict(beta1=1.0), ValueError, "beta1"),
    (dict(beta1=-0.1), ValueError, "beta1"),
    (dict(beta2=1.5), ValueError, "beta2"),
    (dict(grad_clip=-1.0), ValueError, "grad_clip"),
    (dict(eval_interval=-250), ValueError, "eval_interval"),
    (dict(eval_iters=0), ValueError, "eval_iters"),
    (dict(eval_iters=-2), ValueError, "eval_iters"),
    (dict(log_interval=0), ValueError, "log_interval"),
    (dict(log_interval=False), TypeError, "log_interval"),
    (dict(peak_tflops=0.0), ValueError, "peak_tflops"),
    (dict(progress="False"), TypeError, "progress"),
    (dict(verbose=1), TypeError, "verbose"),
    (dict(compile="yes"), TypeError, "compile"),
    (dict(dtype="float64"), ValueError, "dtype"),
    (dict(warmup_iters=100, lr_decay_iters=50), ValueError, "lr_decay_iters"),
    (dict(out_dir=""), ValueError, "out_dir is empty"),
    (dict(out_dir="   "), ValueError, "out_dir is empty"),
    (dict(out_dir=0), TypeError, "out_dir"),
]


@pytest.mark.parametrize(("kwargs", "error", "word"), TRAIN_CONFIG_CASES, ids=lambda v: str(v)[:30])
def test_train_config_rejects_bad_settings(kwargs, error, word):
    with pytest.raises(error, match=word):
        tl.TrainConfig(**kwargs)


def test_train_config_accepts_the_edges():
    # zero where zero has a meaning: no steps, no warm-up, no evaluation, no clipping, no decay
    tl.TrainConfig(max_iters=0, warmup_iters=0, eval_interval=0, grad_clip=0.0, weight_decay=0.0, min_lr=0.0)


# (command-line arguments, a word of the one-line error)
CLI_CASES = [
    (["--batch-size", "0"], "batch_size"),
    (["--context-len", "0"], "context_len"),
    (["--eval-iters", "0"], "eval_iters"),
    (["--max-iters", "-5"], "max_iters"),
    (["--lr", "0"], "lr"),
    (["--log-interval", "0"], "log_interval"),
    (["--beta2", "1"], "beta2"),
    (["--dropout", "1.5"], "dropout"),
    (["--n-heads", "0"], "n_heads"),
    (["--d-model", "-8"], "d_model"),
    (["--n-layers", "0"], "n_layers"),
    (["--warmup-iters", "-1"], "warmup_iters"),
    (["--grad-clip", "-1"], "grad_clip"),
]


@pytest.fixture
def small_text(tmp_path, monkeypatch):
    monkeypatch.setenv(tl.OFFLINE_ENV, "1")
    text = tmp_path / "text.txt"
    text.write_text("to be or not to be, that is the question\n" * 40)
    return text


TINY = ["--n-layers", "1", "--n-heads", "1", "--d-model", "8", "--batch-size", "2", "--context-len", "8",
        "--eval-iters", "1", "--eval-interval", "2", "--device", "cpu", "--no-progress"]  # fmt: skip


@pytest.mark.parametrize(("args", "word"), CLI_CASES)
def test_command_line_errors_are_one_line_with_status_2(args, word, small_text, tmp_path, capsys):
    code = cli.main(["train", *TINY, "--data", str(small_text), "--out-dir", str(tmp_path / "run"), *args])
    err = capsys.readouterr().err.strip()
    assert code == 2 and word in err and "Traceback" not in err and len(err.splitlines()) == 1
    assert not (tmp_path / "run" / "ckpt.pt").exists()


def test_debug_shows_the_traceback(small_text, tmp_path):
    with pytest.raises(ValueError, match="batch_size"):
        cli.main(
            ["train", "--debug", *TINY, "--data", str(small_text), "--out-dir", str(tmp_path), "--batch-size", "0"]
        )


def test_a_missing_data_file_is_one_line_naming_it(tmp_path, capsys):
    code = cli.main(["train", *TINY, "--data", str(tmp_path / "absent.txt"), "--out-dir", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert code == 2 and "absent.txt" in err and len(err.strip().splitlines()) == 1


def test_a_fresh_run_never_replaces_another_runs_checkpoint(small_text, tmp_path, capsys):
    out = tmp_path / "run"
    assert cli.main(["train", *TINY, "--data", str(small_text), "--out-dir", str(out), "--max-iters", "2"]) == 0
    before = (out / "ckpt.pt").read_bytes()
    assert cli.main(["train", *TINY, "--data", str(small_text), "--out-dir", str(out), "--max-iters", "4"]) == 2
    assert "--resume" in capsys.readouterr().err
    assert (out / "ckpt.pt").read_bytes() == before  # untouched
    assert cli.main(["train", *TINY, "--data", str(small_text), "--out-dir", str(out), "--max-iters", "4",
                     "--force"]) == 0  # fmt: skip
    assert tl.read_checkpoint(out)["step"] == 4


def test_the_command_as_a_process_prints_no_traceback(small_text, tmp_path):
    cmd = [sys.executable, "-m", "transformer_lib", "train", *TINY, "--data", str(small_text),
           "--out-dir", str(tmp_path), "--lr", "-1"]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.strip().startswith("error:") and "Traceback" not in done.stderr


def test_a_nan_loss_stops_the_run_and_keeps_the_last_good_checkpoint(tmp_path):
    tok = tl.CharTokenizer.from_text("abcdefgh")
    ids = torch.tensor(tok.encode("abcdefgh" * 50))
    model = tl.GPT(tl.GPTConfig(vocab_size=tok.vocab_size, context_len=8, n_layers=1, n_heads=1, d_model=8))
    batches = tl.LMBatches(*tl.split_tokens(ids), 8, 4, seed=0)
    config = tl.TrainConfig(max_iters=6, eval_interval=2, eval_iters=1, log_interval=1, device="cpu",
                            progress=False, verbose=False, out_dir=str(tmp_path))  # fmt: skip
    tl.train(model, batches, config, until=2)
    good = (tmp_path / "ckpt.pt").read_bytes()
    with torch.no_grad():
        model.lm_head.weight.fill_(float("nan"))  # the next step's loss is NaN
    with pytest.raises(FloatingPointError, match="step 3"):
        tl.train(model, batches, config, resume=tl.read_checkpoint(tmp_path) | {"model": model.state_dict()})
    assert (tmp_path / "ckpt.pt").read_bytes() == good


# ---- faults: a Ctrl-C at every point of a step; resume must equal the run that never stopped ----

POINTS = ["forward", "backward", "optimizer", "counter"]


def tiny_run(out_dir, seed=0):
    """A fresh process's view of the same small run: model, batches and config, all seeded."""
    tl.set_seed(seed)
    tok = tl.CharTokenizer.from_text("abcdefgh")
    model = tl.GPT(tl.GPTConfig(vocab_size=tok.vocab_size, context_len=8, n_layers=1, n_heads=1, d_model=8))
    batches = tl.LMBatches(*tl.split_tokens(torch.tensor(tok.encode("abcdefgh" * 50))), 8, 4, seed=seed)
    config = tl.TrainConfig(max_iters=6, eval_interval=2, eval_iters=1, log_interval=1, device="cpu",
                            progress=False, verbose=False, out_dir=str(out_dir), warmup_iters=2)  # fmt: skip
    return model, batches, config


def finished_state(out_dir):
    """The model and optimizer state after all six steps of the run in ``out_dir``."""
    ckpt = tl.read_checkpoint(out_dir)
    return ckpt["step"], ckpt["model"], ckpt["optimizer"]["state"]


def assert_same_state(a, b):
    assert a[0] == b[0]
    assert all(torch.equal(a[1][k], b[1][k]) for k in a[1])
    assert all(torch.equal(a[2][i][k], b[2][i][k]) for i in a[2] for k in a[2][i])


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    out = tmp_path_factory.mktemp("uninterrupted")
    tl.train(*tiny_run(out))
    return finished_state(out)


def interrupt_at(monkeypatch, point, at_step, how):
    """Make step ``at_step`` (0-based) meet a Ctrl-C at ``point``: a real SIGINT, or a raw KeyboardInterrupt."""

    def fire(run, name):
        if name == point and run.step == at_step:
            if how == "signal":
                signal.raise_signal(signal.SIGINT)
            else:
                raise KeyboardInterrupt

    monkeypatch.setattr(train_module._Run, "point", fire)


@pytest.mark.parametrize("how", ["signal", "raise"])
@pytest.mark.parametrize("point", POINTS)
def test_a_ctrl_c_at_any_point_of_a_step_resumes_bitwise_equal(point, how, tmp_path, monkeypatch, uninterrupted):
    interrupt_at(monkeypatch, point, 3, how)
    with pytest.raises(KeyboardInterrupt):
        tl.train(*tiny_run(tmp_path))
    ckpt = tl.read_checkpoint(tmp_path)
    # a signal lets step 4 finish and saves it; a raw interrupt mid-step keeps step 2's checkpoint
    assert ckpt["step"] == (4 if how == "signal" else 2)
    assert all(s["step"].item() == ckpt["step"] for s in ckpt["optimizer"]["state"].values())  # Adam agrees
    monkeypatch.undo()
    tl.train(*tiny_run(tmp_path), resume=True)
    assert_same_state(finished_state(tmp_path), uninterrupted)
    assert not list(tmp_path.glob("*.tmp"))


@pytest.mark.parametrize("how", ["signal", "raise"])
def test_a_ctrl_c_while_the_checkpoint_is_written_loses_nothing(how, tmp_path, monkeypatch, uninterrupted):
    real_save = torch.save
    calls = []

    def interrupted_save(obj, f, *args, **kwargs):
        calls.append(f)
        if len(calls) == 2 and how == "signal":  # the second checkpoint (step 4) meets a Ctrl-C
            signal.raise_signal(signal.SIGINT)
        real_save(obj, f, *args, **kwargs)
        if len(calls) == 2 and how == "raise":  # half written, then the Ctrl-C
            with open(f, "r+b") as handle:
                handle.truncate(100)
            raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", interrupted_save)
    with pytest.raises(KeyboardInterrupt):
        tl.train(*tiny_run(tmp_path))
    monkeypatch.undo()
    assert tl.read_checkpoint(tmp_path)["step"] in (2, 4)  # loads: a whole checkpoint, never the torn file
    assert not list(tmp_path.glob("*.tmp"))
    tl.train(*tiny_run(tmp_path), resume=True)
    assert_same_state(finished_state(tmp_path), uninterrupted)


def test_orphaned_temporary_checkpoints_are_removed(tmp_path, uninterrupted):
    orphan = tmp_path / "ckpt.pt.k1ll3d.tmp"
    orphan.write_bytes(b"half a checkpoint")
    keep = tmp_path / "notes.tmp"
    keep.write_bytes(b"the user's own file")
    tl.train(*tiny_run(tmp_path))
    assert not orphan.exists() and keep.read_bytes() == b"the user's own file"
    assert_same_state(finished_state(tmp_path), uninterrupted)


# ---- damaged checkpoints: one clear ValueError naming the file; the file itself left as it was ----


def flip_a_tensor_byte(good: bytes) -> bytes:
    """Overwrite one byte inside the largest tensor's stored data (the zip archive keeps it uncompressed)."""
    with zipfile.ZipFile(io.BytesIO(good)) as archive:
        info = max((i for i in archive.infolist() if "/data/" in i.filename), key=lambda i: i.file_size)
    name_len, extra_len = struct.unpack("<HH", good[info.header_offset + 26 : info.header_offset + 30])
    at = info.header_offset + 30 + name_len + extra_len + info.file_size // 2
    return good[:at] + bytes([good[at] ^ 0xFF]) + good[at + 1 :]


def resaved(change):
    """The checkpoint loaded, changed by ``change``, and saved again by plain ``torch.save``."""

    def damage(good: bytes) -> bytes:
        ckpt = torch.load(io.BytesIO(good), weights_only=True)
        buffer = io.BytesIO()
        torch.save(change(ckpt), buffer)
        return buffer.getvalue()

    return damage


class RunsCode:
    def __reduce__(self):
        return (print, ("this ran",))


def _tamper(ckpt):
    ckpt["model"]["lm_head.weight"][0, 0] += 1.0
    return ckpt


# (how the good checkpoint's bytes are damaged, a word of the message)
DAMAGE_CASES = {
    "empty": (lambda good: b"", "empty"),
    "truncated to half": (lambda good: good[: len(good) // 2], "truncated"),
    "last bytes cut": (lambda good: good[:-7], "truncated"),
    "garbage": (lambda good: random.Random(0).randbytes(4096), "damaged"),
    "a byte flipped inside a tensor": (flip_a_tensor_byte, "damaged"),
    "a tensor changed and saved again": (resaved(_tamper), "checksum"),
    "no checksum": (resaved(lambda c: {k: v for k, v in c.items() if k != "checksum"}), "checksum"),
    "a list, not a dict": (resaved(lambda c: [1, 2, 3]), "checksum"),
    "a pickle that runs code": (resaved(lambda c: {**c, "meta": RunsCode()}), "refused"),
}


@pytest.fixture(scope="module")
def good_checkpoint(tmp_path_factory):
    """A checkpoint as the command writes it, with the text it was trained on."""
    folder = tmp_path_factory.mktemp("good")
    text = folder / "text.txt"
    text.write_text("to be or not to be, that is the question\n" * 40)
    os.environ[tl.OFFLINE_ENV] = "1"
    assert cli.main(["train", *TINY, "--data", str(text), "--out-dir", str(folder / "run"), "--max-iters", "2"]) == 0
    return (folder / "run" / "ckpt.pt").read_bytes()


def damaged(tmp_path, good_checkpoint, kind):
    damage, word = DAMAGE_CASES[kind]
    run = tmp_path / "run"
    run.mkdir()
    (run / "ckpt.pt").write_bytes(damage(good_checkpoint))
    return run / "ckpt.pt", word


@pytest.mark.parametrize("kind", DAMAGE_CASES)
def test_a_damaged_checkpoint_is_one_clear_error_naming_the_file(kind, tmp_path, good_checkpoint):
    file, word = damaged(tmp_path, good_checkpoint, kind)
    before = file.read_bytes()
    for read in (tl.read_checkpoint, tl.load_checkpoint):
        with pytest.raises(ValueError, match=word) as error:
            read(file)
        assert str(file) in str(error.value) and "weights_only" not in str(error.value)
    assert file.read_bytes() == before


@pytest.mark.parametrize("command", ["train", "sample"])
@pytest.mark.parametrize("kind", DAMAGE_CASES)
def test_the_commands_refuse_a_damaged_checkpoint_in_one_line(kind, command, tmp_path, good_checkpoint, capsys):
    file, word = damaged(tmp_path, good_checkpoint, kind)
    before = file.read_bytes()
    args = (
        ["train", "--resume", "--out-dir", str(file.parent)] if command == "train" else ["sample", "--ckpt", str(file)]
    )
    assert cli.main([*args, "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert word in err and str(file) in err and len(err.splitlines()) == 1 and "Traceback" not in err
    assert file.read_bytes() == before


def library_checkpoint(out_dir, model_class="GPT", tokenizer=True):
    """A checkpoint written by train() itself, not by the command."""
    tok = tl.CharTokenizer.from_text("to be or not, that is the question\n")
    tl.set_seed(0)
    if model_class == "GPT":
        model = tl.GPT(tl.GPTConfig(vocab_size=tok.vocab_size, context_len=8, n_layers=1, n_heads=1, d_model=8))
        ids = torch.tensor(tok.encode("to be or not to be, that is the question\n" * 40))
        batches = tl.LMBatches(*tl.split_tokens(ids), 8, 2, seed=0)
    else:
        data = tl.sequence_task("copy", n_train=50, n_val=10, n_symbols=5, max_len=4)
        model = tl.Transformer(tl.TransformerConfig(src_vocab_size=8, tgt_vocab_size=8, d_model=8, n_heads=1,
                                                    context_len=data.context_len))  # fmt: skip
        batches = tl.Seq2SeqBatches(data, batch_size=4)
    config = tl.TrainConfig(max_iters=2, eval_interval=2, eval_iters=1, device="cpu", progress=False,
                            verbose=False, out_dir=str(out_dir))  # fmt: skip
    tl.train(model, batches, config, tokenizer=tok if tokenizer else None)
    return out_dir / "ckpt.pt"


# (model class, saved with its tokenizer, --data given, --val-fraction given, a word of the error or None: it resumes)
LIBRARY_RESUME_CASES = [
    ("GPT", True, True, True, None),
    ("GPT", True, True, False, "--val-fraction"),  # train() does not know how the text was split
    ("GPT", True, False, True, "--data"),
    ("GPT", False, True, True, "tokenizer"),
    ("Transformer", False, True, True, "Transformer"),
]


@pytest.mark.parametrize(("model_class", "with_tokenizer", "with_data", "with_split", "word"), LIBRARY_RESUME_CASES)
def test_resume_of_a_checkpoint_written_by_train(model_class, with_tokenizer, with_data, with_split, word, small_text,
                                                 tmp_path, capsys):  # fmt: skip
    file = library_checkpoint(tmp_path / "run", model_class, with_tokenizer)
    before = file.read_bytes()
    data = ["--data", str(small_text)] if with_data else []
    data += ["--val-fraction", "0.1"] if with_split else []
    code = cli.main(["train", "--resume", "--out-dir", str(file.parent), "--max-iters", "4", "--no-progress", *data])
    if word is None:
        ckpt = tl.read_checkpoint(file)
        assert code == 0 and ckpt["step"] == 4
        assert ckpt["train_config"]["batch_size"] == 2  # the batch size the run used, not the default 12
    else:
        err = capsys.readouterr().err.strip()
        assert code == 2 and word in err and len(err.splitlines()) == 1
        assert file.read_bytes() == before


# ---- an out-dir no checkpoint can be written to: found before the first step ----


def not_a_folder(tmp_path):
    (tmp_path / "taken").write_text("the user's notes")
    return tmp_path / "taken"


def under_a_file(tmp_path):
    (tmp_path / "taken").write_text("the user's notes")
    return tmp_path / "taken" / "run"


def read_only(tmp_path):
    folder = tmp_path / "locked"
    folder.mkdir()
    folder.chmod(0o500)
    return folder


# (makes the out-dir, a word of the error)
UNWRITABLE_CASES = [(not_a_folder, "taken"), (under_a_file, "taken")]
if os.geteuid() != 0:  # root writes anywhere
    UNWRITABLE_CASES.append((read_only, "locked"))


@pytest.mark.parametrize(("make", "word"), UNWRITABLE_CASES, ids=lambda v: getattr(v, "__name__", v))
def test_an_unwritable_out_dir_stops_the_library_before_any_step(make, word, tmp_path):
    out = make(tmp_path)
    model, batches, config = tiny_run(out)
    drawn = []

    def get_batch(split):
        drawn.append(split)
        return batches(split)

    with pytest.raises(OSError, match=word):
        tl.train(model, get_batch, config)
    assert drawn == []  # found before the first batch
    if word == "taken":
        assert (tmp_path / "taken").read_text() == "the user's notes"


@pytest.mark.parametrize(("make", "word"), UNWRITABLE_CASES, ids=lambda v: getattr(v, "__name__", v))
def test_an_unwritable_out_dir_is_one_line_from_the_command(make, word, small_text, tmp_path, capsys):
    out = make(tmp_path)
    assert cli.main(["train", *TINY, "--data", str(small_text), "--out-dir", str(out)]) == 2
    out, err = capsys.readouterr()
    assert word in err and "cannot write" in err and len(err.strip().splitlines()) == 1
    assert "characters" not in out  # stopped before the data was read


# ---- data files that are not UTF-8 text: a ValueError naming the file, the file untouched ----

# (the file's bytes, a word of the error)
DATA_FILE_CASES = {
    "latin-1": ("Roméo et Juliette\n".encode("latin-1") * 20, "UTF-8"),
    "utf-16": (("to be or not to be\n" * 20).encode("utf-16"), "UTF-8"),
    "png": (b"\x89PNG\r\n\x1a\n" + bytes(range(256)), "UTF-8"),
    "random bytes": (random.Random(1).randbytes(2048), "UTF-8"),
    "NUL bytes": (b"abc\x00def\n" * 30, "binary"),
    "empty": (b"", "empty"),
    "only a byte-order mark": (b"\xef\xbb\xbf", "empty"),
}


@pytest.mark.parametrize("kind", DATA_FILE_CASES)
def test_a_data_file_that_is_not_text_is_named(kind, tmp_path, monkeypatch):
    data, word = DATA_FILE_CASES[kind]
    path = tmp_path / "corpus.bin"
    path.write_bytes(data)
    with pytest.raises(ValueError, match=word) as error:
        tl.load_corpus(path)
    assert str(path) in str(error.value)
    monkeypatch.setenv("TINY_SHAKESPEARE", str(path))
    with pytest.raises(ValueError, match=word), pytest.warns(UserWarning, match="checksum"):
        tl.load_corpus()
    assert path.read_bytes() == data


@pytest.mark.parametrize("kind", DATA_FILE_CASES)
def test_the_command_names_a_data_file_that_is_not_text(kind, tmp_path, capsys):
    data, word = DATA_FILE_CASES[kind]
    path = tmp_path / "corpus.bin"
    path.write_bytes(data)
    assert cli.main(["train", *TINY, "--data", str(path), "--out-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert word in err and str(path) in err and len(err.splitlines()) == 1
    assert path.read_bytes() == data and not (tmp_path / "run" / "ckpt.pt").exists()


# ---- a UTF-8 byte-order mark at the start of a text: read, it is not part of the text ----


def test_a_byte_order_mark_is_no_character_of_the_text(tmp_path, monkeypatch):
    path = tmp_path / "bom.txt"
    path.write_bytes("\ufeffto be or not to be\n".encode() * 30)  # a mark at the start, and inside (kept there)
    text = tl.load_corpus(path).text
    assert text.startswith("to be") and text.count("\ufeff") == 29
    monkeypatch.setenv("TINY_SHAKESPEARE", str(path))
    with pytest.warns(UserWarning, match="checksum"):
        assert tl.load_corpus().text == text


def test_the_command_trains_on_a_text_with_a_byte_order_mark_without_it(small_text, tmp_path):
    path = tmp_path / "bom.txt"
    path.write_bytes(b"\xef\xbb\xbf" + small_text.read_bytes())
    out = tmp_path / "run"
    assert cli.main(["train", *TINY, "--data", str(path), "--out-dir", str(out), "--max-iters", "2"]) == 0
    tokenizer = tl.load_checkpoint(out)[1]
    assert "\ufeff" not in tokenizer.chars and set(tokenizer.chars) == set(small_text.read_text())
    assert cli.main(["train", "--resume", "--out-dir", str(out), "--max-iters", "4"]) == 0  # the same text


# ---- batches whose targets do not fit the inputs: a clear error before the model sees them ----


def gpt_batches_changed(change):
    def make(batches):
        return lambda split: change(*batches(split))

    return make


# (turns a good get_batch into a bad one, error class, a word of the message)
BATCH_CASES = {
    "targets one shorter": (gpt_batches_changed(lambda x, y: (x, y[:, :-1])), ValueError, "shape"),
    "targets flattened": (gpt_batches_changed(lambda x, y: (x, y.reshape(-1))), ValueError, "targets"),
    "targets with an extra axis": (gpt_batches_changed(lambda x, y: (x, y[..., None])), ValueError, "shape"),
    "targets transposed": (gpt_batches_changed(lambda x, y: (x, y.T)), ValueError, "shape"),
    "one tensor, not a tuple": (gpt_batches_changed(lambda x, y: x), TypeError, "tuple of tensors"),
    "a list of lists": (gpt_batches_changed(lambda x, y: (x.tolist(), y.tolist())), TypeError, "tuple of tensors"),
}


@pytest.mark.parametrize("kind", BATCH_CASES)
def test_batches_whose_targets_do_not_fit_are_a_clear_error(kind, tmp_path):
    change, error, word = BATCH_CASES[kind]
    model, batches, config = tiny_run(tmp_path)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(error, match=word):
        tl.train(model, change(batches), config)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # not one step taken
    assert not (tmp_path / "ckpt.pt").exists()


def test_seq2seq_targets_must_fit_the_decoder_inputs(tmp_path):
    data = tl.sequence_task("copy", n_train=50, n_val=10, n_symbols=5, max_len=4)
    model = tl.Transformer(tl.TransformerConfig(src_vocab_size=8, tgt_vocab_size=8, d_model=8, n_heads=1,
                                                context_len=data.context_len))  # fmt: skip
    batches = tl.Seq2SeqBatches(data, batch_size=4)
    config = tl.TrainConfig(max_iters=2, eval_iters=1, device="cpu", progress=False, verbose=False)
    with pytest.raises(ValueError, match="shape"):
        tl.train(model, lambda split: (*batches(split)[:2], batches(split)[2][:, 1:]), config)

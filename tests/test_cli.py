"""Tests for the command line (transformer_lib/cli/, python -m transformer_lib train|sample):
a few-step training run writes a checkpoint that the sample command loads; --resume continues
it; --help works. Offline and on a small temporary text, so they are fast."""

import os
import subprocess
import sys
from dataclasses import fields

import pytest
import torch

import transformer_lib as tl
from transformer_lib import cli
from transformer_lib import data as D
from transformer_lib import recipe as recipe_module
from transformer_lib.data import corpus as C

TINY = (
    "--preset cpu --n-layers 1 --n-heads 2 --d-model 16 --context-len 8 --batch-size 4 "
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


def test_no_arguments_and_help_list_the_commands_and_nothing_trains(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert cli.main([]) == 2  # nothing is trained without being asked
    out, err = capsys.readouterr()
    assert err == "error: give a command (nothing was run)\n" and list(tmp_path.iterdir()) == []
    for name in ("train", "sample", "finetune", "export", "help"):
        assert f"\n  {name} " in out
    for argv in (["--help"], ["-h"], ["help"]):
        assert cli.main(argv) == 0 and capsys.readouterr().out == out
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["help", "finetune"])
    assert exit_info.value.code == 0 and "--lora-rank" in capsys.readouterr().out
    assert cli.main(["trian"]) == 2
    assert "unknown command 'trian'; did you mean 'train'?" in capsys.readouterr().err
    shown = run_module("transformer_lib", "--help")
    assert shown.returncode == 0 and "finetune" in shown.stdout and "export" in shown.stdout


@pytest.mark.parametrize(
    "argv, nearest",
    [(["train", "--max-itres", "3"], "--max-iters"), (["train", "--learnin-rate", "1"], "--learning-rate"),
     (["finetune", "--lora-rnk", "2"], "--lora-rank"), (["sample", "--temprature", "1"], "--temperature"),
     (["export", "--ckpt", "r", "--out-dir", "o", "--merge-adapters"], "--merge-adapter")],
)  # fmt: skip
def test_an_unknown_flag_names_the_nearest_one_in_one_line(argv, nearest, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(argv)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1 and f"did you mean {nearest}?" in err


def test_hugging_face_names_are_aliases_and_every_default_is_written_out():
    args = cli.build_parser().parse_args(["--max-steps", "7", "--learning-rate", "0.01", "--output-dir", "o"])
    assert (args.max_iters, args.lr, args.out_dir) == (7, 0.01, "o")
    from transformer_lib.cli import finetune

    parser = finetune.build_parser()
    assert parser.parse_args(["--lora-r", "4"]).lora_rank == 4
    helps = {a.dest: a.help for a in parser._actions}
    assert "(default: 300)" in helps["max_iters"] and "1e-3 with --lora-rank, 3e-4 without" in helps["lr"]
    assert "FINETUNE_DEFAULTS" not in parser.format_help() and "pretrained.pt" in helps["ckpt"]
    train_help = {a.dest: a.help for a in cli.build_parser()._actions}
    assert "tokens" in train_help["context_len"] and "6 with gpu" in train_help["n_layers"]
    assert "2000 with --preset cpu" in train_help["max_iters"]


def test_help(capsys):
    out = run_module("transformer_lib", "train", "--help")
    assert out.returncode == 0, out.stderr
    for flag in ("--preset", "--resume", "--max-iters", "--n-layers", "--data", "--compile", "sample"):
        assert flag in out.stdout
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["sample", "--help"])
    assert exit_info.value.code == 0
    assert "--temperature" in capsys.readouterr().out


def test_train_then_sample_then_resume(tmp_path, text_file, capsys):
    out_dir = tmp_path / "run"
    assert cli.main([*TINY, "--data", str(text_file), "--max-iters", "10", "--out-dir", str(out_dir)]) == 0
    assert "final val loss" in capsys.readouterr().out
    model, tok, ckpt = tl.load_checkpoint(out_dir)
    assert ckpt["step"] == 10 and ckpt["model_config"]["n_layers"] == 1 and model.config.d_model == 16

    assert cli.main(["sample", "--ckpt", str(out_dir), "--prompt", "ROMEO:", "--max-new-tokens", "30",
                   "--temperature", "0.8", "--top-k", "5", "--device", "cpu"]) == 0  # fmt: skip
    sample = capsys.readouterr().out
    assert sample.startswith("ROMEO:") and len(sample.rstrip("\n")) >= 6 + 25
    assert set(sample) <= set(tok.chars) | {"\n"}

    assert cli.main(["--resume", "--out-dir", str(out_dir), "--max-iters", "15", "--no-progress"]) == 0
    assert tl.load_checkpoint(out_dir)[2]["step"] == 15
    assert cli.main(["--resume", "--out-dir", str(out_dir), "--n-layers", "3"]) == 2  # the shape is the checkpoint's
    assert "cannot change the model's shape" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["--resume", "--out-dir", str(tmp_path / "nothing")])


def test_offline_fallback_corpus_run(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(C, "SHIPPED_PATH", tmp_path / "not-shipped.txt")  # an install without the text
    with pytest.warns(UserWarning, match="offline fallback"):
        assert cli.main([*TINY, "--max-iters", "2", "--out-dir", str(tmp_path / "run")]) == 0
    assert capsys.readouterr().out.startswith("python_stdlib:")


def test_sample_errors(tmp_path, text_file):
    with pytest.raises(SystemExit):
        cli.main(["sample", "--ckpt", str(tmp_path / "missing")])
    cli.main([*TINY, "--data", str(text_file), "--max-iters", "1", "--out-dir", str(tmp_path / "r")])
    with pytest.raises(SystemExit):  # "Z" never occurs in the training text
        cli.main(["sample", "--ckpt", str(tmp_path / "r"), "--prompt", "Zebra", "--device", "cpu"])


def test_every_training_setting_has_one_flag_made_from_its_field():
    parser = cli.build_parser()
    flags = {a.dest: a for a in parser._actions}
    for f in fields(tl.TrainConfig):
        if f.name != "out_dir":
            assert f.name in flags and flags[f.name].default is None, f.name
            assert flags[f.name].help.startswith(f.metadata["help"]) and "default" in flags[f.name].help
    # the shape, then the recipe's choices by their flat names: each kind's options are its spec's fields
    shape = fields_of(tl.GPTConfig) - {"vocab_size", "recipe"}
    assert set(cli.MODEL_SETTINGS) == shape | set(recipe_module.FLAT_HELP)
    # chapters "Experts" and "Longer than trained": a spec's fields are flags too, named after its recipe field
    specs = {"experts": tl.ExpertsSpec, "rope_scaling": tl.RopeScaling}
    spec_flags = {
        (
            "experts"
            if f.name == "n_experts"
            else "rope_scaling"
            if f.name == "kind"
            else f.metadata.get("flat") or prefix + f.name
        ): f
        for key, cls in specs.items()
        for prefix in [{"experts": "experts_", "rope_scaling": "rope_"}[key]]
        for f in fields(cls)
    }
    for name in cli.MODEL_SETTINGS:
        assert flags[name].default is None, name
    for name, f in spec_flags.items():  # its help is the spec's field's own
        assert flags[name].help.startswith(f.metadata["help"]), name


def fields_of(cls):
    return {f.name for f in fields(cls)}


def test_presets_are_train_configs_and_gpt_shapes():
    for shape, config in cli.PRESETS.values():
        assert isinstance(config, tl.TrainConfig) and set(shape) <= set(cli.MODEL_SETTINGS)
        tl.GPTConfig(vocab_size=3, **shape)  # a valid shape


def test_flags_override_the_preset_and_decay_follows_max_iters():
    args = cli.build_parser().parse_args(["--preset", "gpu", "--max-iters", "500", "--lr", "0.002", "--no-progress"])
    preset, shape, config = cli.model_settings(args, None, None)
    assert preset == "gpu" and shape["d_model"] == 384 and shape["context_len"] == 256
    assert config.max_iters == 500 and config.lr == 0.002 and config.batch_size == 64 and config.progress is False
    assert config.lr_decay_iters is None and tl.lr_at(499, config) == pytest.approx(config.min_lr, rel=1e-3)


def _replica_worker(rank, world_size, init_file, out_dir, differ):
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    try:
        torch.manual_seed(rank if differ else 0)
        model = torch.nn.Linear(3, 2)
        line = cli._compare_replicas(model, world_size)
        with open(f"{out_dir}/rank{rank}.txt", "w") as f:
            f.write(line)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("differ", [False, True])
def test_data_parallel_run_reports_whether_the_processes_agree(tmp_path, differ):
    """Under torchrun the command ends by comparing every process's weights (gloo, 2 processes)."""
    import torch.multiprocessing as mp

    mp.spawn(_replica_worker, args=(2, str(tmp_path / "init"), str(tmp_path), differ), nprocs=2, join=True)
    lines = [(tmp_path / f"rank{r}.txt").read_text() for r in range(2)]
    assert lines[0] == lines[1]  # every rank computes the same verdict
    if differ:
        assert lines[0].startswith("warning: the 2 processes hold different weights")
    else:
        assert lines[0].startswith("weights identical on all 2 processes (checksum ")


def test_a_bpe_run_trains_its_tokenizer_on_the_training_split_and_keeps_it(tmp_path, text_file, capsys):
    out_dir = tmp_path / "bpe"
    text = text_file.read_text()
    text_file.write_text(text + "ZZZ unique to the validation text " * 40)  # only in the last 10 %
    args = [*TINY, "--data", str(text_file), "--tokenizer", "bpe", "--vocab-size", "300", "--out-dir", str(out_dir)]
    assert cli.main([*args, "--max-iters", "6"]) == 0
    tok = tl.load_tokenizer(out_dir / cli.TOKENIZER_NAME)
    assert isinstance(tok, tl.BPETokenizer) and tok.vocab_size == 300
    n_train = int(len(text_file.read_text()) * 0.9)
    # the validation text never trains it; <|endoftext|> is its one special token, the last id (as in GPT-2)
    assert tok == tl.train_bpe(text_file.read_text()[:n_train], 300, specials=("<|endoftext|>",))
    assert tok.eos_id == 299
    model, from_ckpt, ckpt = tl.load_checkpoint(out_dir)
    assert from_ckpt == tok and model.config.vocab_size == 300
    assert ckpt["meta"]["tokenizer"] == "bpe" and ckpt["meta"]["tokenizer_sha256"] == tl.tokenizer_checksum(tok)
    capsys.readouterr()
    assert cli.main(["sample", "--ckpt", str(out_dir), "--prompt", "ROMEO:", "--max-new-tokens", "5"]) == 0
    assert capsys.readouterr().out.startswith("ROMEO:")
    assert cli.main([*args, "--max-iters", "8", "--resume"]) == 0  # the saved tokenizer, not a new one
    # a different tokenizer file beside the checkpoint is refused by name, by resume and by sample
    tl.save_tokenizer(tl.train_bpe(text, 290), out_dir / cli.TOKENIZER_NAME, force=True)
    for command in ([*args, "--max-iters", "10", "--resume"], ["sample", "--ckpt", str(out_dir)]):
        assert cli.main(command) == 2
        err = capsys.readouterr().err
        assert "tokenizer.json holds a different tokenizer" in err and "\n" == err[-1] and err.count("\n") == 1


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (["--vocab-size", "300"], ["--vocab-size 300 is for --tokenizer bpe"]),
        (["--tokenizer", "bpe", "--vocab-size", "256"], ["at least 258", "256"]),
    ],
)
def test_tokenizer_flags_are_checked_before_training(tmp_path, text_file, capsys, flags, words):
    out_dir = tmp_path / "never"
    assert cli.main([*TINY, "--data", str(text_file), "--out-dir", str(out_dir), *flags]) == 2
    err = capsys.readouterr().err
    assert all(w in err for w in words), err
    assert not (out_dir / "ckpt.pt").exists()


def test_resume_cannot_change_the_tokenizer(tmp_path, text_file, capsys):
    out_dir = tmp_path / "char"
    assert cli.main([*TINY, "--data", str(text_file), "--max-iters", "4", "--out-dir", str(out_dir)]) == 0
    capsys.readouterr()
    assert cli.main([*TINY, "--out-dir", str(out_dir), "--resume", "--tokenizer", "bpe"]) == 2
    assert "--resume cannot change --tokenizer: the run in" in capsys.readouterr().err

"""A run has one owner (transformer_lib/run.py): the names of a run folder's files are defined
there alone, its lock's included (the checkpoint's own name, a folder's checkpoint, in
checkpoint.py, which keeps the bytes of one file and takes the lock's name from its caller),
every command that starts from a checkpoint builds its model with
:func:`~transformer_lib.run.start_model`, and the commands that continue a run, ``train``'s
included, share one resume rule, :meth:`~transformer_lib.run.RunFolder.resumed`. The first
tests read the library's source; the last ones run the rule."""

import ast
import inspect
from pathlib import Path

import pytest
import torch

import transformer_lib as tl
from transformer_lib import checkpoint, cli, run

LIBRARY = Path(tl.__file__).parent
CLI = LIBRARY / "cli"
# Where each name of a run folder's files may be written as a string: run.py defines the run's own
# files and the lock that owns the folder; checkpoint.py the name of the checkpoint in a folder.
DEFINED_IN = {
    run.TOKENIZER_NAME: "run.py",
    run.ADAPTER_NAME: "run.py",
    run.LOCK_NAME: "run.py",
    checkpoint.CHECKPOINT_NAME: "checkpoint.py",
}
# Messages elsewhere that show the name as an example path, not as the run's file.
EXAMPLES = {("data/tokenizer.py", run.TOKENIZER_NAME)}
# The commands that start from a checkpoint, and those of them that continue a run.
STARTING = ("finetune.py", "tune.py", "sample.py", "evaluate.py")
RESUMING = ("finetune.py", "tune.py")
# The flags of a tiny training run (refused below before it trains a step).
TINY = "--n-layers 1 --n-heads 1 --d-model 4 --context-len 4 --batch-size 2 --max-iters 2 --device cpu".split()


def strings(path: Path):
    """The string constants of the module at ``path`` (f-strings' pieces too), its docstrings left out."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docs = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            yield node.value


def calls(path: Path) -> set[str]:
    """The names of the functions and methods the module at ``path`` calls."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            found.add(func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None))
    return found


def test_a_run_folders_file_names_are_written_in_one_module_each():
    found = set()
    for path in sorted(LIBRARY.rglob("*.py")):
        where = path.relative_to(LIBRARY).as_posix()
        for value in strings(path):
            for name, owner in DEFINED_IN.items():
                if value in (name, "/" + name) and where != owner and (where, name) not in EXAMPLES:
                    found.add((where, name))
    assert not found, f"a run folder's file named outside its owner: {sorted(found)}"
    assert run.RunFolder("out").adapter == Path("out", run.ADAPTER_NAME)  # the folder's paths are run.py's
    assert {run.RunFolder("out").checkpoint, run.RunFolder("out").lock} == {
        Path("out", checkpoint.CHECKPOINT_NAME),
        Path("out", run.LOCK_NAME),
    }


def test_checkpoint_py_takes_the_lock_and_the_checkpoint_name_from_its_caller(tmp_path):
    assert not hasattr(checkpoint, "LOCK_NAME")
    assert "lock_name" in inspect.signature(checkpoint.own_folder).parameters
    with checkpoint.own_folder(tmp_path, "other.lock"):
        assert (tmp_path / "other.lock").is_file() and not (tmp_path / run.LOCK_NAME).exists()
    with run.RunFolder(tmp_path).own():
        assert run.RunFolder(tmp_path).lock.is_file()
    assert not list(tmp_path.iterdir())  # each lock removed by its holder
    model = tl.GPT(tl.GPTConfig(vocab_size=8, context_len=4, n_layers=1, n_heads=1, d_model=4))
    checkpoint.save_checkpoint({"model": model.state_dict()}, tmp_path / "best.pt")
    assert checkpoint.checkpoint_file(tmp_path, "best.pt") == tmp_path / "best.pt"
    assert "model" in checkpoint.read_checkpoint(tmp_path, name="best.pt")


def test_checkpoint_py_keeps_the_bytes_and_knows_no_command_and_no_lora_file():
    source = (LIBRARY / "checkpoint.py").read_text(encoding="utf-8")
    for word in ("python -m transformer_lib", "--adapter", "adapter.pt", "tokenizer.json", "finetune"):
        assert word not in source, word
    assert not hasattr(checkpoint, "ADAPTER_NAME") and not hasattr(checkpoint, "TrainingFile")


def test_train_py_writes_no_checkpoint_layout_of_its_own():
    source = (LIBRARY / "train.py").read_text(encoding="utf-8")
    assert "model_class" not in source and "CHECKPOINT_NAME" not in source
    assert {"state", "check"} <= calls(LIBRARY / "train.py")  # TrainingFile.state and TrainingFile.check


@pytest.mark.parametrize("command", STARTING)
def test_every_command_that_starts_from_a_checkpoint_uses_start_model(command):
    called = calls(CLI / command)
    assert "start_model" in called
    assert not called & {"load_checkpoint", "load_run", "build_model", "add_adapter", "load_adapter"}
    tree = ast.parse((CLI / command).read_text(encoding="utf-8"))
    private = [
        f"{node.module}.{a.name}"
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.level == 1
        for a in node.names
        if a.name.startswith("_")
    ]
    assert not private, f"cli/{command} imports another command's private {private}"


@pytest.mark.parametrize("command", RESUMING)
def test_every_command_that_continues_a_run_uses_the_one_resume_rule(command):
    called = calls(CLI / command)
    assert {"resumed", "resumed_file", "read_base", "resume_config", "resume_record"} <= called
    assert "read_checkpoint" not in called  # the run's checkpoint is read by the rule, once


def test_the_train_command_continues_a_run_by_the_same_rule():
    called = calls(CLI / "train.py") | calls(CLI / "settings.py")  # settings.py checks the flags it resumes with
    assert {"resumed", "resume_config", "resume_record"} <= called
    assert "read_checkpoint" not in called and "check_fresh" not in calls(CLI / "train.py")


def test_the_resume_rule_names_the_kind_and_its_command(tmp_path):
    folder = run.RunFolder(tmp_path)
    model = tl.GPT(tl.GPTConfig(vocab_size=8, context_len=4, n_layers=1, n_heads=1, d_model=4))
    meta = run.RunRecord(kind="grpo", seed=1, val_fraction=0.1).to_meta()
    checkpoint.save_checkpoint({"model": model.state_dict(), "meta": meta}, folder.checkpoint)
    refusal = r"holds a grpo run, not a fine-tuning run: continue it with python -m transformer_lib grpo --resume"
    with pytest.raises(ValueError, match=refusal):
        folder.resumed("finetune", resume=True, force=False)
    ckpt, record = folder.resumed("grpo", resume=True, force=False)
    assert record.kind == "grpo" and torch.equal(ckpt["model"]["lm_head.weight"], model.lm_head.weight)
    with pytest.raises(ValueError, match="continue it with --resume, replace it with --force"):
        folder.resumed("grpo", resume=False, force=False)
    assert folder.resumed("grpo", resume=False, force=True) == (None, None)


def test_the_train_command_refuses_to_continue_another_kind_of_run(tmp_path, capsys):
    folder = run.RunFolder(tmp_path / "tuned")
    folder.path.mkdir()
    model = tl.GPT(tl.GPTConfig(vocab_size=8, context_len=4, n_layers=1, n_heads=1, d_model=4))
    meta = run.RunRecord(kind="finetune", seed=1, val_fraction=0.1).to_meta()
    checkpoint.save_checkpoint({"model": model.state_dict(), "meta": meta}, folder.checkpoint)
    before = folder.checkpoint.read_bytes()
    assert cli.main(["train", *TINY, "--resume", "--out-dir", str(folder.path)]) == 2
    err = capsys.readouterr().err
    assert "holds a fine-tuning run, not a training run: continue it with python -m transformer_lib finetune" in err
    assert folder.checkpoint.read_bytes() == before and not folder.lock.exists()

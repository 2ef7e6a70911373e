"""Tests for the fine-tuning command (transformer_lib/cli/finetune.py, chapter "Fine-tuning"): full and LoRA
runs on a tiny BPE base, the adapter file and ``sample --adapter``, resume (after Ctrl-C too)
equal to an uninterrupted run bit for bit, and a one-line refusal with exit status 2 for every
bad input. Offline, tiny models and a few steps, so they are fast."""

import signal
import sys

import pytest
import torch

import transformer_lib as tl
from tests.test_cli import offline_one_thread  # noqa: F401 (autouse: offline, one thread)
from tests.test_run_ownership import same_state, state
from transformer_lib import cli
from transformer_lib.cli.finetune import ADAPTER_NAME, FINETUNE_DEFAULTS
from transformer_lib.data.instructions import PROMPT_END, encode_pair
from transformer_lib.finetune import LORA_TARGETS, answers

BASE = ("--n-layers 1 --n-heads 2 --d-model 16 --context-len 32 --batch-size 4 --eval-interval 2 --eval-iters 1 "
        "--device cpu --no-progress --max-iters 4").split()  # fmt: skip
# the learning rate decays over 6 steps whatever --max-iters says, so a shorter run is a prefix of a longer one
TINY = "--batch-size 4 --eval-interval 2 --eval-iters 1 --device cpu --no-progress --warmup-iters 0".split()
TINY += ["--lr-decay-iters", "6", "--max-iters", "6"]
TEXT = "ROMEO: But soft, what light through yonder window breaks?\nJULIET: Ay me!\n" * 30
WORDS = ["ROMEO", "JULIET", "light", "soft", "window", "breaks", "yonder", "what", "me", "Ay", "But", "through"]


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A tiny GPT trained on BPE tokens (with <|endoftext|>) by the train command: its folder."""
    folder = tmp_path_factory.mktemp("base")
    (folder / "text.txt").write_text(TEXT)
    args = ["train", *BASE, "--data", str(folder / "text.txt"), "--tokenizer", "bpe", "--vocab-size", "300"]
    assert cli.main([*args, "--out-dir", str(folder / "bpe")]) == 0
    assert cli.main(["train", *BASE, "--data", str(folder / "text.txt"), "--out-dir", str(folder / "char")]) == 0
    return folder


def write_pairs(path, pairs):
    return tl.write_pairs(pairs, path)


@pytest.fixture
def pairs(tmp_path):
    return write_pairs(tmp_path / "pairs.jsonl", [(w, w[::-1].upper()) for w in WORDS])


def finetune(base, pairs, out, *extra):
    return cli.main(["finetune", "--ckpt", str(base / "bpe"), "--data", str(pairs), "--out-dir", str(out), *TINY,
                     *map(str, extra)])  # fmt: skip


def base_names(state):
    """A LoRA run's state dict with the names the base model gives its weights."""
    plain = {}
    for name, t in state.items():
        if name.endswith((".A", ".B")) and ".parametrizations." in name:
            continue
        plain[name.replace(".parametrizations.", ".").replace(".original", "")] = t
    return plain


def greedy_answer(model, tokenizer, prompt):
    ids, _ = answers(model, tokenizer, [tokenizer.encode(prompt + PROMPT_END)], 20)[0]
    return tokenizer.decode(ids)


def sample(capsys, *args):
    capsys.readouterr()
    code = cli.main(["sample", "--prompt", "ROMEO", "--greedy", "--max-new-tokens", "20", "--device", "cpu", *args])
    return code, capsys.readouterr()


def test_the_defaults_are_one_table():
    assert FINETUNE_DEFAULTS["lr"] == {"lora": 1e-3, "full": 3e-4} and FINETUNE_DEFAULTS["max_iters"] == 300
    args = cli.finetune.build_parser().parse_args(["--lora-rank", "4"])
    record = cli.finetune.finetune_record(args, None, None)
    config = cli.finetune.finetune_config(args, record, None, None)
    assert record.lora_alpha == 8.0 and record.method == "lora"
    assert config.lr == 1e-3 and config.min_lr == pytest.approx(1e-4)
    assert (config.max_iters, config.warmup_iters, config.eval_interval, config.batch_size) == (300, 20, 50, 16)
    assert config.weight_decay == 0.0


def test_full_finetuning_trains_every_weight_and_sample_answers_in_the_format(base, pairs, tmp_path, capsys):
    out = tmp_path / "full"
    assert finetune(base, pairs, out) == 0
    said = capsys.readouterr().out
    assert "12 pairs" not in said and "11 pairs to train on, 1 to validate" in said and "final val loss" in said
    model, tok, ckpt = tl.load_checkpoint(out)
    assert ckpt["meta"]["finetune"] == "full" and ckpt["meta"]["data_sha256"] == tl.sha256_of(pairs)
    assert ckpt["train_config"]["lr"] == 3e-4 and ckpt["step"] == 6 and not (out / ADAPTER_NAME).exists()
    before = tl.read_checkpoint(base / "bpe")["model"]
    assert all(not torch.equal(before[k], ckpt["model"][k]) for k in before if "ln" not in k)
    code, printed = sample(capsys, "--ckpt", str(out))
    assert code == 0 and printed.out == greedy_answer(model, tok, "ROMEO") + "\n"


def test_sample_of_a_fine_tuned_model_stops_at_the_end_token(base, pairs, tmp_path, capsys, monkeypatch):
    out = tmp_path / "full"
    assert finetune(base, pairs, out, "--max-iters", "1") == 0
    _, tok, _ = tl.load_checkpoint(out)
    said, after = tok.encode("WORD"), tok.encode(" and more")

    wanted, steps = said + [tok.eos_id] + after * 100, []

    def forward(self, idx, *args, **kwargs):  # the model writes its end token, then would go on
        logits = torch.full((*idx.shape, self.config.vocab_size), -1e4)
        logits[:, -1, wanted[len(steps)]] = 0.0
        steps.append(idx.shape[1])
        return logits, None

    monkeypatch.setattr(tl.GPT, "forward", forward)
    code, printed = sample(capsys, "--ckpt", str(out), "--max-new-tokens", "100")
    assert code == 0 and printed.out == "WORD\n"
    assert len(steps) == len(said) + 1  # no step after the end token


def test_lora_trains_only_the_adapters_and_sample_adapter_gives_the_same_answer(base, pairs, tmp_path, capsys):
    out = tmp_path / "lora"
    assert finetune(base, pairs, out, "--lora-rank", 2) == 0
    assert "adapter in" in capsys.readouterr().out
    ckpt, adapter = tl.read_checkpoint(out), tl.read_checkpoint(out / ADAPTER_NAME)
    assert ckpt["meta"]["finetune"] == "lora" and ckpt["train_config"]["lr"] == 1e-3
    assert adapter["rank"] == 2 and adapter["alpha"] == 4.0 and adapter["meta"]["lora_rank"] == 2
    assert adapter["meta"]["base_sha256"] == tl.read_checkpoint(base / "bpe")["checksum"]
    # the base's weights are in the checkpoint bit for bit; the adapters moved
    before, after = tl.read_checkpoint(base / "bpe")["model"], base_names(ckpt["model"])
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    assert any(t.abs().sum() > 0 for k, t in adapter["tensors"].items() if k.endswith(".B"))
    size = (out / ADAPTER_NAME).stat().st_size
    assert size < (base / "bpe" / "ckpt.pt").stat().st_size / 4, size
    # the checkpoint holds the parametrized model: load_checkpoint says what to do instead
    with pytest.raises(ValueError, match="LoRA adapters.*--adapter"):
        tl.load_checkpoint(out)
    # the model the checkpoint holds answers as the base with the adapter file does, and sample
    # reads the run's folder as it is
    model, tok, _ = tl.load_checkpoint(base / "bpe")
    tl.add_lora(model, list(LORA_TARGETS), rank=2, alpha=4.0)
    model.load_state_dict(ckpt["model"])
    code, printed = sample(capsys, "--ckpt", str(base / "bpe"), "--adapter", str(out / ADAPTER_NAME))
    assert code == 0 and printed.out == greedy_answer(model.eval(), tok, "ROMEO") + "\n"
    assert sample(capsys, "--ckpt", str(out))[1].out == printed.out
    # an adapter trained on another base is refused by name
    code, printed = sample(capsys, "--ckpt", str(base / "char"), "--adapter", str(out / ADAPTER_NAME))
    assert code == 2 and "was trained on the base" in printed.err and printed.err.count("\n") == 1


def test_new_token_rows_train_beside_the_adapters_and_every_tool_reads_them(base, pairs, tmp_path, capsys):
    out = tmp_path / "rows"
    assert finetune(base, pairs, out, "--lora-rank", 2, "--new-token-rows") == 0
    record, adapter = tl.read_record(out), tl.read_checkpoint(out / ADAPTER_NAME)
    tokenizer = tl.load_checkpoint(base / "bpe")[1]
    seen = set(tokenizer.encode_ordinary(TEXT[: int(len(TEXT) * 0.9)]))
    used = set(tokenizer.encode_ordinary("".join(f"{w}{PROMPT_END}{w[::-1].upper()}" for w in WORDS)))
    assert list(record.token_rows) == sorted(used - seen) == adapter["token_rows"] and record.token_rows
    # load_run gives the model the run trained: its rows moved, the other rows are the base's
    model, tok, adapters = tl.load_run(out)
    base_model = tl.load_checkpoint(base / "bpe")[0]
    moved = (model.tok_embed.weight - base_model.tok_embed.weight).abs().sum(-1) > 0
    assert moved.nonzero().flatten().tolist() == list(record.token_rows) and adapters
    assert torch.equal(model.lm_head.weight, model.tok_embed.weight)  # still tied
    code, printed = sample(capsys, "--ckpt", str(base / "bpe"), "--adapter", str(out / ADAPTER_NAME))
    assert code == 0 and printed.out == greedy_answer(model, tok, "ROMEO") + "\n"
    # exported with the adapters and the rows merged: transformers computes the same logits
    transformers = pytest.importorskip("transformers")
    tl.export_hf(out, tmp_path / "hf", merge_adapter=True)
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    ids = torch.tensor([tok.encode("ROMEO" + PROMPT_END)])
    with torch.no_grad():
        assert torch.allclose(hf(ids).logits, model(ids)[0], atol=1e-5)
    # resumed: the same run; a resume may not add rows to a run without them
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    assert finetune(base, pairs, resumed, "--lora-rank", 2, "--new-token-rows", "--max-iters", 4) == 0
    assert cli.main(["finetune", "--resume", "--out-dir", str(resumed), "--max-iters", "6", "--no-progress"]) == 0
    assert same_state(state(out), state(resumed))
    assert finetune(base, pairs, straight, "--lora-rank", 2, "--max-iters", 4) == 0
    capsys.readouterr()
    code = cli.main(["finetune", "--resume", "--out-dir", str(straight), "--new-token-rows", "--no-progress"])
    assert code == 2 and "--new-token-rows" in capsys.readouterr().err
    assert finetune(base, pairs, tmp_path / "full", "--new-token-rows") == 2  # rows are for LoRA


@pytest.mark.parametrize("lora", [[], ["--lora-rank", "2"]], ids=["full", "lora"])
def test_resume_equals_an_uninterrupted_run(base, pairs, tmp_path, lora):
    straight, out = tmp_path / "straight", tmp_path / "run"
    assert finetune(base, pairs, straight, *lora) == 0
    assert finetune(base, pairs, out, *lora, "--max-iters", 4) == 0
    assert cli.main(["finetune", "--resume", "--out-dir", str(out), "--max-iters", "6", "--no-progress"]) == 0
    assert same_state(state(straight), state(out))
    if lora:
        assert (
            tl.read_checkpoint(straight / ADAPTER_NAME)["checksum"]
            == tl.read_checkpoint(out / ADAPTER_NAME)["checksum"]
        )


def test_ctrl_c_saves_the_checkpoint_and_the_adapter_and_resumes_exactly(base, pairs, tmp_path, monkeypatch, capsys):
    straight, out = tmp_path / "straight", tmp_path / "run"
    assert finetune(base, pairs, straight, "--lora-rank", 2) == 0

    def point(run, name):
        if name == "counter" and run.step == 3:
            signal.raise_signal(signal.SIGINT)

    with monkeypatch.context() as m:
        m.setattr(sys.modules["transformer_lib.train"]._Run, "point", point)
        assert finetune(base, pairs, out, "--lora-rank", 2) == 130
    assert "finetune --resume --out-dir" in capsys.readouterr().out
    ckpt, adapter = tl.read_checkpoint(out), tl.read_checkpoint(out / ADAPTER_NAME)
    assert ckpt["step"] == 4  # the step under way when Ctrl-C came finished first
    lora = {k.replace(".parametrizations.", ".").replace(".0.A", ".A").replace(".0.B", ".B"): t
            for k, t in ckpt["model"].items() if k.endswith((".A", ".B"))}  # fmt: skip
    assert lora.keys() == adapter["tensors"].keys()
    assert all(torch.equal(lora[k], adapter["tensors"][k]) for k in lora)  # the adapter of the saved step
    assert cli.main(["finetune", "--resume", "--out-dir", str(out), "--no-progress"]) == 0
    assert same_state(state(straight), state(out))


def bad_file(tmp_path, name, text):
    (tmp_path / name).write_text(text)
    return tmp_path / name


# (flags after --out-dir, with {base}, {pairs}, {tmp} filled in; words the one line on stderr must hold)
REFUSALS = {
    "a missing data file": (["--data", "{tmp}/none.jsonl"], ["no data file at", "none.jsonl"]),
    "a missing base": (["--ckpt", "{tmp}/nothing"], ["no base checkpoint at", "nothing"]),
    "a base that is not a checkpoint": (["--ckpt", "{tmp}/garbage.pt"], ["garbage.pt", "not a readable checkpoint"]),
    "a malformed line": (["--data", "{tmp}/broken.jsonl"], ["broken.jsonl, line 2", "not JSON"]),
    "a line that is not a pair": (["--data", "{tmp}/keys.jsonl"], ["keys.jsonl, line 1", '"prompt"']),
    "a pair longer than the context": (["--data", "{tmp}/long.jsonl"], ["long.jsonl, line 3", "tokens", "reads 32"]),
    "too few pairs": (["--data", "{tmp}/one.jsonl"], ["one.jsonl holds 1 pair", "at least 2"]),
    "a base without an end token": (["--ckpt", "{base}/char"], ["no end token", "<|endoftext|>", "--tokenizer bpe"]),
    "--lora-rank 0": (["--lora-rank", "0"], ["--lora-rank must be a positive int, got 0"]),
    "--lora-rank -2": (["--lora-rank", "-2"], ["--lora-rank must be a positive int, got -2"]),
    "--lora-rank too big": (["--lora-rank", "99"], ["--lora-rank 99", "above the smaller side"]),
    "--lora-alpha 0": (["--lora-rank", "2", "--lora-alpha", "0"], ["--lora-alpha must be a positive number, got 0"]),
    "--lora-alpha -1": (["--lora-rank", "2", "--lora-alpha", "-1"], ["--lora-alpha must be a positive", "-1"]),
    "--lora-alpha alone": (["--lora-alpha", "4"], ["--lora-alpha is for --lora-rank"]),
    "--resume with --force": (["--resume", "--force"], ["contradict"]),
    "a folder without a checkpoint": (["--ckpt", "{tmp}"], ["no checkpoint at", "ckpt.pt"]),
}


@pytest.mark.parametrize("case", REFUSALS)
def test_every_bad_input_is_one_line_and_exit_2(case, base, pairs, tmp_path, capsys):
    bad_file(tmp_path, "garbage.pt", "not a checkpoint")
    bad_file(tmp_path, "broken.jsonl", '{"prompt": "a", "response": "b"}\n{"prompt": oops\n')
    bad_file(tmp_path, "keys.jsonl", '{"question": "a", "answer": "b"}\n')
    write_pairs(tmp_path / "long.jsonl", [("a", "b"), ("c", "d"), ("qz" * 20, "JULIET")])
    write_pairs(tmp_path / "one.jsonl", [("a", "b")])
    flags, words = REFUSALS[case]
    flags = [f.format(base=base, pairs=pairs, tmp=tmp_path) for f in flags]
    out = tmp_path / "never"
    capsys.readouterr()
    code = cli.main(["finetune", "--ckpt", str(base / "bpe"), "--data", str(pairs), "--out-dir", str(out), *TINY,
                     *flags])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert all(w in err for w in words), err
    assert not (out / "ckpt.pt").exists()


def test_a_folder_of_another_run_and_a_changed_resume_are_refused(base, pairs, tmp_path, capsys):
    out = tmp_path / "run"
    assert finetune(base, pairs, out, "--lora-rank", 2, "--max-iters", 2) == 0
    before = (out / "ckpt.pt").read_bytes()
    other = write_pairs(tmp_path / "other.jsonl", [("a", "b"), ("c", "d")])
    resume = ["finetune", "--resume", "--out-dir", str(out), "--max-iters", "4"]
    cases = [
        (["finetune", "--ckpt", str(base / "bpe"), "--data", str(pairs), "--out-dir", str(out)],
         "holds another run's checkpoint: continue it with --resume"),
        ([*resume, "--data", str(other)], f"{other} is not the data the run in"),
        ([*resume, "--ckpt", str(base / "char")], "--resume cannot change --ckpt: the run in"),
        ([*resume, "--lora-rank", "4"], "--resume cannot change --lora-rank: the run in"),
        ([*resume, "--lora-alpha", "3"], "--resume cannot change --lora-alpha"),
        ([*resume, "--seed", "7"], "--resume cannot change --seed"),
        (["finetune", "--ckpt", str(out), "--data", str(pairs), "--out-dir", str(tmp_path / "x")],
         "is a LoRA run's checkpoint"),
    ]  # fmt: skip
    capsys.readouterr()
    for argv, words in cases:
        assert cli.main(argv) == 2, argv
        err = capsys.readouterr().err
        assert words in err and err.count("\n") == 1, err
    assert (out / "ckpt.pt").read_bytes() == before
    full = tmp_path / "full"
    assert finetune(base, pairs, full, "--max-iters", 2) == 0
    capsys.readouterr()
    assert cli.main(["finetune", "--resume", "--out-dir", str(full), "--lora-rank", "2"]) == 2
    assert "uses none (full fine-tuning), not 2" in capsys.readouterr().err
    # a training run's folder is not a fine-tuning run to continue
    assert cli.main(["finetune", "--resume", "--out-dir", str(base / "bpe")]) == 2
    assert "not a fine-tuning run: continue it with python -m transformer_lib train --resume" in (
        capsys.readouterr().err
    )
    # --force replaces the run: its adapter goes with it
    assert finetune(base, pairs, out, "--force", "--max-iters", 2) == 0
    assert not (out / ADAPTER_NAME).exists()


def test_encode_pair_layout_is_what_the_command_trains_on(base):
    _, tok, _ = tl.load_checkpoint(base / "bpe")
    ids, n_prompt = encode_pair(tok, "ROMEO", "OEMOR")
    assert tok.decode(ids[:n_prompt]) == "ROMEO" + PROMPT_END and ids[-1] == tok.eos_id

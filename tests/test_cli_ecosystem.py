"""What every command of the command line shares: one PyTorch thread unless --threads says more,
flags spelt as Hugging Face's and TRL's scripts spell them, no abbreviated flag, help text without
reST markup; and the sample command's end token and Ctrl-C, the training loop's first evaluation
before its progress bar, and runs refused before they leave a folder behind."""

import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import transformer_lib as tl
from transformer_lib import cli
from transformer_lib.cli import evaluate, finetune, sample, tune
from transformer_lib.cli import train as cli_train
from transformer_lib.preference_runs import GRPOBatches
from transformer_lib.sampling import generate_tokens

TINY = ["--n-layers", "1", "--n-heads", "1", "--d-model", "8", "--batch-size", "2", "--context-len", "8",
        "--eval-iters", "1", "--eval-interval", "2", "--device", "cpu", "--no-progress"]  # fmt: skip

PARSERS = {
    "train": cli_train.build_parser,
    "sample": sample.build_parser,
    "finetune": finetune.build_parser,
    "dpo": lambda: tune.build_parser("dpo"),
    "grpo": lambda: tune.build_parser("grpo"),
    "evaluate": evaluate.build_parser,
}


def exit_status(args) -> int:
    try:
        return cli.main(args)
    except SystemExit as e:
        return e.code


def refused_args(command: str, tmp_path) -> list[str]:
    """Arguments each command parses and then refuses (a file that is not there)."""
    missing = str(tmp_path / "missing")
    if command == "train":
        return ["--out-dir", ""]
    if command in ("sample", "evaluate"):
        return ["--ckpt", missing]
    if command == "export":
        return ["--ckpt", missing, "--out-dir", str(tmp_path / "out")]
    return ["--ckpt", missing, "--data", missing, "--out-dir", str(tmp_path / "out")]


@pytest.mark.parametrize("command", cli.COMMANDS)
@pytest.mark.parametrize("threads", [None, 3])
def test_every_command_hands_its_threads_to_torch_and_restores_them(command, threads, tmp_path, monkeypatch):
    calls = []
    real = torch.set_num_threads
    monkeypatch.setattr(torch, "set_num_threads", lambda n: calls.append(n))
    before = torch.get_num_threads()
    flag = [] if threads is None else ["--threads", str(threads)]
    assert exit_status([command, *flag, *refused_args(command, tmp_path)]) == 2
    monkeypatch.setattr(torch, "set_num_threads", real)
    assert calls == [threads or 1, before]  # the command's, then the caller's again


@pytest.mark.parametrize("command", cli.COMMANDS)
def test_every_command_refuses_threads_below_one(command, tmp_path, capsys):
    assert exit_status([command, "--threads", "0", *refused_args(command, tmp_path)]) == 2
    err = capsys.readouterr().err
    flags = f"python -m transformer_lib {command} --help lists the flags"
    assert err == f"error: --threads must be a positive int, got 0 ({flags})\n"


@pytest.mark.parametrize("command", cli.COMMANDS)
def test_every_help_is_plain_text_and_offers_threads(command, capsys):
    assert exit_status([command, "--help"]) == 0
    out = capsys.readouterr().out
    assert not any(markup in out for markup in (":class:", ":func:", ":mod:", ":data:", "``")), out
    assert "--threads N" in out and "1 is fastest on a busy laptop" in " ".join(out.split())


@pytest.mark.parametrize("command", ["train", "sample", "finetune", "dpo", "grpo"])
def test_the_help_says_the_typical_time_on_a_laptop(command, capsys):
    assert exit_status([command, "--help"]) == 0
    said = " ".join(capsys.readouterr().out.split())
    assert re.search(r"(?i)(typical time|minutes|seconds) on (a laptop|one CPU thread)", said)


def test_dpo_and_grpo_each_have_their_own_description(capsys):
    texts = {}
    for kind in ("dpo", "grpo"):
        assert exit_status([kind, "--help"]) == 0
        texts[kind] = " ".join(capsys.readouterr().out.split())
    assert "DPO" in texts["dpo"] and "chosen" in texts["dpo"] and "GRPO" not in texts["dpo"]
    assert "GRPO" in texts["grpo"] and "mean reward" in texts["grpo"] and "chosen" not in texts["grpo"]
    assert "(default: a tenth of --lr)" in texts["dpo"] and "(default: a tenth of --lr)" in texts["grpo"]


def test_sample_help_prints_each_default_once_and_train_data_names_the_shipped_copy(capsys):
    assert exit_status(["sample", "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "(default: None)" not in out
    for option in re.split(r" (?=--[a-z])", out):
        assert option.count("(default") <= 1, option
    assert exit_status(["train", "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "the copy shipped with the package" in out and "download" in out


@pytest.mark.parametrize("name", PARSERS)
def test_every_flag_is_read_with_underscores_too(name):
    parser = PARSERS[name]()
    assert parser.allow_abbrev is False
    for action in parser._actions:
        for option in action.option_strings:
            if option.startswith("--") and "-" in option[2:]:
                assert parser.dashed([option.replace("-", "_").replace("__", "--", 1)]) == [option]
                assert parser.dashed([option.replace("-", "_").replace("__", "--", 1) + "=1"]) == [option + "=1"]


def test_ecosystem_spellings_set_the_same_settings():
    args = cli_train.build_parser().parse_args(["--learning_rate", "0.5", "--max_steps=7", "--output_dir", "o"])
    assert (args.lr, args.max_iters, args.out_dir) == (0.5, 7, "o")
    args = cli_train.build_parser().parse_args(["--eval_steps", "3", "--logging_steps", "4", "--max_grad_norm", "0.5"])
    assert (args.eval_interval, args.log_interval, args.grad_clip) == (3, 4, 0.5)
    trl = ["--num_generations", "4", "--max_completion_length", "9", "--epsilon", "0.3", "--beta", "0.0",
           "--scale_rewards", "none", "--lora_r", "2"]  # fmt: skip
    args = tune.build_parser("grpo").parse_args(trl)
    assert (args.group_size, args.max_new_tokens, args.clip, args.beta, args.scale, args.lora_rank) == (
        4, 9, 0.3, 0.0, "none", 2)  # fmt: skip
    assert tune.build_parser("dpo").parse_args(["--per_device_train_batch_size", "4"]).batch_size == 4


@pytest.mark.parametrize("spelling", ["--per-device-train-batch-size", "--per_device_train_batch_size"])
def test_grpo_refuses_trls_batch_size_which_counts_answers(spelling, capsys):
    assert exit_status(["grpo", spelling, "16"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ")
    assert "--per-device-train-batch-size counts answers" in err and "--batch-size" in err and "prompts" in err


@pytest.mark.parametrize("command", cli.COMMANDS)
def test_no_flag_is_abbreviated(command, capsys):
    required = {"evaluate": ["--ckpt", "x"], "export": ["--ckpt", "x", "--out-dir", "y"]}.get(command, [])
    assert exit_status([command, "--max-iter", "10", *required]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: unknown flag --max-iter"), err
    assert err.count("\n") == 1


def test_grpo_evaluation_prints_the_mean_reward():
    line = GRPOBatches.eval_line(None, 25, {"train": 0.25, "val": 0.625})
    assert line == "step 25: train reward 0.7500, val reward 0.3750"


def small_model(seed: int, context_len: int = 8) -> tl.GPT:
    torch.manual_seed(seed)
    return tl.GPT(tl.GPTConfig(vocab_size=11, context_len=context_len, n_layers=1, n_heads=2, d_model=16)).eval()


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**16), length=st.integers(1, 12), new=st.integers(0, 14), top_k=st.sampled_from([None, 3]))
def test_generate_tokens_draws_the_tokens_of_generate(seed, length, new, top_k):
    model = small_model(seed)
    idx = torch.randint(0, 11, (1, length), generator=torch.Generator().manual_seed(seed))
    expected = model.generate(idx, new, top_k=top_k, generator=torch.Generator().manual_seed(seed))
    got = list(generate_tokens(model, idx, new, top_k=top_k, generator=torch.Generator().manual_seed(seed)))
    assert got == expected[0, length:].tolist()


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**16), stop=st.integers(0, 10))
def test_generate_tokens_stops_at_the_end_token(seed, stop):
    model = small_model(seed)
    idx = torch.tensor([[1, 2]])
    full = list(generate_tokens(model, idx, 30, generator=torch.Generator().manual_seed(seed)))
    calls = []
    model.register_forward_hook(lambda *a: calls.append(1))
    cut = list(generate_tokens(model, idx, 30, generator=torch.Generator().manual_seed(seed), stop_id=stop))
    expected = full[: full.index(stop) + 1] if stop in full else full
    assert cut == expected and len(calls) == len(cut)  # no step after the end token


@pytest.fixture
def char_run(tmp_path, monkeypatch):
    monkeypatch.setenv(tl.OFFLINE_ENV, "1")
    text = tmp_path / "text.txt"
    text.write_text("to be or not to be, that is the question\n" * 40)
    assert cli.main(["train", *TINY, "--data", str(text), "--out-dir", str(tmp_path / "run"), "--max-iters", "2"]) == 0
    return tmp_path / "run"


def test_ctrl_c_during_sample_prints_the_text_so_far_then_one_line(char_run, capsys, monkeypatch):
    real, calls = tl.GPT.forward, []

    def forward(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 5:  # the fifth step: four tokens drawn
            raise KeyboardInterrupt
        return real(self, *args, **kwargs)

    monkeypatch.setattr(tl.GPT, "forward", forward)
    capsys.readouterr()
    assert cli.main(["sample", "--ckpt", str(char_run), "--prompt", "to be", "--max-new-tokens", "50"]) == 130
    out, err = capsys.readouterr()
    assert err == "interrupted (Ctrl-C)\n"
    assert out.startswith("to be") and len(out) == len("to be") + 4 + 1  # the prompt, four tokens, a newline


def test_a_latent_shape_the_user_cannot_see_is_refused_by_the_flags_that_made_it(tmp_path, capsys):
    out = tmp_path / "new" / "run"
    args = ["train", "--attention", "latent", "--positions", "rotary", "--n-heads", "8", "--d-model", "16",
            "--out-dir", str(out), "--max-iters", "1"]  # fmt: skip
    assert exit_status(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--d-model 16" in err and "--n-heads 8" in err, err
    assert "raise --d-model to at least 32" in err and "lower --n-heads to at most 4" in err
    assert not (tmp_path / "new").exists()


@pytest.mark.parametrize("command", ["finetune", "dpo", "grpo"])
def test_a_refused_tuning_run_leaves_no_folder_it_made(command, char_run, tmp_path, capsys):
    pairs = tmp_path / "pairs.jsonl"
    line = '{"prompt": "a", "chosen": "b", "rejected": "c"}' if command == "dpo" else '{"prompt": "a", "response": "b"}'
    pairs.write_text((line + "\n") * 4)
    out = tmp_path / "fresh" / "deeper"
    assert exit_status([command, "--ckpt", str(char_run), "--data", str(pairs), "--out-dir", str(out)]) == 2
    assert "no end token" in capsys.readouterr().err  # refused inside the folder: a character run's tokenizer
    assert not (tmp_path / "fresh").exists()
    existing = tmp_path / "kept"
    existing.mkdir()
    assert exit_status([command, "--ckpt", str(char_run), "--data", str(pairs), "--out-dir", str(existing)]) == 2
    assert existing.is_dir()  # a folder the call did not make stays


def test_the_first_evaluation_runs_before_the_progress_bar_starts(monkeypatch, capsys):
    import importlib

    import tqdm

    train_module = importlib.import_module("transformer_lib.train")  # the module, not the function of its name

    events = []
    real_estimate, real_init = train_module.estimate_loss, tqdm.tqdm.__init__

    def estimate(*args, **kwargs):
        events.append("evaluation")
        return real_estimate(*args, **kwargs)

    def init(self, *args, **kwargs):
        events.append("bar")
        real_init(self, *args, **kwargs)

    monkeypatch.setattr(train_module, "estimate_loss", estimate)
    monkeypatch.setattr(tqdm.tqdm, "__init__", init)
    tokens = torch.arange(200) % 7
    batches = tl.LMBatches(tokens[:150], tokens[150:], 8, 2, seed=0)
    model = tl.GPT(tl.GPTConfig(vocab_size=7, context_len=8, n_layers=1, n_heads=1, d_model=8))
    config = tl.TrainConfig(max_iters=4, eval_interval=2, eval_iters=3, batch_size=2, device="cpu", progress=True)
    tl.train(model, batches, config)
    assert events == ["evaluation", "bar", "evaluation", "evaluation"]
    out = capsys.readouterr().out
    assert out.index("evaluating the starting model on 6 training and 6 validation rows...") < out.index("step 0:")

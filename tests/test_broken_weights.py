"""Broken weights, table by table: the usual broken downloads (a Git LFS pointer, an empty or
half-copied file, a config.json with a syntax error or without n_head) and models holding NaN are
one clear error naming the file (or the tensor) and the cause, and never suggest unsafe loading."""

import json

import pytest
import torch

import transformer_lib as tl
from transformer_lib import cli

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_thread")

SIZES = dict(n_layer=1, n_head=2, n_embd=8, vocab_size=11, n_positions=16, bos_token_id=0, eos_token_id=0)
LFS = b"version https://git-lfs.github.com/spec/v1\noid sha256:4b0f\nsize 548105171\n"


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gpt2") / "tiny"
    torch.manual_seed(0)
    transformers.GPT2LMHeadModel(transformers.GPT2Config(**SIZES)).save_pretrained(folder)
    return folder


def nanogpt_file(folder, hf_folder):
    hf = transformers.GPT2LMHeadModel.from_pretrained(hf_folder)
    conv = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
    state = {k: (v.t().contiguous() if k.endswith(conv) else v.clone()) for k, v in hf.state_dict().items()}
    args = dict(n_layer=1, n_head=2, n_embd=8, block_size=16, bias=True, vocab_size=11, dropout=0.0)
    torch.save({"model": state, "model_args": args}, folder / "ckpt.pt")
    return folder / "ckpt.pt"


def copy_of(hf_folder, tmp_path):
    folder = tmp_path / "copy"
    folder.mkdir()
    for f in hf_folder.iterdir():
        (folder / f.name).write_bytes(f.read_bytes())
    return folder


def edit_config(change):
    def apply(folder):
        config = json.loads((folder / "config.json").read_text())
        change(config)
        (folder / "config.json").write_text(json.dumps(config))

    return apply


def half(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


# (how the downloaded folder is broken, the file the message names, words of the message)
HF_CASES = {
    "a Git LFS pointer": (lambda f: (f / "model.safetensors").write_bytes(LFS), "model.safetensors", "git lfs pull"),
    "an empty file": (lambda f: (f / "model.safetensors").write_bytes(b""), "model.safetensors", "empty"),
    "half copied": (lambda f: half(f / "model.safetensors"), "model.safetensors", "truncated or damaged"),
    "config.json with a syntax error": (
        lambda f: (f / "config.json").write_text('{"n_layer": 1,'),
        "config.json",
        "not valid JSON",
    ),
    "config.json without n_head": (edit_config(lambda c: c.pop("n_head")), "", "lacks n_head"),
}


@pytest.mark.parametrize("case", HF_CASES)
def test_a_broken_hugging_face_download_is_one_clear_error(case, hf_folder, tmp_path):
    break_it, file, word = HF_CASES[case]
    folder = copy_of(hf_folder, tmp_path)
    break_it(folder)
    with pytest.raises(ValueError, match=word) as error:
        tl.gpt_from_hf(folder)
    assert str(folder / file) in str(error.value) and "weights_only=False" not in str(error.value)


def test_without_n_head_the_given_n_heads_is_used(hf_folder, tmp_path):
    folder = copy_of(hf_folder, tmp_path)
    edit_config(lambda c: c.pop("n_head"))(folder)
    assert tl.gpt_from_hf(folder, n_heads=2).config.n_heads == 2


class Unsafe:
    pass


# (how nanoGPT's ckpt.pt is broken, words of the message)
NANOGPT_CASES = {
    "a Git LFS pointer": (lambda p: p.write_bytes(LFS), "git lfs pull"),
    "an empty file": (lambda p: p.write_bytes(b""), "empty"),
    "half copied": (half, "truncated or damaged"),
    "a pickle of a class": (lambda p: torch.save({"model": {}, "model_args": Unsafe()}, p), "could run code"),
}


@pytest.mark.parametrize("case", NANOGPT_CASES)
def test_a_broken_nanogpt_checkpoint_is_one_clear_error(case, hf_folder, tmp_path):
    break_it, word = NANOGPT_CASES[case]
    path = nanogpt_file(tmp_path, hf_folder)
    tl.gpt_from_nanogpt(path)  # sound before it is broken
    break_it(path)
    with pytest.raises(ValueError, match=word) as error:
        tl.gpt_from_nanogpt(path)
    assert str(path) in str(error.value) and "weights_only" not in str(error.value)


# ---- models holding NaN ----


def with_nan(state, key):
    state = {k: v.clone() for k, v in state.items()}
    state[key][0] = float("nan")
    return state


@pytest.mark.parametrize("loader", ["hf", "nanogpt"])
def test_the_loaders_refuse_nan_weights_naming_the_tensor(loader, hf_folder, tmp_path):
    hf = transformers.GPT2LMHeadModel.from_pretrained(hf_folder)
    if loader == "hf":
        with pytest.raises(ValueError, match="h.0.mlp.c_fc.weight holds values that are not finite"):
            tl.gpt_from_hf(with_nan(hf.state_dict(), "transformer.h.0.mlp.c_fc.weight"), n_heads=2)
    else:
        ckpt = torch.load(nanogpt_file(tmp_path, hf_folder), weights_only=True)
        ckpt["model"] = with_nan(ckpt["model"], "transformer.wpe.weight")
        with pytest.raises(ValueError, match="wpe.weight holds values that are not finite"):
            tl.gpt_from_nanogpt(ckpt)


@pytest.mark.parametrize("use_cache", [True, False])
def test_generating_from_a_nan_model_says_the_outputs_are_not_finite(use_cache):
    model = tl.GPT(tl.GPTConfig(vocab_size=7, context_len=8, n_layers=1, n_heads=1, d_model=8)).eval()
    with torch.no_grad():
        model.lm_head.weight.fill_(float("nan"))
    with pytest.raises(FloatingPointError, match=r"outputs \(logits\) are not finite"):
        model.generate(torch.zeros(1, 2, dtype=torch.long), 3, use_cache=use_cache)


def test_sampling_from_a_nan_checkpoint_is_one_line_naming_the_file(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv(tl.OFFLINE_ENV, "1")
    text = tmp_path / "text.txt"
    text.write_text("to be or not to be\n" * 40)
    out = tmp_path / "run"
    assert cli.main(["train", "--n-layers", "1", "--n-heads", "1", "--d-model", "8", "--context-len", "8",
                     "--batch-size", "2", "--eval-iters", "1", "--max-iters", "2", "--device", "cpu", "--no-progress",
                     "--data", str(text), "--out-dir", str(out)]) == 0  # fmt: skip
    ckpt = tl.read_checkpoint(out)
    ckpt["model"]["lm_head.weight"][0, 0] = float("nan")
    ckpt.pop("checksum")
    tl.checkpoint.save_checkpoint(ckpt, out / "ckpt.pt")  # as a damaged run of another version might have
    capsys.readouterr()
    assert cli.main(["sample", "--ckpt", str(out), "--device", "cpu", "--max-new-tokens", "3"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(out / "ckpt.pt") in err and "not finite" in err
    assert "tok_embed.weight" in err or "lm_head.weight" in err  # one tensor, tied

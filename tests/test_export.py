"""Tests for transformer_lib/export.py and the export command: runs trained for two steps by the
command line (GPT-2-style and Llama-style, character and BPE tokens, a LoRA fine-tuning) are
written in Hugging Face's format and loaded back by ``transformers`` offline, with the same logits,
token ids, text and greedy continuation; LoRA adapters go to peft's format and come back from it.
Offline, tiny models, so they are fast."""

import json

import pytest
import torch

import transformer_lib as tl
from tests.test_cli import offline_one_thread  # noqa: F401 (autouse: offline, one thread)
from transformer_lib import cli

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

SHAPE = ("--n-layers 2 --n-heads 2 --d-model 16 --context-len 24 --batch-size 4 --eval-interval 2 --eval-iters 1 "
         "--device cpu --no-progress --max-iters 2").split()  # fmt: skip
FINETUNE = "--batch-size 4 --eval-interval 2 --eval-iters 1 --device cpu --no-progress --max-iters 4".split()
TEXT = "ROMEO: But soft, what light through yonder window breaks?\nJULIET: Ay me!\n" * 30
BPE = ["--tokenizer", "bpe", "--vocab-size", "300"]
RUNS = {  # name: the train command's flags
    "gpt2-char": ["--preset", "cpu"],
    "gpt2-bpe": ["--preset", "cpu", *BPE],
    "llama-char": ["--preset", "llama-cpu"],
    "llama-bpe": ["--preset", "llama-cpu", *BPE, "--n-kv-heads", "1"],
}
PROMPT = "ROMEO: But"
ATOL = 1e-5  # float32; transformers computes Llama's norms and angles in float32


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Each run of RUNS, and a LoRA fine-tuning of each BPE one, written by the commands: their folders."""
    folder = tmp_path_factory.mktemp("runs")
    (folder / "text.txt").write_text(TEXT)
    for name, flags in RUNS.items():
        assert (
            cli.main(["train", *flags, *SHAPE, "--data", str(folder / "text.txt"), "--out-dir", str(folder / name)])
            == 0
        )
    pairs = tl.write_pairs([(w, w[::-1]) for w in ("soft", "light", "window", "yonder")] * 2, folder / "pairs.jsonl")
    for name in ("gpt2-bpe", "llama-bpe"):
        out = str(folder / f"{name}-lora")
        args = ["finetune", "--ckpt", str(folder / name), "--data", str(pairs), "--out-dir", out,
                "--lora-rank", "2", "--lr", "0.05", "--warmup-iters", "0", *FINETUNE]  # fmt: skip
        assert cli.main(args) == 0
    return folder


def book_logits(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids]))[0]


def hf_logits(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids])).logits


@pytest.mark.parametrize("name", RUNS)
def test_an_exported_run_loads_in_transformers_with_equal_logits_ids_and_greedy_text(name, runs, tmp_path):
    files = tl.export_hf(runs / name, tmp_path / "hf")
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= {f.name for f in files}
    model, tokenizer, _ = tl.load_run(runs / name)
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    hf_tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    assert type(hf).__name__ == ("LlamaForCausalLM" if name.startswith("llama") else "GPT2LMHeadModel")
    ids = tokenizer.encode(PROMPT)
    assert hf_tok(PROMPT)["input_ids"] == ids and hf_tok.decode(ids) == tokenizer.decode(ids) == PROMPT
    assert (hf_logits(hf, ids) - book_logits(model, ids)).abs().max() < ATOL
    # the end token: the tokenizer's, or none for characters (never id 2, "!" of a character vocabulary)
    assert hf.config.eos_token_id == hf.generation_config.eos_token_id == tokenizer.eos_id == hf_tok.eos_token_id
    assert (tokenizer.eos_id is None) == name.endswith("char")
    ours = model.generate(torch.tensor([ids]), 10, top_k=1)[0].tolist()
    theirs = hf.generate(torch.tensor([ids]), max_new_tokens=10, do_sample=False, eos_token_id=None,
                         pad_token_id=0)[0].tolist()  # fmt: skip
    assert theirs == ours and hf_tok.decode(theirs) == tokenizer.decode(ours)


def test_the_bpe_tokenizer_reads_any_text_as_the_book_does(runs):
    _, tokenizer, _ = tl.load_run(runs / "gpt2-bpe")
    hf_tok = tl.hf_tokenizer(tokenizer)
    for text in ["", " leading", "trailing  ", "tabs\tand\nnewlines\n\n", "caf\u00e9 na\u00efve \u2014 \U0001f600",
                 "it's 2024, they'll've 12345 ...!?", "JULIET: Ay me!\n" * 3]:  # fmt: skip
        ids = tokenizer.encode(text)
        assert hf_tok(text)["input_ids"] == ids, text
        assert hf_tok.decode(ids) == text
    assert hf_tok.eos_token == "<|endoftext|>" and hf_tok.eos_token_id == tokenizer.eos_id == 299


def test_a_lora_run_is_merged_on_request_and_refused_otherwise(runs, tmp_path):
    with pytest.raises(ValueError, match="LoRA run: export it with --merge-adapter"):
        tl.export_hf(runs / "gpt2-bpe-lora", tmp_path / "hf")
    assert not (tmp_path / "hf").exists()
    tl.export_hf(runs / "gpt2-bpe-lora", tmp_path / "hf", merge_adapter=True)
    model, tokenizer, adapters = tl.load_run(runs / "gpt2-bpe-lora")
    assert adapters and any(lora.B.abs().max() > 0 for lora in adapters.values())
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    ids = tokenizer.encode(PROMPT)
    assert (hf_logits(hf, ids) - book_logits(model, ids)).abs().max() < ATOL
    with pytest.raises(ValueError, match="no LoRA adapters"):
        tl.export_hf(runs / "gpt2-bpe", tmp_path / "other", merge_adapter=True)


@pytest.mark.parametrize("name", ["llama-bpe-lora", "gpt2-bpe-lora"])
def test_a_lora_run_goes_to_peft_and_back_with_equal_logits(name, runs, tmp_path):
    tl.export_hf(runs / name, tmp_path / "hf", peft_adapter=True)
    model, tokenizer, adapters = tl.load_run(runs / name)
    ids = tokenizer.encode(PROMPT)
    base = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    adapted = peft.PeftModel.from_pretrained(base, tmp_path / "hf" / "adapter")
    assert (hf_logits(adapted, ids) - book_logits(model, ids)).abs().max() < ATOL
    tl.remove_lora(model, merge=False)  # the base alone
    assert (hf_logits(adapted, ids) - book_logits(model, ids)).abs().max() > 1e-3  # the adapters matter
    names = tl.load_peft_adapter(model, tmp_path / "hf" / "adapter")
    assert sorted(names) == sorted(adapters)
    assert (hf_logits(adapted, ids) - book_logits(model, ids)).abs().max() < ATOL


def test_peft_adapters_with_their_own_q_k_v_matrices_become_one_exact_fused_adapter(runs, tmp_path):
    model, tokenizer, _ = tl.load_run(runs / "llama-bpe")
    llama = tl.hf_model(model)
    config = peft.LoraConfig(r=2, lora_alpha=3, target_modules=["q_proj", "v_proj", "o_proj", "down_proj"],
                             init_lora_weights=False)  # fmt: skip
    adapted = peft.get_peft_model(llama, config)
    adapted.save_pretrained(tmp_path / "adapter")
    names = tl.load_peft_adapter(model, tmp_path / "adapter")
    fused = tl.lora_weights(model)["decoder.layers.0.self_attn.in_proj_weight"]
    assert fused.rank == 4 and fused.scale == pytest.approx(1.5)  # q and v: rank 2 + 2, alpha 3 + 3
    assert len(names) == 3 * 2
    ids = tokenizer.encode(PROMPT)
    assert (hf_logits(adapted, ids) - book_logits(model, ids)).abs().max() < ATOL


def test_an_adapter_on_a_module_the_book_does_not_adapt_is_refused_by_name(runs, tmp_path):
    model, _, _ = tl.load_run(runs / "llama-bpe")
    adapted = peft.get_peft_model(tl.hf_model(model), peft.LoraConfig(r=2, target_modules=["lm_head", "q_proj"]))
    adapted.save_pretrained(tmp_path / "adapter")
    with pytest.raises(ValueError, match="lm_head|embed_tokens"):
        tl.load_peft_adapter(model, tmp_path / "adapter")
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    (tmp_path / "adapter" / "adapter_config.json").write_text(json.dumps({**config, "use_dora": True}))
    with pytest.raises(ValueError, match="use_dora"):
        tl.load_peft_adapter(model, tmp_path / "adapter")


def test_a_folder_with_files_is_refused_and_force_keeps_the_users_other_files(runs, tmp_path, capsys):
    out = tmp_path / "hf"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    assert cli.main(["export", "--ckpt", str(runs / "gpt2-bpe"), "--out-dir", str(out)]) == 2
    assert "not empty (notes.txt)" in capsys.readouterr().err and sorted(p.name for p in out.iterdir()) == ["notes.txt"]
    assert cli.main(["export", "--ckpt", str(runs / "gpt2-bpe"), "--out-dir", str(out), "--force"]) == 0
    assert (out / "notes.txt").read_text() == "mine" and (out / "model.safetensors").is_file()
    assert "AutoModelForCausalLM" in capsys.readouterr().out
    assert [p.name for p in tmp_path.iterdir()] == ["hf"]  # no temporary folder left beside it


def test_the_export_command_refuses_a_lora_run_in_one_line_and_writes_an_adapter_on_request(runs, tmp_path, capsys):
    assert cli.main(["export", "--ckpt", str(runs / "llama-bpe-lora"), "--out-dir", str(tmp_path / "a")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--merge-adapter" in err and not (tmp_path / "a").exists()
    assert cli.main(["export", "--ckpt", str(runs / "llama-bpe-lora"), "--out-dir", str(tmp_path / "b"),
                     "--peft-adapter"]) == 0  # fmt: skip
    assert (tmp_path / "b" / "adapter" / "adapter_model.safetensors").is_file()

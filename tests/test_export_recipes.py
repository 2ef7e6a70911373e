"""Every recipe of the book through ``hf_model``: written with ``save_pretrained`` and read back by
``AutoModelForCausalLM`` it computes the GPT's logits (float32, 1e-5), or it is refused with a
``ValueError`` that names a setting the recipe changes. No recipe is converted into a model that
computes something else. Each converter names every setting of the config (check_settings), and the
converters refuse a layer or model of another class with a ``TypeError`` naming both classes."""

import dataclasses

import pytest
import torch

import transformer_lib as tl
from tests.test_cli import offline_one_thread  # noqa: F401 (autouse: offline, one thread)
from tests.test_recipes_compose import RECIPES, TOKENIZER, batches, ids, make, settings
from transformer_lib import cli
from transformer_lib.export import GPT2_SETTINGS, gpt2_from_gpt
from transformer_lib.pretrained_experts import MIXTRAL_SETTINGS
from transformer_lib.pretrained_gpt_oss import GPT_OSS_SETTINGS, gpt_oss_from_gpt
from transformer_lib.pretrained_latent import DEEPSEEK_V3_SETTINGS, deepseek_v3_from_gpt
from transformer_lib.pretrained_llama import LLAMA_SETTINGS, SETTINGS, check_settings, missing_settings
from transformer_lib.pretrained_qwen3_next import QWEN3_NEXT_SETTINGS, qwen3_next_from_gpt

transformers = pytest.importorskip("transformers")

ATOL = 1e-5
TABLES = {
    "GPT-2": GPT2_SETTINGS,
    "Llama": LLAMA_SETTINGS,
    "Mixtral": MIXTRAL_SETTINGS,
    "DeepSeek-V3": DEEPSEEK_V3_SETTINGS,
    "gpt-oss": GPT_OSS_SETTINGS,
    "Qwen3-Next": QWEN3_NEXT_SETTINGS,
}


def changed_settings(config: tl.GPTConfig) -> set[str]:
    """The names of the settings ``config`` sets away from GPT-2's block, the options of its specs too."""
    names = set(config.recipe.changes())
    for spec_name in ("experts", "rope_scaling"):
        spec = getattr(config, spec_name)  # the flat alias: the spec or None
        if spec is not None:
            names |= {f.name for f in dataclasses.fields(spec)}
    names |= {name for name in ("n_kv_heads", "window") if getattr(config, name) not in (None, config.n_heads)}
    return names


def written_and_read(hf, folder):
    hf.save_pretrained(folder)
    return transformers.AutoModelForCausalLM.from_pretrained(folder).eval()


@pytest.mark.parametrize("name", list(RECIPES))
def test_every_recipe_is_exported_with_equal_logits_or_refused_by_name(name, tmp_path):
    gpt = make(RECIPES[name], dtype=torch.float32).eval()
    try:
        hf = tl.hf_model(gpt)
    except ValueError as refusal:
        named = [s for s in changed_settings(gpt.config) if f"{s}=" in str(refusal)]
        assert named, f"{name}: the refusal names no setting the recipe changes: {refusal}"
        return
    loaded = written_and_read(hf, tmp_path)
    with torch.no_grad():
        difference = (loaded(ids()).logits - gpt(ids())[0]).abs().max().item()
    assert difference < ATOL, f"{name}: {type(loaded).__name__} differs from the GPT by {difference}"


# Recipes a format writes: the book's named ones, chapter "Latent, sparse and sink attention"'s latent attention with
# the eps that DeepSeek-V3's latent norms keep (1e-6), with a full query projection and with a query latent, its
# sinks with a window, grouped-query attention and an untied head (gpt-oss), Llama's block with a
# window (gpt-oss without sinks), and chapter "Attention as a recurrence"'s hybrid with query-key norms (Qwen3-Next)
EXPORTED = {name: RECIPES[name] for name in ("gpt2", "llama", "experts", "rope-yarn", "sinks")} | {
    "sinks-window-gqa-untied": {"recipe": "sinks", "window": 4, "n_kv_heads": 1, "tie_embeddings": False},
    "llama-window": {"recipe": "llama", "window": 4},
    "hybrid-qk-norm": {"recipe": "gated_delta", "full_every": 2, "qk_norm": True},
    "hybrid-qk-norm-untied-eps": {
        "recipe": "gated_delta",
        "full_every": 2,
        "qk_norm": True,
        "tie_embeddings": False,
        "norm_eps": 1e-6,
        "rotary_base": 500.0,
    },
    "latent-eps-1e-6": {"recipe": "latent", "norm_eps": 1e-6},
    "latent-query-latent-eps-1e-6": {
        "recipe": "latent",
        "kv_latent": 8,
        "q_latent": 12,
        "rope_dim": 2,
        "norm_eps": 1e-6,
        "tie_embeddings": False,
    },
}


@pytest.mark.parametrize("name", list(EXPORTED))
def test_a_written_recipe_computes_the_gpts_logits_and_depends_on_its_weights(name, tmp_path):
    """Equal logits after save_pretrained and from_pretrained; the same model with one changed weight differs."""
    gpt = make(EXPORTED[name], dtype=torch.float32).eval()
    loaded = written_and_read(tl.hf_model(gpt), tmp_path)
    with torch.no_grad():
        assert (loaded(ids()).logits - gpt(ids())[0]).abs().max().item() < ATOL
        gpt.decoder.norm.weight[0] += 1.0
        assert (loaded(ids()).logits - gpt(ids())[0]).abs().max().item() > 1e-3


def test_latent_attention_with_another_eps_is_refused_naming_deepseeks_latent_norms():
    with pytest.raises(ValueError, match="needs norm_eps=1e-06, the GPT has norm_eps=1e-05: DeepSeek-V3 normalises"):
        deepseek_v3_from_gpt(make(RECIPES["latent"], dtype=torch.float32))


@pytest.mark.parametrize("family", list(TABLES))
def test_each_format_names_every_setting(family):
    assert missing_settings(TABLES[family]) == []
    assert set(TABLES[family]) == set(SETTINGS)


def test_a_table_that_leaves_a_setting_out_is_an_error():
    config = make({}).config
    with pytest.raises(RuntimeError, match="'sinks'"):
        check_settings(config, {k: v for k, v in GPT2_SETTINGS.items() if k != "sinks"}, "GPT-2's format")


@pytest.mark.parametrize(
    "choices, setting",
    [
        ({"sinks": True}, "norm"),
        ({"recipe": "sinks", "window": 4, "keep_first": 2}, "keep_first"),
        ({"recipe": "sinks", "qk_norm": True}, "qk_norm"),
        ({"recipe": "gated_delta", "full_every": 2}, "qk_norm"),
        ({"recipe": "llama", "attention": "delta"}, "attention"),
        ({"recipe": "llama", "attention": "linear"}, "attention"),
        ({"recipe": "sparse", "sparse_k": 4}, "attention"),
        ({"attention": "sparse", "sparse_k": 4}, "attention"),
        ({"recipe": "latent", "bias": True, "norm_eps": 1e-6}, "bias"),
        ({"recipe": "gated_delta"}, "full_every"),
        ({"window": 4, "keep_first": 2}, "window"),
        ({"recipe": "llama", "qk_norm": True}, "qk_norm"),
        ({"n_kv_heads": 1}, "n_kv_heads"),
        ({"rope_scaling": {"kind": "linear", "factor": 2.0}, "positions": "rotary"}, "norm"),
    ],
)
def test_a_setting_no_format_writes_is_named(choices, setting):
    gpt = make(choices, dtype=torch.float32)
    with pytest.raises(ValueError, match=f"needs {setting}="):
        tl.hf_model(gpt)


def test_the_export_command_refuses_a_recurrent_run_in_one_line(tmp_path, capsys):
    gpt = make(RECIPES["gated-delta"], dtype=torch.float32)
    tl.train(gpt, batches(), settings(tmp_path / "run", max_iters=1), tokenizer=TOKENIZER)
    code = cli.main(["export", "--ckpt", str(tmp_path / "run"), "--out-dir", str(tmp_path / "hf")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "attention=" in err and "Traceback" not in err
    assert not (tmp_path / "hf").exists() or not any((tmp_path / "hf").iterdir())


def test_converters_refuse_another_class_naming_both():
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=20, n_positions=8))
    llama = LlamaForCausalLM(
        LlamaConfig(num_hidden_layers=1, hidden_size=16, num_attention_heads=2, vocab_size=20, intermediate_size=32)
    )
    classifier = tl.GPTClassifier(make({}), 2)
    cases = [
        (gpt2_from_gpt, gpt2, "gpt2_from_gpt takes a GPT, got a GPT2LMHeadModel"),
        (gpt2_from_gpt, classifier, r"got a GPTClassifier \(convert its \.gpt"),
        (tl.hf_model, gpt2, "hf_model takes a GPT, got a GPT2LMHeadModel"),
        (tl.hf_model, classifier, r"hf_model takes a GPT, got a GPTClassifier"),
        (tl.gpt_from_llama, gpt2, "takes a transformers LlamaForCausalLM .* got GPT2LMHeadModel"),
        (tl.gpt_from_llama, llama.model.layers[0], "LlamaForCausalLM .* got LlamaDecoderLayer"),
        (tl.gpt_from_hf, llama, "takes a transformers GPT2LMHeadModel or GPT2Model, got LlamaForCausalLM"),
        (tl.llama_from_gpt, gpt2, "llama_from_gpt takes a GPT, got a GPT2LMHeadModel"),
        (tl.mixtral_from_gpt, llama, "mixtral_from_gpt takes a GPT, got a LlamaForCausalLM"),
        (deepseek_v3_from_gpt, llama, "deepseek_v3_from_gpt takes a GPT, got a LlamaForCausalLM"),
        (gpt_oss_from_gpt, llama, "gpt_oss_from_gpt takes a GPT, got a LlamaForCausalLM"),
        (qwen3_next_from_gpt, classifier, r"qwen3_next_from_gpt takes a GPT, got a GPTClassifier \(convert its \.gpt"),
    ]
    for convert, given, message in cases:
        with pytest.raises(TypeError, match=message):
            convert(given)

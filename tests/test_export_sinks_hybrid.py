"""Chapter "Latent, sparse and sink attention"'s sinks written as gpt-oss and chapter "Attention as a recurrence"'s
hybrid as Qwen3-Next: with every weight drawn at random (sinks and norms included, which the recipes start at 0 and 1),
the model read back by ``AutoModelForCausalLM`` computes the GPT's logits (float32, 1e-5), each weight that only these
formats hold reaches the logits, and the settings that make them exact are the ones written."""

import pytest
import torch

import transformer_lib as tl
from tests.test_cli import offline_one_thread  # noqa: F401 (autouse: offline, one thread)
from tests.test_recipes_compose import TOKENIZER, batches, ids, make, settings
from transformer_lib import cli
from transformer_lib.pretrained_gpt_oss import gpt_oss_from_gpt
from transformer_lib.pretrained_qwen3_next import qwen3_next_from_gpt

transformers = pytest.importorskip("transformers")

ATOL = 1e-5
SINKS = {"recipe": "sinks", "window": 4, "n_kv_heads": 1, "tie_embeddings": False}
HYBRID = {"recipe": "gated_delta", "full_every": 2, "qk_norm": True, "n_layers": 4}
YARN = {"kind": "yarn", "factor": 2.0, "original_context": 8}
# each with biases, and with YaRN's rescaled rotary positions (built at 16 positions, trained at 8)
SINKS_MORE = {**SINKS, "bias": True, "rope_scaling": YARN}
HYBRID_MORE = {**HYBRID, "rope_scaling": YARN, "n_layers": 2}


def randomised(choices, seed=0):
    """The recipe's GPT in float32 with every parameter moved by a seeded random amount."""
    choices = dict(choices)
    n_layers = choices.pop("n_layers", 2)
    torch.manual_seed(seed)
    gpt = tl.GPT(tl.GPTConfig(make({}).config.vocab_size, 16, n_layers, 2, 16, **choices)).float().eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in gpt.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=g))
    return gpt


def read_back(hf, folder):
    hf.save_pretrained(folder)
    return transformers.AutoModelForCausalLM.from_pretrained(folder).eval()


def difference(loaded, gpt):
    with torch.no_grad():
        return (loaded(ids()).logits - gpt(ids())[0]).abs().max().item()


@pytest.mark.parametrize("choices", [SINKS, SINKS_MORE], ids=["sinks", "biases-yarn"])
@pytest.mark.parametrize("seed", [0, 1])
def test_sinks_as_gpt_oss_compute_the_gpts_logits_and_read_each_sink(choices, seed, tmp_path):
    gpt = randomised(choices, seed)
    loaded = read_back(tl.hf_model(gpt), tmp_path)
    assert type(loaded).__name__ == "GptOssForCausalLM"
    assert difference(loaded, gpt) < ATOL
    with torch.no_grad():
        gpt.decoder.layers[1].self_attn.sinks[0] += 2.0  # a sink reaches the logits
    assert difference(loaded, gpt) > 1e-3


def test_gpt_oss_settings_make_one_plain_swiglu_expert(tmp_path):
    gpt = randomised(SINKS)
    loaded = read_back(gpt_oss_from_gpt(gpt), tmp_path)
    c = loaded.config
    assert (c.num_local_experts, c.num_experts_per_tok, c.swiglu_alpha) == (1, 1, 1.0)
    assert c.swiglu_limit == torch.finfo(torch.float32).max
    assert c.layer_types == ["sliding_attention"] * 2 and c.sliding_window == 4
    assert c.rope_parameters["rope_type"] == "default" and not c.attention_bias
    x = torch.randn(5, 16, generator=torch.Generator().manual_seed(0))
    _, scores, chosen = loaded.model.layers[0].mlp.router(x)
    assert torch.equal(scores, torch.ones(5, 1)) and torch.equal(chosen, torch.zeros(5, 1, dtype=chosen.dtype))


def test_a_gpt_without_sinks_is_written_with_sinks_that_take_nothing():
    hf = gpt_oss_from_gpt(randomised({"recipe": "llama", "window": 4}))
    assert torch.equal(hf.model.layers[0].self_attn.sinks, torch.full((2,), -torch.inf))


def test_a_bias_reaches_gpt_oss(tmp_path):
    gpt = randomised(SINKS_MORE)
    loaded = read_back(gpt_oss_from_gpt(gpt), tmp_path)
    assert loaded.config.attention_bias and loaded.config.rope_parameters["rope_type"] == "yarn"
    with torch.no_grad():
        gpt.decoder.layers[0].ff.up_proj.bias[3] += 1.0
    assert difference(loaded, gpt) > 1e-4


@pytest.mark.parametrize("choices", [HYBRID, HYBRID_MORE], ids=["hybrid", "yarn"])
@pytest.mark.parametrize("seed", [0, 1])
def test_the_hybrid_as_qwen3_next_computes_the_gpts_logits_and_reads_each_norm(choices, seed, tmp_path):
    gpt = randomised(choices, seed)
    loaded = read_back(tl.hf_model(gpt), tmp_path)
    n = gpt.config.n_layers
    assert type(loaded).__name__ == "Qwen3NextForCausalLM"
    assert loaded.config.layer_types == ["linear_attention", "full_attention"] * (n // 2)
    # transformers' gated DeltaNet runs its recurrence in float32 whatever the model's dtype: with the
    # reference decay (a state kept ~0.93 per token) its rounding adds up over the tokens, 1.4e-5 here
    assert difference(loaded, gpt) < 2 * ATOL
    with torch.no_grad():
        gpt.decoder.layers[n - 1].self_attn.qk_transform.k_norm.weight[1] += 1.0  # a full layer's key norm
    assert difference(loaded, gpt) > 1e-4
    with torch.no_grad():
        gpt.decoder.layers[n - 1].self_attn.qk_transform.k_norm.weight[1] -= 1.0
        gpt.decoder.layers[0].self_attn.log_rate[0] += 1.0  # a DeltaNet layer's decay rate
    assert difference(loaded, gpt) > 1e-4


def test_qwen3_next_settings_keep_every_mlp_dense_and_rotate_every_dimension():
    hf = qwen3_next_from_gpt(randomised(HYBRID))
    c = hf.config
    assert c.mlp_only_layers == [0, 1, 2, 3] and c.rope_parameters["partial_rotary_factor"] == 1.0
    assert all(type(layer.mlp).__name__ == "Qwen3NextMLP" for layer in hf.model.layers)
    gate = hf.model.layers[1].self_attn.q_proj.weight.view(2, 2, 8, 16)[:, 1]  # each head's gate rows
    assert torch.equal(gate, torch.zeros_like(gate))


@pytest.mark.parametrize(
    "convert, choices, message",
    [
        (gpt_oss_from_gpt, {"recipe": "sinks", "window": 4, "keep_first": 2}, "gpt-oss's format needs keep_first=0"),
        (gpt_oss_from_gpt, {"recipe": "sinks", "qk_norm": True}, "gpt-oss's format needs qk_norm=False"),
        (
            qwen3_next_from_gpt,
            {"recipe": "gated_delta", "full_every": 2, "qk_norm": True, "bias": True},
            "needs bias=False",
        ),
        (gpt_oss_from_gpt, {"recipe": "gated_delta", "full_every": 2}, "gpt-oss's format needs attention='multi_head'"),
        (qwen3_next_from_gpt, {"recipe": "gated_delta", "full_every": 2}, "Qwen3-Next's format needs qk_norm=True"),
        (qwen3_next_from_gpt, {"recipe": "gated_delta"}, "Qwen3-Next's format needs full_every=N with N > 0"),
        (qwen3_next_from_gpt, {"recipe": "llama", "attention": "delta", "full_every": 2}, "needs attention="),
        (qwen3_next_from_gpt, {"recipe": "sinks"}, "Qwen3-Next's format needs attention='gated_delta'"),
    ],
)
def test_each_new_format_refuses_by_name(convert, choices, message):
    with pytest.raises(ValueError, match=message):
        convert(make(choices, dtype=torch.float32))


@pytest.mark.parametrize("choices", [SINKS_MORE, HYBRID], ids=["sinks", "hybrid"])
def test_transformers_greedy_decoding_with_its_cache_gives_the_books_tokens(choices, tmp_path):
    """gpt-oss's sliding cache and Qwen3-Next's recurrent one, past the window, against the book's caches."""
    gpt = randomised(choices)
    loaded = read_back(tl.hf_model(gpt), tmp_path)
    prompt = ids(1, 5)
    ours = gpt.generate(prompt, 10, top_k=1, use_cache=True)
    theirs = loaded.generate(prompt, max_new_tokens=10, min_new_tokens=10, do_sample=False, pad_token_id=0)
    assert torch.equal(theirs, ours)


def test_the_export_command_writes_a_hybrid_run_that_transformers_loads(tmp_path):
    gpt = make({"recipe": "gated_delta", "full_every": 2, "qk_norm": True}, dtype=torch.float32)
    tl.train(gpt, batches(), settings(tmp_path / "run", max_iters=1), tokenizer=TOKENIZER)
    assert cli.main(["export", "--ckpt", str(tmp_path / "run"), "--out-dir", str(tmp_path / "hf")]) == 0
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    x = torch.tensor([tokenizer("the cat sat")["input_ids"]])
    assert x.tolist() == [TOKENIZER.encode("the cat sat")]
    with torch.no_grad():
        assert (loaded(x).logits - gpt.eval()(x)[0]).abs().max().item() < ATOL


def test_a_float64_gpt_oss_runs_its_one_expert_in_float64():
    gpt = randomised(SINKS_MORE).double()
    hf = gpt_oss_from_gpt(gpt)
    assert hf.model.layers[0].mlp.experts.down_proj.dtype == torch.float64
    assert difference(hf, gpt) < ATOL  # transformers' norms and angles in float32: no closer


def test_a_lora_sinks_run_is_merged_not_written_as_a_peft_adapter(tmp_path):
    (tmp_path / "text.txt").write_text("the cat sat on the mat. the dog sat on the log.\n" * 30)
    flags = "--batch-size 4 --eval-interval 2 --eval-iters 1 --device cpu --no-progress --max-iters 2".split()
    shape = "--n-layers 2 --n-heads 2 --d-model 16 --context-len 24 --tokenizer bpe --vocab-size 300".split()
    train = ["train", "--preset", "llama-cpu", "--sinks", *shape, "--data", str(tmp_path / "text.txt")]
    assert cli.main([*train, "--out-dir", str(tmp_path / "run"), *flags]) == 0
    pairs = tl.write_pairs([("the cat", "sat"), ("the dog", "ran")] * 4, tmp_path / "pairs.jsonl")
    finetune = ["finetune", "--ckpt", str(tmp_path / "run"), "--data", str(pairs), "--lora-rank", "2"]
    assert cli.main([*finetune, "--lr", "0.05", "--out-dir", str(tmp_path / "lora"), *flags]) == 0
    with pytest.raises(ValueError, match="written as a GptOssForCausalLM.*--merge-adapter"):
        tl.export_hf(tmp_path / "lora", tmp_path / "hf", peft_adapter=True)
    assert not (tmp_path / "hf").exists()
    tl.export_hf(tmp_path / "lora", tmp_path / "hf", merge_adapter=True)
    model, _, _ = tl.load_run(tmp_path / "lora")
    tl.remove_lora(model, merge=True)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    assert difference(loaded, model.eval()) < ATOL

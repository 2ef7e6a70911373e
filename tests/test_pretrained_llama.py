"""The book's GPT computes what transformers' LlamaForCausalLM computes, given the same random
weights (no download): float64 logits, greedy tokens with and without the cache, the way back,
and the settings it cannot follow refused by name."""

import pytest
import torch
from _float64_patches import float64_rms_norm_and_rotary

import transformer_lib as tl

transformers = pytest.importorskip("transformers")
from transformers.models.llama import modeling_llama  # noqa: E402


def _llama(n_kv_heads=2, tie=False, seed=0):
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(
        vocab_size=50, hidden_size=32, intermediate_size=40, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=n_kv_heads, max_position_embeddings=64, rms_norm_eps=1e-6, tie_word_embeddings=tie,
        rope_parameters={"rope_type": "default", "rope_theta": 500.0}, attn_implementation="sdpa",
    )  # fmt: skip
    model = transformers.LlamaForCausalLM(config).double().eval()
    with torch.no_grad():  # norms' gains away from 1, so that a gain read into the wrong place shows
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.2 * torch.randn_like(p))
    return model


@pytest.fixture
def llama_in_float64(monkeypatch):
    """transformers computes the RMSNorm and the rotary angles in float32 even for float64 weights:
    the same functions in float64, for a comparison at 1e-10."""
    float64_rms_norm_and_rotary(monkeypatch, modeling_llama.LlamaRMSNorm, modeling_llama.LlamaRotaryEmbedding)


IDX = torch.randint(0, 50, (2, 23), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("n_kv_heads, tie", [(2, False), (1, False), (4, True)])
def test_logits_equal_llamas_in_float64(llama_in_float64, n_kv_heads, tie):
    llama = _llama(n_kv_heads, tie)
    gpt = tl.gpt_from_llama(llama)
    c = gpt.config
    assert (c.n_kv_heads, c.tie_embeddings, c.norm_eps, c.rotary_base, c.d_ff) == (n_kv_heads, tie, 1e-6, 500.0, 40)
    with torch.no_grad():
        expected = llama(IDX).logits
    assert (gpt(IDX)[0] - expected).abs().max().item() < 1e-10


def test_float32_functions_of_transformers_differ_only_by_float32_rounding():
    llama = _llama()
    with torch.no_grad():
        difference = (tl.gpt_from_llama(llama)(IDX)[0] - llama(IDX).logits).abs().max().item()
    assert difference < 1e-5  # about 3e-8: transformers' float32 norms and angles


def test_greedy_tokens_equal_with_and_without_the_cache_and_llamas(llama_in_float64):
    llama = _llama()
    gpt = tl.gpt_from_llama(llama)
    prompt = IDX[:, :4]
    cached = gpt.generate(prompt, 24, top_k=1)
    assert torch.equal(cached, gpt.generate(prompt, 24, top_k=1, use_cache=False))
    theirs = llama.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=24, do_sample=False)
    assert torch.equal(cached, theirs)


def test_a_state_dict_with_its_config_and_the_way_back(llama_in_float64):
    llama = _llama()
    gpt = tl.gpt_from_llama(llama.state_dict(), llama.config.to_dict())
    back = tl.llama_from_gpt(gpt)
    for name, tensor in llama.state_dict().items():
        assert torch.equal(back.state_dict()[name], tensor), name
    with torch.no_grad():
        assert (back(IDX).logits - gpt(IDX)[0]).abs().max().item() < 1e-10


def test_the_rotary_conventions_agree_after_reordering_the_rows():
    # Llama's rotate_half on a head equals the book's pairwise rotation of the reordered head
    d_k, T = 8, 5
    x = torch.randn(1, 1, T, d_k, dtype=torch.float64)
    order = tl.half_split_rows(1, d_k)
    rotary = modeling_llama.LlamaRotaryEmbedding(transformers.LlamaConfig(hidden_size=8, num_attention_heads=1))
    cos, sin = rotary(x, torch.arange(T)[None])
    theirs, _ = modeling_llama.apply_rotary_pos_emb(x, x, cos, sin)
    ours = tl.rotate_heads(x[..., order], tl.RotaryEmbedding(d_k))
    torch.testing.assert_close(ours, theirs[..., order], atol=1e-6, rtol=0)  # their angles are float32


UNSUPPORTED = [
    # chapter "Longer than trained": linear, yarn and llama3 are read (test_rope_scaling_parity.py); these are not
    ({"rope_parameters": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4}}, "rope_type 'dynamic'"),
    (
        {"rope_scaling": {"rope_type": "longrope", "short_factor": [1.0] * 4, "long_factor": [2.0] * 4}},
        "rope_type 'longrope'",
    ),
    ({"attention_bias": True}, "attention_bias=True"),
    ({"mlp_bias": True}, "mlp_bias=True"),
    ({"hidden_act": "gelu"}, "hidden_act='gelu'"),
    ({"pretraining_tp": 2}, "pretraining_tp=2"),
    ({"head_dim": 16}, "head_dim=16"),
]


@pytest.mark.parametrize("change, message", UNSUPPORTED)
def test_an_unsupported_llama_setting_is_named(change, message):
    config = _llama().config.to_dict()
    config.pop("rope_scaling", None)
    config.update(change)
    with pytest.raises(ValueError, match=message):
        tl.gpt_config_from_llama(config)


@pytest.mark.parametrize("settings, name", [({}, "norm='rmsnorm'"), (dict(qk_norm=True), "qk_norm=False"),
                                            (dict(window=4), "window=None")])  # fmt: skip
def test_the_way_back_refuses_a_gpt_llama_cannot_be(settings, name):
    base = {} if not settings else dict(norm="rmsnorm", ffn="swiglu", positions="rotary", bias=False)
    gpt = tl.GPT(tl.GPTConfig(vocab_size=10, n_layers=1, n_heads=2, d_model=16, **base, **settings))
    with pytest.raises(ValueError, match=f"llama_from_gpt needs {name}"):
        tl.llama_from_gpt(gpt)
    with pytest.raises(ValueError, match="needs the LlamaConfig"):
        tl.gpt_from_llama(_llama().state_dict())


@pytest.mark.parametrize("recipe", ["sinks", "sparse", "latent", "gated_delta", "hybrid"])
def test_both_ways_out_refuse_an_attention_their_formats_lack(recipe):
    # Llama's and GPT-2's formats hold plain multi-head attention: a sink logit, a sparse indexer,
    # a latent or a recurrence would be dropped or misread, so each is refused by name
    llama_like = tl.GPT(tl.GPTConfig(vocab_size=10, context_len=16, n_layers=4, n_heads=2, d_model=16, recipe=recipe))
    with pytest.raises(ValueError, match="llama_from_gpt needs (attention='multi_head'|sinks=False)"):
        tl.llama_from_gpt(llama_like)
    option = {"sinks": True} if recipe == "sinks" else {"attention": "sparse", "sparse_k": 4}
    gpt2_like = tl.GPT(tl.GPTConfig(vocab_size=10, context_len=16, n_layers=2, n_heads=2, d_model=16, **option))
    with pytest.raises(ValueError, match="GPT-2's format needs (attention='multi_head'|sinks=False)"):
        tl.gpt2_from_gpt(gpt2_like)

"""Tests for the Mixtral converters of transformer_lib/pretrained_experts.py (chapter "Experts") and
the export of an experts run (transformer_lib/export.py).

An experts GPT routed as Mixtral routes, written as transformers' ``MixtralForCausalLM``, computes
the GPT's logits in float64 (grouped-query attention or not, its head tied or not); there and back
gives equal state dicts both ways; every setting Mixtral has no place for is refused by its name;
and the export command writes a tiny trained experts run into a folder that
``AutoModelForCausalLM.from_pretrained`` loads as a Mixtral with the run's logits. Random weights,
no download, tiny models.

transformers computes Mixtral's RMSNorm and rotary angles in float32 even for float64 weights; the
float64 tests put the same functions in float64 in their place (as chapter "Today's block"'s Llama tests do).
What is left in float32 is Mixtral's router: it rounds the logits to float32 and takes the softmax
and the top k weights there, so each expert's weight is off by up to float32's rounding, about
6e-8 of itself, and the logits by less than that of their size (seen: 1e-9 to 5e-9 of the
largest). Hence ``ROUTER_ROUNDING``, 1e-7 of the largest logit; with the router in float64 too,
the logits agree to 1e-12 (seen: 2e-16). Each test asserts that
every token's top-k choice has a margin (between the router logits of the last expert chosen and
the first passed over) far above float32's rounding, so that no near tie can change an expert and
make a test pass or fail by chance.
"""

import pytest
import torch
import torch.nn.functional as F
from _float64_patches import float64_rms_norm_and_rotary

import transformer_lib as tl
from tests.test_cli import offline_one_thread  # noqa: F401 (autouse: offline, one thread)
from transformer_lib import cli
from transformer_lib.pretrained_experts import gpt_from_mixtral, mixtral_from_gpt

transformers = pytest.importorskip("transformers")
from transformers.models.mixtral import modeling_mixtral  # noqa: E402

V, D = 50, 32  # vocab_size, d_model
EXPERTS = {"n_experts": 4, "top_k": 2, "d_expert": 24}
IDX = torch.randint(0, V, (2, 13), generator=torch.Generator().manual_seed(1))  # (B, T)
ROUTER_ROUNDING = 1e-7  # of the largest logit: float32's rounding of the router's weights (module docstring)
MARGIN = 1e-4  # the least gap of a top-k choice's logits; float32 rounds them by about 1e-7 of their size


def experts_gpt(n_kv_heads=None, tie=False, seed=0, experts=None, **choices) -> tl.GPT:
    """A float64 experts GPT in eval mode, its weights drawn from ``seed``: the routers 0.5 (logits of
    about 3, few near ties), the norms' gains 1 +- 0.2 (a gain read into the wrong place shows)."""
    torch.manual_seed(seed)
    config = tl.GPTConfig(
        V,
        32,
        2,
        4,
        D,
        recipe="experts",
        experts={**EXPERTS, **(experts or {})},
        n_kv_heads=n_kv_heads,
        tie_embeddings=tie,
        norm_eps=1e-6,
        **{"rotary_base": 500.0, **choices},
    )
    gpt = tl.GPT(config).double().eval()
    g = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():
        for name, p in gpt.named_parameters():
            if name.endswith("ff.gate.weight"):
                p.copy_(0.5 * torch.randn(p.shape, generator=g, dtype=p.dtype))
            elif "norm" in name:
                p.add_(0.2 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return gpt


def book_logits(gpt, idx=IDX):
    """The GPT's logits ``(B, T, V)``, after asserting that each token's choice in each layer is clear."""
    with torch.no_grad():
        logits = gpt(idx)[0]
    for name, layer in tl.experts_layers(gpt).items():
        ranked = layer.routing.logits.sort(-1, descending=True).values  # (N, E): softmax keeps their order
        k = layer.spec.top_k
        assert (ranked[:, k - 1] - ranked[:, k]).min().item() > MARGIN, name
    return logits


def hf_logits(model, idx=IDX):
    with torch.no_grad():
        return model(idx).logits


@pytest.fixture
def mixtral_in_float64(monkeypatch):
    """Mixtral's RMSNorm and rotary angles in float64, as the GPT computes them."""
    float64_rms_norm_and_rotary(monkeypatch, modeling_mixtral.MixtralRMSNorm, modeling_mixtral.MixtralRotaryEmbedding)


def float64_router(self, hidden_states):
    """transformers' ``MixtralTopKRouter.forward`` with its softmax and top k in the input's dtype."""
    logits = F.linear(hidden_states.reshape(-1, self.hidden_dim), self.weight)  # (N, E)
    top, chosen = logits.softmax(-1).topk(self.top_k, dim=-1)  # (N, k) each
    return logits, top / top.sum(-1, keepdim=True), chosen


@pytest.mark.parametrize("n_kv_heads, tie", [(None, False), (2, False), (1, True)])
def test_logits_equal_the_gpts_in_float64(mixtral_in_float64, monkeypatch, n_kv_heads, tie):
    # capacity and the balancing terms are training's: dropped, and the eval logits still equal
    gpt = experts_gpt(n_kv_heads, tie, experts={"capacity": 1.0, "aux_loss": 0.01, "z_loss": 1e-3})
    mixtral = mixtral_from_gpt(gpt)
    cfg = mixtral.config
    assert type(mixtral).__name__ == "MixtralForCausalLM" and not mixtral.training
    assert (cfg.num_local_experts, cfg.num_experts_per_tok, cfg.intermediate_size) == (4, 2, 24)
    assert (cfg.num_key_value_heads, cfg.tie_word_embeddings) == (n_kv_heads or 4, tie)
    ours = book_logits(gpt)
    difference = (hf_logits(mixtral) - ours).abs().max().item()
    assert difference < ROUTER_ROUNDING * ours.abs().max().item()  # seen: 1e-9 to 5e-9 of it
    monkeypatch.setattr(modeling_mixtral.MixtralTopKRouter, "forward", float64_router)
    assert (hf_logits(mixtral) - ours).abs().max().item() < 1e-12  # the float32 router was all that differed


def test_the_weights_really_matter():
    """A converter that copied a tensor wrongly would change the logits far beyond the tolerance:
    here, the experts of one layer swapped, or one router row."""
    gpt = experts_gpt(2)
    mixtral = mixtral_from_gpt(gpt)
    ours = book_logits(gpt)
    experts = mixtral.model.layers[1].mlp.experts
    with torch.no_grad():
        experts.down_proj.copy_(experts.down_proj.flip(0))
    assert (hf_logits(mixtral) - ours).abs().max().item() > 1e-3


def test_there_and_back_gives_equal_state_dicts_both_ways():
    gpt = experts_gpt(2, tie=True, experts={"capacity": 1.25, "aux_loss": 0.02})
    mixtral = mixtral_from_gpt(gpt)
    back = gpt_from_mixtral(mixtral, capacity=1.25, aux_loss=0.02)
    assert not back.training and back.tok_embed.weight.dtype == torch.float64
    ours, theirs = gpt.state_dict(), back.state_dict()
    assert list(theirs) == list(ours)
    for name, tensor in ours.items():
        assert torch.equal(theirs[name], tensor), name
    c = back.config
    assert (c.n_kv_heads, c.tie_embeddings, c.norm_eps, c.rotary_base) == (2, True, 1e-6, 500.0)
    s = c.experts
    assert (s.n_experts, s.top_k, s.d_expert, s.score, s.norm_topk, s.capacity, s.aux_loss) == (
        4,
        2,
        24,
        "softmax",
        True,
        1.25,
        0.02,
    )
    # and from transformers' side: a Mixtral made by transformers, to the book and back
    config = transformers.MixtralConfig(
        vocab_size=V,
        hidden_size=D,
        intermediate_size=12,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=1,
        num_local_experts=3,
        num_experts_per_tok=1,
        max_position_embeddings=32,
        rope_parameters={"rope_type": "default", "rope_theta": 1000.0},
        experts_implementation="eager",
    )
    torch.manual_seed(3)
    original = transformers.MixtralForCausalLM(config).eval()
    again = mixtral_from_gpt(gpt_from_mixtral(original))
    assert again.dtype == torch.float32
    for name, tensor in original.state_dict().items():
        assert torch.equal(again.state_dict()[name], tensor), name


# Each setting an experts GPT may have that Mixtral has no place for: the GPTConfig's changes.
REFUSED = {
    "score": {"experts": {"score": "sigmoid"}},
    "norm_topk": {"experts": {"norm_topk": False}},
    "n_shared": {"experts": {"n_shared": 1}},
    "n_groups": {"experts": {"n_groups": 2, "topk_groups": 1}},
    "scaling": {"experts": {"scaling": 2.5}},
    "dense_layers": {"experts": {"dense_layers": 1}},
    "qk_norm": {"qk_norm": True},
    "window": {"window": 8},
    "sinks": {"sinks": True},
    "attention": {"attention": "latent"},
    "bias": {"bias": True},
    "norm": {"norm": "layernorm"},
    "positions": {"positions": "learned", "rotary_base": 10000.0},  # learned positions have no rotary base
}


@pytest.mark.parametrize("name", REFUSED)
def test_each_setting_mixtral_cannot_hold_is_refused_by_name(name):
    gpt = experts_gpt(**REFUSED[name])
    with pytest.raises(ValueError, match=rf"needs (experts )?{name}="):
        mixtral_from_gpt(gpt)
    with pytest.raises(ValueError, match=rf"needs (experts )?{name}="):
        tl.hf_model(gpt)  # the export's choice of model, too


def test_a_choice_bias_no_experts_adapters_and_a_classifier_are_refused():
    gpt = experts_gpt(experts={"bias_rate": 1e-3})
    mixtral_from_gpt(gpt)  # a bias rate that moved nothing is dropped
    with torch.no_grad():
        gpt.decoder.layers[1].ff.score_bias[2] = 0.1
    with pytest.raises(ValueError, match=r"decoder\.layers\.1\.ff\.score_bias.*bias_rate=0\.001"):
        mixtral_from_gpt(gpt)
    dense = tl.GPT(tl.GPTConfig(V, 32, 2, 4, D, recipe="llama"))
    with pytest.raises(ValueError, match="needs experts.*llama_from_gpt"):
        mixtral_from_gpt(dense)
    adapted = experts_gpt()
    tl.add_lora(adapted, ["decoder.layers.0.self_attn.in_proj_weight"], rank=2)
    with pytest.raises(ValueError, match="LoRA adapters.*remove_lora"):
        mixtral_from_gpt(adapted)
    with pytest.raises(TypeError, match=r"takes a GPT, got a GPTClassifier \(convert its \.gpt"):
        mixtral_from_gpt(tl.GPTClassifier(experts_gpt(), 3))


def _random_mixtral(**settings):
    config = transformers.MixtralConfig(
        vocab_size=V,
        hidden_size=D,
        intermediate_size=12,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_local_experts=3,
        max_position_embeddings=32,
        experts_implementation="eager",
        **settings,
    )
    return transformers.MixtralForCausalLM(config)


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"sliding_window": 8}, "Mixtral setting sliding_window=8"),
        ({"hidden_act": "gelu"}, "Mixtral setting hidden_act='gelu'"),
        ({"router_jitter_noise": 0.1}, "router_jitter_noise=0.1"),
    ],
)
def test_the_way_back_refuses_what_the_gpt_cannot_follow_by_name(settings, message):
    with pytest.raises(ValueError, match=message) as raised:
        gpt_from_mixtral(_random_mixtral(**settings))
    assert "Llama" not in str(raised.value)


def test_the_way_back_takes_the_whole_model():
    model = _random_mixtral()
    with pytest.raises(TypeError, match=r"gpt_from_mixtral takes a transformers MixtralForCausalLM \(the whole"):
        gpt_from_mixtral(model.model)
    with pytest.raises(TypeError, match="unknown option 'top_k'"):
        gpt_from_mixtral(model, top_k=1)  # the routing comes from the model


SHAPE = (
    "--n-layers 2 --n-heads 2 --n-kv-heads 1 --d-model 16 --context-len 24 --batch-size 4 --eval-interval 2 "
    "--eval-iters 1 --device cpu --no-progress --max-iters 2"
).split()
TEXT = "ROMEO: But soft, what light through yonder window breaks?\nJULIET: Ay me!\n" * 30
PROMPT = "ROMEO: But soft"


def test_the_export_command_writes_an_experts_run_that_transformers_loads_as_mixtral(tmp_path, capsys):
    (tmp_path / "text.txt").write_text(TEXT)
    run, out = tmp_path / "run", tmp_path / "hf"
    flags = ["--preset", "llama-cpu", "--experts", "4", "--experts-top-k", "2", "--experts-capacity", "1.0"]
    assert cli.main(["train", *flags, *SHAPE, "--data", str(tmp_path / "text.txt"), "--out-dir", str(run)]) == 0
    assert cli.main(["export", "--ckpt", str(run), "--out-dir", str(out)]) == 0
    assert "AutoModelForCausalLM" in capsys.readouterr().out
    model, tokenizer, _ = tl.load_run(run)
    assert model.config.experts.capacity == 1.0  # trained with a capacity; eval mode has none, nor has Mixtral
    hf = transformers.AutoModelForCausalLM.from_pretrained(out)
    hf_tok = transformers.AutoTokenizer.from_pretrained(out)
    assert type(hf).__name__ == "MixtralForCausalLM" and hf.dtype == torch.float32
    assert (hf.config.num_local_experts, hf.config.num_experts_per_tok, hf.config.num_key_value_heads) == (4, 2, 1)
    ids = hf_tok(PROMPT)["input_ids"]
    assert ids == tokenizer.encode(PROMPT)
    idx = torch.tensor([ids])
    # float32 on both sides, the same router steps: the rounding of float32 sums taken in other orders
    assert (hf_logits(hf, idx) - book_logits(model, idx)).abs().max().item() < 1e-5

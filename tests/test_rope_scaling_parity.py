"""Chapter "Longer than trained": the book's rescaled rotary frequencies equal transformers' (no
download, random weights), and Llama's converters read and write them.

- ``RopeScaling.frequencies`` against ``transformers.modeling_rope_utils.ROPE_INIT_FUNCTIONS``
  (``"linear"``, ``"dynamic"`` at several lengths, ``"yarn"`` with and without ``truncate``,
  ``"llama3"``): their functions build ``inv_freq`` in float32 (``torch.float``, so a float64 default
  dtype changes nothing, as a test shows), so they agree to float32 rounding. To compare in float64,
  their functions run unchanged with the ``torch`` that their module sees replaced by a stand-in whose
  ``float`` and ``float32`` are ``torch.float64`` (:func:`their_float64`): then every step is theirs,
  in float64, and the two agree to a few units of float64 rounding.
- The logits of a scaled Llama-style GPT equal ``transformers``' ``LlamaForCausalLM`` with the same
  ``rope_parameters`` (linear, yarn, llama3, and the GPT's ``"ntk"`` written as a larger base), both
  ways through :func:`~transformer_lib.gpt_from_llama` and :func:`~transformer_lib.llama_from_gpt`:
  to 1e-12 in float64 (measured: 3e-16) once their norms and rotary angles are computed in float64
  too (the frequencies from their own function, in float64), and to float32 rounding as they ship
  (measured: 9e-8).
- The converters: each setting read, the older ``rope_scaling`` and ``type`` spellings, the round
  trips, and ``"dynamic"``, ``"longrope"`` and others refused by name.
"""

import math

import pytest
import torch
from _float64_patches import float64_rms_norm_and_rotary

import transformer_lib as tl
from transformer_lib.rope_scaling import RopeScaling

transformers = pytest.importorskip("transformers")
from transformers import modeling_rope_utils  # noqa: E402
from transformers.models.llama import modeling_llama  # noqa: E402

ROPE_INIT_FUNCTIONS = modeling_rope_utils.ROPE_INIT_FUNCTIONS
D64 = torch.float64


class _Float64Torch:
    """``torch``, except that ``torch.float`` and ``torch.float32`` are float64."""

    float = float32 = torch.float64

    def __getattr__(self, name):
        return getattr(torch, name)


@pytest.fixture
def their_float64(monkeypatch):
    """transformers' rope functions, unchanged, computing in float64."""
    monkeypatch.setattr(modeling_rope_utils, "torch", _Float64Torch())


def llama_config(d, base, max_len, rope):
    """A LlamaConfig of two ``d``-wide heads with the rotary settings ``rope`` (``rope_type`` and the rest)."""
    return transformers.LlamaConfig(
        hidden_size=2 * d,
        num_attention_heads=2,
        head_dim=d,
        max_position_embeddings=max_len,
        rope_parameters={"rope_theta": base, **rope},
    )


def transformers_rope(kind, d, base, max_len, rope, seq_len=None):
    """``(inv_freq (d/2,), attention_factor)`` from transformers' function for ``kind``."""
    return ROPE_INIT_FUNCTIONS[kind](llama_config(d, base, max_len, {"rope_type": kind, **rope}), seq_len=seq_len)


# (kind, d, base, L, s, their rope_parameters past rope_type and factor, our options past factor and L)
CASES = {
    "linear": ("linear", 64, 1e4, 4096, 4.0, {}, {}),
    "linear-tiny": ("linear", 16, 100.0, 16, 2.0, {}, {}),
    "yarn": ("yarn", 64, 1e4, 4096, 4.0, {}, {}),
    "yarn-llama-sized": ("yarn", 128, 5e5, 8192, 8.0, {}, {}),
    "yarn-no-truncate": ("yarn", 64, 1e4, 4096, 4.0, {"truncate": False}, {"truncate": False}),
    "yarn-betas-own-factor": (
        "yarn",
        16,
        100.0,
        16,
        4.0,
        {"beta_fast": 2.0, "beta_slow": 0.1, "attention_factor": 1.3},
        {"beta_fast": 2.0, "beta_slow": 0.1, "attention_factor": 1.3},
    ),
    "llama3": ("llama3", 128, 5e5, 8192, 8.0, {"low_freq_factor": 1.0, "high_freq_factor": 4.0}, {}),
    "llama3-tiny": (
        "llama3",
        16,
        100.0,
        16,
        4.0,
        {"low_freq_factor": 0.5, "high_freq_factor": 2.0},
        {"low_freq_factor": 0.5, "high_freq_factor": 2.0},
    ),
}


def both(name):
    """Ours and theirs for ``CASES[name]``: ``(omega, factor), (inv_freq, factor)``."""
    kind, d, base, L, s, theirs, ours = CASES[name]
    rope = {"factor": s, **theirs} | ({} if kind == "linear" else {"original_max_position_embeddings": L})
    return RopeScaling(kind, s, L, **ours).frequencies(d, base), transformers_rope(kind, d, base, int(s * L), rope)


def test_their_functions_build_float32_even_with_a_float64_default_dtype(monkeypatch):
    default = torch.get_default_dtype()
    torch.set_default_dtype(D64)
    try:
        shipped, _ = transformers_rope("linear", 16, 100.0, 32, {"factor": 2.0})
    finally:
        torch.set_default_dtype(default)
    assert shipped.dtype == torch.float32  # `torch.float` is float32 whatever the default
    monkeypatch.setattr(modeling_rope_utils, "torch", _Float64Torch())
    assert transformers_rope("linear", 16, 100.0, 32, {"factor": 2.0})[0].dtype == D64  # the stand-in's


@pytest.mark.parametrize("name", list(CASES))
def test_each_kind_equals_transformers_to_float32_rounding(name):
    (omega, factor), (inv_freq, their_factor) = both(name)
    assert inv_freq.dtype == torch.float32 and factor == pytest.approx(their_factor, rel=1e-15)
    torch.testing.assert_close(inv_freq.double(), omega, rtol=1e-6, atol=0)  # measured: at most 3.3e-7


@pytest.mark.parametrize("name", list(CASES))
def test_each_kind_equals_transformers_in_float64(their_float64, name):
    (omega, factor), (inv_freq, their_factor) = both(name)
    assert inv_freq.dtype == D64 and factor == pytest.approx(their_factor, rel=1e-15)
    torch.testing.assert_close(inv_freq, omega, rtol=1e-14, atol=0)  # measured: at most 3.4e-16


@pytest.mark.parametrize("float64", [False, True])
@pytest.mark.parametrize("d, base, L, s", [(64, 1e4, 64, 4.0), (16, 100.0, 16, 2.0), (128, 5e5, 8192, 8.0)])
def test_dynamic_equals_transformers_at_every_length(monkeypatch, float64, d, base, L, s):
    if float64:
        monkeypatch.setattr(modeling_rope_utils, "torch", _Float64Torch())
    tolerance = {"rtol": 1e-14 if float64 else 1e-6, "atol": 0}
    spec = RopeScaling("dynamic", s, L)
    for T in (None, 1, L // 2, L, L + 1, int((2 - 1 / s) * L), int(s * L), 10 * L):
        theirs, factor = transformers_rope("dynamic", d, base, L, {"factor": s}, seq_len=T)  # their L: max length
        omega, ours = spec.frequencies(d, base, seq_len=T)
        assert factor == ours == 1.0
        torch.testing.assert_close(theirs.double(), omega, **tolerance)
    # the static "ntk" of factor s is their dynamic entry read at (2 - 1/s) L tokens
    theirs, _ = transformers_rope("dynamic", d, base, L, {"factor": s}, seq_len=(2 - 1 / s) * L)
    torch.testing.assert_close(theirs.double(), RopeScaling("ntk", s, L).frequencies(d, base)[0], **tolerance)


def test_transformers_reads_yarns_truncate_from_the_top_dict_not_a_layers_own(their_float64):
    # transformers 5.24 reads every other yarn setting from the layer type's own dict, but `truncate`
    # from config.rope_parameters, which for a per-layer config holds the layer types: a layer's
    # truncate=False is never seen, and the ramp is the truncated one (a version that reads it fails here)
    rope = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096, "rope_theta": 1e4}
    config = transformers.Gemma3TextConfig(
        hidden_size=128,
        num_attention_heads=2,
        head_dim=64,
        max_position_embeddings=16384,
        num_hidden_layers=2,
        layer_types=["sliding_attention", "full_attention"],
        rope_parameters={
            "full_attention": {**rope, "truncate": False},
            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
        },
    )
    theirs, _ = ROPE_INIT_FUNCTIONS["yarn"](config, layer_type="full_attention")
    truncated, _ = RopeScaling("yarn", 4.0, 4096, truncate=True).frequencies(64, 1e4)
    untruncated, _ = RopeScaling("yarn", 4.0, 4096, truncate=False).frequencies(64, 1e4)
    torch.testing.assert_close(theirs, truncated, rtol=1e-14, atol=0)
    assert (theirs - untruncated).abs().max() > 1e-3
    # in a flat config's rope_parameters it is read
    flat, _ = transformers_rope(
        "yarn", 64, 1e4, 16384, {"factor": 4.0, "original_max_position_embeddings": 4096, "truncate": False}
    )
    torch.testing.assert_close(flat, untruncated, rtol=1e-14, atol=0)


# ---------------------------------------------------------------- whole models

ROPES = {
    "linear": {"rope_type": "linear", "factor": 4.0},
    "yarn": {
        "rope_type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": 16,
        "beta_fast": 2.0,
        "beta_slow": 0.1,
    },
    "yarn-no-truncate-own-factor": {
        "rope_type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": 16,
        "beta_fast": 2.0,
        "beta_slow": 0.1,
        "truncate": False,
        "attention_factor": 1.3,
    },
    "llama3": {
        "rope_type": "llama3",
        "factor": 4.0,
        "original_max_position_embeddings": 16,
        "low_freq_factor": 0.5,
        "high_freq_factor": 2.0,
    },
}
BASE, CONTEXT = 100.0, 64  # 16-wide heads of base 100 trained on 16 tokens, read at 64: every band has pairs
IDX = torch.randint(0, 50, (2, CONTEXT), generator=torch.Generator().manual_seed(1))


def tiny_config(rope):
    """A LlamaConfig of 4 heads 16 wide, 2 of keys and values, 2 layers, with the rotary settings ``rope``."""
    return transformers.LlamaConfig(
        vocab_size=50,
        hidden_size=64,
        intermediate_size=40,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=CONTEXT,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        rope_parameters={"rope_theta": BASE, **rope},
        attn_implementation="sdpa",
    )


def scaled_llama(rope, seed=0):
    """A float64 LlamaForCausalLM with random weights and the rotary settings ``rope``."""
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(tiny_config(rope)).double().eval()
    with torch.no_grad():  # norms' gains away from 1, so that a gain read into the wrong place shows
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.2 * torch.randn_like(p))
    return model


@pytest.fixture
def llama_in_float64(monkeypatch, their_float64):
    """transformers' RMSNorm and rotary angles in float64, the rotary ones from the frequencies its own
    rope function built (in float64: ``their_float64``; plain ones recomputed in float64) and its
    attention factor on cos and sin."""
    float64_rms_norm_and_rotary(monkeypatch, modeling_llama.LlamaRMSNorm, modeling_llama.LlamaRotaryEmbedding)

    def rotary(self, x, position_ids):
        inv_freq = self.inv_freq.double()  # (d/2,), built in float64 by their rescaling's function
        if self.rope_type == "default":  # built by Llama's own function, in float32
            d = 2 * inv_freq.shape[0]
            inv_freq = self.config.rope_parameters["rope_theta"] ** -(torch.arange(0, d, 2, dtype=D64) / d)
        angles = position_ids[..., None].double() * inv_freq  # (B, T, d/2)
        angles = torch.cat([angles, angles], dim=-1)  # (B, T, d): their rotate_half layout
        return (angles.cos() * self.attention_scaling).to(x.dtype), (angles.sin() * self.attention_scaling).to(x.dtype)

    monkeypatch.setattr(modeling_llama.LlamaRotaryEmbedding, "forward", rotary)


def logits_difference(gpt, llama):
    with torch.no_grad():
        return (gpt(IDX)[0] - llama(IDX).logits).abs().max().item()


@pytest.mark.parametrize("name", list(ROPES))
def test_a_scaled_llamas_logits_equal_the_gpts_read_from_it(llama_in_float64, name):
    llama = scaled_llama(ROPES[name])
    assert llama.model.rotary_emb.inv_freq.dtype == D64
    gpt = tl.gpt_from_llama(llama)
    assert gpt.config.rope_scaling.kind == name.split("-")[0]
    assert logits_difference(gpt, llama) < 1e-12
    assert logits_difference(_unscaled(gpt), llama) > 1e-3  # the rescaling matters past 16 tokens


@pytest.mark.parametrize("name", list(ROPES))
def test_as_transformers_ships_them_they_differ_by_float32_rounding(name):
    llama = scaled_llama(ROPES[name])
    assert logits_difference(tl.gpt_from_llama(llama), llama) < 1e-5


@pytest.mark.parametrize(
    "spec",
    [
        {"kind": "linear", "factor": 4.0, "original_context": 16},
        {"kind": "yarn", "factor": 4.0, "original_context": 16, "beta_fast": 2.0, "beta_slow": 0.1},
        {"kind": "yarn", "factor": 3.0, "original_context": 20, "truncate": False, "attention_factor": 1.25},
        {"kind": "llama3", "factor": 4.0, "original_context": 16, "low_freq_factor": 0.5, "high_freq_factor": 2.0},
        {"kind": "ntk", "factor": 4.0, "original_context": 16},
    ],
    ids=["linear", "yarn", "yarn-own", "llama3", "ntk"],
)
def test_a_scaled_gpts_logits_equal_the_llama_written_from_it_and_back(llama_in_float64, spec):
    torch.manual_seed(0)
    config = tl.GPTConfig(50, CONTEXT, 2, 4, 64, n_kv_heads=2, recipe="llama", rotary_base=BASE, rope_scaling=spec)
    gpt = tl.GPT(config).double().eval()
    llama = tl.llama_from_gpt(gpt)
    assert logits_difference(gpt, llama) < 1e-12
    back = tl.gpt_from_llama(llama)
    if spec["kind"] == "ntk":  # written as plain rotary positions of the larger base: the same frequencies
        d = 16
        assert back.config.rope_scaling is None and back.config.rotary_base == BASE * 4.0 ** (d / (d - 2))
        assert llama.config.rope_parameters["rope_type"] == "default"
    else:
        assert back.config.rope_scaling == gpt.config.rope_scaling
        assert back.config.rotary_base == BASE
    assert logits_difference(back, llama) < 1e-12


def test_greedy_tokens_with_the_cache_equal_a_scaled_llamas(llama_in_float64, one_thread):
    llama = scaled_llama(ROPES["yarn"])
    gpt = tl.gpt_from_llama(llama)
    prompt = IDX[:, :4]
    ours = gpt.generate(prompt, 24, top_k=1)  # past the 16 trained positions
    assert torch.equal(ours, gpt.generate(prompt, 24, top_k=1, use_cache=False))
    theirs = llama.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=24, do_sample=False)
    assert torch.equal(ours, theirs)


# ---------------------------------------------------------------- the converters' reading


def config_dict(rope_parameters=None, **settings):
    """A Llama config's dict (as a config.json holds it) with ``rope_parameters`` and other settings."""
    config = tiny_config({"rope_type": "default"}).to_dict()
    config.pop("rope_parameters")
    if rope_parameters is not None:
        config["rope_parameters"] = rope_parameters
    return config | settings


def read(**settings):
    return tl.gpt_config_from_llama(config_dict(**settings))


def test_each_setting_is_read_where_transformers_reads_it(their_float64):
    # the older spelling: rope_scaling with `type`, the base beside it (as Qwen2.5's config.json writes it)
    old = read(rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}, rope_theta=500.0)
    assert old.rotary_base == 500.0 and old.rope_scaling == RopeScaling("yarn", 4.0, 16)
    # rope_scaling wins over rope_parameters, as transformers reads it first
    both = read(rope_parameters={"rope_type": "linear", "factor": 2.0}, rope_scaling={"type": "linear", "factor": 4.0})
    assert both.rope_scaling.factor == 4.0
    # linear's trained length: its own, or the length over the factor (64 / 4)
    assert read(rope_parameters={"rope_type": "linear", "factor": 4.0}).rope_scaling.original_context == 16
    own = {"rope_type": "linear", "factor": 4.0, "original_max_position_embeddings": 10}
    assert read(rope_parameters=own).rope_scaling.original_context == 10
    # yarn without a factor: the lengths' ratio; without betas: 32 and 1; a top-level trained length first
    bare = read(rope_parameters={"rope_type": "yarn", "original_max_position_embeddings": 8, "beta_fast": None})
    assert (bare.rope_scaling.factor, bare.rope_scaling.beta_fast, bare.rope_scaling.beta_slow) == (8.0, 32.0, 1.0)
    top = read(
        rope_parameters={"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 8},
        original_max_position_embeddings=32,
    )
    assert top.rope_scaling.original_context == 32
    # DeepSeek's mscale and mscale_all_dim: the attention factor transformers computes from them
    rope = {
        "rope_type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": 16,
        "mscale": 0.7,
        "mscale_all_dim": 1.0,
    }
    spec = read(rope_parameters=rope).rope_scaling
    _, theirs = ROPE_INIT_FUNCTIONS["yarn"](tiny_config(rope))
    assert spec.frequencies(16, BASE)[1] == pytest.approx(theirs, rel=1e-15)
    assert theirs != pytest.approx(1 + 0.1 * math.log(4.0))  # not the default factor
    # no rotary settings at all: plain positions of the top-level base
    assert read(rope_theta=700.0).rope_scaling is None and read(rope_theta=700.0).rotary_base == 700.0


@pytest.mark.parametrize(
    "rope, message",
    [
        ({"rope_type": "dynamic", "factor": 2.0}, "rope_type 'dynamic' is not supported: its frequencies change"),
        (
            {
                "rope_type": "longrope",
                "short_factor": [1.0] * 8,
                "long_factor": [2.0] * 8,
                "original_max_position_embeddings": 16,
            },
            "rope_type 'longrope' is not supported",
        ),
        ({"rope_type": "proportional", "partial_rotary_factor": 0.5}, "rope_type 'proportional' is not supported"),
        ({"rope_type": "linear", "factor": 2.0, "partial_rotary_factor": 0.5}, "partial_rotary_factor=0.5"),
        ({"rope_type": "linear"}, "rope_type 'linear' needs factor"),
        ({"rope_type": "llama3", "factor": 8.0, "high_freq_factor": 4.0}, "'llama3' needs low_freq_factor"),
        ({"rope_type": "linear", "factor": 0.5}, "factor must be at least 1"),
        ({"rope_type": "yarn", "factor": 2.0, "beta_fast": 1.0, "beta_slow": 2.0}, "beta_slow=2.0 must be below"),
    ],
)
def test_what_the_gpt_cannot_follow_is_refused_by_name(rope, message):
    with pytest.raises(ValueError, match=message):
        read(rope_parameters=rope)


@pytest.mark.parametrize("name", list(ROPES))
def test_a_llama_configs_rotary_settings_round_trip(name):
    llama = scaled_llama(ROPES[name])
    written = tl.llama_from_gpt(tl.gpt_from_llama(llama)).config.rope_parameters
    defaults = {"rope_theta": BASE, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": True}
    expected = {k: v for k, v in (defaults | llama.config.rope_parameters).items() if k in written}
    assert written == expected and set(written) >= set(llama.config.rope_parameters)


def test_a_written_llama_keeps_its_rescaling_through_save_and_load(tmp_path):
    spec = {"kind": "yarn", "factor": 4.0, "original_context": 16, "beta_fast": 2.0, "truncate": False}
    torch.manual_seed(0)
    gpt = tl.GPT(tl.GPTConfig(50, CONTEXT, 1, 4, 64, recipe="llama", rotary_base=BASE, rope_scaling=spec)).double()
    tl.llama_from_gpt(gpt).save_pretrained(tmp_path)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=D64)
    assert tl.gpt_from_llama(loaded).config.rope_scaling == RopeScaling(**spec)
    assert logits_difference(gpt.eval(), loaded.eval()) < 1e-5  # their float32 angles


def _unscaled(gpt):
    """``gpt`` with its rescaling removed, the same weights."""
    c = gpt.config
    plain = tl.GPT(tl.GPTConfig(**{**c.to_dict(), "recipe": tl.as_recipe(c.recipe, rope_scaling=None)}))
    plain.load_state_dict(gpt.state_dict())
    return plain.double().eval()

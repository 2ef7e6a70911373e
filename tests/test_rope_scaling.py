"""Chapter "Longer than trained": the rescalings of the rotary frequencies, each by a property a wrong
version breaks (factor 1 is no rescaling; linear divides every pair; NTK keeps the fastest pair and
divides the slowest; dynamic is NTK with a grown factor; YaRN's ramp between beta_fast and beta_slow
and where truncation puts its ends; Llama 3's three bands; the attention factor squared on every
score; scores that depend on offsets only), the refusals by name, and the recipe's dict and flat
settings. Parity with transformers' functions and LlamaForCausalLM is in test_rope_scaling_parity.py."""

import dataclasses
import math
import random

import pytest
import torch

import transformer_lib as tl
from transformer_lib.positional import rotate_pairs, sinusoidal_frequencies
from transformer_lib.rope_scaling import ROPE_KINDS, RopeScaling

D64 = torch.float64


def _settings(n=10, seed=0):
    """``n`` random ``(d, base, L, s)``: head widths, rotary bases, trained lengths and factors of
    today's models and of tiny ones."""
    rng = random.Random(seed)
    return [
        (
            rng.choice([8, 16, 64, 128]),
            rng.choice([100.0, 1e4, 5e5]),
            rng.choice([16, 64, 4096, 8192]),
            rng.choice([1.5, 2.0, 4.0, 8.0, 32.0]),
        )
        for _ in range(n)
    ]


SETTINGS = _settings()


def turns(omega, L):
    """How many times each pair turns over ``L`` positions: ``L omega / (2 pi)``."""
    return L * omega / (2 * math.pi)


def pair_turning(t, d, base, L):
    """The fractional pair index that turns ``t`` times over ``L`` positions (``omega_i = base^(-2i/d)``)."""
    return d * math.log(L / (2 * math.pi * t)) / (2 * math.log(base))


# ---------------------------------------------------------------- factor 1, linear, NTK, dynamic


@pytest.mark.parametrize("kind", ROPE_KINDS)
@pytest.mark.parametrize("d, base, L, s", SETTINGS[:4])
def test_factor_one_changes_nothing(kind, d, base, L, s):
    plain = sinusoidal_frequencies(d, base=base)
    seq_lens = [None, L // 2, L] + ([] if kind == "dynamic" else [4 * L])  # dynamic grows past L even at factor 1
    for seq_len in seq_lens:
        omega, attention = RopeScaling(kind, 1.0, L).frequencies(d, base, seq_len=seq_len)
        assert omega.dtype == D64 and omega.shape == (d // 2,)
        torch.testing.assert_close(omega, plain, rtol=1e-15, atol=0)
        assert attention == 1.0  # yarn's 0.1 ln 1 + 1 too


@pytest.mark.parametrize("d, base, L, s", SETTINGS)
def test_linear_divides_every_frequency_by_the_factor(d, base, L, s):
    omega, attention = RopeScaling("linear", s, L).frequencies(d, base)
    assert torch.equal(omega, sinusoidal_frequencies(d, base=base) / s) and attention == 1.0
    # the new length s L is squeezed into the old angles: position s m now turns as m did
    m = torch.arange(L, dtype=D64)
    torch.testing.assert_close((s * m)[:, None] * omega, m[:, None] * sinusoidal_frequencies(d, base=base))


@pytest.mark.parametrize("d, base, L, s", SETTINGS)
def test_ntk_keeps_the_fastest_pair_divides_the_slowest_and_blends_geometrically(d, base, L, s):
    plain = sinusoidal_frequencies(d, base=base)
    omega, attention = RopeScaling("ntk", s, L).frequencies(d, base)
    assert omega[0] == plain[0] == 1.0 and attention == 1.0
    torch.testing.assert_close(omega[-1], plain[-1] / s, rtol=1e-14, atol=0)
    log_ratio = torch.log(omega / plain)  # -2i/(d - 2) ln s: a straight line in the pair index
    torch.testing.assert_close(log_ratio, -torch.arange(d // 2, dtype=D64) * 2 / (d - 2) * math.log(s))
    assert (log_ratio.diff() < 0).all()  # each slower pair divided by more


@pytest.mark.parametrize("d, base, L, s", SETTINGS)
def test_dynamic_is_plain_up_to_the_trained_length_then_ntk_with_a_grown_factor(d, base, L, s):
    plain = sinusoidal_frequencies(d, base=base)
    dynamic = RopeScaling("dynamic", s, L)
    for seq_len in (None, 1, L // 2, L):
        assert torch.equal(dynamic.frequencies(d, base, seq_len=seq_len)[0], plain)
    for T in (L + 1, 2 * L, int(s * L), 10 * L):
        grown = s * T / L - (s - 1)
        ntk = RopeScaling("ntk", grown, L).frequencies(d, base)[0]
        torch.testing.assert_close(dynamic.frequencies(d, base, seq_len=T)[0], ntk, rtol=1e-14, atol=0)
    # it reaches NTK of factor s at (2 - 1/s) L tokens, and at s L it has grown past it to s^2 - s + 1
    ntk_s = RopeScaling("ntk", s, L).frequencies(d, base)[0]
    at = dynamic.frequencies(d, base, seq_len=(2 - 1 / s) * L)[0]
    torch.testing.assert_close(at, ntk_s, rtol=1e-14, atol=0)
    at_sL = dynamic.frequencies(d, base, seq_len=s * L)[0]
    torch.testing.assert_close(at_sL, RopeScaling("ntk", s * s - s + 1, L).frequencies(d, base)[0], rtol=1e-14, atol=0)
    assert at_sL[-1] < ntk_s[-1]
    slowest = [dynamic.frequencies(d, base, seq_len=T)[0][-1] for T in range(L, 4 * L, max(1, L // 4))]
    assert all(a >= b for a, b in zip(slowest, slowest[1:], strict=False))  # the longer, the slower


# ---------------------------------------------------------------- YaRN

# (d, base, L, s, beta_fast, beta_slow): a ramp with pairs on both sides, Llama-sized and tiny
YARN = [
    (64, 1e4, 4096, 4.0, 32.0, 1.0),
    (128, 5e5, 8192, 8.0, 32.0, 1.0),
    (16, 100.0, 16, 4.0, 2.0, 0.1),
    (64, 1e4, 4096, 16.0, 8.0, 0.5),
]


def ramp_of(omega, plain, s):
    """How far each pair moved from kept (0) to divided by ``s`` (1)."""
    return (plain - omega) / (plain - plain / s)


@pytest.mark.parametrize("truncate", [True, False])
@pytest.mark.parametrize("d, base, L, s, fast, slow", YARN)
def test_yarn_keeps_fast_pairs_divides_slow_ones_and_ramps_between(d, base, L, s, fast, slow, truncate):
    plain = sinusoidal_frequencies(d, base=base)
    spec = RopeScaling("yarn", s, L, beta_fast=fast, beta_slow=slow, truncate=truncate)
    omega, attention = spec.frequencies(d, base)
    t = turns(plain, L)
    kept, divided = t > fast, t < slow
    assert kept.any() and divided.any() and (~kept & ~divided).any()  # the settings have all three
    assert torch.equal(omega[kept], plain[kept])
    assert torch.equal(omega[divided], plain[divided] / s)
    ramp = ramp_of(omega, plain, s)
    assert ((ramp >= -1e-12) & (ramp <= 1 + 1e-12)).all() and (ramp.diff() >= -1e-12).all()  # monotone
    assert attention == pytest.approx(0.1 * math.log(s) + 1.0)


@pytest.mark.parametrize("d, base, L, s, fast, slow", YARN)
def test_truncation_moves_the_ramps_ends_to_whole_pairs(d, base, L, s, fast, slow):
    plain = sinusoidal_frequencies(d, base=base)
    low, high = pair_turning(fast, d, base, L), pair_turning(slow, d, base, L)
    assert low > 0 and high < d // 2 - 1 and low != math.floor(low)
    for truncate, ends in ((False, (low, high)), (True, (math.floor(low), math.ceil(high)))):
        spec = RopeScaling("yarn", s, L, beta_fast=fast, beta_slow=slow, truncate=truncate)
        ramp = ramp_of(spec.frequencies(d, base)[0], plain, s)
        inside = (ramp > 1e-9) & (ramp < 1 - 1e-9)
        i = torch.arange(d // 2, dtype=D64)[inside]
        slope = (ramp[inside][-1] - ramp[inside][0]) / (i[-1] - i[0]) if len(i) > 1 else 1 / (ends[1] - ends[0])
        torch.testing.assert_close(ramp[inside], (i - ends[0]) * slope)  # a straight line from the start ...
        assert slope.item() == pytest.approx(1 / (ends[1] - ends[0]))  # ... that reaches 1 at the end
    without = RopeScaling("yarn", s, L, beta_fast=fast, beta_slow=slow, truncate=False).frequencies(d, base)[0]
    with_ = RopeScaling("yarn", s, L, beta_fast=fast, beta_slow=slow, truncate=True).frequencies(d, base)[0]
    assert not torch.allclose(without, with_)


def test_yarns_attention_factor_is_its_own_when_given():
    spec = RopeScaling("yarn", 4.0, 64, attention_factor=1.7)
    assert spec.frequencies(16)[1] == 1.7 and RopeScaling("yarn", 4.0, 64).frequencies(16)[1] == 1 + 0.1 * math.log(4)


# ---------------------------------------------------------------- Llama 3


@pytest.mark.parametrize(
    "d, base, L, s, low, high",
    [(128, 5e5, 8192, 8.0, 1.0, 4.0), (16, 100.0, 16, 4.0, 0.5, 2.0), (64, 1e4, 256, 2.0, 1.0, 8.0)],
)
def test_llama3s_three_bands_by_wavelength(d, base, L, s, low, high):
    plain = sinusoidal_frequencies(d, base=base)
    omega, attention = RopeScaling("llama3", s, L, low_freq_factor=low, high_freq_factor=high).frequencies(d, base)
    wavelength = 2 * math.pi / plain
    short, long_ = wavelength < L / high, wavelength > L / low
    medium = ~short & ~long_
    assert short.any() and long_.any() and medium.any() and attention == 1.0
    assert torch.equal(omega[short], plain[short]) and torch.equal(omega[long_], plain[long_] / s)
    ratio = omega / plain
    assert ((ratio[medium] > 1 / s) & (ratio[medium] < 1)).all() and (ratio.diff() <= 1e-15).all()
    # in the middle band the ratio is a straight line in L / wavelength: 1/s at low_freq_factor, 1 at high
    x = L / wavelength[medium]
    torch.testing.assert_close(ratio[medium], 1 / s + (1 - 1 / s) * (x - low) / (high - low))


# ---------------------------------------------------------------- what attention sees


def rotated_scores(q, k, rotary, positions=None):
    """``q (B, h, T, d)`` and ``k`` rotated by ``rotary``, then ``q . k``: ``(B, h, T, T)``."""
    return rotary(q, positions) @ rotary(k, positions).transpose(-2, -1)


SPECS = {
    "linear": RopeScaling("linear", 4.0, 16),
    "ntk": RopeScaling("ntk", 4.0, 16),
    "dynamic": RopeScaling("dynamic", 4.0, 16),
    "yarn": RopeScaling("yarn", 4.0, 16, beta_fast=2.0, beta_slow=0.1),
    "yarn-own-factor": RopeScaling("yarn", 4.0, 16, beta_fast=2.0, beta_slow=0.1, attention_factor=1.7),
    "llama3": RopeScaling("llama3", 4.0, 16, low_freq_factor=0.5, high_freq_factor=2.0),
}


@pytest.mark.parametrize("name", list(SPECS))
def test_the_attention_factor_multiplies_every_score_by_its_square(name, gen):
    spec, d, T = SPECS[name], 16, 40  # past the trained 16 positions
    q, k = (torch.randn(2, 3, T, d, dtype=D64, generator=gen) for _ in range(2))
    scores = rotated_scores(q, k, tl.RotaryEmbedding(d, base=100.0, scaling=spec))
    omega, factor = spec.frequencies(d, 100.0, seq_len=T)
    positions = torch.arange(T)
    plain_rotation = rotate_pairs(q, positions, omega) @ rotate_pairs(k, positions, omega).transpose(-2, -1)
    torch.testing.assert_close(scores, factor**2 * plain_rotation, rtol=1e-12, atol=1e-12)
    assert factor == {"yarn": 1 + 0.1 * math.log(4), "yarn-own-factor": 1.7}.get(name, 1.0)
    # the norms of the pairs are multiplied by the factor, and only by it
    pairs = tl.RotaryEmbedding(d, base=100.0, scaling=spec)(q).unflatten(-1, (d // 2, 2)).norm(dim=-1)
    torch.testing.assert_close(pairs, factor * q.unflatten(-1, (d // 2, 2)).norm(dim=-1))


@pytest.mark.parametrize("name", list(SPECS))
def test_scores_depend_on_the_offset_only_for_every_kind(name, gen):
    d, T = 16, 40
    rotary = tl.RotaryEmbedding(d, base=100.0, scaling=SPECS[name])
    # one query and one key vector at every position: the score of (m, n) is a function of n - m
    q = torch.randn(1, 1, 1, d, dtype=D64, generator=gen).expand(1, 1, T, d)
    k = torch.randn(1, 1, 1, d, dtype=D64, generator=gen).expand(1, 1, T, d)
    scores = rotated_scores(q, k, rotary)[0, 0]  # (T, T)
    for offset in range(-T + 1, T):
        diagonal = torch.diagonal(scores, offset)
        torch.testing.assert_close(diagonal, diagonal[:1].expand_as(diagonal), rtol=1e-12, atol=1e-12)
    if name != "dynamic":  # fixed frequencies: moving every position by the same amount changes nothing
        q, k = (torch.randn(1, 2, 8, d, dtype=D64, generator=gen) for _ in range(2))
        near, far = torch.arange(8), torch.arange(8) + 100
        torch.testing.assert_close(rotated_scores(q, k, rotary, near), rotated_scores(q, k, rotary, far))


# ---------------------------------------------------------------- refusals, the recipe, its dict and flags


@pytest.mark.parametrize(
    "options, message",
    [
        ({"kind": "ntk-by-parts"}, "kind must be one of"),
        ({"factor": 0.5}, "factor must be at least 1"),
        ({"factor": float("nan")}, "factor must be a finite number > 0, got nan"),
        ({"factor": True}, "factor must be a finite number"),
        ({"original_context": 0}, "original_context"),
        ({"original_context": 64.0}, "original_context"),
        ({"beta_fast": 1.0, "beta_slow": 1.0}, "beta_slow=1.0 must be below beta_fast=1.0"),
        ({"beta_fast": 0.0}, "beta_fast must be a finite number > 0"),
        ({"low_freq_factor": 4.0, "high_freq_factor": 4.0}, "low_freq_factor=4.0 must be below high_freq_factor=4.0"),
        ({"truncate": 1}, "truncate"),
        ({"attention_factor": 0.0}, "attention_factor must be None or a finite number > 0, got 0.0"),
        ({"attention_factor": float("inf")}, "attention_factor"),
    ],
)
def test_a_bad_option_is_refused_by_name(options, message):
    with pytest.raises((TypeError, ValueError), match=message):
        RopeScaling(**{"kind": "yarn", **options})


def test_bad_widths_and_scalings_are_refused_by_name():
    with pytest.raises(ValueError, match="d must be even, got 7"):
        RopeScaling("yarn", 2.0, 16).frequencies(7)
    with pytest.raises(TypeError, match="scaling must be a RopeScaling"):
        tl.RotaryEmbedding(8, scaling="yarn")
    with pytest.raises(ValueError, match="unknown rope_scaling choice 'factr'"):
        tl.GPTConfig(20, recipe="llama", rope_scaling={"kind": "yarn", "factr": 2.0})
    with pytest.raises(ValueError, match="kind must be one of .*, got 2.0"):  # the flag's value is the kind
        tl.GPTConfig(20, recipe="llama", rope_scaling=2.0)


@pytest.mark.parametrize(
    "choices, message",
    [
        ({}, "rope_scaling rescales rotary positions: positions is 'learned'"),
        ({"recipe": "latent"}, "attention is 'latent'"),
        ({"recipe": "sparse"}, "attention is 'sparse'"),
        ({"recipe": "gated_delta"}, "attention is 'gated_delta'"),
        ({"recipe": "llama", "kind": "dynamic"}, "kind 'dynamic' changes the frequencies as the sequence grows"),
    ],
)
def test_a_recipe_refuses_a_rescaling_it_cannot_apply_by_name(choices, message):
    choices = dict(choices)
    spec = {"kind": choices.pop("kind", "yarn"), "factor": 2.0, "original_context": 8}
    with pytest.raises(ValueError, match=message):
        tl.GPTConfig(20, 16, 4, 2, 16, rope_scaling=spec, **choices)


def test_a_hybrids_multi_head_layers_take_the_rescaling():
    config = tl.GPTConfig(20, 16, 2, 2, 16, recipe="hybrid", full_every=2, rope_scaling={"kind": "linear"})
    rotary = tl.GPT(config).decoder.layers[1].self_attn.qk_transform.rotary
    assert rotary.scaling == RopeScaling("linear")


@pytest.mark.parametrize("kind", [k for k in ROPE_KINDS if k != "dynamic"])
def test_a_checkpoints_dict_and_the_flat_settings_give_the_same_recipe(kind):
    spec = {"kind": kind, "factor": 4.0, "original_context": 8, "beta_fast": 4.0, "truncate": False}
    config = tl.GPTConfig(20, 32, 2, 2, 16, recipe="llama", rope_scaling=spec)
    assert config.recipe.positions.scaling == RopeScaling(**spec)
    assert tl.GPTConfig(**config.to_dict()).recipe == config.recipe
    flat = config.settings()
    assert (flat["rope_scaling"], flat["rope_factor"], flat["rope_truncate"]) == (kind, 4.0, False)
    assert tl.GPTConfig(**flat).recipe == config.recipe
    plain = tl.GPTConfig(20, recipe="llama")
    assert plain.settings()["rope_scaling"] is None and tl.GPTConfig(**plain.settings()).recipe == plain.recipe
    with pytest.raises(ValueError, match="rope_factor=4.0 is a choice of rope_scaling: give rope_scaling too"):
        tl.GPTConfig(20, recipe="llama", rope_factor=4.0)
    # the same model from the dict: equal logits past the trained length
    torch.manual_seed(0)
    model = tl.GPT(config).double().eval()
    again = tl.GPT(tl.GPTConfig(**config.to_dict())).double().eval()
    again.load_state_dict(model.state_dict())
    idx = torch.randint(0, 20, (1, 32), generator=torch.Generator().manual_seed(0))
    assert torch.equal(model(idx)[0], again(idx)[0])
    assert not torch.allclose(model(idx)[0], _unscaled(model)(idx)[0])  # and the rescaling is in use


def _unscaled(model):
    c = model.config
    unscaled = dataclasses.replace(c.recipe, positions=dataclasses.replace(c.recipe.positions, scaling=None))
    plain = tl.GPT(tl.GPTConfig(**{**c.to_dict(), "recipe": unscaled}))
    plain.load_state_dict(model.state_dict())
    return plain.double().eval()

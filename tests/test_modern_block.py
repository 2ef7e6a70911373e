"""Chapter "Today's block"'s block as properties: RMSNorm is torch's, rotary scores depend only on the offset,
the cache holds rotated keys, GPT-2's block stays the default bit for bit, and bad settings are
refused by name."""

from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
import torch

import transformer_lib as tl
from transformer_lib import cli

DATA = Path(__file__).resolve().parent / "data"
LLAMA_STYLE = dict(norm="rmsnorm", ffn="swiglu", positions="rotary", bias=False)


@pytest.mark.parametrize("eps", [1e-5, 1e-6, 0.1, np.float32(1e-5)])  # NumPy's numbers too
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_rmsnorm_equals_torch_rmsnorm(eps, dtype):
    torch.manual_seed(0)
    ours, theirs = tl.RMSNorm(12, eps=eps).to(dtype), torch.nn.RMSNorm(12, eps=eps).to(dtype)
    with torch.no_grad():
        ours.weight.normal_()
        theirs.weight.copy_(ours.weight)
    x = 3 * torch.randn(2, 5, 12, dtype=dtype)
    torch.testing.assert_close(ours(x), theirs(x))
    assert sum(p.numel() for p in ours.parameters()) == 12  # a gain, no bias


@pytest.mark.parametrize("shift", [1, 5, 17])
def test_rotary_scores_depend_only_on_the_offset(shift):
    torch.manual_seed(0)
    rotary = tl.RotaryEmbedding(8)
    q, k = torch.randn(1, 2, 6, 8, dtype=torch.float64), torch.randn(1, 2, 6, 8, dtype=torch.float64)
    scores = tl.rotate_heads(q, rotary) @ tl.rotate_heads(k, rotary).transpose(-1, -2)  # positions 0..5
    moved = tl.rotate_heads(q, rotary, shift) @ tl.rotate_heads(k, rotary, shift).transpose(-1, -2)
    torch.testing.assert_close(moved, scores, atol=1e-12, rtol=0)
    assert not torch.allclose(scores, q @ k.transpose(-1, -2))  # the rotation does change the scores


def test_swiglu_keeps_the_parameters_of_the_gelu_network():
    for d_model in (32, 64, 128, 384):
        d_ff = tl.swiglu_hidden(d_model)
        assert d_ff % 8 == 0 and 0 <= 3 * d_model * d_ff - 8 * d_model**2 <= 3 * d_model * 7
    assert tl.swiglu_hidden(128) == 344
    gpt2 = tl.GPT(tl.GPTConfig(vocab_size=65))
    llama = tl.GPT(tl.GPTConfig(vocab_size=65, **LLAMA_STYLE))
    assert abs(llama.num_params() - gpt2.num_params()) / gpt2.num_params() < 0.02


@pytest.mark.parametrize(
    "settings",
    [dict(LLAMA_STYLE, n_kv_heads=2), dict(LLAMA_STYLE, n_kv_heads=1, qk_norm=True, tie_embeddings=False),
     dict(positions="rotary", window=5), dict(qk_norm=True)],
)  # fmt: skip
def test_cached_decoding_equals_uncached_with_rotary_keys(settings):
    tl.set_seed(0)
    model = tl.GPT(tl.GPTConfig(vocab_size=30, context_len=24, n_layers=2, n_heads=4, d_model=32, **settings))
    model = model.double().eval()
    idx = torch.randint(0, 30, (2, 20), generator=torch.Generator().manual_seed(1))
    full, _ = model(idx)
    cache = model.new_cache()
    steps = [model(idx[:, :7], cache=cache)[0]] + [model(idx[:, t : t + 1], cache=cache)[0] for t in range(7, 20)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-12, rtol=0)
    greedy = model.generate(idx[:, :3], 30, top_k=1)  # past context_len too
    assert torch.equal(greedy, model.generate(idx[:, :3], 30, top_k=1, use_cache=False))


def test_rotary_model_has_no_position_table_and_its_cache_holds_rotated_keys():
    tl.set_seed(0)
    model = tl.GPT(tl.GPTConfig(vocab_size=11, n_layers=1, n_heads=2, d_model=16, **LLAMA_STYLE)).double().eval()
    assert model.pos_embed is None and not any("pos_embed" in name for name, _ in model.named_parameters())
    idx = torch.tensor([[1, 2, 3, 4]])
    cache = model.new_cache()
    model(idx, cache=cache)
    attn = model.decoder.layers[0].self_attn
    x = model.decoder.layers[0].res_self.norm(model.tok_embed(idx))
    _, k, _ = attn.project(x, x, x)
    rotated = tl.rotate_heads(k, attn.qk_transform.rotary)
    torch.testing.assert_close(cache.layers[0].self_attn.k, rotated, atol=1e-14, rtol=0)
    assert not torch.allclose(cache.layers[0].self_attn.k, k)


def test_the_default_config_is_gpt2s_block_draw_for_draw():
    # tests/data/gpt2_block_reference.pt: a seeded default GPT's weights and float64 logits, saved
    # by the code before chapter "Today's block"'s options existed
    ref = torch.load(DATA / "gpt2_block_reference.pt", weights_only=True)
    tl.set_seed(0)
    model = tl.GPT(tl.GPTConfig(**ref["config"])).double().eval()
    state = model.state_dict()
    assert list(state) == list(ref["state_dict"])  # the same parameter names, in the same order
    # the same seeded draws: equal to float32's rounding, since PyTorch's portable CPU kernels
    # (ATEN_CPU_CAPABILITY=default) round the normal distribution's transform differently in the last
    # bits (up to 3e-8 here); the loaded weights below must give the logits to float64's precision
    for k, v in ref["state_dict"].items():
        torch.testing.assert_close(state[k], v, rtol=1e-6, atol=1e-7, msg=k)
    torch.testing.assert_close(model(ref["idx"])[0], ref["logits"], atol=1e-5, rtol=0)
    loaded = tl.GPT(tl.GPTConfig(**ref["config"])).double().eval()
    loaded.load_state_dict(ref["state_dict"])  # strict: no key added or missing
    torch.testing.assert_close(loaded(ref["idx"])[0], ref["logits"], atol=1e-12, rtol=0)


def test_an_old_checkpoint_without_the_new_settings_loads_with_gpt2s_block():
    ckpt = torch.load(DATA / "gpt_checkpoint_v0.pt", weights_only=False)
    assert "norm" not in ckpt["model_config"]
    model, _, _ = tl.load_checkpoint(DATA / "gpt_checkpoint_v0.pt")
    c = model.config
    assert (c.norm, c.ffn, c.positions, c.qk_norm, c.tie_embeddings) == ("layernorm", "mlp", "learned", False, True)


def test_the_flags_and_the_llama_preset():
    args = cli.build_parser().parse_args(["--preset", "llama-cpu", "--qk-norm", "--norm-eps", "1e-6"])
    _, shape, _ = cli.model_settings(args, None, None)
    assert shape["norm"] == "rmsnorm" and shape["ffn"] == "swiglu" and shape["positions"] == "rotary"
    assert shape["bias"] is False and shape["qk_norm"] is True and shape["norm_eps"] == 1e-6
    assert shape["d_model"] == 128 and shape["n_layers"] == 4  # the CPU preset's size
    tl.GPT(tl.GPTConfig(vocab_size=65, **shape))
    with pytest.raises(SystemExit):  # argparse: a name that is not a choice
        cli.build_parser().parse_args(["--norm", "batchnorm"])


@pytest.mark.parametrize(
    "flags, message",
    [(["--norm", "rmsnorm"], "--norm layernorm, not rmsnorm"), (["--positions", "rotary"], "--positions learned"),
     (["--qk-norm"], "--qk-norm False, not True"), (["--ffn", "swiglu"], "--ffn mlp")],
)  # fmt: skip
def test_resume_refuses_a_change_of_block_by_name(flags, message, tmp_path):
    ckpt = {"model_config": tl.GPTConfig(vocab_size=65).to_dict(), "train_config": asdict(tl.TrainConfig())}
    args = cli.build_parser().parse_args(["--resume", *flags])
    with pytest.raises(ValueError, match="--resume cannot change") as err:
        cli.model_settings(args, ckpt, tmp_path / "ckpt.pt")
    assert message in str(err.value)


def test_resume_of_a_checkpoint_older_than_the_settings_reads_the_defaults(tmp_path):
    # a checkpoint saved before chapter "Today's block": its settings flat, without the block's choices (GPT-2's)
    settings = tl.GPTConfig(vocab_size=65).settings()
    old = {k: v for k, v in settings.items() if k not in tl.models.RECIPE_FIELDS or k in ("bias", "activation")}
    args = cli.build_parser().parse_args(["--resume", "--norm", "rmsnorm"])
    with pytest.raises(ValueError, match="--norm layernorm, not rmsnorm"):
        cli.model_settings(args, {"model_config": old, "train_config": {}}, tmp_path / "ckpt.pt")


BAD = [
    (
        lambda: tl.GPTConfig(vocab_size=5, norm="batchnorm"),
        ValueError,
        r"norm must be one of \['layernorm', 'rmsnorm'\]",
    ),
    (lambda: tl.GPTConfig(vocab_size=5, ffn="geglu"), ValueError, r"ffn must be one of \['mlp', 'swiglu'\]"),
    (lambda: tl.GPTConfig(5, positions="alibi"), ValueError, r"positions must be one of \['learned', 'rotary'\]"),
    (lambda: tl.GPTConfig(5, attention="flash"), ValueError, r"attention must be one of \['multi_head', 'latent', "),
    (lambda: tl.GPTConfig(5, nrom="rmsnorm"), TypeError, "'nrom' is not a choice of the block"),
    (
        lambda: tl.GPTConfig(5, recipe="mistral"),
        ValueError,
        r"recipe must be one of \['experts', 'gated_delta', 'gpt2', 'hybrid', ",
    ),
    (lambda: tl.GPTConfig(5, recipe=3), TypeError, "recipe must be a BlockRecipe"),
    (lambda: tl.GPTConfig(vocab_size=5, qk_norm="yes"), TypeError, "qk_norm"),
    (lambda: tl.GPTConfig(vocab_size=5, tie_embeddings=1), TypeError, "tie_embeddings"),
    (lambda: tl.GPTConfig(vocab_size=5, norm_eps=0.0), ValueError, "norm_eps"),
    (lambda: tl.GPTConfig(vocab_size=5, rotary_base=-1.0), ValueError, "rotary_base"),
    (lambda: tl.GPTConfig(vocab_size=5, d_ff=0), ValueError, "d_ff"),
    (
        lambda: tl.GPTConfig(vocab_size=5, ffn="swiglu", activation="gelu_tanh"),
        ValueError,
        "activation='gelu_tanh' is mlp ffn's",
    ),
    (lambda: tl.GPTConfig(vocab_size=5, d_model=12, n_heads=4, positions="rotary"), ValueError, "must be even"),
    (lambda: tl.RMSNorm(8, eps=0), ValueError, "eps must be a number > 0"),
    (lambda: tl.RMSNorm(8)(torch.zeros(2, 7)), ValueError, "expected last dimension d=8"),
    (lambda: tl.rotate_heads(torch.zeros(2, 3, 8), tl.RotaryEmbedding(8)), ValueError, r"\(B, h, T, d_k\)"),
    (lambda: tl.rotate_heads(torch.zeros(1, 2, 3, 8), tl.RotaryEmbedding(8), -1), ValueError, "start"),
    (lambda: tl.DecoderLayer(16, 2, parts=tl.LLAMA_BLOCK, bias=False), ValueError, "in the parts"),
    (lambda: tl.Decoder(16, 2, 1, parts="swiglu"), TypeError, "parts must make a block's parts"),
    (lambda: tl.QKTransform(8, qk_norm="yes"), TypeError, "qk_norm"),
]


@pytest.mark.parametrize("make, error, message", BAD)
def test_bad_settings_are_refused_by_name(make, error, message):
    with pytest.raises(error, match=message):
        make()

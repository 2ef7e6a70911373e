"""Weight quantisation (chapter "Measuring a model"): per-channel int8 equals PyTorch's own quantisation bit for bit,
NF4's codebook, codes and dequantised weights equal bitsandbytes' (and torchao's to its printed
decimals), every weight is within half a step of its dequantised value, NF4 and narrow-range int8
are idempotent, and a model of every recipe quantises into a copy that computes nearly the same."""

import sys
import warnings
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.ao.quantization import PerChannelMinMaxObserver

import transformer_lib as tl

pytestmark = [
    pytest.mark.usefixtures("one_thread"),
    pytest.mark.filterwarnings("ignore:torch.quantize_per_tensor:UserWarning"),  # deprecated, still the reference
]


def torch_int8(w, narrow_range=False):
    """PyTorch's own per-channel symmetric int8: ``(codes, scales, dequantised)``."""
    limits = dict(quant_min=-127, quant_max=127) if narrow_range else {}
    observer = PerChannelMinMaxObserver(ch_axis=0, dtype=torch.qint8, qscheme=torch.per_channel_symmetric, **limits)
    observer(w)
    scales, zero_points = observer.calculate_qparams()
    q = torch.quantize_per_channel(w, scales, zero_points, 0, torch.qint8)
    return q.int_repr(), scales, q.dequantize()


def awkward_weight(seed, out, inn, largest=3.4e38):
    """Rows of very different sizes (10^-45 .. ``largest``, subnormal to float32's largest), rows of
    zeros, rows with a single weight, and rows whose values sit exactly halfway between two codes."""
    g = torch.Generator().manual_seed(seed)
    exponent = torch.empty(out, 1).uniform_(-45, 37, generator=g)
    w = torch.randn(out, inn, generator=g) * 10.0**exponent
    kind = torch.randint(0, 6, (out,), generator=g)
    w[kind == 0] = 0.0
    w[kind == 1, 1:] = 0.0
    ties = kind == 2  # max 127.5 * 2^-7: the scale is 2^-7 exactly and k + 1/2 steps a tie
    steps = torch.randint(-127, 127, (int(ties.sum()), inn), generator=g) + 0.5
    steps[:, 0] = 127.5
    w[ties] = steps * 2.0**-7
    w[kind == 3] = (torch.rand(int((kind == 3).sum()), inn, generator=g) * 2 - 1) * largest
    return w


def test_int8_equals_pytorch_bit_for_bit_on_a_million_weights():
    w = awkward_weight(0, 4096, 256)
    for narrow in (False, True):
        codes, scales = tl.quantize_int8(w, narrow_range=narrow)
        want_codes, want_scales, want = torch_int8(w, narrow)
        assert torch.equal(scales, want_scales) and scales.dtype == torch.float32
        assert torch.equal(codes, want_codes) and codes.dtype == torch.int8
        assert torch.equal(tl.dequantize_int8(codes, scales), want)
        assert int(codes.min()) == (-127 if narrow else -128) and int(codes.max()) == 127
    s = tl.quantize_int8(w)[1][:, None]  # dividing instead of multiplying by 1 / s would round some the other way
    assert not torch.equal(torch.round(w / s), torch.round(w * (1 / s)))


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**31), st.integers(1, 24), st.integers(1, 80), st.booleans())
def test_int8_equals_pytorch_on_any_shape(seed, out, inn, narrow):
    w = awkward_weight(seed, out, inn)
    codes, scales = tl.quantize_int8(w, narrow_range=narrow)
    want_codes, want_scales, want = torch_int8(w, narrow)
    assert torch.equal(scales, want_scales) and torch.equal(codes, want_codes)
    assert torch.equal(tl.dequantize_int8(codes, scales), want)


def test_int8_ties_round_half_to_even():
    w = torch.tensor([[127.5, 0.5, 1.5, 2.5, -0.5, -1.5, -127.5]]) * 2.0**-7  # scale 2^-7: every value a tie
    codes, scales = tl.quantize_int8(w)
    assert scales.item() == 2.0**-7
    assert codes.tolist() == [[127, 0, 2, 2, 0, -2, -128]] == torch_int8(w)[0].tolist()


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**31), st.integers(1, 24), st.integers(1, 80), st.booleans())
def test_int8_error_is_at_most_half_a_step(seed, out, inn, narrow):
    w = awkward_weight(seed, out, inn, largest=3.3e38)  # -128 steps of a row of 3.4e38 overflow to -inf
    codes, scales = tl.quantize_int8(w, narrow_range=narrow)
    error = (w.double() - tl.dequantize_int8(codes, scales).double()).abs()  # (out, in)
    assert (error <= scales.double()[:, None] * (0.5 + 2**-15)).all()  # half a step, up to float32's rounding


def int8_round_trip(w, narrow):
    return tl.dequantize_int8(*tl.quantize_int8(w, narrow_range=narrow))


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**31), st.integers(1, 24), st.integers(1, 80))
def test_narrow_int8_keeps_its_codes_and_settles_after_one_more_round_trip(seed, out, inn):
    w = torch.randn(out, inn, generator=torch.Generator().manual_seed(seed)) * 10.0 ** (seed % 40 - 20)
    codes, scales = tl.quantize_int8(w, narrow_range=True)
    once = tl.dequantize_int8(codes, scales)
    codes2, scales2 = tl.quantize_int8(once, narrow_range=True)
    assert torch.equal(codes2, codes)
    # scale' = fl(fl(127 s) / 127) is s or one float32 step away (0.8 % of scales), and a fixed point
    assert ((scales2 - scales).abs() <= torch.finfo(torch.float32).eps * scales).all()
    twice = tl.dequantize_int8(codes2, scales2)
    assert torch.equal(int8_round_trip(twice, True), twice)


def test_pytorchs_default_int8_is_not_idempotent():
    """Its scale divides by 127.5: a row whose largest weight is positive lands on 127 and the next
    round trip's scale is 127 / 127.5 of it; one whose largest is negative lands on -128 (128 / 127.5)."""
    w = torch.tensor([[127.5, 40.0, -30.0], [-127.5, 40.0, 30.0]]) * 2.0**-7  # the scale is 2^-7 exactly
    once = int8_round_trip(w, False)
    _, s1 = tl.quantize_int8(w)
    _, s2 = tl.quantize_int8(once)
    torch.testing.assert_close(s2 / s1, torch.tensor([127 / 127.5, 128 / 127.5]))
    assert not torch.equal(int8_round_trip(once, False), once)


@pytest.fixture(scope="module")
def bnb():
    """bitsandbytes' functional module (the test is skipped where it is not installed). scripts/test.sh
    installs it in a folder of its own, out of the notebooks' environment, which this puts on the path."""
    kept_apart = Path(__file__).resolve().parent.parent / ".cache" / "bitsandbytes"
    if kept_apart.is_dir() and str(kept_apart) not in sys.path:
        sys.path.append(str(kept_apart))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # it warns about optional kernels at import
        pytest.importorskip("bitsandbytes", reason="bitsandbytes is not installed")
        import bitsandbytes.functional as functional
    return functional


def bnb_nf4(bnb, w, block_size):
    """bitsandbytes' NF4 of ``w``: ``(codes unpacked to w's shape, absmax, packed, state)``. It packs
    two codes a byte, the first in the high four bits."""
    packed, state = bnb.quantize_4bit(w, blocksize=block_size, quant_type="nf4")
    flat = packed.reshape(-1)
    codes = torch.stack([flat >> 4, flat & 0xF], dim=1).reshape(-1)[: w.numel()].view(w.shape)
    return codes, state.absmax, packed, state


def test_the_nf4_codebook_is_bitsandbytes_bit_for_bit_and_torchaos_to_its_four_decimals(bnb):
    code = tl.nf4_codebook()
    assert code.dtype == torch.float32 and code.shape == (16,)
    assert torch.equal(code, code.sort().values) and code[0] == -1 and code[-1] == 1 and code[7] == 0
    assert (code < 0).sum() == 7 and (code > 0).sum() == 8  # one more positive value: an exact zero
    assert torch.equal(code, bnb.get_4bit_type("nf4", device="cpu"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        nf4_tensor = pytest.importorskip("torchao.quantization.quantize_.workflows.nf4.nf4_tensor")
    table = nf4_tensor.to_nf4(torch.randn(256, 64)).nf4  # torchao prints its table to 4 decimals
    assert (table - code).abs().max() <= 5e-5


NF4_CASES = [
    ((1024, 1024), 64), ((96, 128), 64), ((31, 32), 64), ((7, 9), 64), ((300, 77), 32), ((64, 64), 128),
    ((333, 100), 256),
]  # fmt: skip


@pytest.mark.parametrize(("shape", "block_size"), NF4_CASES)
def test_nf4_codes_and_weights_equal_bitsandbytes(bnb, shape, block_size):
    g = torch.Generator().manual_seed(sum(shape))
    w = torch.randn(shape, generator=g) * 10.0 ** torch.empty(shape[0], 1).uniform_(-20, 20, generator=g)
    w[0] = 0.0  # a block of zeros
    w[1] *= 1e-25  # subnormal
    w[-1] = (torch.rand(shape[1], generator=g) * 2 - 1) * 3.4e38  # near float32's largest
    codes, absmax = tl.quantize_nf4(w, block_size)
    want_codes, want_absmax, packed, state = bnb_nf4(bnb, w, block_size)
    assert codes.dtype == torch.uint8 and codes.shape == w.shape and int(codes.max()) <= 15
    assert torch.equal(codes, want_codes)
    nonzero = absmax > 0  # an all-zero last, shorter block: bitsandbytes stores 1e-38, this library 0
    assert torch.equal(absmax[nonzero], want_absmax[nonzero]) and absmax.shape == want_absmax.shape
    deq = tl.dequantize_nf4(codes, absmax, w.shape, block_size)
    scale = want_absmax.repeat_interleave(block_size)[: w.numel()].view(w.shape)
    assert torch.equal(deq, state.code[want_codes.long()] * scale)  # its table times its absmax
    if shape[1] % block_size == 0:
        # its native CPU kernel; it gives an even row shorter than a block another block's absmax, and
        # an odd row goes to a torch.compile'd function (seconds per shape)
        assert torch.equal(deq, bnb.dequantize_4bit(packed, state))


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**31), st.integers(1, 40), st.integers(1, 70), st.sampled_from([32, 64, 128, 256]))
def test_nf4_equals_bitsandbytes_on_any_shape(bnb, seed, out, inn, block_size):
    w = torch.randn(out, inn, generator=torch.Generator().manual_seed(seed)) * 10.0 ** (seed % 60 - 30)
    codes, absmax = tl.quantize_nf4(w, block_size)
    want_codes, want_absmax, _, _ = bnb_nf4(bnb, w, block_size)
    assert torch.equal(codes, want_codes) and torch.equal(absmax, want_absmax)


def test_an_nf4_value_halfway_between_two_codes_takes_the_lower(bnb):
    code = tl.nf4_codebook()
    midpoints = (code[:-1] + code[1:]) / 2  # float32, as bitsandbytes computes them
    w = torch.cat([torch.ones(1), midpoints, torch.zeros(64 - 16)]).view(1, 64)  # absmax 1: scaled = w exactly
    codes, _ = tl.quantize_nf4(w)
    assert codes[0, 1:16].tolist() == list(range(15))  # 15 ties, each to the lower (more negative) code
    assert torch.equal(codes, bnb_nf4(bnb, w, 64)[0])


def test_nf4_codes_equal_torchaos_but_where_its_rounded_table_moves_a_midpoint():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        nf4_tensor = pytest.importorskip("torchao.quantization.quantize_.workflows.nf4.nf4_tensor")
    w = torch.randn(256, 256, generator=torch.Generator().manual_seed(0))
    packed = nf4_tensor.to_nf4(w, 64, 256).quantized_data  # two codes a byte, the first high, as bitsandbytes
    theirs = torch.stack([packed >> 4, packed & 0xF], dim=1).view(w.shape)
    codes, absmax = tl.quantize_nf4(w)
    code = tl.nf4_codebook()
    scaled = (w.view(-1, 64) / absmax[:, None]).view(w.shape)
    near = ((scaled[..., None] - (code[:-1] + code[1:]) / 2).abs() < 5e-5).any(-1)  # within its rounding
    assert torch.equal(codes[~near], theirs[~near]) and 0 < int(near.sum()) < 100


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**31), st.integers(1, 40), st.integers(1, 70), st.sampled_from([16, 64, 100]))
def test_nf4_error_is_within_half_a_gap_and_quantising_again_changes_nothing(seed, out, inn, block_size):
    w = torch.randn(out, inn, generator=torch.Generator().manual_seed(seed)) * 10.0 ** (seed % 60 - 30)
    codes, absmax = tl.quantize_nf4(w, block_size)
    deq = tl.dequantize_nf4(codes, absmax, w.shape, block_size)
    code = tl.nf4_codebook().double()
    gap = torch.cat([code[1:2] - code[:1], code[1:] - code[:-1], code[-1:] - code[-2:-1]])  # (17,) edges doubled
    k = codes.long()
    half_gap = torch.maximum(gap[k], gap[k + 1]) / 2  # the larger gap beside each weight's code
    scale = absmax.double().repeat_interleave(block_size)[: w.numel()].view(w.shape)
    assert ((w.double() - deq.double()).abs() <= scale * half_gap * (1 + 1e-6)).all()
    codes2, absmax2 = tl.quantize_nf4(deq, block_size)
    assert torch.equal(codes2, codes) and torch.equal(absmax2, absmax)
    assert torch.equal(tl.dequantize_nf4(codes2, absmax2, w.shape, block_size), deq)


# ---- whole models ----

RECIPES = {**tl.RECIPES, "linear": tl.as_recipe("llama", attention="linear"), "delta": tl.as_recipe("llama",
           attention="delta"), "untied": tl.as_recipe("llama", tie_embeddings=False)}  # fmt: skip


def small_gpt(recipe="gpt2", seed=0, dtype=torch.float32):
    torch.manual_seed(seed)
    n_layers = 4 if recipe == "hybrid" else 2  # the hybrid's fourth layer is multi-head attention
    config = tl.GPTConfig(31, 16, n_layers, 4, 32, recipe=RECIPES[recipe])
    return tl.GPT(config).to(dtype).eval()


def matrices(model, roles=("attention", "feed_forward")):
    names = set()
    for role in roles:
        for part_name, part in tl.find_parts(model, role).items():
            names |= {f"{part_name}.{n}".lstrip(".") for n, p in part.named_parameters() if p.dim() == 2}
    return names


@pytest.mark.parametrize("recipe", sorted(RECIPES))
@pytest.mark.parametrize("method", tl.QUANT_METHODS)
def test_every_recipe_quantises_into_a_copy_that_computes_nearly_the_same(recipe, method):
    model = small_gpt(recipe)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x = torch.randint(0, 31, (2, 16), generator=torch.Generator().manual_seed(1))
    want = model(x)[0]
    small, report = tl.quantize_weights(model, method)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())  # the original is untouched
    got = small(x)[0]
    assert torch.isfinite(got).all()
    error = (got - want).pow(2).mean().sqrt() / want.std()  # seeds 0-2 of every recipe: at most 0.005 and 0.08
    assert error <= {"int8": 0.02, "nf4": 0.25}[method], error
    names = report["weights_quantised"]
    params = dict(model.named_parameters())
    assert set(names) == matrices(model) and all(params[n].dim() == 2 for n in names)
    quantised = dict(small.named_parameters())
    round_trip = {"int8": lambda w: tl.dequantize_int8(*tl.quantize_int8(w)),
                  "nf4": lambda w: tl.dequantize_nf4(*tl.quantize_nf4(w), w.shape)}[method]  # fmt: skip
    for name, p in params.items():
        if name in names:
            assert torch.equal(quantised[name], round_trip(p)) and not torch.equal(quantised[name], p), name
        else:  # embeddings, the head, norms, biases, the short convolution: as they were
            assert torch.equal(quantised[name], p), name
    n = sum(params[k].numel() for k in names)
    shapes = [params[k].shape for k in names]
    bits = {
        "int8": sum(8 * o * i + 32 * o for o, i in shapes),  # codes and a float32 scale per row
        "nf4": sum(4 * o * i + 32 * -(-o * i // 64) for o, i in shapes),  # codes and a float32 absmax per block
    }
    assert report["method"] == method and report["bits_per_weight"] == bits[method] / n
    if method == "nf4":
        assert report["bits_per_weight"] == 4.5  # the book's small matrices fill whole blocks of 64
    full = sum(p.numel() * 4 for p in model.parameters())
    assert report["bytes_before"] == tl.weight_bytes(model) == full
    assert report["bytes_after"] == tl.weight_bytes(model, method) == full - 4 * n + bits[method] // 8


@pytest.mark.parametrize("recipe", ["gpt2", "latent", "hybrid"])
def test_quantising_a_quantised_model_again_changes_nothing(recipe):
    model = small_gpt(recipe, dtype=torch.float64)
    once, _ = tl.quantize_weights(model, "nf4")
    twice, _ = tl.quantize_weights(once, "nf4")
    assert all(torch.equal(v, twice.state_dict()[k]) for k, v in once.state_dict().items())
    once, _ = tl.quantize_weights(model, "int8", narrow_range=True)
    twice, _ = tl.quantize_weights(once, "int8", narrow_range=True)
    thrice, _ = tl.quantize_weights(twice, "int8", narrow_range=True)
    assert all(torch.equal(v, thrice.state_dict()[k]) for k, v in twice.state_dict().items())


def test_embeddings_and_a_tied_head_are_quantised_together_or_not_at_all():
    model = small_gpt("gpt2")  # the head is the token embedding's matrix
    small, report = tl.quantize_weights(model, "int8", include=("attention", "feed_forward", "embedding", "head"))
    assert "tok_embed.weight" in report["weights_quantised"]  # the learned positions are no part: left as they are
    assert "pos_embed.embedding.weight" not in report["weights_quantised"]
    assert small.lm_head.weight is small.tok_embed.weight and not torch.equal(small.tok_embed.weight,
                                                                              model.tok_embed.weight)  # fmt: skip
    with pytest.raises(ValueError, match=r"tok_embed.weight is shared with lm_head.weight \(tied weights\)"):
        tl.quantize_weights(model, "nf4", include=("embedding",))
    with pytest.raises(ValueError, match=r"lm_head.weight is shared with tok_embed.weight \(tied weights\)"):
        tl.quantize_weights(model, "nf4", include=("attention", "head"))
    llama = small_gpt("untied")  # the head alone
    _, report = tl.quantize_weights(llama, "nf4", include="head")
    assert report["weights_quantised"] == ["lm_head.weight"]
    assert report["bits_per_weight"] == (4 * 992 + 32 * 16) / 992  # 31 * 32 weights: 15 blocks of 64, one of 32


def test_a_lora_adapted_model_is_refused_until_its_adapters_are_merged():
    model = small_gpt("gpt2")
    tl.add_lora(model, ["*.self_attn.in_proj_weight", "*.ff.net.*.weight"], rank=2)
    with pytest.raises(ValueError, match=r"decoder.layers.0.self_attn.in_proj_weight carries a parametrization.*"
                                         r"remove_lora"):  # fmt: skip
        tl.quantize_weights(model, "nf4")
    tl.remove_lora(model)  # the adapters merged into the weights
    small, report = tl.quantize_weights(model, "nf4")
    assert "decoder.layers.0.self_attn.in_proj_weight" in report["weights_quantised"]
    tl.add_lora(small, ["*.self_attn.in_proj_weight"], rank=2)  # QLoRA's order: adapters on the quantised base
    x = torch.randint(0, 31, (1, 16))
    assert torch.isfinite(small(x)[0]).all()


@pytest.mark.parametrize(
    ("call", "error", "words"),
    [
        (lambda: tl.quantize_int8(torch.randn(5)), ValueError, ["matrix (out, in)", "(5,)"]),
        (lambda: tl.quantize_nf4(torch.randn(2, 3, 4)), ValueError, ["matrix (out, in)", "(2, 3, 4)"]),
        (lambda: tl.quantize_int8(torch.ones(2, 3, dtype=torch.int64)), TypeError, ["floating-point", "torch.int64"]),
        (lambda: tl.quantize_nf4([[1.0, 2.0]]), TypeError, ["torch.Tensor", "list"]),
        (lambda: tl.quantize_int8(torch.zeros(0, 4)), ValueError, ["empty", "(0, 4)"]),
        (lambda: tl.quantize_int8(torch.tensor([[1.0, 2.0], [3.0, float("nan")]])), ValueError,
         ["1 NaN or infinite", "nan at (1, 1)"]),
        (lambda: tl.quantize_nf4(torch.tensor([[float("-inf"), 1.0]])), ValueError, ["NaN or inf", "-inf at (0, 0)"]),
        (lambda: tl.quantize_int8(torch.tensor([[1e300, 1.0]], dtype=torch.float64)), ValueError, ["in float32"]),
        (lambda: tl.quantize_nf4(torch.randn(4, 4), block_size=0), ValueError, ["block_size", "positive", "0"]),
        (lambda: tl.quantize_nf4(torch.randn(4, 4), block_size=64.0), TypeError, ["block_size must be an int", "64.0"]),
        (lambda: tl.quantize_int8(torch.randn(4, 4), narrow_range="yes"), TypeError, ["narrow_range", "'yes'"]),
        (lambda: tl.quantize_weights(small_gpt(), "int4"), ValueError, ["must be one of ['int8', 'nf4']", "'int4'"]),
        (lambda: tl.weight_bytes(small_gpt(), "fp8"), ValueError, ["method must be one of", "'fp8'"]),
        (lambda: tl.quantize_weights(small_gpt(), "nf4", include=("norm",)), ValueError, ["'norm'", "'attention'"]),
        (lambda: tl.quantize_weights(small_gpt(), "nf4", include=()), TypeError, ["tuple of part roles"]),
        (lambda: tl.quantize_weights(torch.nn.Sequential(torch.nn.Linear(4, 4)), "nf4"), ValueError, ["nothing to"]),
        (lambda: tl.quantize_weights(torch.randn(4, 4), "nf4"), TypeError, ["torch.nn.Module", "Tensor"]),
        (lambda: tl.dequantize_int8(torch.zeros(2, 3), torch.ones(2)), TypeError, ["int8 matrix", "torch.float32"]),
        (lambda: tl.dequantize_int8(torch.zeros(2, 3, dtype=torch.int8), torch.ones(3)), ValueError, ["(2,)", "(3,)"]),
        (lambda: tl.dequantize_nf4(torch.full((2, 32), 16, dtype=torch.uint8), torch.ones(1), (2, 32)), ValueError,
         ["0 .. 15", "16"]),
        (lambda: tl.dequantize_nf4(torch.zeros(2, 32, dtype=torch.uint8), torch.ones(2), (2, 32)), ValueError,
         ["absmax must be float32 of shape (1,)", "(2,)"]),
        (lambda: tl.dequantize_nf4(torch.zeros(2, 32, dtype=torch.uint8), torch.ones(1), (2, 31)), ValueError,
         ["64 values", "(2, 31)"]),
    ],
)  # fmt: skip
def test_bad_input_is_named(call, error, words):
    with pytest.raises(error) as e:
        call()
    assert all(w in str(e.value) for w in words), str(e.value)


def test_a_bad_weight_inside_a_model_is_named():
    model = small_gpt("llama")
    with torch.no_grad():
        model.decoder.layers[1].ff.up_proj.weight[3, 4] = float("nan")
    with pytest.raises(ValueError, match=r"decoder.layers.1.ff.up_proj.weight holds 1 NaN .* at \(3, 4\)"):
        tl.quantize_weights(model, "int8")

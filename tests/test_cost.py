"""Tests for transformer_lib/cost.py: receptive fields of convolution stacks (chapter "Why attention?"), training
FLOPs and MFU (chapter "A GPT from scratch"), and the peak-memory probe."""

import pytest
import torch

import transformer_lib as tl


@pytest.mark.parametrize("k", [2, 3, 5])
@pytest.mark.parametrize("dilated", [False, True])
def test_layers_to_connect_is_the_fewest_layers_whose_field_covers_n(k, dilated):
    for n in range(1, 200):
        L = tl.layers_to_connect(n, k, dilated)
        assert tl.receptive_field(L, k, dilated) >= n  # enough layers
        if L > 0:
            assert tl.receptive_field(L - 1, k, dilated) < n  # and no fewer would do


def test_receptive_field_grows_linearly_or_exponentially():
    assert [tl.receptive_field(L, 3) for L in range(4)] == [1, 3, 5, 7]
    assert [tl.receptive_field(L, 3, dilated=True) for L in range(4)] == [1, 3, 9, 27]


BAD_SIZES = [(tl.receptive_field, (-1, 3)), (tl.receptive_field, (2, 0)), (tl.layers_to_connect, (0, 3)),
             (tl.layers_to_connect, (5, 1))]  # fmt: skip


@pytest.mark.parametrize(("call", "args"), BAD_SIZES)
def test_bad_sizes_raise(call, args):
    with pytest.raises(ValueError, match="must be"):
        call(*args)


def test_flops_per_token_counts_parameters_and_attention():
    model = tl.GPT(tl.GPTConfig(vocab_size=11, context_len=16, n_layers=2, n_heads=2, d_model=32))
    assert tl.flops_per_token(model, 16) == 6 * model.num_params() + 12 * 2 * 32 * 16
    assert tl.flops_per_token(model, 8) < tl.flops_per_token(model, 16)
    assert tl.estimate_mfu(model, 1000.0, 16, 1e12) == pytest.approx(tl.flops_per_token(model, 16) * 1000 / 1e12)


def test_gpu_peaks_prefer_the_specific_name():
    assert tl.gpu_peak_flops("NVIDIA H100 PCIe") == tl.PEAK_FLOPS["H100 PCIe"] < tl.gpu_peak_flops("NVIDIA H100 SXM")


def test_peak_memory_sees_a_large_temporary_on_the_cpu():
    n = 1 << 20  # a float32 tensor of 4 MiB, made and dropped inside the call

    def call():
        x = torch.ones(n)
        return float((x * 2).sum())

    peak = tl.peak_memory_bytes(call, "cpu")
    assert peak >= 4 * n
    assert tl.peak_memory_bytes(lambda: None, "cpu") == 0

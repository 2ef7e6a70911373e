"""Tests for the chapter 7 additions to transformer_lib/blocks.py."""

import math

import torch

import transformer_lib as tl
from transformer_lib.blocks import layer_grad_norms


def test_layer_grad_norms_matches_a_manual_sum(gen):
    enc = tl.Encoder(3, 8, 2, 16)
    x = torch.randn(2, 5, 8, generator=gen)
    enc(x).pow(2).sum().backward()
    norms = layer_grad_norms(enc.layers)
    assert norms.shape == (3,) and norms.dtype == torch.float32
    for layer, norm in zip(enc.layers, norms, strict=True):
        manual = math.sqrt(sum(float(p.grad.double().pow(2).sum()) for p in layer.parameters()))
        assert math.isclose(float(norm), manual, rel_tol=1e-5)


def test_layer_grad_norms_counts_missing_gradients_as_zero(gen):
    enc = tl.Encoder(2, 8, 2, 16)
    assert torch.equal(layer_grad_norms(enc.layers), torch.zeros(2))  # no backward yet
    x = torch.randn(1, 3, 8, generator=gen)
    enc.layers[1](x).sum().backward()  # only the second layer gets gradients
    norms = layer_grad_norms(enc.layers)
    assert norms[0] == 0 and norms[1] > 0


def test_layer_grad_norms_handles_empty_lists_and_parameterless_layers():
    assert layer_grad_norms([]).shape == (0,)
    assert torch.equal(layer_grad_norms([torch.nn.ReLU(), torch.nn.Identity()]), torch.zeros(2))


def test_layer_grad_norms_is_exported_from_blocks():
    assert "layer_grad_norms" in tl.blocks.__all__
    assert tl.blocks.layer_grad_norms is layer_grad_norms

"""Tests for transformer_lib/masks.py."""

import pytest
import torch

import transformer_lib as tl


@pytest.mark.parametrize("T_q,T_k", [(1, 1), (5, 5), (3, 7), (4, 4)])
def test_causal_mask_definition(T_q, T_k):
    m = tl.causal_mask(T_q, T_k)
    assert m.dtype == torch.bool and m.shape == (T_q, T_k)
    offset = T_k - T_q  # queries are the last T_q positions of the keys
    for i in range(T_q):
        for j in range(T_k):
            assert m[i, j].item() == (j <= i + offset)


def test_causal_mask_default_square_and_device():
    m = tl.causal_mask(4, device="cpu")
    assert torch.equal(m, torch.ones(4, 4, dtype=torch.bool).tril())
    assert m.device.type == "cpu"


def test_causal_mask_bad_sizes():
    with pytest.raises(ValueError, match="T_q must be a positive int"):
        tl.causal_mask(0)
    with pytest.raises(ValueError, match="T_k must be a positive int"):
        tl.causal_mask(3, -1)


def test_padding_mask():
    m = tl.padding_mask(torch.tensor([3, 1, 0]), 4)
    assert m.dtype == torch.bool
    assert m.int().tolist() == [[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]]
    assert tl.padding_mask([2], 2).all()
    with pytest.raises(ValueError, match="lengths must lie in"):
        tl.padding_mask(torch.tensor([5]), 4)
    with pytest.raises(TypeError, match="integer"):
        tl.padding_mask(torch.tensor([1.5]), 4)


def test_combine_masks_shapes_and_logic():
    pad = tl.padding_mask(torch.tensor([3, 5]), 5)  # (B, T_k)
    m = tl.combine_masks(pad, causal=True)
    assert m.shape == (2, 1, 5, 5)
    expected = pad[:, None, None, :] & torch.ones(5, 5, dtype=torch.bool).tril()
    assert torch.equal(m, expected)
    cross = tl.combine_masks(pad, T_q=3)  # cross-attention: decoder length 3, encoder length 5
    assert cross.shape == (2, 1, 3, 5)
    assert torch.equal(cross[0, 0], pad[0].expand(3, 5))
    with pytest.raises(TypeError, match="bool tensor of shape"):
        tl.combine_masks(torch.ones(2, 5), causal=True)

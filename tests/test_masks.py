"""Tests for transformer_lib/masks.py."""

import pytest
import torch
from torch import nn

import transformer_lib as tl
from transformer_lib.masks import Seq2SeqMasks, additive_mask, seq2seq_masks, to_ignore_mask


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


def test_to_ignore_mask_inverts_and_validates():
    keep = tl.padding_mask([3, 1], 4)
    assert torch.equal(to_ignore_mask(keep), ~keep)
    with pytest.raises(TypeError, match="bool"):
        to_ignore_mask(keep.int())


def test_ignore_mask_makes_torch_mha_agree_with_the_library():
    tl.set_seed(0)
    torch_mha = nn.MultiheadAttention(8, 2, batch_first=True)
    ours = tl.MultiHeadAttention.from_torch(torch_mha)
    x = torch.randn(2, 5, 8)
    keep = tl.padding_mask([5, 3], 5)
    out_ours, w_ours = ours(x, x, x, mask=tl.combine_masks(keep, causal=True), need_weights=True)
    out_torch, w_torch = torch_mha(
        x,
        x,
        x,
        key_padding_mask=to_ignore_mask(keep),
        attn_mask=to_ignore_mask(tl.causal_mask(5)),
        need_weights=True,
        average_attn_weights=False,
    )
    torch.testing.assert_close(out_ours, out_torch)
    torch.testing.assert_close(w_ours, w_torch)


ALL_FLOATS = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
# the largest |score| whose sum with the default fill rounds back to the fill
ABSORBED = {
    torch.float16: 8.0,
    torch.bfloat16: 2.0**118,
    torch.float32: 2.0**102,
    torch.float64: 2.0**969,
}


@pytest.mark.parametrize("dtype", ALL_FLOATS)
def test_additive_mask_values(dtype):
    mask = tl.causal_mask(3)
    add = additive_mask(mask, dtype=dtype)
    assert add.dtype == dtype and add.shape == (3, 3)
    assert torch.all(add[mask] == 0)
    assert torch.all(add[~mask] == torch.finfo(dtype).min / 2)


def _random_scores(dtype, shape, scale, seed):
    g = torch.Generator().manual_seed(seed)
    return ((torch.rand(shape, generator=g, dtype=torch.float64) * 2 - 1) * scale).to(dtype)


@pytest.mark.parametrize("dtype", ALL_FLOATS)
@pytest.mark.parametrize("seed", range(5))
def test_additive_mask_never_overflows(dtype, seed):
    # any score up to half the dtype's largest value, plus the mask, stays finite,
    # and so does the softmax, also on rows whose keys are all masked
    info = torch.finfo(dtype)
    g = torch.Generator().manual_seed(100 + seed)
    mask = torch.rand(4, 6, 6, generator=g) < 0.5
    mask[0] = False  # a batch entry with every key masked
    for scale in (1.0, 20.0, 1e3, info.max / 2):
        scores = _random_scores(dtype, (4, 6, 6), scale, seed)
        scores[..., 0] = -info.max / 2  # the extremes themselves
        scores[..., 1] = info.max / 2
        summed = scores + additive_mask(mask, dtype=dtype)
        assert torch.isfinite(summed).all(), (dtype, scale)
        weights = torch.softmax(summed, -1)
        assert torch.isfinite(weights).all(), (dtype, scale)


@pytest.mark.parametrize("dtype", ALL_FLOATS)
def test_additive_mask_float16_regression_scores_minus_20_and_minus_30(dtype):
    # finfo.min + (-20) overflows to -inf in float16 and the softmax of the
    # fully masked row is NaN; the default fill must not
    scores = torch.tensor([[-20.0, -30.0]], dtype=dtype)
    mask = torch.zeros(1, 2, dtype=torch.bool)
    weights = torch.softmax(scores + additive_mask(mask, dtype=dtype), -1)
    assert torch.equal(weights, torch.full_like(weights, 0.5))


@pytest.mark.parametrize("dtype", ALL_FLOATS)
@pytest.mark.parametrize("seed", range(5))
def test_additive_mask_fully_masked_row_is_uniform_within_the_stated_bound(dtype, seed):
    bound = ABSORBED[dtype]
    scores = _random_scores(dtype, (3, 5, 7), bound * 0.99, seed)
    mask = torch.zeros(3, 5, 7, dtype=torch.bool)
    summed = scores + additive_mask(mask, dtype=dtype)
    assert torch.all(summed == torch.finfo(dtype).min / 2)
    weights = torch.softmax(summed, -1)
    assert torch.equal(weights, torch.full_like(weights, 1 / 7))


@pytest.mark.parametrize("dtype", ALL_FLOATS)
@pytest.mark.parametrize("seed", range(5))
def test_additive_mask_masked_weight_is_exactly_zero_and_matches_the_bool_path(dtype, seed):
    # scores spread far less than |fill| - 750: masked weights are exactly 0
    # and the weights equal tl.masked_softmax's, computed in the same dtype
    g = torch.Generator().manual_seed(200 + seed)
    scale = 1e4 if dtype == torch.float16 else 1e30
    scores = _random_scores(dtype, (2, 3, 5, 5), scale, seed)
    mask = tl.combine_masks(tl.padding_mask([5, 1 + seed % 4], 5), causal=True)
    mask = mask & (torch.rand(2, 1, 5, 5, generator=g) < 0.7)
    mask[..., 0] = True  # every row keeps a key
    weights = torch.softmax(scores + additive_mask(mask, dtype=dtype), -1)
    assert torch.all(weights.masked_select(~mask) == 0)
    expected = tl.masked_softmax(scores, mask)
    torch.testing.assert_close(weights, expected, rtol=0, atol=0)


def test_additive_mask_finfo_min_would_overflow_in_float16():
    # the reason for the half-min default, kept as a test so that it is not undone
    scores = torch.tensor([[-20.0, -30.0]], dtype=torch.float16)
    naive = scores + torch.finfo(torch.float16).min
    assert torch.isinf(naive).all() and torch.isnan(torch.softmax(naive, -1)).all()


def test_additive_mask_matches_torch_square_subsequent_mask():
    add = additive_mask(tl.causal_mask(6), fill=float("-inf"))
    assert torch.equal(add, nn.Transformer.generate_square_subsequent_mask(6))


def test_additive_mask_gives_the_masked_softmax_on_rows_with_a_key():
    torch.manual_seed(0)
    scores = torch.randn(2, 3, 5, 5)
    mask = tl.combine_masks(tl.padding_mask([5, 2], 5), causal=True)
    torch.testing.assert_close(torch.softmax(scores + additive_mask(mask), -1), tl.masked_softmax(scores, mask))


def test_additive_mask_rejects_bad_input():
    with pytest.raises(TypeError, match="bool"):
        additive_mask(torch.ones(2, 2))
    with pytest.raises(TypeError, match="floating"):
        additive_mask(tl.causal_mask(2), dtype=torch.int64)


def test_seq2seq_masks_shapes_and_contents():
    masks = seq2seq_masks([4, 2], [3, 1], T_src=4, T_tgt=3)
    assert isinstance(masks, Seq2SeqMasks)
    assert masks.encoder.shape == (2, 1, 4, 4)
    assert masks.decoder.shape == (2, 1, 3, 3)
    assert masks.cross.shape == (2, 1, 3, 4)
    src_keep = tl.padding_mask([4, 2], 4)
    tgt_keep = tl.padding_mask([3, 1], 3)
    # encoder and cross-attention: every query sees exactly the real source tokens
    assert torch.equal(masks.encoder, src_keep[:, None, None, :].expand(2, 1, 4, 4))
    assert torch.equal(masks.cross, src_keep[:, None, None, :].expand(2, 1, 3, 4))
    # decoder: causal and target padding
    expected = tgt_keep[:, None, None, :] & tl.causal_mask(3)
    assert torch.equal(masks.decoder, expected)
    # only the decoder's self-attention is causal
    assert not torch.equal(masks.encoder[0, 0], tl.causal_mask(4))
    assert masks.encoder[0, 0, 0, 3] and masks.cross[0, 0, 0, 3] and not masks.decoder[0, 0, 0, 2]


def test_seq2seq_masks_batch_mismatch():
    with pytest.raises(ValueError, match="batch size"):
        seq2seq_masks([4, 2], [3], T_src=4, T_tgt=3)


# --- sliding windows, chapter "Generation" ---


@pytest.mark.parametrize(("T_q", "T_k"), [(1, 1), (5, 5), (1, 7), (3, 8), (6, 6)])
@pytest.mark.parametrize("window", [1, 2, 3, 10])
def test_sliding_window_mask_sees_itself_and_window_minus_one_before(T_q, T_k, window):
    mask = tl.sliding_window_mask(T_q, T_k, window)
    assert mask.shape == (T_q, T_k) and mask.dtype == torch.bool
    for i in range(T_q):
        p = i + T_k - T_q  # the query's position among the keys (end-aligned)
        for j in range(T_k):
            assert bool(mask[i, j]) == (p - window < j <= p), (i, j)
    assert not (mask & ~tl.causal_mask(T_q, T_k)).any()  # never the future
    assert (mask.sum(-1) <= window).all()  # never beyond the window
    assert mask[:, -1].tolist() == [i == T_q - 1 for i in range(T_q)]  # the newest key: the newest query only


def test_a_window_longer_than_the_keys_is_the_causal_mask():
    for T_q, T_k in ((4, 4), (2, 6)):
        assert torch.equal(tl.sliding_window_mask(T_q, T_k, window=T_k), tl.causal_mask(T_q, T_k))
        assert torch.equal(tl.sliding_window_mask(T_q, T_k, 100), tl.causal_mask(T_q, T_k))
    assert torch.equal(tl.sliding_window_mask(3, window=1), torch.eye(3, dtype=torch.bool))


@pytest.mark.parametrize(("args", "error", "word"), [
    ((4, 4, None), ValueError, "window"), ((4, 4, 0), ValueError, "window"), ((4, 4, 2.0), TypeError, "window"),
    ((0, 4, 2), ValueError, "T_q"), ((4, -1, 2), ValueError, "T_k"),
])  # fmt: skip
def test_sliding_window_mask_rejects_bad_sizes(args, error, word):
    with pytest.raises(error, match=word):
        tl.sliding_window_mask(*args)

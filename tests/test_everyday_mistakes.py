"""The everyday mistakes a reader makes with the library (the third pass over bad input): each
one used to end in a raw error from deep inside PyTorch or NumPy, or in a silent wrong answer
(an id dropped, a tensor truncated to integers, a NaN). Each now gives a clear error naming the
argument and the value, or the right result."""

import time

import pytest
import torch

import transformer_lib as tl


def randn(*shape, dtype=torch.float32, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def tiny_gpt():
    torch.manual_seed(0)
    return tl.GPT(tl.GPTConfig(vocab_size=3, context_len=8, n_layers=1, n_heads=2, d_model=8)).eval()


def tiny_seq2seq():
    torch.manual_seed(0)
    config = tl.TransformerConfig(src_vocab_size=9, tgt_vocab_size=10, d_model=8, n_heads=2, n_encoder_layers=1,
                                  n_decoder_layers=1, context_len=8, dropout=0.0)  # fmt: skip
    return tl.Transformer(config).eval()


TOK = tl.CharTokenizer("abc")
INTS = torch.tensor([[1, 2, 3]])

# (name, call, error class, words the one-line message must hold)
MISTAKES = [
    ("decode the (B, T) output of generate", lambda: TOK.decode(tiny_gpt().generate(torch.tensor([[0, 1]]), 3)),
     ValueError, ["(1, 5)", "ids[0]"]),
    ("decode a nested list", lambda: TOK.decode([[0, 1]]), ValueError, ["one sequence"]),
    ("decode an id past the vocabulary", lambda: TOK.decode([0, 7]), ValueError, ["7", "vocab_size=3"]),
    ("decode a negative id", lambda: TOK.decode([0, -1, 1]), ValueError, ["-1", "vocab_size=3"]),
    ("decode float ids", lambda: TOK.decode([0.0, 1.0]), TypeError, ["0.0", "float"]),
    ("integer scores in masked_softmax", lambda: tl.masked_softmax(INTS), TypeError, ["scores", "int64"]),
    ("integer logits in top_p_filter", lambda: tl.top_p_filter(INTS, 0.9), TypeError, ["logits", "int64"]),
    ("integer logits in top_k_filter", lambda: tl.top_k_filter(INTS, 2), TypeError, ["logits", "int64"]),
    ("an integer vector in apply_rotary", lambda: tl.apply_rotary(torch.arange(8).reshape(1, 2, 4)),
     TypeError, ["x", "int64"]),
    ("integer embeddings in SinusoidalPositionalEncoding",
     lambda: tl.SinusoidalPositionalEncoding(4, 8)(torch.ones(1, 3, 4, dtype=torch.long)), TypeError, ["x", "int64"]),
    ("integer embeddings in LearnedPositionalEmbedding",
     lambda: tl.LearnedPositionalEmbedding(4, 8)(torch.ones(1, 3, 4, dtype=torch.long)), TypeError, ["x", "int64"]),
    ("q and k/v of different batch sizes (sdpa)",
     lambda: tl.scaled_dot_product_attention(randn(2, 3, 4), randn(3, 3, 4), randn(3, 3, 4)),
     ValueError, ["batch", "(2, 3, 4)", "(3, 3, 4)"]),
    ("q and k/v of different batch sizes (dot-product)",
     lambda: tl.dot_product_attention(randn(2, 3, 4), randn(3, 3, 4), randn(3, 3, 4)), ValueError, ["batch"]),
    ("q and k/v of different batch sizes (multi-head)",
     lambda: tl.MultiHeadAttention(8, 2)(randn(2, 3, 8), randn(3, 3, 8), randn(3, 3, 8)), ValueError, ["share B"]),
    ("float64 input to a float32 multi-head layer",
     lambda: tl.MultiHeadAttention(8, 2)(*[randn(2, 3, 8, dtype=torch.float64)] * 3),
     TypeError, ["float64", "float32"]),
    ("float64 input to a float32 feed-forward layer",
     lambda: tl.FeedForward(8, 16)(randn(2, 3, 8, dtype=torch.float64)), TypeError, ["float64", "float32"]),
    ("float64 input to a float32 encoder layer",
     lambda: tl.EncoderLayer(8, 2, 16)(randn(2, 3, 8, dtype=torch.float64)), TypeError, ["float64", "float32"]),
    ("float64 input to a float32 pre-LN decoder layer",
     lambda: tl.DecoderLayer(8, 2, 16, norm_first=True)(randn(2, 3, 8, dtype=torch.float64)),
     TypeError, ["float64", "float32"]),
    ("merge_heads on a 3-D tensor", lambda: tl.merge_heads(randn(2, 3, 4)), ValueError, ["(B, h, T, d_k)", "2, 3, 4"]),
    ("1-D keys in AdditiveAttention",
     lambda: tl.AdditiveAttention(4, 5, 6)(randn(2, 1, 4), randn(5), randn(3, 2)), ValueError, ["keys", "(5,)"]),
    ("a (4,) query against (3, 5) keys in soft_lookup",
     lambda: tl.soft_lookup(randn(4), randn(3, 5), randn(3, 2)), ValueError, ["(4,)", "(3, 5)"]),
    ("values with another n in soft_lookup",
     lambda: tl.soft_lookup(randn(5), randn(3, 5), randn(4, 2)), ValueError, ["values", "n=3"]),
    ("set_seed(time.time())", lambda: tl.set_seed(time.time()), TypeError, ["seed", "float", "int(time.time())"]),
    ("LMBatches with batch_size=0", lambda: tl.LMBatches(torch.arange(100), torch.arange(50), 8, 0),
     ValueError, ["batch_size", "0"]),
    ("LMBatches with a float batch size", lambda: tl.LMBatches(torch.arange(100), torch.arange(50), 8, 4.0),
     TypeError, ["batch_size", "4.0"]),
    ("get_batch with batch_size=0", lambda: tl.get_batch(torch.arange(100), 8, 0), ValueError, ["batch_size", "0"]),
    ("FeedForward(8, d_ff=0)", lambda: tl.FeedForward(8, d_ff=0), ValueError, ["d_ff", "0"]),
    ("q and k of width 0 (sdpa)",
     lambda: tl.scaled_dot_product_attention(randn(2, 3, 0), randn(2, 3, 0), randn(2, 3, 4)), ValueError, ["d_k >= 1"]),
    ("q and k of width 0 (dot-product)",
     lambda: tl.dot_product_attention(randn(2, 3, 0), randn(2, 3, 0), randn(2, 3, 4)), ValueError, ["d_k >= 1"]),
    ("sinusoidal_encoding(..., base=0)", lambda: tl.sinusoidal_encoding(8, 4, base=0), ValueError, ["base", "0"]),
    ("sinusoidal_encoding(..., base=-1)", lambda: tl.sinusoidal_encoding(8, 4, base=-1), ValueError, ["base", "-1"]),
    ("sinusoidal_encoding(..., base=inf)", lambda: tl.sinusoidal_encoding(8, 4, base=float("inf")),
     ValueError, ["base", "inf"]),
    ("apply_rotary(..., base=0)", lambda: tl.apply_rotary(randn(1, 2, 4), base=0), ValueError, ["base", "0"]),
    ("RotaryEmbedding(4, base='10000')", lambda: tl.RotaryEmbedding(4, base="10000"), TypeError, ["base", "str"]),
    ("a Transformer loss when every target is padding",
     lambda: tiny_seq2seq()(torch.tensor([[3, 4]]), torch.tensor([[1, 5]]), torch.tensor([[0, 0]])),
     ValueError, ["every target is padding", "pad_id=0"]),
]  # fmt: skip


@pytest.mark.parametrize(("call", "error", "words"), [m[1:] for m in MISTAKES], ids=[m[0] for m in MISTAKES])
def test_an_everyday_mistake_gets_a_clear_error(call, error, words):
    with pytest.raises(error) as caught:
        call()
    message = str(caught.value)
    assert "\n" not in message, message
    for word in words:
        assert word in message, (word, message)


def test_decode_still_reads_a_row_a_list_and_numpy_ints():
    import numpy as np

    ids = TOK.encode("cab")
    assert TOK.decode(ids) == TOK.decode(torch.tensor(ids)) == TOK.decode(np.array(ids)) == "cab"
    with_specials = tl.CharTokenizer("ab", specials=tl.SPECIALS)
    row = with_specials.encode("ab", bos=True, eos=True)
    assert with_specials.decode(row) == "ab"
    assert with_specials.decode(row, skip_specials=False) == "<bos>ab<eos>"


def test_a_float32_layer_under_autocast_takes_lower_precision_input():
    """The dtype guard names a mismatch only where PyTorch would fail: under autocast a bfloat16
    input to a float32 layer is how mixed precision works."""
    torch.manual_seed(0)
    mha = tl.MultiHeadAttention(8, 2).eval()
    x = randn(2, 3, 8).bfloat16()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, _ = mha(x, x, x)
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()


def test_base_one_is_legal_and_gives_one_frequency():
    """A base of 1 is a valid (if useless) encoding: every pair turns at one radian per position."""
    pe = tl.sinusoidal_encoding(6, 5, base=1)
    assert torch.isfinite(pe).all()
    assert torch.equal(pe[:, 0], pe[:, 2]) and torch.equal(pe[:, 1], pe[:, 3])


def test_a_loss_with_some_padding_averages_over_the_real_targets_only():
    model = tiny_seq2seq()
    src, tgt = torch.tensor([[3, 4]]), torch.tensor([[1, 5]])
    logits, loss = model(src, tgt, torch.tensor([[6, 0]]))
    expected = torch.nn.functional.cross_entropy(logits[0, :1], torch.tensor([6]))
    assert torch.allclose(loss, expected)

"""Bad input to the library's functions and classes: each case names the exact error class and a
word its message must hold, or, where the input is legal, the behaviour it must give."""

import math

import pytest
import torch

import transformer_lib as tl

NAN, INF = float("nan"), float("inf")


def qkv(dtype=torch.float32, T=3, d=4):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(2, T, d, generator=g).to(dtype) for _ in range(3)]


def gpt(**sizes):
    torch.manual_seed(0)
    return tl.GPT(tl.GPTConfig(vocab_size=11, context_len=8, n_layers=1, n_heads=2, d_model=8, **sizes)).eval()


def seq2seq(**sizes):
    torch.manual_seed(0)
    config = tl.TransformerConfig(src_vocab_size=9, tgt_vocab_size=10, d_model=8, n_heads=2, n_encoder_layers=1,
                                  n_decoder_layers=1, context_len=8, dropout=0.0, **sizes)  # fmt: skip
    return tl.Transformer(config).eval()


def mha():
    torch.manual_seed(0)
    return tl.MultiHeadAttention(8, 2).eval()


IDS = torch.tensor([[1, 2, 3]])
X = torch.randn(2, 3, 8, generator=torch.Generator().manual_seed(1))
LOGITS = torch.randn(2, 11, generator=torch.Generator().manual_seed(2))

# (name, call, error class, a word of the message)
ERRORS = [
    # q, k, v: types and dtypes
    ("sdpa int64 q k v", lambda: tl.scaled_dot_product_attention(*qkv(torch.int64)), TypeError, "floating"),
    ("sdpa int32 q", lambda: tl.scaled_dot_product_attention(qkv(torch.int32)[0], *qkv()[1:]), TypeError, "int32"),
    ("sdpa mixed float64 k", lambda: tl.scaled_dot_product_attention(qkv()[0], qkv(torch.float64)[1], qkv()[2]),
     TypeError, "dtype"),
    ("sdpa mixed float16 v", lambda: tl.scaled_dot_product_attention(*qkv()[:2], qkv(torch.float16)[2]),
     TypeError, "share"),
    ("sdpa bool q", lambda: tl.scaled_dot_product_attention(qkv(torch.bool)[0], *qkv()[1:]), TypeError, "bool"),
    ("sdpa a list for q", lambda: tl.scaled_dot_product_attention([[1.0]], *qkv()[1:]), TypeError, "list"),
    ("sdpa dropout negative", lambda: tl.scaled_dot_product_attention(*qkv(), dropout_p=-0.1), ValueError, "-0.1"),
    ("sdpa dropout 1", lambda: tl.scaled_dot_product_attention(*qkv(), dropout_p=1.0), ValueError, "[0, 1)"),
    ("sdpa dropout NaN", lambda: tl.scaled_dot_product_attention(*qkv(), dropout_p=NAN), ValueError, "nan"),
    ("sdpa dropout string", lambda: tl.scaled_dot_product_attention(*qkv(), dropout_p="0.1"), TypeError, "str"),
    ("dot-product int q k v", lambda: tl.dot_product_attention(*qkv(torch.int16)), TypeError, "int16"),
    ("mha int64 query", lambda: mha()(*[t.long() for t in qkv(d=8)]), TypeError, "int64"),
    ("mha mixed dtypes", lambda: mha()(X, X.double(), X.double()), TypeError, "share"),
    ("mha half query, float key", lambda: mha()(X.half(), X, X), TypeError, "float16"),
    ("mha a numpy array", lambda: mha()(X.numpy(), X, X), TypeError, "ndarray"),
    # multi-head construction and helpers
    ("mha negative dropout", lambda: tl.MultiHeadAttention(8, 2, dropout=-0.5), ValueError, "dropout"),
    ("mha dropout 1.5", lambda: tl.MultiHeadAttention(8, 2, dropout=1.5), ValueError, "1.5"),
    ("mha d_model not divisible", lambda: tl.MultiHeadAttention(10, 3), ValueError, "divisible"),
    ("mha zero heads", lambda: tl.MultiHeadAttention(8, 0), ValueError, "n_heads"),
    ("mha string d_model", lambda: tl.MultiHeadAttention("8", 2), TypeError, "d_model"),
    ("mha float heads", lambda: tl.MultiHeadAttention(8, 2.0), TypeError, "n_heads"),
    ("mha bias as a string", lambda: tl.MultiHeadAttention(8, 2, bias="False"), TypeError, "bias"),
    ("split_heads width not divisible", lambda: tl.split_heads(torch.zeros(1, 2, 10), 3), ValueError, "divisible"),
    ("split_heads zero heads", lambda: tl.split_heads(torch.zeros(1, 2, 8), 0), ValueError, "n_heads"),
    ("split_heads float heads", lambda: tl.split_heads(torch.zeros(1, 2, 8), 2.0), TypeError, "n_heads"),
    ("split_heads a 2-D input", lambda: tl.split_heads(torch.zeros(2, 8), 2), ValueError, "(B, T, d_model)"),
    ("multihead_cost negative T_q", lambda: tl.multihead_cost(8, 2, -4), ValueError, "T_q"),
    ("multihead_cost negative T_k", lambda: tl.multihead_cost(8, 2, 4, T_k=-1), ValueError, "T_k"),
    ("multihead_cost negative batch", lambda: tl.multihead_cost(8, 2, 4, batch=-2), ValueError, "batch"),
    ("multihead_cost float T_q", lambda: tl.multihead_cost(8, 2, 4.5), TypeError, "T_q"),
    ("multihead_cost not divisible", lambda: tl.multihead_cost(10, 4, 4), ValueError, "divisible"),
    # token ids, prompts, targets
    ("gpt float ids", lambda: gpt()(IDS.float()), TypeError, "integer"),
    ("gpt bool ids", lambda: gpt()(IDS.bool()), TypeError, "bool"),
    ("gpt 1-D ids", lambda: gpt()(IDS[0]), ValueError, "(B, T)"),
    ("gpt empty prompt T=0", lambda: gpt()(IDS[:, :0]), ValueError, "empty"),
    ("gpt id out of the vocabulary", lambda: gpt()(IDS + 20), ValueError, "vocab_size"),
    ("gpt uint8 id out of the vocabulary", lambda: gpt()((IDS + 20).to(torch.uint8)), ValueError, "vocab_size"),
    ("gpt targets of the wrong shape", lambda: gpt()(IDS, IDS[:, :2]), ValueError, "shape"),
    ("gpt targets as floats", lambda: gpt()(IDS, IDS.float()), TypeError, "targets"),
    ("transformer targets of the wrong shape", lambda: seq2seq()(IDS, IDS, IDS[0]), ValueError, "shape"),
    ("transformer empty target prefix", lambda: seq2seq()(IDS, IDS[:, :0]), ValueError, "empty"),
    # sampling
    ("generate T=0 prompt", lambda: gpt().generate(IDS[:, :0], 3), ValueError, "empty"),
    ("generate negative count", lambda: gpt().generate(IDS, -3), ValueError, "max_new_tokens"),
    ("generate float count", lambda: gpt().generate(IDS, 2.0), TypeError, "max_new_tokens"),
    ("generate NaN temperature", lambda: gpt().generate(IDS, 2, temperature=NAN), ValueError, "temperature"),
    ("generate zero temperature", lambda: gpt().generate(IDS, 2, temperature=0), ValueError, "> 0"),
    ("generate negative temperature", lambda: gpt().generate(IDS, 2, temperature=-1.0), ValueError, "-1.0"),
    ("generate infinite temperature", lambda: gpt().generate(IDS, 2, temperature=INF), ValueError, "finite"),
    ("generate string temperature", lambda: gpt().generate(IDS, 2, temperature="0.5"), TypeError, "temperature"),
    ("generate float top_k", lambda: gpt().generate(IDS, 2, top_k=2.5), TypeError, "top_k"),
    ("generate bool top_k", lambda: gpt().generate(IDS, 2, top_k=True), TypeError, "top_k"),
    ("generate zero top_k", lambda: gpt().generate(IDS, 2, top_k=0), ValueError, "top_k"),
    ("sample_next NaN temperature", lambda: tl.sample_next(LOGITS, NAN), ValueError, "temperature"),
    ("sample_next float top_k", lambda: tl.sample_next(LOGITS, 1.0, top_k=3.0), TypeError, "top_k"),
    ("top_k_filter negative k", lambda: tl.top_k_filter(LOGITS, -2), ValueError, "-2"),
    ("greedy_decode negative count", lambda: seq2seq().greedy_decode(IDS, -1), ValueError, "max_new_tokens"),
    ("greedy_decode float count", lambda: seq2seq().greedy_decode(IDS, 2.5), TypeError, "max_new_tokens"),
    ("greedy_decode empty source", lambda: seq2seq().greedy_decode(IDS[:, :0], 3), ValueError, "empty"),
    # configs built from Python
    ("gpt d_model=0", lambda: tl.GPTConfig(vocab_size=11, d_model=0), ValueError, "d_model"),
    ("gpt negative n_layers", lambda: tl.GPTConfig(vocab_size=11, n_layers=-2), ValueError, "n_layers"),
    ("gpt string n_layers", lambda: tl.GPTConfig(vocab_size=11, n_layers="2"), TypeError, "n_layers"),
    ("gpt bool d_model", lambda: tl.GPTConfig(vocab_size=11, d_model=True), TypeError, "d_model"),
    ("gpt float vocab_size", lambda: tl.GPTConfig(vocab_size=11.0), TypeError, "vocab_size"),
    ("gpt zero vocab_size", lambda: tl.GPTConfig(vocab_size=0), ValueError, "vocab_size"),
    ("gpt zero context_len", lambda: tl.GPTConfig(vocab_size=11, context_len=0), ValueError, "context_len"),
    ("gpt d_model not divisible", lambda: tl.GPTConfig(vocab_size=11, d_model=10, n_heads=4), ValueError,
     "divisible"),
    ("gpt zero heads", lambda: tl.GPTConfig(vocab_size=11, n_heads=0), ValueError, "n_heads"),
    ("gpt bias as a string", lambda: tl.GPTConfig(vocab_size=11, bias="False"), TypeError, "bias"),
    ("gpt dropout 1", lambda: tl.GPTConfig(vocab_size=11, dropout=1.0), ValueError, "dropout"),
    ("gpt negative dropout", lambda: tl.GPTConfig(vocab_size=11, dropout=-0.1), ValueError, "dropout"),
    ("gpt string dropout", lambda: tl.GPTConfig(vocab_size=11, dropout="0.1"), TypeError, "dropout"),
    ("gpt from a dict", lambda: tl.GPT({"vocab_size": 11}), TypeError, "GPTConfig"),
    ("transformer norm_first as a string", lambda: seq2seq(norm_first="False"), TypeError, "norm_first"),
    ("transformer pad_id outside the vocabulary", lambda: seq2seq(pad_id=9), ValueError, "pad_id"),
    ("transformer negative pad_id", lambda: seq2seq(pad_id=-1), ValueError, "pad_id"),
    ("transformer eos_id outside the vocabulary", lambda: seq2seq(eos_id=10), ValueError, "eos_id"),
    ("transformer negative encoder layers",
     lambda: tl.TransformerConfig(src_vocab_size=9, tgt_vocab_size=9, n_encoder_layers=-1), ValueError,
     "n_encoder_layers"),
    ("transformer string d_ff", lambda: tl.TransformerConfig(src_vocab_size=9, tgt_vocab_size=9, d_ff="512"),
     TypeError, "d_ff"),
    ("transformer unknown positional",
     lambda: tl.TransformerConfig(src_vocab_size=9, tgt_vocab_size=9, positional="rope"), ValueError, "positional"),
    ("transformer from a dict", lambda: tl.Transformer({"src_vocab_size": 9}), TypeError, "TransformerConfig"),
    # layers
    ("encoder negative n_layers", lambda: tl.Encoder(8, 2, -1), ValueError, "n_layers"),
    ("encoder layer norm_first as a string", lambda: tl.EncoderLayer(8, 2, norm_first="False"), TypeError,
     "norm_first"),
    ("decoder layer zero d_ff", lambda: tl.DecoderLayer(8, 2, 0), ValueError, "d_ff"),
    ("learned positions negative dropout", lambda: tl.LearnedPositionalEmbedding(8, 4, dropout=-0.2), ValueError,
     "dropout"),
    ("sinusoidal encoding string width", lambda: tl.sinusoidal_encoding("8", 4), TypeError, "d_model"),
    # chapter "Generation": grouped-query attention, sliding windows, caches, top-p
    ("mha n_kv_heads not dividing n_heads", lambda: tl.MultiHeadAttention(12, 6, n_kv_heads=4), ValueError,
     "divide"),
    ("mha zero n_kv_heads", lambda: tl.MultiHeadAttention(8, 2, n_kv_heads=0), ValueError, "n_kv_heads"),
    ("mha float n_kv_heads", lambda: tl.MultiHeadAttention(8, 2, n_kv_heads=1.0), TypeError, "n_kv_heads"),
    ("mha window without is_causal", lambda: mha()(X, X, X, window=2), ValueError, "is_causal"),
    ("mha zero window", lambda: mha()(X, X, X, is_causal=True, window=0), ValueError, "window"),
    ("mha float window", lambda: mha()(X, X, X, is_causal=True, window=2.5), TypeError, "window"),
    ("mha cache of the wrong type", lambda: mha()(X, X, X, cache={}), TypeError, "KVCache"),
    ("mha cache of another batch", lambda: [m := mha(), c := tl.KVCache(), m(X, X, X, cache=c),
                                            m(X[:1], X[:1], X[:1], cache=c)], ValueError, "batch"),
    ("mha static cache of another batch", lambda: [m := mha(), c := tl.KVCache(static=True), m(X, X, X, cache=c),
                                                   m(X[:1], X[:1], X[:1], cache=c)], ValueError, "B=1"),
    ("mha mask without the cached keys", lambda: [m := mha(), c := tl.KVCache(), m(X, X, X, cache=c),
                                                  m(X, X, X, mask=torch.ones(3, 3, dtype=torch.bool), cache=c)],
     ValueError, "broadcast"),
    ("kv cache window 0", lambda: tl.KVCache(window=0), ValueError, "window"),
    ("kv cache static with a window", lambda: tl.KVCache(window=4, static=True), ValueError, "static"),
    ("kv cache static as a string", lambda: tl.KVCache(static="yes"), TypeError, "static"),
    ("kv cache 3-D keys", lambda: tl.KVCache().append(X, X), ValueError, "(B, n_kv_heads, T, d_k)"),
    ("kv_cache_bytes negative T", lambda: tl.kv_cache_bytes(2, 2, 4, -1), ValueError, "T"),
    ("kv_cache_bytes zero heads", lambda: tl.kv_cache_bytes(2, 0, 4, 8), ValueError, "n_kv_heads"),
    ("kv_cache_bytes a string dtype", lambda: tl.kv_cache_bytes(2, 2, 4, 8, dtype="float32"), TypeError, "dtype"),
    ("sliding_window_mask no window", lambda: tl.sliding_window_mask(4, 4), ValueError, "window"),
    ("sliding_window_mask negative window", lambda: tl.sliding_window_mask(4, 4, -1), ValueError, "-1"),
    ("decoder layer zero window", lambda: tl.DecoderLayer(8, 2, window=0), ValueError, "window"),
    ("gpt window 0", lambda: tl.GPTConfig(vocab_size=11, window=0), ValueError, "window"),
    ("gpt string window", lambda: tl.GPTConfig(vocab_size=11, window="4"), TypeError, "window"),
    ("gpt n_kv_heads not dividing", lambda: tl.GPTConfig(vocab_size=11, n_heads=4, n_kv_heads=3), ValueError,
     "n_kv_heads (3)"),
    ("transformer n_kv_heads 0", lambda: seq2seq(n_kv_heads=0), ValueError, "n_kv_heads"),
    ("gpt cache past context_len", lambda: [m := gpt(), c := m.new_cache(), m(IDS.repeat(1, 2), cache=c),
                                            m(IDS, cache=c)], ValueError, "context_len"),
    ("gpt cache of a 2-layer decoder", lambda: gpt()(IDS, cache=tl.Decoder(8, 2, 2).new_cache()),
     TypeError, "DecoderCache"),
    ("decode with a spent cache", lambda: [m := seq2seq(), mem := m.encode(IDS), c := m.new_cache(),
                                           m.decode(IDS, *mem, cache=c), m.decode(IDS, *mem, cache=c)],
     ValueError, "position 3"),
    ("generate use_cache as a string", lambda: gpt().generate(IDS, 2, use_cache="no"), TypeError, "use_cache"),
    ("greedy_decode use_cache as 1", lambda: seq2seq().greedy_decode(IDS, 2, use_cache=1), TypeError, "use_cache"),
    ("generate top_p 0", lambda: gpt().generate(IDS, 2, top_p=0.0), ValueError, "top_p"),
    ("generate top_p above 1", lambda: gpt().generate(IDS, 2, top_p=1.5), ValueError, "1.5"),
    ("generate top_p NaN", lambda: gpt().generate(IDS, 2, top_p=NAN), ValueError, "top_p"),
    ("generate top_p string", lambda: gpt().generate(IDS, 2, top_p="0.9"), TypeError, "top_p"),
    ("top_p_filter negative p", lambda: tl.top_p_filter(LOGITS, -0.5), ValueError, "-0.5"),
    ("sample_next top_p bool", lambda: tl.sample_next(LOGITS, top_p=True), TypeError, "top_p"),
]  # fmt: skip


@pytest.mark.parametrize(("call", "error", "word"), [c[1:] for c in ERRORS], ids=[c[0] for c in ERRORS])
def test_bad_input_gives_a_clear_error(call, error, word):
    with pytest.raises(Exception) as caught:
        call()
    assert type(caught.value) is error, f"{type(caught.value).__name__}: {caught.value}"
    assert word.lower() in str(caught.value).lower()


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64])
def test_every_integer_id_dtype_gives_the_int64_result(dtype):
    model = gpt()
    logits, loss = model(IDS.to(dtype), IDS.to(dtype))
    want, want_loss = model(IDS, IDS)
    assert torch.equal(logits, want) and torch.equal(loss, want_loss)


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int16, torch.int32])
def test_the_encoder_decoder_takes_every_integer_id_dtype(dtype):
    model = seq2seq()
    assert torch.equal(model(IDS.to(dtype), IDS.to(dtype))[0], model(IDS, IDS)[0])
    assert torch.equal(model.greedy_decode(IDS.to(dtype), 3), model.greedy_decode(IDS, 3))


@pytest.mark.parametrize("temperature", [1e-30, 1e-45, 5e-324])
def test_a_tiny_temperature_takes_the_argmax(temperature):
    logits = torch.randn(64, 11, generator=torch.Generator().manual_seed(3)) * 50
    got = tl.sample_next(logits, temperature, generator=torch.Generator().manual_seed(0))
    assert torch.equal(got[:, 0], logits.argmax(-1))


def test_a_tiny_temperature_in_generate_is_greedy():
    model = gpt()
    out = model.generate(IDS, 4, temperature=1e-40)
    for t in range(IDS.shape[1], out.shape[1]):
        assert out[0, t] == model(out[:, :t])[0][0, -1].argmax()


def test_zero_new_tokens_return_the_prompt():
    assert torch.equal(gpt().generate(IDS, 0), IDS)
    assert seq2seq().greedy_decode(IDS, 0).shape == (1, 0)


@pytest.mark.parametrize(("T_q", "T_k"), [(0, 5), (3, 0), (0, 0)])
def test_multihead_cost_of_empty_sequences_counts_only_what_is_done(T_q, T_k):
    cost = tl.multihead_cost(8, 2, T_q, T_k)
    assert cost["score_entries"] == 0 and cost["attention_flops"] == 0
    assert cost["projection_flops"] == 2 * 8 * 8 * (2 * T_q + 2 * T_k) >= 0


# --- NaN: the fused and the hand-written multi-head paths agree, NaN positions included ---


def nan_inputs(where: str):
    g = torch.Generator().manual_seed(4)
    query, memory = torch.randn(2, 5, 8, generator=g), torch.randn(2, 5, 8, generator=g)
    query[0, 2, 3] = NAN
    if where == "self":
        return query, query, query
    return query, memory, memory


MASK = torch.ones(2, 1, 5, 5, dtype=torch.bool)
MASK[0, :, 2, :] = False  # the NaN query's row: every key masked
MASK[1, :, :, 3] = False


@pytest.mark.parametrize("where", ["self", "cross"])
@pytest.mark.parametrize("mask", [None, MASK], ids=["no mask", "mask"])
@pytest.mark.parametrize("is_causal", [False, True])
def test_both_multi_head_paths_give_the_same_output_nan_included(where, mask, is_causal):
    m = mha()
    args = (*nan_inputs(where),)
    fused, _ = m(*args, mask=mask, is_causal=is_causal)
    written, _ = m(*args, mask=mask, is_causal=is_causal, need_weights=True)
    assert torch.equal(fused.isnan(), written.isnan())
    torch.testing.assert_close(fused.nan_to_num(), written.nan_to_num(), rtol=1e-5, atol=1e-6)


def test_a_nan_query_gives_nan_in_its_row_only_unless_it_is_fully_masked():
    m = mha()
    query, key, value = nan_inputs("cross")
    out, _ = m(query, key, value)
    assert out[0, 2].isnan().all() and not out[0, [0, 1, 3, 4]].isnan().any() and not out[1].isnan().any()
    masked, _ = m(query, key, value, mask=MASK)
    bias = m.out_proj.bias
    assert not masked.isnan().any() and torch.equal(masked[0, 2], bias)  # zeros through W_o: the bias


def test_a_fully_masked_query_gets_zeros_even_when_a_value_is_nan():
    q, k, v = qkv()
    v[0, 1, 0] = NAN
    mask = torch.ones(3, 3, dtype=torch.bool)
    mask[2] = False
    out, weights = tl.scaled_dot_product_attention(q, k, v, mask=mask)
    assert torch.equal(out[:, 2], torch.zeros(2, 4)) and torch.equal(weights[:, 2], torch.zeros(2, 3))
    assert out[0, :2].isnan().any() and not out[1].isnan().any()


def test_the_nan_guard_leaves_gradients_unchanged():
    m = mha().train()
    x = X.clone().requires_grad_()
    m(x, x, x, is_causal=True)[0].square().sum().backward()
    fused = x.grad.clone()
    x.grad = None
    m(x, x, x, is_causal=True, need_weights=True)[0].square().sum().backward()
    torch.testing.assert_close(fused, x.grad, rtol=1e-4, atol=1e-6)
    assert math.isfinite(float(fused.abs().sum()))


def test_a_top_p_of_one_samples_as_without_it():
    a = gpt().generate(IDS, 6, top_p=1.0, generator=torch.Generator().manual_seed(0))
    assert torch.equal(a, gpt().generate(IDS, 6, generator=torch.Generator().manual_seed(0)))


def test_a_window_of_one_attends_to_itself_only():
    model = gpt(window=1)
    ids = torch.tensor([[1, 2, 3, 4]])
    changed = ids.clone()
    changed[0, :2] = 5
    out, out_changed = model(ids)[0], model(changed)[0]
    assert torch.equal(out[0, 2:], out_changed[0, 2:]) and not torch.equal(out[0, :2], out_changed[0, :2])


def qkv4(T_q=6, T_k=6, d=4, dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(2, 2, T, d, generator=g).to(dtype) for T in (T_q, T_k, T_k)]


# chapter "Generation": tiled attention, the online softmax, the peak-memory probe, GPT-2's GELU
LONG_CONTEXT_ERRORS = [
    ("tiled 3-D q", lambda: tl.tiled_attention(*qkv()), ValueError, "(B, h, T, d)"),
    ("tiled q and k widths differ", lambda: tl.tiled_attention(qkv4(d=4)[0], *qkv4(d=5)[1:]), ValueError, "width"),
    ("tiled k and v lengths differ", lambda: tl.tiled_attention(*qkv4(T_k=6)[:2], qkv4(T_k=7)[2]), ValueError, "T_k"),
    ("tiled heads differ", lambda: tl.tiled_attention(qkv4()[0][:, :1], *qkv4()[1:]), ValueError, "share B and h"),
    ("tiled empty keys", lambda: tl.tiled_attention(*qkv4(T_k=0)), ValueError, "T = 0"),
    ("tiled causal with T_q != T_k", lambda: tl.tiled_attention(*qkv4(T_q=3, T_k=6), is_causal=True), ValueError,
     "T_q=3"),
    ("tiled causal as a string", lambda: tl.tiled_attention(*qkv4(), is_causal="yes"), TypeError, "is_causal"),
    ("tiled block_size 0", lambda: tl.tiled_attention(*qkv4(), block_size=0), ValueError, "block_size"),
    ("tiled block_size float", lambda: tl.tiled_attention(*qkv4(), block_size=16.0), TypeError, "block_size"),
    ("tiled block_size True", lambda: tl.tiled_attention(*qkv4(), block_size=True), TypeError, "block_size"),
    ("tiled int64 q k v", lambda: tl.tiled_attention(*[t.long() for t in qkv4()]), TypeError, "int64"),
    ("tiled mixed float64 k", lambda: tl.tiled_attention(qkv4()[0], qkv4(dtype=torch.float64)[1], qkv4()[2]),
     TypeError, "share one dtype"),
    ("online softmax block 0", lambda: tl.online_softmax(LOGITS, 0), ValueError, "block_size"),
    ("online softmax int tensor", lambda: tl.online_softmax(IDS, 2), TypeError, "floating"),
    ("online softmax empty row", lambda: tl.online_softmax(torch.zeros(2, 0), 2), ValueError, "n >= 1"),
    ("peak memory unknown method", lambda: tl.attention_peak_memory(64, method="flash"), ValueError, "flash"),
    ("peak memory T 0", lambda: tl.attention_peak_memory(0), ValueError, "T must"),
    ("peak memory int dtype", lambda: tl.attention_peak_memory(8, dtype=torch.int32), TypeError, "int32"),
    ("feed-forward unknown activation", lambda: tl.FeedForward(8, 16, activation="gelu_new"), ValueError,
     "gelu_tanh"),
    ("gpt config unknown activation", lambda: gpt(activation="relu"), ValueError, "relu"),
    ("gpt from hf: a number", lambda: tl.gpt_from_hf(3), TypeError, "int"),
    ("gpt from hf: an empty state dict", lambda: tl.gpt_from_hf({}, n_heads=2), ValueError, "wte.weight"),
    ("gpt from hf: a non-tensor value", lambda: tl.gpt_from_hf({"wte.weight": [1.0]}), TypeError, "list"),
    ("gpt from nanogpt: a bare state dict", lambda: tl.gpt_from_nanogpt({"wte.weight": X}), ValueError, "model_args"),
    ("gpt from nanogpt: a list", lambda: tl.gpt_from_nanogpt([1]), ValueError, "list"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("call", "error", "word"), [c[1:] for c in LONG_CONTEXT_ERRORS], ids=[c[0] for c in LONG_CONTEXT_ERRORS]
)
def test_bad_long_context_input_gives_a_clear_error(call, error, word):
    test_bad_input_gives_a_clear_error(call, error, word)


# chapter "What attention learns": head indices, query and loss masks, token ids and targets, repeats that do not fit
def attention_only():
    torch.manual_seed(0)
    return tl.AttentionOnly(10, 16, n_layers=2, n_heads=2, d_model=8)


REP = tl.repeat_batch(3, 16, 10, 4, generator=torch.Generator().manual_seed(0), return_distance=True)
RIDX, RTGT, RMASK, RDIST = REP
PATTERN = torch.rand(3, 2, 16, 16).softmax(-1)
YES = torch.ones(3, dtype=torch.bool)


def intervene(heads):
    with tl.intervene_heads(attention_only(), heads):
        pass


# (name, call, error class, words the message must hold: the argument and the value)
CH12_ERRORS = [
    ("intervene: a float head", lambda: intervene({"layers.0": 1.0}), TypeError, ["heads['layers.0']", "1.0"]),
    ("intervene: a bool head", lambda: intervene({"layers.0": True}), TypeError, ["heads['layers.0']", "True"]),
    ("intervene: a 0-d tensor head", lambda: intervene({"layers.1": torch.tensor(1)}), TypeError,
     ["heads['layers.1']", "tensor(1)", "int(...)"]),
    ("intervene: a float in the list", lambda: intervene({"layers.0": [0, 1.0]}), TypeError,
     ["heads['layers.0']", "1.0"]),
    ("intervene: a bool in the list", lambda: intervene({"layers.0": [False]}), TypeError,
     ["heads['layers.0']", "False"]),
    ("intervene: a float tensor", lambda: intervene({"layers.0": torch.tensor([1.0])}), TypeError,
     ["heads['layers.0']", "tensor([1.])"]),
    ("intervene: a negative head", lambda: intervene({"layers.0": [-1]}), ValueError,
     ["heads['layers.0']", "head -1", "n_heads=2"]),
    ("ov_circuit: a float head", lambda: tl.ov_circuit(attention_only(), 0, 1.0), TypeError, ["head", "1.0"]),
    ("ov_circuit: a bool head", lambda: tl.ov_circuit(attention_only(), 0, True), TypeError, ["head", "True"]),
    ("ov_circuit: a 0-d tensor layer", lambda: tl.ov_circuit(attention_only(), torch.tensor(0), 1), TypeError,
     ["layer", "tensor(0)"]),
    ("ov_circuit: a negative layer", lambda: tl.ov_circuit(attention_only(), -1, 0), ValueError, ["layer -1"]),
    ("induction_score: queries one short", lambda: tl.induction_score(PATTERN, RDIST[:, None], RMASK[:, None, :-1]),
     ValueError, ["queries", "(3, 1, 15)", "T=16"]),
    ("induction_score: integer queries", lambda: tl.induction_score(PATTERN, RDIST[:, None], RMASK.long()[:, None]),
     TypeError, ["queries", "int64"]),
    ("head_scores: loss_mask one short", lambda: tl.head_scores(attention_only(), RIDX, RMASK[:, :-1], RDIST),
     ValueError, ["loss_mask", "(3, 15)", "(3, 16)"]),
    ("head_scores: loss_mask as ints", lambda: tl.head_scores(attention_only(), RIDX, RMASK.long(), RDIST), ValueError,
     ["loss_mask", "int64"]),
    ("head_scores: distance one short", lambda: tl.head_scores(attention_only(), RIDX, RMASK, RDIST[:-1]), ValueError,
     ["distance", "(2,)"]),
    ("head_scores: a mask before the distance", lambda: tl.head_scores(attention_only(), RIDX, RMASK, RDIST + 15),
     ValueError, ["loss_mask", "distance"]),
    ("forward: loss_mask one short", lambda: attention_only()(RIDX, RTGT, RMASK[:, :-1]), ValueError,
     ["loss_mask", "(3, 15)"]),
    ("forward: a target past the vocabulary", lambda: attention_only()(RIDX, RTGT.clamp(max=9) + 1), ValueError,
     ["targets", "vocab_size=10", "10"]),
    ("forward: a negative target", lambda: attention_only()(RIDX, RTGT - 1), ValueError, ["targets", "-1"]),
    ("forward: a target of -100", lambda: attention_only()(RIDX, torch.full_like(RTGT, -100)), ValueError,
     ["targets", "-100"]),
    ("forward: a negative token id", lambda: attention_only()(RIDX - 1), ValueError, ["idx", "-1"]),
    ("gpt forward: a negative target", lambda: gpt()(IDS, torch.tensor([[1, -1, 2]])), ValueError,
     ["targets", "-1"]),
    ("loss_by_position: a target past the vocabulary", lambda: tl.loss_by_position(attention_only(), RIDX, RTGT + 10),
     ValueError, ["targets", "vocab_size=10"]),
    ("loss_by_position: a negative target", lambda: tl.loss_by_position(attention_only(), RIDX, -RTGT - 1), ValueError,
     ["targets", "-"]),
    ("agreement: a negative s_token", lambda: tl.agreement_probability(attention_only(), RIDX, YES, -1), ValueError,
     ["s_token", "-1"]),
    ("agreement: s_token past the vocabulary", lambda: tl.agreement_probability(attention_only(), RIDX, YES, 10),
     ValueError, ["s_token", "10"]),
    ("agreement: a float s_token", lambda: tl.agreement_probability(attention_only(), RIDX, YES, 1.0), TypeError,
     ["s_token", "1.0"]),
    ("train_on_repeats: the context too short",
     lambda: tl.train_on_repeats(tl.AttentionOnly(10, 8, 1, 1, 8), 1, repeat_len=5), ValueError,
     ["context_len=8", "repeat_len=5", "10"]),
    ("train_on_repeats: max_distance too long",
     lambda: tl.train_on_repeats(tl.AttentionOnly(10, 16, 1, 1, 8), 1, repeat_len=4, max_distance=14), ValueError,
     ["max_distance=14", "context_len=16"]),
    ("repeat_batch: seq_len too short", lambda: tl.repeat_batch(2, 8, 10, 5), ValueError,
     ["seq_len=8", "repeat_len=5"]),
    ("repeat_batch: min_distance past the length", lambda: tl.repeat_batch(2, 12, 10, 4, min_distance=10),
     ValueError, ["seq_len=12", "min_distance=10"]),
    ("repeat_batch: max_distance below min_distance",
     lambda: tl.repeat_batch(2, 16, 10, 4, min_distance=10, max_distance=6), ValueError,
     ["max_distance=6", "min_distance=10"]),
]  # fmt: skip


@pytest.mark.parametrize(("call", "error", "words"), [c[1:] for c in CH12_ERRORS], ids=[c[0] for c in CH12_ERRORS])
def test_bad_chapter_12_input_names_the_argument_and_the_value(call, error, words):
    with pytest.raises(Exception) as caught:
        call()
    assert type(caught.value) is error, f"{type(caught.value).__name__}: {caught.value}"
    assert all(word in str(caught.value) for word in words), str(caught.value)


def test_head_indices_may_be_a_1d_integer_tensor():
    model = attention_only()
    with tl.intervene_heads(model, {"layers.0": torch.tensor([1])}):
        a = model(RIDX)[0]
    with tl.intervene_heads(model, {"layers.0": [1]}):
        b = model(RIDX)[0]
    assert torch.equal(a, b)


def test_captured_weights_are_the_probabilities_before_dropout_in_train_mode():
    torch.manual_seed(0)
    layer = tl.MultiHeadAttention(8, 2, dropout=0.5).train()
    x = torch.randn(2, 6, 8, generator=torch.Generator().manual_seed(3))
    with tl.capture_attention(layer) as captured:
        _, returned = layer(x, x, x, need_weights=True, is_causal=True)
    probabilities = captured[""]
    # what the layer returns in train mode is after dropout: zeros, and the rest scaled by 1 / (1 - p)
    assert (returned == 0).sum() > (probabilities == 0).sum()
    assert not torch.allclose(returned.sum(-1), torch.ones(2, 2, 6))
    # what capture_attention records is the probabilities: rows sum to 1, equal to eval mode's
    assert torch.allclose(probabilities.sum(-1), torch.ones(2, 2, 6))
    kept = returned != 0
    assert torch.allclose(returned[kept], probabilities[kept] * 2)
    layer.eval()
    assert torch.equal(probabilities, layer(x, x, x, need_weights=True, is_causal=True)[1])


# A NaN in a masked key's value: its weight is exactly 0, but 0 * NaN is NaN, so it reaches every
# output row that has a key (as the attention functions' docstrings say); PyTorch's kernel agrees.
def _nan_value_case():
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(1, 1, 4, 8, generator=g) for _ in range(3))
    v[..., 3, :] = NAN  # the last position: in the future of rows 0..2, and padding below
    return q, k, v


def _mha_value_nan(need_weights):
    layer = mha()
    x = torch.randn(1, 4, 8, generator=torch.Generator().manual_seed(5))
    xv = x.clone()
    xv[:, 3] = NAN
    return layer(x, x, xv, mask=PADDED[:, None, None, :], need_weights=need_weights)[0]


PADDED = torch.tensor([[True, True, True, False]])  # (B, T_k): the last key is padding
CAUSAL = tl.causal_mask(4)
NAN_VALUE_CASES = {
    "scaled_dot_product_attention, causal": lambda: tl.scaled_dot_product_attention(*_nan_value_case(), mask=CAUSAL)[0],
    "scaled_dot_product_attention, padding": lambda: tl.scaled_dot_product_attention(
        *_nan_value_case(), mask=PADDED[:, None, None, :]
    )[0],
    "dot_product_attention, causal": lambda: tl.dot_product_attention(*_nan_value_case(), mask=CAUSAL)[0],
    "PyTorch's kernel, causal": lambda: torch.nn.functional.scaled_dot_product_attention(
        *_nan_value_case(), is_causal=True
    ),
    "MultiHeadAttention, fused path": lambda: _mha_value_nan(False),
    "MultiHeadAttention, need_weights path": lambda: _mha_value_nan(True),
    "SingleHeadAttention, causal": lambda: tl.SingleHeadAttention(8, 8)(
        torch.randn(1, 4, 8), torch.cat([torch.randn(1, 3, 8), torch.full((1, 1, 8), NAN)], 1), mask=CAUSAL
    )[0],
    "AdditiveAttention, causal": lambda: tl.AdditiveAttention(8, 8, 8)(*_nan_value_case(), mask=CAUSAL)[0],
}


@pytest.mark.parametrize("case", NAN_VALUE_CASES)
def test_a_nan_in_a_masked_value_reaches_every_output_row(case):
    torch.manual_seed(0)
    out = NAN_VALUE_CASES[case]()
    rows = out.isnan().any(-1).flatten()  # one per query
    assert rows.all(), f"{case}: rows without NaN {(~rows).nonzero().flatten().tolist()}"


def test_cleaning_the_padding_first_keeps_the_other_rows_finite():
    q, k, v = _nan_value_case()
    out, weights = tl.scaled_dot_product_attention(q, k, v.nan_to_num(), mask=CAUSAL)
    assert torch.isfinite(out).all() and (weights[..., :3, 3] == 0).all()
    # and the result is the one a finite value there gives: masked, it had no weight
    v2 = v.nan_to_num(nan=123.0)
    assert torch.equal(out[..., :3, :], tl.scaled_dot_product_attention(q, k, v2, mask=CAUSAL)[0][..., :3, :])


def test_a_fully_masked_query_still_gets_zeros_but_dot_product_attention_gives_nan():
    q, k, v = _nan_value_case()
    none_for_row_0 = CAUSAL.clone()
    none_for_row_0[0] = False
    assert (tl.scaled_dot_product_attention(q, k, v, mask=none_for_row_0)[0][..., 0, :] == 0).all()
    assert tl.dot_product_attention(q, k, v, mask=none_for_row_0)[0][..., 0, :].isnan().all()

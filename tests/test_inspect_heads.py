"""Tests for transformer_lib/inspect_heads.py: capturing attention weights without changing the
outputs, interventions on heads that undo themselves, and the scores on hand-built patterns."""

import math

import pytest
import torch

import transformer_lib as tl
from transformer_lib.inspect_heads import attention_layers


def gpt(dtype=torch.float64, **overrides):
    torch.manual_seed(0)
    config = dict(vocab_size=11, context_len=12, n_layers=2, n_heads=4, d_model=16)
    return tl.GPT(tl.GPTConfig(**{**config, **overrides})).to(dtype).eval()


def transformer(dtype=torch.float64):
    torch.manual_seed(0)
    config = tl.TransformerConfig(11, 13, d_model=16, n_heads=2, n_encoder_layers=2, n_decoder_layers=2)
    return tl.Transformer(config).to(dtype).eval()


def attention_only(dtype=torch.float64, **options):
    torch.manual_seed(0)
    return tl.AttentionOnly(11, 12, 2, 4, 16, **options).to(dtype).eval()


def no_hooks_left(model):
    return all(
        not m._forward_hooks and not m._forward_pre_hooks and not m._forward_hooks_with_kwargs for m in model.modules()
    )


def ids(gen, B, T, low=0, high=11):
    return torch.randint(low, high, (B, T), generator=gen)


def seq2seq_inputs(gen):
    src = ids(gen, 3, 7, 3, 11)
    src[1, 5:] = 0  # padding, so the encoder's and cross-attention's masks matter
    return src, ids(gen, 3, 6, 3, 13)


# --- capturing -------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_capture_leaves_gpt_outputs_bitwise_equal_and_keeps_the_fused_path(gen, dtype):
    model = gpt(dtype)
    idx = ids(gen, 3, 12)
    plain, _ = model(idx)
    calls = []
    real_sdpa = torch.nn.functional.scaled_dot_product_attention

    def counting(*args, **kwargs):
        calls.append(1)
        return real_sdpa(*args, **kwargs)

    torch.nn.functional.scaled_dot_product_attention = counting
    try:
        (logits, _), weights = tl.run_with_attention(model, idx)
    finally:
        torch.nn.functional.scaled_dot_product_attention = real_sdpa
    assert len(calls) == 2  # one fused call per layer: the model's forward took its usual path
    assert torch.equal(logits, plain)
    assert list(weights) == ["decoder.layers.0.self_attn", "decoder.layers.1.self_attn"]
    for w in weights.values():
        assert w.shape == (3, 4, 12, 12) and w.dtype == dtype
        torch.testing.assert_close(w.sum(-1), torch.ones(3, 4, 12, dtype=dtype))
        assert not w.triu(1).any()  # causal
    assert no_hooks_left(model)


def layer_inputs(model, idx_args):
    """Each attention layer's query, key and value in a plain forward, read by a pre-hook."""
    seen, handles = {}, []
    for name, m in attention_layers(model).items():
        hook = lambda mod, args, kwargs, name=name: seen.setdefault(name, (args, kwargs))
        handles.append(m.register_forward_pre_hook(hook, with_kwargs=True))
    model(*idx_args)
    for h in handles:
        h.remove()
    return seen


@pytest.mark.parametrize("make", [gpt, transformer, attention_only])
def test_captured_weights_equal_what_need_weights_returns(gen, make):
    model = make()
    args = seq2seq_inputs(gen) if make is transformer else (ids(gen, 3, 9),)
    plain = model(*args)[0]
    (out, _), weights = tl.run_with_attention(model, *args)
    assert torch.equal(out, plain)
    layers = attention_layers(model)
    assert set(weights) == set(layers)
    # bitwise: each layer's need_weights=True on the very inputs it saw in the forward pass
    for name, (a, kw) in layer_inputs(model, args).items():
        _, expected = layers[name](*a, **{**kw, "need_weights": True})
        assert torch.equal(weights[name], expected), name
    if make is gpt:  # the first layer sees the same input in both runs: bitwise equal
        model(*args, need_weights=True)
        assert torch.equal(weights["decoder.layers.0.self_attn"], model.decoder.layers[0].self_attn_weights)
    if make is transformer:
        # and, up to rounding, the weights the whole model keeps with need_weights=True
        model(*args, need_weights=True)
        torch.testing.assert_close(weights["decoder.layers.1.cross_attn"], model.decoder.layers[1].cross_attn_weights)
        assert weights["encoder.layers.0.self_attn"].shape == (3, 2, 7, 7)
        assert weights["decoder.layers.0.cross_attn"].shape == (3, 2, 6, 7)
        assert not weights["encoder.layers.0.self_attn"][1, :, :, 5:].any()  # padding gets no weight


def test_capture_with_grouped_query_and_window_attention(gen):
    model = gpt(n_kv_heads=2, window=4)
    idx = ids(gen, 2, 10)
    (logits, _), weights = tl.run_with_attention(model, idx)
    assert torch.equal(logits, model(idx)[0])
    for name, (a, kw) in layer_inputs(model, (idx,)).items():
        expected = attention_layers(model)[name](*a, **{**kw, "need_weights": True})[1]
        assert torch.equal(weights[name], expected)
    assert not weights["decoder.layers.0.self_attn"].tril(-4).any()  # each query sees 4 keys at most


def test_capture_keeps_weights_the_caller_asked_for_and_chosen_layers_only(gen):
    model = gpt()
    idx = ids(gen, 2, 5)
    with tl.capture_attention(model, layers=["decoder.layers.1.self_attn"]) as weights:
        model(idx, need_weights=True)
    assert list(weights) == ["decoder.layers.1.self_attn"]
    assert torch.equal(weights["decoder.layers.1.self_attn"], model.decoder.layers[1].self_attn_weights)


def test_capture_removes_its_hooks_when_the_forward_raises():
    model = gpt()
    with pytest.raises(ValueError, match="idx"):
        with tl.capture_attention(model):
            model(torch.tensor([[99]]))  # a token id out of range
    assert no_hooks_left(model)
    with pytest.raises(ValueError, match="idx"):
        tl.head_activations(model, torch.tensor([[99]]))
    with pytest.raises(ValueError, match="idx"):
        with tl.intervene_heads(model, {"decoder.layers.0.self_attn": [1]}):
            model(torch.tensor([[99]]))
    assert no_hooks_left(model)
    with pytest.raises(ValueError, match="KVCache"):
        with tl.capture_attention(model):
            model(torch.tensor([[1, 2]]), cache=model.new_cache())
    assert no_hooks_left(model)


def test_capture_names_a_missing_layer():
    model = gpt()
    with pytest.raises(ValueError, match="'decoder.layers.7.self_attn'.*decoder.layers.0.self_attn"):
        tl.run_with_attention(model, torch.tensor([[1]]), layers=["decoder.layers.7.self_attn"])
    with pytest.raises(ValueError, match="no attention layer"):
        tl.run_with_attention(torch.nn.Linear(2, 2), torch.zeros(1, 2))
    assert no_hooks_left(model)


def test_head_activations_are_the_out_proj_input(gen):
    model = attention_only()
    idx = ids(gen, 2, 6)
    (logits, _), heads = tl.head_activations(model, idx)
    assert torch.equal(logits, model(idx)[0])
    attn = model.layers[0]
    h = model.norms[0](model.tok_embed(idx) + model.pos_embed(torch.arange(6)))
    out = attn(h, h, h, is_causal=True)[0]
    merged = heads["layers.0"].transpose(1, 2).reshape(2, 6, 16)  # (B, T, h * d_k)
    assert heads["layers.0"].shape == (2, 4, 6, 4)
    assert torch.equal(attn.out_proj(merged), out)
    assert no_hooks_left(model)


# --- interventions ---------------------------------------------------------------------------


@pytest.mark.parametrize("make", [gpt, transformer, attention_only])
def test_intervening_on_no_head_changes_nothing(gen, make):
    model = make()
    args = seq2seq_inputs(gen) if make is transformer else (ids(gen, 3, 9),)
    plain = model(*args)[0]
    first = next(iter(attention_layers(model)))
    for heads in ({}, {first: []}):
        with tl.intervene_heads(model, heads):
            assert torch.equal(model(*args)[0], plain)
    with tl.intervene_heads(model, {first: [0, 1]}, mode="patch", reference=args):
        assert torch.equal(model(*args)[0], plain)  # a head patched with its own activation
    assert no_hooks_left(model)


@pytest.mark.parametrize("bias", [True, False])
def test_zeroing_every_head_leaves_only_the_out_proj_bias(gen, bias):
    # Zeroing all h heads of a layer makes its attention output out_proj(0) = out_proj.bias at
    # every position (zero without a bias): exactly the model whose attention sublayer returns
    # that constant, which, without a bias, is the model without the sublayer (x + 0 = x).
    model = gpt(bias=bias)
    idx = ids(gen, 3, 9)
    attn = model.decoder.layers[1].self_attn

    def constant(module, args, output):
        out = output[0]
        return (torch.zeros_like(out) if module.out_proj.bias is None else module.out_proj.bias.expand_as(out)), None

    handle = attn.register_forward_hook(constant)
    removed = model(idx)[0]
    handle.remove()
    with tl.intervene_heads(model, {"decoder.layers.1.self_attn": range(4)}):
        zeroed = model(idx)[0]
    assert torch.equal(zeroed, removed)
    assert not torch.equal(zeroed, model(idx)[0])
    if not bias:  # the decoder layer's output is its input plus its feed-forward's
        layer = model.decoder.layers[1]
        x = torch.randn(2, 5, 16, generator=gen, dtype=torch.float64)
        with tl.intervene_heads(model, {"decoder.layers.1.self_attn": [0, 1, 2, 3]}):
            assert torch.equal(layer(x), layer.res_ff(x, layer.ff))
    assert no_hooks_left(model)


def test_zeroing_one_head_changes_only_that_heads_columns(gen):
    model = attention_only()
    idx = ids(gen, 2, 8)
    _, before = tl.head_activations(model, idx, layers="layers.0")
    with tl.intervene_heads(model, {"layers.0": 2}):
        # registered after the intervention, this reads what out_proj receives
        _, after = tl.head_activations(model, idx, layers="layers.0")
    assert not after["layers.0"][:, 2].any()
    assert torch.equal(after["layers.0"][:, [0, 1, 3]], before["layers.0"][:, [0, 1, 3]])
    assert no_hooks_left(model)


def test_mean_and_patch_modes_put_in_the_reference_activations(gen):
    model = attention_only()
    idx, ref = ids(gen, 3, 8), ids(gen, 3, 8)
    _, acts = tl.head_activations(model, ref)
    mean = acts["layers.1"][:, 1].mean(dim=(0, 1))  # (d_k,)
    for mode, expected in (("mean", mean.expand(3, 8, 4)), ("patch", acts["layers.1"][:, 1])):
        seen = {}
        with tl.intervene_heads(model, {"layers.1": [1]}, mode=mode, reference=ref):
            hook = lambda m, a: seen.setdefault("x", a[0])
            h = model.layers[1].out_proj.register_forward_pre_hook(hook)  # runs after the intervention
            model(idx)
            h.remove()
        torch.testing.assert_close(tl.split_heads(seen["x"], 4)[:, 1], expected, rtol=0, atol=1e-12)
    assert no_hooks_left(model)


def test_patching_into_the_first_layer_equals_running_the_other_input_there(gen):
    # patching every head of the only layer of a one-layer model with the activations on `ref`
    # gives exactly the logits of `ref`... except the residual stream, which still holds `idx`
    torch.manual_seed(0)
    model = tl.AttentionOnly(11, 12, 1, 2, 8).double().eval()
    idx, ref = ids(gen, 2, 6), ids(gen, 2, 6)
    with tl.intervene_heads(model, {"layers.0": [0, 1]}, mode="patch", reference=(ref,)):
        patched = model(idx)[0]
    x = model.tok_embed(idx) + model.pos_embed(torch.arange(6))
    h = model.norms[0](model.tok_embed(ref) + model.pos_embed(torch.arange(6)))
    expected = model.unembed(model.norm_f(x + model.layers[0](h, h, h, is_causal=True)[0]))
    assert torch.equal(patched, expected)


def test_intervention_errors_name_the_value_and_leave_no_hooks(gen):
    model = attention_only()
    with pytest.raises(ValueError, match="'layers.5'"):
        with tl.intervene_heads(model, {"layers.5": [0]}):
            pass
    with pytest.raises(ValueError, match="head 4 is out of range for layer 'layers.0', which has n_heads=4"):
        with tl.intervene_heads(model, {"layers.0": [4]}):
            pass
    with pytest.raises(TypeError, match=r"heads\['layers.1'\] must be a head index .* got 'a'"):
        with tl.intervene_heads(model, {"layers.1": "a"}):
            pass
    with pytest.raises(ValueError, match="head -1"):
        with tl.intervene_heads(model, {"layers.0": -1}):
            pass
    with pytest.raises(ValueError, match="mode must be one of .* got 'ablate'"):
        with tl.intervene_heads(model, {"layers.0": [0]}, mode="ablate"):
            pass
    with pytest.raises(ValueError, match="mode 'mean' needs reference"):
        with tl.intervene_heads(model, {"layers.0": [0]}, mode="mean"):
            pass
    with pytest.raises(ValueError, match="mode 'zero' takes no reference"):
        with tl.intervene_heads(model, {"layers.0": [0]}, reference=ids(gen, 1, 3)):
            pass
    with pytest.raises(TypeError, match="heads must be a dict"):
        with tl.intervene_heads(model, ["layers.0"]):
            pass
    with pytest.raises(ValueError, match=r"reference has \(B, T\)=\(1, 3\), this input has \(2, 5\)"):
        with tl.intervene_heads(model, {"layers.0": [0]}, mode="patch", reference=ids(gen, 1, 3)):
            model(ids(gen, 2, 5))
    assert no_hooks_left(model)


# --- scores on hand-built patterns -----------------------------------------------------------


def test_previous_token_score_exact_values():
    T = 5
    prev = torch.zeros(T, T)
    prev[0, 0] = 1
    prev[torch.arange(1, T), torch.arange(T - 1)] = 1  # every query on the token before it
    assert tl.previous_token_score(prev).item() == 1.0
    assert tl.previous_token_score(torch.eye(T)).item() == 0.0
    uniform = torch.tril(torch.ones(T, T, dtype=torch.float64))
    uniform = uniform / uniform.sum(-1, keepdim=True)
    expected = sum(1 / (t + 1) for t in range(1, T)) / (T - 1)  # row t gives 1/(t+1) to t-1
    assert math.isclose(tl.previous_token_score(uniform).item(), expected, rel_tol=1e-15)
    both = torch.stack([prev, torch.eye(T)])[None].expand(3, 2, T, T)  # (B, h, T, T)
    assert tl.previous_token_score(both).tolist() == [[1.0, 0.0]] * 3


def test_induction_score_exact_values():
    # T = 8, the second half repeats the first: query t >= 4 should read key t - 3
    T, half = 8, 4
    induction = torch.zeros(T, T, dtype=torch.float64)
    induction[:, 0] = 1
    for t in range(half, T):
        induction[t] = 0
        induction[t, t - half + 1] = 1
    assert tl.induction_score(induction).item() == 1.0
    assert tl.induction_score(torch.eye(T)).item() == 0.0
    half_right = induction.clone()
    half_right[half:] = 0
    half_right[half:, 0] = 0.5
    half_right[torch.arange(half, T), torch.arange(1, half + 1)] = 0.5
    assert tl.induction_score(half_right).item() == 0.5
    # the token itself (a "duplicate-token" head), not the one after it, scores 0
    dup = torch.zeros(T, T)
    dup[torch.arange(T), torch.arange(T)] = 1
    dup[torch.arange(half, T), torch.arange(half)] = 1
    assert tl.induction_score(dup).item() == 0.0


def test_induction_score_per_sequence_distance_and_queries():
    T = 6
    w = torch.zeros(2, 1, T, T)  # (B, h, T, T)
    w[0, 0, 4, 2] = 1  # distance 3: query 4 reads key 2
    w[0, 0, 5, 3] = 0.5
    w[1, 0, 5, 4] = 1  # distance 2: query 5 reads key 4
    queries = torch.zeros(2, 1, T, dtype=torch.bool)
    queries[0, 0, 4:] = True
    queries[1, 0, 5] = True
    score = tl.induction_score(w, torch.tensor([[3], [2]]), queries)
    assert score.tolist() == [[0.75], [1.0]]
    assert torch.isnan(tl.induction_score(w, 3, torch.zeros(T, dtype=torch.bool))).all()


def test_score_errors():
    with pytest.raises(ValueError, match=r"\(\.\.\., T, T\)"):
        tl.previous_token_score(torch.zeros(3, 4))
    with pytest.raises(ValueError, match="T >= 2"):
        tl.previous_token_score(torch.ones(1, 1))
    with pytest.raises(ValueError, match="odd length T=5"):
        tl.induction_score(torch.zeros(5, 5))
    with pytest.raises(ValueError, match="distance must be integers >= 1, got 0"):
        tl.induction_score(torch.zeros(4, 4), 0)
    with pytest.raises(ValueError, match="does not broadcast"):
        tl.induction_score(torch.zeros(2, 3, 4, 4), torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="queries marks a position t < distance"):
        tl.induction_score(torch.zeros(4, 4), 2, torch.ones(4, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"\(\.\.\., V, V\)"):
        tl.copying_score(torch.zeros(3))


def test_copying_score_exact_values():
    V = 4
    assert tl.copying_score(torch.eye(V, dtype=torch.float64)).item() == 1 - 1 / V
    assert tl.copying_score(-2 * torch.eye(V, dtype=torch.float64)).item() == -2 * (1 - 1 / V)
    assert tl.copying_score(torch.ones(V, V)).item() == 0.0  # raises every logit alike
    ov = torch.tensor([[3.0, 0.0], [1.0, 2.0]])  # column b: the logits a head reading token b adds
    # b = 0: 3 - (3 + 1) / 2 = 1; b = 1: 2 - (0 + 2) / 2 = 1
    assert tl.copying_score(ov).item() == 1.0
    assert tl.copying_score(torch.stack([ov, -ov])).tolist() == [1.0, -1.0]

"""Tests for transformer_lib/models.py: causality, padding invariance, overfitting a tiny batch,
decoding, clear errors for bad input, and the same code on CUDA when a GPU is present."""

import pytest
import torch
from _gpu import requires_cuda

import transformer_lib as tl


def tiny_gpt(**kw):
    torch.manual_seed(0)
    cfg = dict(vocab_size=11, context_len=16, n_layers=2, n_heads=2, d_model=32, dropout=0.0)
    cfg.update(kw)
    return tl.GPT(tl.GPTConfig(**cfg))


def tiny_transformer(**kw):
    torch.manual_seed(0)
    cfg = dict(
        src_vocab_size=13,
        tgt_vocab_size=13,
        d_model=32,
        n_heads=2,
        n_encoder_layers=2,
        n_decoder_layers=2,
        dropout=0.0,
        context_len=16,
    )
    cfg.update(kw)
    return tl.Transformer(tl.TransformerConfig(**cfg))


def test_gpt_is_causal(gen):
    model = tiny_gpt().eval()
    idx = torch.randint(0, 11, (2, 12), generator=gen)
    base, _ = model(idx)
    for t in range(12):
        changed = idx.clone()
        changed[:, t:] = torch.randint(0, 11, (2, 12 - t), generator=gen)
        out, _ = model(changed)
        assert torch.equal(out[:, :t], base[:, :t]), f"position < {t} saw the future"


@pytest.mark.parametrize("norm_first", [False, True])
def test_transformer_padding_invariance(gen, norm_first):
    model = tiny_transformer(norm_first=norm_first).eval()
    src = torch.randint(3, 13, (1, 6), generator=gen)
    tgt = torch.randint(3, 13, (1, 5), generator=gen)
    ref, _ = model(src, tgt)
    src_padded = torch.cat([src, torch.zeros(1, 4, dtype=torch.long)], dim=1)
    tgt_padded = torch.cat([tgt, torch.zeros(1, 3, dtype=torch.long)], dim=1)
    out, _ = model(src_padded, tgt_padded)
    torch.testing.assert_close(out[:, :5], ref, atol=1e-5, rtol=1e-5)


def test_transformer_decoder_is_causal(gen):
    model = tiny_transformer().eval()
    src = torch.randint(3, 13, (2, 6), generator=gen)
    tgt = torch.randint(3, 13, (2, 8), generator=gen)
    base, _ = model(src, tgt)
    for t in range(8):
        changed = tgt.clone()
        changed[:, t:] = torch.randint(3, 13, (2, 8 - t), generator=gen)
        assert torch.equal(model(src, changed)[0][:, :t], base[:, :t])


def test_gpt_overfits_a_tiny_batch(gen):
    model = tiny_gpt()
    idx = torch.randint(0, 11, (4, 16), generator=gen)
    x, y = idx[:, :-1], idx[:, 1:]
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(150):
        _, loss = model(x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.2
    model.eval()
    # from the second position on, the context identifies the sequence: memorised exactly
    assert torch.equal(model(x)[0].argmax(-1)[:, 1:], y[:, 1:])


def test_transformer_overfits_and_greedy_decodes_a_tiny_batch(gen):
    model = tiny_transformer()
    src = torch.randint(3, 13, (4, 6), generator=gen)
    answer = src.flip(1)  # reverse the source
    bos, eos = torch.ones(4, 1, dtype=torch.long), torch.full((4, 1), 2)
    tgt = torch.cat([bos, answer, eos], dim=1)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(150):
        _, loss = model(src, tgt[:, :-1], targets=tgt[:, 1:])
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.05
    decoded = model.eval().greedy_decode(src, max_new_tokens=10)
    assert torch.equal(decoded[:, :7], torch.cat([answer, eos], dim=1))


def test_generate_shapes_and_top_k(gen):
    model = tiny_gpt(context_len=8).eval()
    idx = torch.randint(0, 11, (2, 5), generator=gen)
    out = model.generate(idx, 10, temperature=0.7, top_k=1, generator=torch.Generator().manual_seed(0))
    assert out.shape == (2, 15) and torch.equal(out[:, :5], idx)
    # top_k=1 is greedy: each new token is the argmax given the (cropped) context
    for t in range(5, 15):
        logits, _ = model(out[:, max(0, t - 8) : t])
        assert torch.equal(out[:, t], logits[:, -1].argmax(-1))
    with pytest.raises(ValueError, match="temperature"):
        model.generate(idx, 1, temperature=0.0)


def test_bad_model_inputs():
    model = tiny_gpt(context_len=8)
    with pytest.raises(ValueError, match="longer than context_len=8"):
        model(torch.zeros(1, 9, dtype=torch.long))
    with pytest.raises(ValueError, match=r"must lie in \[0, vocab_size=11\)"):
        model(torch.tensor([[1, 11]]))
    with pytest.raises(ValueError, match=r"must lie in \[0, vocab_size=11\)"):
        model(torch.tensor([[-1, 2]]))
    with pytest.raises(TypeError, match="integer tensor"):
        model(torch.zeros(1, 3))
    with pytest.raises(ValueError, match="divisible"):
        tiny_gpt(d_model=30, n_heads=4)
    t = tiny_transformer()
    with pytest.raises(ValueError, match="src"):
        t(torch.tensor([[3, 99]]), torch.tensor([[1]]))
    with pytest.raises(ValueError, match="tgt: sequence length 17"):
        t(torch.tensor([[3]]), torch.ones(1, 17, dtype=torch.long))


@requires_cuda
def test_models_run_on_cuda(gen):
    model = tiny_gpt().cuda()
    idx = torch.randint(0, 11, (2, 8), generator=gen).cuda()
    logits, loss = model(idx, idx)
    loss.backward()
    assert logits.device.type == "cuda"
    assert model.generate(idx, 3).device.type == "cuda"
    t = tiny_transformer().cuda().eval()
    src = torch.randint(3, 13, (2, 8), generator=gen).cuda()  # the tiny transformer's source ids
    assert t.greedy_decode(src, 4).device.type == "cuda"


def test_gpt_bias_flag_removes_every_bias():
    with_bias = tiny_gpt(bias=True)
    without = tiny_gpt(bias=False)
    assert any(name.endswith("bias") for name, _ in with_bias.named_parameters())
    assert not any(name.endswith("bias") for name, _ in without.named_parameters())
    logits, _ = without(torch.zeros(1, 4, dtype=torch.long))
    assert logits.shape == (1, 4, 11)


# --- chapter "Generation": n_kv_heads and window in the configs; caches (more in tests/test_cache.py) ---


def test_default_configs_build_the_same_models_as_before():
    # the new fields default to None: standard attention, full causal context, the same draws
    a, b = tiny_gpt(), tiny_gpt(n_kv_heads=None, window=None)
    assert list(a.state_dict()) == list(b.state_dict())
    assert all(torch.equal(p, q) for p, q in zip(a.state_dict().values(), b.state_dict().values(), strict=True))
    attn = a.decoder.layers[0].self_attn
    assert attn.in_proj_weight.shape == (3 * 32, 32) and a.decoder.layers[0].window is None
    assert tl.GPTConfig(vocab_size=5).to_dict()["n_kv_heads"] is None


def test_gpt_config_sets_grouped_heads_and_window_in_every_layer():
    model = tiny_gpt(n_kv_heads=1, window=5)
    for layer in model.decoder.layers:
        assert layer.self_attn.n_kv_heads == 1 and layer.window == 5
        assert layer.self_attn.in_proj_weight.shape == (32 + 2 * 16, 32)
    seq = tiny_transformer(n_kv_heads=1)
    assert all(m.n_kv_heads == 1 for m in seq.modules() if isinstance(m, tl.MultiHeadAttention))


def test_a_grouped_windowed_gpt_survives_a_checkpoint(tmp_path):
    model = tiny_gpt(n_kv_heads=1, window=3).eval()
    state = {"model_class": "GPT", "model_config": model.config.to_dict(), "model": model.state_dict()}
    tl.save_checkpoint(state, tmp_path / "ckpt.pt")
    loaded, _, _ = tl.load_checkpoint(tmp_path)
    idx = torch.randint(0, 11, (2, 10), generator=torch.Generator().manual_seed(0))
    assert loaded.config == model.config and torch.equal(loaded(idx)[0], model(idx)[0])


def test_a_cache_follows_the_positions_of_a_gpt():
    model = tiny_gpt().eval()
    cache = model.new_cache()
    idx = torch.randint(0, 11, (1, 6), generator=torch.Generator().manual_seed(1))
    model(idx[:, :4], cache=cache)
    assert cache.position == 4 and all(c.self_attn.length == 4 for c in cache.layers)
    step, _ = model(idx[:, 4:5], cache=cache)
    torch.testing.assert_close(step[:, -1], model(idx[:, :5])[0][:, -1], atol=1e-5, rtol=1e-5)


def test_a_subclass_whose_decode_takes_no_cache_still_greedy_decodes():
    class OldStyle(tl.Transformer):
        def decode(self, tgt, memory, src_keep, need_weights=False):
            return super().decode(tgt, memory, src_keep, need_weights)

    torch.manual_seed(0)
    config = tl.TransformerConfig(src_vocab_size=13, tgt_vocab_size=13, d_model=16, n_heads=2, context_len=16)
    old, new = OldStyle(config).eval(), tl.Transformer(config).eval()
    new.load_state_dict(old.state_dict())
    src = torch.randint(3, 13, (2, 5), generator=torch.Generator().manual_seed(0))
    assert torch.equal(old.greedy_decode(src, 6), new.greedy_decode(src, 6))


@pytest.mark.parametrize("d_model", [32, 64, 128])
def test_transformer_token_embeddings_match_the_positional_scale(d_model):
    # After the sqrt(d_model) factor a token vector must be of the same order as its sinusoidal
    # position vector (chapter "The transformer block"): E|sqrt(d) E[id]|^2 = d with std 1/sqrt(d), |PE(t)|^2 = d / 2,
    # so the ratio is 2 (std 0.02 would give 0.0008 d: 0.05 at d_model = 64).
    model = tiny_transformer(d_model=d_model, src_vocab_size=500, tgt_vocab_size=400, context_len=64)
    pe_sq = model.src_pos.pe.double().pow(2).sum(-1).mean().item()
    assert pe_sq == pytest.approx(d_model / 2)
    for embed in (model.src_embed, model.tgt_embed):
        ids = torch.arange(embed.num_embeddings)
        tok_sq = tl.scaled_embedding(embed, ids).double().pow(2).sum(-1).mean().item()
        assert 1 / 2.5 < tok_sq / pe_sq < 2.5, (d_model, tok_sq, pe_sq)


def test_gpt_keeps_gpt2_embedding_init():
    # GPT has no sqrt(d_model) factor and learned positions: GPT-2's N(0, 0.02) for both tables.
    model = tiny_gpt(vocab_size=2000, d_model=64)
    for table in (model.tok_embed.weight, model.pos_embed.embedding.weight):
        assert 0.018 < table.std().item() < 0.022

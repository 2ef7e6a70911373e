"""Chapter "Latent, sparse and sink attention"'s sparse attention by selection: the indexer matches DeepSeek-V3.2's in
transformers, covering top-k is dense attention, selection never looks ahead, the cache changes nothing, and the
indexer's loss trains the indexer alone."""

import copy

import pytest
import torch
from torch import nn

from transformer_lib.kv_cache import KVCache
from transformer_lib.masks import causal_mask, sliding_window_mask
from transformer_lib.modern_block import QKTransform
from transformer_lib.multihead import MultiHeadAttention
from transformer_lib.pretrained_latent import indexer_from_deepseek
from transformer_lib.sparse_attention import (
    AddAuxiliaryLoss,
    Indexer,
    SparseAttention,
    SparseCache,
    select_keys,
)

D64 = torch.float64
pytestmark = pytest.mark.usefixtures("one_thread")  # tiny layers: more threads only stall each other


# ---- parity with transformers' DeepseekV32Indexer -------------------------------------------------


def _deepseek(seed: int = 0):
    """transformers' indexer and rotary embedding on random weights, and the book's Indexer with
    the same weights: DeepSeek rotates half-split pairs (i, i + r/2) of the first r dimensions, the
    book interleaved pairs (2i, 2i + 1), so the rows of the rope part are permuted."""
    from transformers.models.deepseek_v32 import modeling_deepseek_v32 as ds
    from transformers.models.deepseek_v32.configuration_deepseek_v32 import DeepseekV32Config

    config = DeepseekV32Config(
        hidden_size=32, num_attention_heads=4, num_key_value_heads=4, q_lora_rank=24, kv_lora_rank=16,
        qk_rope_head_dim=4, qk_nope_head_dim=8, v_head_dim=8, index_n_heads=4, index_head_dim=16, index_topk=5,
        intermediate_size=64, moe_intermediate_size=16, num_hidden_layers=1, vocab_size=50,
    )  # fmt: skip
    torch.manual_seed(seed)
    theirs = ds.DeepseekV32Indexer(config, layer_idx=0).to(D64)
    with torch.no_grad():
        theirs.k_norm.weight.normal_(1.0, 0.3)
        theirs.k_norm.bias.normal_(0.0, 0.3)
    rotary = ds.DeepseekV32RotaryEmbedding(config)  # the model's (rotary_emb): its cos and sin reach the indexer
    r, D, H = config.qk_rope_head_dim, config.index_head_dim, config.index_n_heads
    order = [i // 2 + (i % 2) * (r // 2) for i in range(r)] + list(range(r, D))  # ours[2i] = theirs[i], ...
    ours = Indexer(32, H, D, rope_dim=r, q_dim=24, rotary_base=config.rope_parameters["rope_theta"]).to(D64)
    with torch.no_grad():
        ours.q_proj.weight.copy_(theirs.wq_b.weight.view(H, D, -1)[:, order].reshape(H * D, -1))
        ours.k_proj.weight.copy_(theirs.wk.weight[order])
        ours.k_norm.weight.copy_(theirs.k_norm.weight[order])
        ours.k_norm.bias.copy_(theirs.k_norm.bias[order])
        ours.weights_proj.weight.copy_(theirs.weights_proj.weight)
    converted = indexer_from_deepseek(theirs)  # the library's converter: the same weights
    mine, its = ours.state_dict(), converted.state_dict()
    assert mine.keys() == its.keys() and all(torch.equal(mine[k], its[k]) for k in mine)
    for wrong in (ds.DeepseekV32MLP(config), torch.nn.Linear(2, 2)):  # another layer: refused by name
        with pytest.raises(TypeError, match=f"must be a transformers DeepseekV32Indexer, got {type(wrong).__name__}"):
            indexer_from_deepseek(wrong)
    return ds, config, theirs, rotary, ours


def _rotary_in_float64(self, x, position_ids):
    """DeepseekV32RotaryEmbedding.forward with its angles in float64 (transformers builds them in float32)."""
    dim, base = self.config.head_dim, self.config.rope_parameters["rope_theta"]
    inv_freq = 1.0 / base ** (torch.arange(0, dim, 2, dtype=D64) / dim)
    freqs = position_ids[..., None].to(D64) * inv_freq  # (B, S, dim / 2)
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos().to(x.dtype), emb.sin().to(x.dtype)


def _their_scores(monkeypatch, ds, theirs, rotary, x, q_resid, start, float64: bool):
    """The index scores transformers ranks (recorded where it calls topk) and its top-k indices."""
    B, S, _ = x.shape
    positions = torch.arange(start, start + S).expand(B, S)
    causal = causal_mask(S, S).expand(B, S, S)
    recorded = []
    topk = torch.Tensor.topk
    with monkeypatch.context() as patch:
        if float64:  # transformers scores in float32 (.float()) and builds the rotary angles in float32
            to_float = torch.Tensor.float
            patch.setattr(torch.Tensor, "float", lambda t, *a, **k: t if t.dtype == D64 else to_float(t, *a, **k))
            patch.setattr(ds.DeepseekV32RotaryEmbedding, "forward", _rotary_in_float64)
        cos_sin = rotary(x, positions)
        patch.setattr(torch.Tensor, "topk", lambda t, *a, **k: recorded.append(t) or topk(t, *a, **k))
        indices = theirs(x, q_resid, cos_sin, causal, positions)
    return recorded[0], indices.long()


def _clear_rows(scores: torch.Tensor, visible: torch.Tensor, top_k: int, gap: float) -> torch.Tensor:
    """Rows whose top-k set is well defined: at most top_k visible keys, or a gap above ``gap``
    between the k-th and the next score (a near tie may go either way at float32 precision)."""
    ranked = scores.masked_fill(~visible, float("-inf")).sort(-1, descending=True).values
    n_visible = visible.sum(-1)
    margin = ranked[..., top_k - 1] - ranked[..., top_k]
    return (n_visible <= top_k) | (margin > gap)


@pytest.mark.parametrize("float64, atol, gap", [(False, 1e-6, 1e-4), (True, 1e-12, 1e-9)])
def test_indexer_matches_deepseek_v32(monkeypatch, float64, atol, gap):
    ds, config, theirs, rotary, ours = _deepseek()
    torch.manual_seed(1)
    B, S, start, top_k = 2, 12, 3, config.index_topk
    x, q_resid = torch.randn(B, S, 32, dtype=D64), torch.randn(B, S, 24, dtype=D64)
    their_scores, their_indices = _their_scores(monkeypatch, ds, theirs, rotary, x, q_resid, start, float64)
    visible = causal_mask(S, S).expand(B, S, S)
    with torch.no_grad():
        scores = ours.scores(x, q_resid, start=start)  # (B, S, S)
    assert their_scores.dtype == (D64 if float64 else torch.float32)  # unpatched, transformers scores in float32
    torch.testing.assert_close(scores.masked_fill(~visible, float("-inf")), their_scores.to(D64), atol=atol, rtol=0)
    theirs_chosen = torch.zeros(B, S, S, dtype=torch.bool).scatter_(-1, their_indices, True) & visible
    ours_chosen = select_keys(scores, top_k, visible)
    clear = _clear_rows(scores, visible, top_k, gap)
    assert clear.float().mean() > 0.8  # the comparison below covers most rows
    assert torch.equal(ours_chosen[clear], theirs_chosen[clear])  # as sets: a bool row per query
    assert torch.equal(ours_chosen.sum(-1), visible.sum(-1).clamp(max=top_k))


# ---- the layer ------------------------------------------------------------------------------------


def _layers(top_k, *, n_kv_heads=None, rotary=False, seed=0, **options):
    """A SparseAttention and a MultiHeadAttention with the same weights, float64, in eval mode."""
    torch.manual_seed(seed)
    sparse = SparseAttention(32, 4, top_k=top_k, n_kv_heads=n_kv_heads, **options).to(D64).eval()
    dense = MultiHeadAttention(32, 4, n_kv_heads=n_kv_heads).to(D64).eval()
    dense.load_state_dict({k: v for k, v in sparse.state_dict().items() if not k.startswith("indexer.")})
    if rotary:
        sparse.qk_transform, dense.qk_transform = QKTransform(8, rotary_base=100.0), QKTransform(8, rotary_base=100.0)
    return sparse, dense


SETTINGS = [dict(), dict(n_kv_heads=2, rotary=True), dict(window=4), dict(rope_dim=4, index_heads=2, index_dim=6)]


@pytest.mark.parametrize("settings", SETTINGS)
def test_top_k_covering_the_context_is_dense_attention(settings):
    settings = dict(settings)
    window = settings.pop("window", None)
    T = 9
    sparse, dense = _layers(T, **settings)
    x = torch.randn(2, T, 32, dtype=D64)
    pad = torch.ones(2, 1, 1, T, dtype=torch.bool)
    pad[1, ..., :2] = False  # the second sequence's first two keys are padding
    for mask in (None, pad):
        args = dict(mask=mask, is_causal=True, window=window)
        for need_weights in (False, True):
            out, weights = sparse(x, x, x, need_weights=need_weights, **args)
            want, want_weights = dense(x, x, x, need_weights=need_weights, **args)
            torch.testing.assert_close(out, want, atol=1e-12, rtol=0)
        torch.testing.assert_close(weights, want_weights, atol=1e-12, rtol=0)


@pytest.mark.parametrize("settings", SETTINGS)
def test_sparse_attention_is_dense_attention_on_the_selected_keys(settings):
    settings = dict(settings)
    window = settings.pop("window", None)
    sparse, dense = _layers(3, **settings)
    x = torch.randn(2, 10, 32, dtype=D64)
    chosen = sparse.selected(x, window=window)  # (B, T, T)
    out, weights = sparse(x, x, x, is_causal=True, window=window, need_weights=True)
    want, want_weights = dense(x, x, x, mask=chosen[:, None], is_causal=True, window=window, need_weights=True)
    torch.testing.assert_close(out, want, atol=1e-12, rtol=0)
    torch.testing.assert_close(weights, want_weights, atol=1e-12, rtol=0)
    assert torch.equal(weights > 0, chosen[:, None].expand_as(weights))
    torch.testing.assert_close(sparse.attention_weights(x, x, x, is_causal=True, window=window), weights)
    full, _ = dense(x, x, x, is_causal=True, window=window)
    assert not torch.allclose(out, full)  # three keys of up to ten: the selection does change the output


@pytest.mark.parametrize("seed", range(4))
def test_selection_never_looks_ahead(seed):
    torch.manual_seed(seed)
    T, top_k = int(torch.randint(2, 14, ())), int(torch.randint(1, 6, ()))
    window = [None, 3][seed % 2]
    sparse, _ = _layers(top_k, rotary=seed >= 2, seed=seed)
    x = 3 * torch.randn(2, T, 32, dtype=D64)
    chosen = sparse.selected(x, start=seed, window=window)
    allowed = causal_mask(T, T) if window is None else sliding_window_mask(T, T, window)
    assert not (chosen & ~allowed).any()  # no future key, nothing outside the window
    assert torch.equal(chosen.sum(-1), allowed.sum(-1).clamp(max=top_k).expand(2, T))
    s = T // 2  # changing the tokens after s changes nothing at or before s
    later = torch.cat([x[:, : s + 1], torch.randn(2, T - s - 1, 32, dtype=D64)], dim=1)
    with torch.no_grad():
        out = sparse(x, x, x, is_causal=True, window=window)[0]
        out_later = sparse(later, later, later, is_causal=True, window=window)[0]
    torch.testing.assert_close(out_later[:, : s + 1], out[:, : s + 1], atol=1e-12, rtol=0)


@pytest.mark.parametrize("settings", SETTINGS)
def test_cached_decoding_equals_the_uncached_forward(settings):
    settings = dict(settings)
    window = settings.pop("window", None)
    sparse, _ = _layers(3, **settings)
    x = torch.randn(2, 12, 32, dtype=D64)
    with torch.no_grad():
        want = sparse(x, x, x, is_causal=True, window=window)[0]
    for grad in (False, True):  # without autograd the cache writes into buffers, with it it concatenates
        with torch.set_grad_enabled(grad):
            cache, outs, at = sparse.new_cache(window), [], 0
            for n in (5, 1, 1, 3, 2):  # a prompt, then tokens one and a few at a time
                part = x[:, at : at + n]
                outs.append(sparse(part, part, part, is_causal=True, window=window, cache=cache)[0])
                at += n
        torch.testing.assert_close(torch.cat(outs, dim=1), want, atol=1e-12, rtol=0)
    assert isinstance(cache, SparseCache) and cache.position == 12
    assert cache.index_keys.shape == (2, cache.length, sparse.indexer.head_dim)
    assert cache.length == (12 if window is None else window - 1)
    keys_only = cache.k.numel() + cache.v.numel()
    assert cache.nbytes() == (keys_only + cache.index_keys.numel()) * 8
    cache.reset()
    assert cache.index_keys is None and cache.nbytes() == 0


# ---- training the indexer -------------------------------------------------------------------------


def _grads(layer: nn.Module) -> dict[str, torch.Tensor | None]:
    return {name: None if p.grad is None else p.grad.clone() for name, p in layer.named_parameters()}


def test_the_indexer_loss_moves_only_the_indexer():
    torch.manual_seed(0)
    layer = SparseAttention(32, 4, top_k=3, index_loss_weight=1.0).to(D64).train()
    without = copy.deepcopy(layer)
    without.index_loss_weight = 0.0  # the same model, no indexer loss
    x = torch.randn(2, 10, 32, dtype=D64, requires_grad=True)
    target = torch.randn(2, 10, 32, dtype=D64)
    grads = []
    for model in (layer, without):
        model(x, x, x, is_causal=True)[0].mul(target).sum().backward()
        grads.append((_grads(model), x.grad.clone()))
        x.grad = None
    (with_loss, x_grad), (plain, plain_x_grad) = grads
    torch.testing.assert_close(x_grad, plain_x_grad, atol=0, rtol=0)  # x reaches the indexer detached
    for name, g in with_loss.items():
        if name.startswith("indexer."):
            assert plain[name] is None and g is not None and g.abs().max() > 0
        else:
            torch.testing.assert_close(g, plain[name], atol=0, rtol=0)
    # the indexer's gradient is the indexer loss's alone, times index_loss_weight
    layer.zero_grad(set_to_none=True)
    layer.index_loss_weight = 2.0
    (0 * layer(x, x, x, is_causal=True)[0].sum()).backward()
    for name, g in _grads(layer).items():
        if name.startswith("indexer."):
            torch.testing.assert_close(g, 2 * with_loss[name], atol=1e-14, rtol=1e-12)
        else:
            assert g.abs().max() == 0
    # one optimizer step: the main weights move as without the indexer loss, the indexer only with it
    for model, g in ((layer, with_loss), (without, plain)):
        for name, p in model.named_parameters():
            p.grad = g[name]
    before = {k: v.clone() for k, v in layer.state_dict().items()}
    torch.optim.SGD(layer.parameters(), lr=0.1).step()
    torch.optim.SGD(without.parameters(), lr=0.1).step()
    for name, p in layer.named_parameters():
        if name.startswith("indexer."):
            assert not torch.equal(p, before[name]) and torch.equal(without.get_parameter(name), before[name])
        else:
            assert not torch.equal(p, before[name])
            torch.testing.assert_close(p, without.get_parameter(name), atol=0, rtol=0)


def test_the_indexer_loss_is_the_divergence_from_the_dense_attention():
    sparse, dense = _layers(3, n_kv_heads=2, rotary=True)
    x = torch.randn(2, 9, 32, dtype=D64)
    sparse.train()(x, x, x, is_causal=True)
    with torch.no_grad():
        p = dense(x, x, x, is_causal=True, need_weights=True)[1].mean(1)  # (B, T, T): the heads' average
        scores = sparse.indexer.scores(x).masked_fill(~causal_mask(9, 9), float("-inf"))
    log_q = scores.log_softmax(-1)
    kl = torch.where(p > 0, p * (p.log() - log_q), 0.0).sum(-1).mean()
    torch.testing.assert_close(sparse.index_loss, kl, atol=1e-12, rtol=0)


def test_the_indexer_learns_a_fixed_attention_pattern():
    torch.manual_seed(0)
    layer = SparseAttention(32, 4, top_k=4, index_heads=2, index_dim=8).to(D64).train()
    with torch.no_grad():
        layer.in_proj_weight[:64] *= 3  # sharper attention: more to imitate
    for name, p in layer.named_parameters():
        p.requires_grad_(name.startswith("indexer."))  # the attention pattern stays fixed
    optimizer = torch.optim.Adam(layer.indexer.parameters(), lr=1e-2)
    x = torch.randn(4, 16, 32, dtype=D64)
    losses = []
    for _ in range(50):  # an ordinary training loop: the indexer loss comes with the output
        optimizer.zero_grad()
        layer(x, x, x, is_causal=True)[0].pow(2).mean().backward()
        optimizer.step()
        losses.append(float(layer.index_loss))
    assert losses[-1] < 0.5 * losses[0]
    layer.eval()
    layer.index_loss = None
    with torch.no_grad():
        layer(x, x, x, is_causal=True)
    assert layer.index_loss is None  # no indexer loss outside training


@pytest.mark.parametrize("seed", range(3))
def test_select_keeps_the_top_k_and_gives_ties_to_the_earliest_key(seed):
    torch.manual_seed(seed)
    scores = torch.randn(2, 6, 9, dtype=D64)
    visible = causal_mask(6, 9)
    chosen = select_keys(scores, 3, visible)
    best = scores.masked_fill(~visible, float("-inf")).topk(3, dim=-1).indices
    assert torch.equal(chosen, torch.zeros_like(chosen).scatter_(-1, best, True) & visible)  # no ties here
    ties = scores.clamp(min=0).round(decimals=0)  # a few distinct values, many equal
    chosen = select_keys(ties, 3, visible)
    for b, s in [(b, s) for b in range(2) for s in range(6) if visible[s].sum() > 3]:  # rows with a choice
        kept = chosen[b, s].nonzero().flatten()
        left = (visible[s] & ~chosen[b, s]).nonzero().flatten()
        assert ties[b, s, left].max() <= ties[b, s, kept].min()  # nothing left out beats a key kept
        for i in kept:  # and an equal key left out comes after every kept one of its score
            assert all(j > i for j in left if ties[b, s, j] == ties[b, s, i])


def test_add_auxiliary_loss_passes_the_output_and_weights_the_loss():
    torch.manual_seed(0)
    x = torch.randn(3, 4, dtype=D64, requires_grad=True)
    w = torch.randn(4, dtype=D64, requires_grad=True)
    out = AddAuxiliaryLoss.apply(x * 2, (w**2).sum(), 0.5)
    assert torch.equal(out, x * 2)
    out.sum().backward()
    torch.testing.assert_close(x.grad, torch.full_like(x, 2.0))
    torch.testing.assert_close(w.grad, 0.5 * 2 * w.detach())


# ---- bad input ------------------------------------------------------------------------------------


@pytest.mark.parametrize("top_k, error", [(0, ValueError), (-2, ValueError), (2.5, TypeError), (True, TypeError)])
def test_bad_top_k_is_refused_by_name(top_k, error):
    with pytest.raises(error, match="top_k"):
        SparseAttention(32, 4, top_k=top_k)
    with pytest.raises(error, match="top_k"):
        select_keys(torch.randn(1, 3, 3), top_k)


def test_bad_settings_and_calls_are_refused_by_name():
    for kwargs, error, name in [
        (dict(rope_dim=3), ValueError, "rope_dim"), (dict(rope_dim=10), ValueError, "rope_dim"),
        (dict(index_heads=0), ValueError, "index_heads"), (dict(index_dim=1.5), TypeError, "index_dim"),
        (dict(index_loss_weight=-1.0), ValueError, "index_loss_weight"),
        (dict(index_loss_weight="1"), TypeError, "index_loss_weight"), (dict(rotary_base=0), ValueError, "rotary_base"),
    ]:  # fmt: skip
        with pytest.raises(error, match=name):
            SparseAttention(32, 4, top_k=2, **kwargs)
    layer = SparseAttention(32, 4, top_k=2)
    x, y = torch.randn(1, 5, 32), torch.randn(1, 5, 32)
    with pytest.raises(ValueError, match="is_causal=True"):
        layer(x, x, x)
    with pytest.raises(ValueError, match="self-attention"):
        layer(x, y, y, is_causal=True)
    with pytest.raises(TypeError, match="SparseCache"):
        layer(x, x, x, is_causal=True, cache=KVCache())
    with pytest.raises(ValueError, match="shape"):
        layer.indexer.scores(x, q_input=torch.randn(1, 4, 32))


# ---- the gathered path: only the selected keys read -----------------------------------------------


def _gathered_and_masked(layer, x, **args):
    """The layer's output and weights both ways: the selected keys gathered, and every score masked."""
    with torch.no_grad():
        return [layer(x, x, x, is_causal=True, need_weights=True, gathered=g, **args) for g in (True, False)]


@pytest.mark.parametrize("settings", SETTINGS)
@pytest.mark.parametrize("seed", range(3))
def test_the_gathered_path_equals_the_masked_one(settings, seed):
    settings = dict(settings)
    window = settings.pop("window", None)
    torch.manual_seed(seed)
    T, top_k = int(torch.randint(1, 13, ())), int(torch.randint(1, 8, ()))  # early queries see fewer than k keys
    sparse, _ = _layers(top_k, seed=seed, **settings)
    x = torch.randn(2, T, 32, dtype=D64)
    pad = torch.ones(2, 1, 1, T, dtype=torch.bool)
    pad[1, ..., : T // 3] = False  # padding: some queries see no key at all
    per_head = torch.rand(2, 4, T, T, generator=torch.Generator().manual_seed(seed)) > 0.3  # a mask per head
    for mask in (None, pad, per_head):
        (out, weights), (want, want_weights) = _gathered_and_masked(sparse, x, mask=mask, window=window)
        torch.testing.assert_close(out, want, atol=1e-12, rtol=0)
        torch.testing.assert_close(weights, want_weights, atol=1e-12, rtol=0)
        with torch.no_grad():
            fused = sparse(x, x, x, is_causal=True, mask=mask, window=window)[0]
            sparse.gathered = True  # the attribute, as the call's option
            plain = sparse(x, x, x, is_causal=True, mask=mask, window=window)[0]
            sparse.gathered = False
        torch.testing.assert_close(plain, fused, atol=1e-12, rtol=0)


@pytest.mark.parametrize("settings", SETTINGS)
def test_gathered_cached_decoding_equals_the_uncached_forward(settings):
    settings = dict(settings)
    window = settings.pop("window", None)
    sparse, _ = _layers(3, **settings)
    sparse.gathered = True
    x = torch.randn(2, 12, 32, dtype=D64)
    with torch.no_grad():
        want = sparse(x, x, x, is_causal=True, window=window, gathered=False)[0]
        cache, outs, at = sparse.new_cache(window), [], 0
        for n in (2, 1, 1, 5, 3):  # a prompt shorter than k, then tokens one and a few at a time
            part = x[:, at : at + n]
            outs.append(sparse(part, part, part, is_causal=True, window=window, cache=cache)[0])
            at += n
    torch.testing.assert_close(torch.cat(outs, dim=1), want, atol=1e-12, rtol=0)


def test_the_gathered_path_reads_only_the_selected_keys():
    sparse, _ = _layers(3, n_kv_heads=2)
    torch.manual_seed(1)
    q = torch.randn(2, 4, 9, 8, dtype=D64)
    k, v = torch.randn(2, 2, 2, 9, 8, dtype=D64)
    chosen = select_keys(torch.randn(2, 9, 9, dtype=D64), 3)  # (B, T_q, T_k): three keys per query
    visible = causal_mask(9, 9)
    poisoned = [t.clone() for t in (k, v)]
    for t in poisoned:  # every key and value no query selected: NaN
        t.masked_fill_(~chosen.any(1)[:, None, :, None], float("nan"))
    at = chosen.nonzero()[:, -1].view(2, 9, 3)  # (B, T_q, n): the positions
    heads, weights = sparse._attend_gathered(q, *poisoned, visible, at, 0.0, True)
    want, want_weights = sparse._attend_by_hand(q, k, v, visible & chosen[:, None], 0.0)
    assert heads.isfinite().all()  # nothing outside the selection was read
    torch.testing.assert_close(heads, want, atol=1e-12, rtol=0)
    torch.testing.assert_close(weights, want_weights, atol=1e-12, rtol=0)


def test_a_cache_for_another_batch_is_refused_and_left_as_it_was():
    sparse, _ = _layers(3)
    x = torch.randn(3, 8, 32, dtype=D64)
    with torch.no_grad():
        want = sparse(x, x, x, is_causal=True)[0]
        cache = sparse.new_cache()
        head, tail = x[:, :5], x[:, 5:]
        first = sparse(head, head, head, is_causal=True, cache=cache)[0]
        held = (cache.position, cache.length, cache.index_keys.clone())
        for other in (x[:2, 5:6], torch.randn(4, 1, 32, dtype=D64)):  # fewer and more sequences
            with pytest.raises(ValueError, match=r"SparseCache holds .*\(3, 5, 8\).*different batch"):
                sparse(other, other, other, is_causal=True, cache=cache)
            assert (cache.position, cache.length) == held[:2] and torch.equal(cache.index_keys, held[2])
        rest = sparse(tail, tail, tail, is_causal=True, cache=cache)[0]  # the cache still works
    torch.testing.assert_close(torch.cat([first, rest], dim=1), want, atol=1e-12, rtol=0)


def test_another_deepseek_layer_is_refused_naming_both_classes():
    from transformers import DeepseekV3Config
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as v3

    config = DeepseekV3Config(
        hidden_size=32, num_attention_heads=4, num_key_value_heads=4, q_lora_rank=24, kv_lora_rank=16,
        qk_rope_head_dim=4, qk_nope_head_dim=8, v_head_dim=8, num_hidden_layers=1, vocab_size=50,
    )  # fmt: skip
    attention = v3.DeepseekV3Attention(config, layer_idx=0)
    with pytest.raises(TypeError, match="must be a transformers DeepseekV32Indexer, got DeepseekV3Attention"):
        indexer_from_deepseek(attention)


def test_bad_gathered_is_refused_by_name():
    layer = SparseAttention(32, 4, top_k=2)
    x = torch.randn(1, 5, 32)
    with pytest.raises(TypeError, match="gathered"):
        layer(x, x, x, is_causal=True, gathered="yes")

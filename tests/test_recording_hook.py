"""Tests for the one recording hook, ``record_scores(callback)``, through which the inspection tools read
any attention: a new kind of attention written here, with nothing but the hook, works with
capture_attention, intervene_heads and attention_logit_max; every attention of the library records
the weights it returns and the logits it scores, refuses a cache, and leaves no callback behind."""

import contextlib
import dataclasses
import math

import pytest
import torch

import transformer_lib as tl


class OneKeyHead(torch.nn.Module):
    """A new kind of attention, written outside the library: every query head reads one shared key
    and value head, from separate matrices. It offers the recording hook by hand, and none of the
    library's attention methods (no ``attention_weights``, no scale, no projection to patch)."""

    part_role = "attention"
    part_matrices = {"q": "q.weight", "kv": "kv.weight", "out": "out_proj.weight"}

    def __init__(self, d_model, n_heads):
        super().__init__()
        self.n_heads, self.d_k = n_heads, d_model // n_heads
        self.q = torch.nn.Linear(d_model, d_model)
        self.kv = torch.nn.Linear(d_model, 2 * self.d_k)
        self.out_proj = torch.nn.Linear(d_model, d_model)
        self.callbacks = []

    @contextlib.contextmanager
    def record_scores(self, callback):
        self.callbacks.append(callback)
        try:
            yield
        finally:
            self.callbacks.remove(callback)

    def new_cache(self, window):
        return tl.KVCache(window=window)

    def forward(self, x, *args, cache=None, need_weights=False, **kwargs):
        B, T, _ = x.shape
        q = tl.split_heads(self.q(x), self.n_heads)  # (B, h, T, d_k)
        k, v = self.kv(x).view(B, T, 1, 2 * self.d_k).transpose(1, 2).split(self.d_k, dim=-1)  # (B, 1, T, d_k)
        if cache is not None:
            k, v = cache.append(k, v)
        logits = q @ k.transpose(-2, -1) / math.sqrt(self.d_k)  # (B, h, T, T_k)
        weights = tl.masked_softmax(logits, tl.causal_mask(T, k.shape[2]))  # end-aligned after a cache
        for callback in self.callbacks:
            callback(logits.detach(), weights.detach())
        return self.out_proj(tl.merge_heads(weights @ v)), weights if need_weights else None


@dataclasses.dataclass(frozen=True)
class OneKeySpec(tl.Spec):
    """The test's own kind of attention: a spec with its layer, and nothing else."""

    kind = "one_key"

    def layer(self, recipe_, d_model, n_heads, *, n_kv_heads, dropout, self_attention):
        return OneKeyHead(d_model, n_heads)


def ids(n=2, T=10, seed=1):
    return torch.randint(0, 11, (n, T), generator=torch.Generator().manual_seed(seed))


def test_a_new_attention_with_only_the_hook_works_with_the_tools(monkeypatch):
    from transformer_lib import recipe

    monkeypatch.setitem(recipe.ATTENTIONS, "one_key", OneKeySpec)
    torch.manual_seed(0)
    config = tl.GPTConfig(vocab_size=11, context_len=12, n_layers=2, n_heads=4, d_model=16, recipe="llama")
    model = tl.GPT(dataclasses.replace(config, attention="one_key")).double().eval()
    layers = tl.attention_layers(model)
    assert all(isinstance(m, OneKeyHead) for m in layers.values()) and len(layers) == 2
    assert not any(hasattr(OneKeyHead, n) for n in ("attention_weights", "scale", "_attend", "_project_cached"))
    x = ids()
    logits, _ = model(x, need_weights=True)
    returned = [layer.self_attn_weights for layer in model.decoder.layers]
    with tl.capture_attention(model) as captured:
        assert torch.equal(model(x)[0], logits)
    assert list(captured) == list(layers)
    assert all(torch.equal(c, r) for c, r in zip(captured.values(), returned, strict=True))
    by_hand = []
    with tl.recording_scores(layers, lambda name, lg, w: by_hand.append(lg.abs().amax())):
        model(x)
    assert torch.equal(tl.attention_logit_max(model, x), torch.stack(by_hand))
    with tl.intervene_heads(model, {"decoder.layers.1.self_attn": 0}, "zero"):
        assert not torch.equal(model(x)[0], logits)
    assert all(not m.callbacks for m in layers.values())  # every tool left its callback
    prompt = ids(1, 4)
    assert torch.equal(model.generate(prompt, 6, top_k=1), model.generate(prompt, 6, top_k=1, use_cache=False))


def library_layers():
    torch.manual_seed(0)
    d, h = 16, 4
    sparse = tl.SparseAttention(d, h, top_k=3)
    gathered = tl.SparseAttention(d, h, top_k=3)
    gathered.gathered = True
    folded = tl.LatentAttention(d, h, kv_latent=8)
    folded.folded = True
    return {
        "multi_head": tl.MultiHeadAttention(d, h),
        "grouped": tl.MultiHeadAttention(d, h, n_kv_heads=2),
        "sinks": tl.SinkAttention(d, h, keep_first=1),
        "sparse": sparse,
        "sparse_gathered": gathered,
        "latent": tl.LatentAttention(d, h, kv_latent=8),
        "latent_folded": folded,
        "gated_delta": tl.GatedDeltaNet(d, h),
    }


@pytest.mark.parametrize("kind", list(library_layers()))
def test_every_library_attention_records_what_it_computes(kind):
    layer = library_layers()[kind].double().eval()
    x = torch.randn(2, 7, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    window = 4 if kind == "sinks" else None
    plain, expected = layer(x, x, x, is_causal=True, window=window, need_weights=True)
    first, second = [], []
    with layer.record_scores(lambda lg, w: first.append((lg, w))), layer.record_scores(lambda *r: second.append(r)):
        out, _ = layer(x, x, x, is_causal=True, window=window)
    torch.testing.assert_close(out, plain, atol=1e-12, rtol=0)  # the fused path beside the record
    assert len(first) == len(second) == 1 and first[0][1] is second[0][1]  # one record, given to both
    logits, weights = first[0]
    assert not weights.requires_grad
    if kind == "sparse_gathered":  # its weights come from the gathered scores: equal up to rounding
        torch.testing.assert_close(weights, expected, atol=1e-12, rtol=0)
    else:
        assert torch.equal(weights, expected)
    if kind == "gated_delta":
        assert logits is None  # a recurrence scores no logits
    else:
        assert logits.shape == weights.shape == (2, 4, 7, 7)
        assert logits.triu(1).any()  # masked pairs are scored too
    if kind in ("multi_head", "grouped", "latent", "latent_folded"):  # plain causal softmax of those logits
        torch.testing.assert_close(weights, tl.masked_softmax(logits, tl.causal_mask(7, 7)), atol=1e-12, rtol=0)
    assert layer._score_callbacks == ()  # both left
    if kind in ("sinks", "sparse", "sparse_gathered"):
        return  # these take no empty sequence at all
    empty, records = x[:, :0], []
    with layer.record_scores(lambda *record: records.append(record)):
        layer(empty, empty, empty, is_causal=True)
    assert records[0][1].shape == (2, 4, 0, 0)  # no token: an empty record, not none


@pytest.mark.parametrize("kind", ["multi_head", "latent", "gated_delta"])
def test_recording_refuses_a_cache_and_a_callback_that_is_no_function(kind):
    layer = library_layers()[kind].double()
    x = torch.randn(1, 3, 16, dtype=torch.float64)
    with pytest.raises(ValueError, match="KVCache"):
        with layer.record_scores(lambda *record: None):
            layer(x, x, x, is_causal=True, cache=layer.new_cache() if hasattr(layer, "new_cache") else tl.KVCache())
    assert layer._score_callbacks == ()
    with pytest.raises(TypeError, match="callback"):
        with layer.record_scores("weights"):
            pass


def test_the_tools_refuse_an_attention_without_the_hook_by_name():
    class NoHook(torch.nn.Module):
        part_role = "attention"

    model = torch.nn.Sequential(tl.MultiHeadAttention(8, 2), NoHook())
    with pytest.raises(TypeError, match="'1' \\(NoHook\\) offers no record_scores"):
        with tl.capture_attention(model):
            pass
    assert model[0]._score_callbacks == ()


def test_logit_max_reads_each_layers_record():
    torch.manual_seed(0)
    model = tl.GPT(tl.GPTConfig(vocab_size=11, context_len=12, n_layers=2, n_heads=4, d_model=16)).eval()
    x = ids()
    records = {}
    with tl.recording_scores(tl.attention_layers(model), lambda name, lg, w: records.setdefault(name, lg)):
        model(x)
    expected = torch.stack([lg.abs().amax() for lg in records.values()])
    assert torch.equal(tl.attention_logit_max(model, x), expected)

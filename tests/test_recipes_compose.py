"""Every tool on every recipe: for GPT-2's block, Llama's block, each single departure from GPT-2's and
chapter "Latent, sparse and sink attention"'s attentions and chapter "Attention as a recurrence"'s recurrences and
hybrid, the book's tools work (train and resume exactly, sample with and without the cache, fine-tune the
head, LoRA or everything, LoRA merge and unmerge, the instruction run, capture, ablate and patch
heads, save and load a checkpoint, the Llama converter both ways where it applies). The command
line's LoRA fine-tuning of a Llama-block model, which once asked for GPT-2's attribute paths, is
tested end to end. Tiny shapes and a few steps, so the whole matrix stays fast."""

import contextlib
import copy
import dataclasses
import math
import os

import pytest
import torch

import transformer_lib as tl
from tests.test_cli import offline_one_thread  # noqa: F401 (autouse: offline, one thread)
from transformer_lib import cli
from transformer_lib.data import CharTokenizer, LMBatches, split_tokens

TEXT = "the cat sat on the mat. the dog sat on the log. " * 20
TOKENIZER = CharTokenizer.from_text(TEXT)

# name -> GPTConfig keywords: the two named recipes, then each departure from GPT-2's block alone
RECIPES = {
    "gpt2": {},
    "llama": {"recipe": "llama"},
    "llama-untied-gqa-qknorm": {"recipe": tl.LLAMA_BLOCK, "tie_embeddings": False, "n_kv_heads": 1, "qk_norm": True},
    "rmsnorm": {"norm": "rmsnorm"},
    "swiglu": {"ffn": "swiglu"},
    "rotary": {"positions": "rotary"},
    "no-bias": {"bias": False},
    "qk-norm": {"qk_norm": True},
    "untied": {"tie_embeddings": False},
    "gelu-tanh": {"activation": "gelu_tanh"},
    "grouped-query": {"n_kv_heads": 1},
    "window": {"window": 4},
    # the attention of chapter "Latent, sparse and sink attention": latent, sparse (the indexer picks 4 keys), a sink
    # logit, and the first tokens kept beside a window
    "latent": {"recipe": "latent"},
    "latent-query-latent": {"recipe": "latent", "kv_latent": 8, "q_latent": 12, "rope_dim": 2},
    "sparse": {"recipe": "sparse", "sparse_k": 4},
    "sinks": {"recipe": "sinks"},
    "sinks-window-keep-first": {"sinks": True, "window": 4, "keep_first": 2},
    # chapter "Attention as a recurrence"'s recurrences in every layer, and a hybrid whose second layer is multi-head
    # attention
    "linear": {"recipe": "llama", "attention": "linear"},
    "delta": {"recipe": "llama", "attention": "delta"},
    "gated-delta": {"recipe": "gated_delta"},
    "hybrid": {"recipe": "gated_delta", "full_every": 2},
    "hybrid-gpt2": {"attention": "gated_delta", "full_every": 2, "qk_norm": True},
    # chapter "Experts": a mixture of experts in every layer (Mixtral's routing, the Switch loss and a
    # capacity), and DeepSeek-V3's (sigmoid scores in groups, a shared expert, a scaling factor, the
    # choice bias updated after each step, the router z-loss) from the second layer on
    "experts": {"recipe": "experts", "experts": {"n_experts": 4, "capacity": 1.0}},
    "experts-deepseek": {
        "recipe": "experts",
        "experts": {
            "n_experts": 4,
            "score": "sigmoid",
            "n_groups": 2,
            "topk_groups": 1,
            "n_shared": 1,
            "scaling": 2.5,
            "dense_layers": 1,
            "aux_loss": 0.0,
            "z_loss": 1e-3,
            "bias_rate": 0.01,
        },
    },
    # chapter "Longer than trained": rotary frequencies rescaled for twice the trained length (the model is
    # built at 16 positions, said to be trained at 8), YaRN with its attention factor, and Llama 3's bands
    "rope-yarn": {"recipe": "llama", "rope_scaling": {"kind": "yarn", "factor": 2.0, "original_context": 8}},
    "rope-llama3-gqa": {
        "recipe": "llama",
        "n_kv_heads": 1,
        "rope_scaling": {"kind": "llama3", "factor": 2.0, "original_context": 8},
    },
}
ALL = pytest.mark.parametrize("choices", list(RECIPES.values()), ids=list(RECIPES))


def make(choices, seed=0, dtype=torch.float64):
    torch.manual_seed(seed)
    config = tl.GPTConfig(TOKENIZER.vocab_size, 16, 2, 2, 16, **choices)
    return tl.GPT(config).to(dtype)


def batches(seed=0):
    train, val = split_tokens(torch.tensor(TOKENIZER.encode(TEXT)))
    return LMBatches(train, val, context_len=16, batch_size=4, seed=seed)


def settings(out_dir=None, **changes):
    base = dict(max_iters=4, lr=3e-3, min_lr=3e-4, warmup_iters=0, eval_interval=2, eval_iters=1, device="cpu",
                progress=False, verbose=False, out_dir=str(out_dir) if out_dir else None)  # fmt: skip
    return tl.TrainConfig(**{**base, **changes})


def ids(n=2, T=12, seed=1):
    return torch.randint(0, TOKENIZER.vocab_size, (n, T), generator=torch.Generator().manual_seed(seed))


def equal_states(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


@ALL
def test_train_resume_save_and_load(choices, tmp_path):
    straight = make(choices)
    tl.set_seed(7)
    history = tl.train(straight, batches(), settings())
    assert history.step_loss[-1] < history.step_loss[0]
    stopped = make(choices)
    tl.set_seed(7)
    tl.train(stopped, batches(), settings(tmp_path), tokenizer=TOKENIZER, until=2)
    resumed = make(choices, seed=3)  # other weights: the checkpoint's win
    tl.train(resumed, batches(), settings(tmp_path), resume=True)
    assert equal_states(straight, resumed)
    loaded, tokenizer, _ = tl.load_checkpoint(tmp_path)
    assert loaded.config == resumed.config and tokenizer.vocab_size == TOKENIZER.vocab_size
    assert torch.equal(loaded(ids())[0], resumed.eval()(ids())[0])


@ALL
def test_sampling_with_and_without_the_cache(choices):
    model = make(choices).eval()
    prompt = ids(1, 5)
    cached = model.generate(prompt, 14, top_k=1, use_cache=True)  # past context_len: the cropped window too
    assert torch.equal(cached, model.generate(prompt, 14, top_k=1, use_cache=False))


@ALL
@pytest.mark.parametrize("method", tl.FINETUNE_METHODS)
def test_finetuning_a_classifier_trains_what_the_method_says(choices, method):
    model = tl.GPTClassifier(make(choices), 2)
    trainable = tl.prepare_finetune(model, method, rank=2, alpha=4.0)
    assert trainable == tl.count_parameters(model) > 0
    before = copy.deepcopy(model.state_dict())
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.5)
    _, loss = model(ids(4), torch.tensor([0, 1, 0, 1]))
    loss.backward()
    opt.step()
    after = model.state_dict()
    changed = {k for k in after if not torch.equal(after[k], before[k])}
    assert any(k.startswith("head.") for k in changed)
    if method == "head":
        assert all(k.startswith("head.") for k in changed)
    elif method == "lora":
        base_weights = {k for k in changed if not k.startswith("head.") and not k.endswith((".A", ".B"))}
        assert not base_weights and any(k.endswith(".B") for k in changed)
    else:
        assert any(k.startswith("gpt.decoder.") for k in changed)


@ALL
def test_lora_adapts_every_block_matrix_and_merges_exactly(choices):
    base = make(choices).eval()
    adapted = copy.deepcopy(base)
    names = tl.add_lora(adapted, tl.lora_targets(adapted), rank=2, alpha=4.0)
    r = adapted.config.recipe
    # Q, K, V fused and the output; latent: q (down, up), kv down, up, out; a recurrence: Q, K, V fused,
    # write strength, decay, output gate and output
    n_attention = [
        2
        if a in ("multi_head", "sparse")
        else 4
        if a == "separate" or (a == "latent" and not r.attention.q_latent)
        else 5
        for a in _attentions(r)
    ]
    assert len(names) == sum(n + _feed_forward_matrices(r.for_layer(i)) for i, n in enumerate(n_attention))
    x = ids()
    assert torch.equal(adapted(x)[0], base(x)[0])  # B starts at zero
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for lora in tl.lora_weights(adapted).values():
            lora.B.copy_(0.1 * torch.randn(lora.B.shape, generator=g, dtype=lora.B.dtype))
    unmerged = adapted(x)[0]
    tl.merge_lora(adapted)
    assert torch.allclose(adapted(x)[0], unmerged, atol=1e-12) and not torch.equal(unmerged, base(x)[0])
    tl.unmerge_lora(adapted)
    tl.remove_lora(adapted, merge=False)
    assert equal_states(adapted, base)


@ALL
def test_capture_ablate_and_patch_heads(choices):
    model = make(choices).eval()
    x = ids()
    layers = tl.attention_layers(model)
    assert list(layers) == [f"decoder.layers.{i}.self_attn" for i in range(2)]
    logits, _ = model(x, need_weights=True)
    returned = [layer.self_attn_weights for layer in model.decoder.layers]
    with tl.capture_attention(model) as captured:
        assert torch.allclose(model(x)[0], logits, atol=1e-12)  # the fused kernel now, the weights' path before
    for i, name in enumerate(layers):  # rotary and QK-norm included: the weights the layer used
        assert torch.allclose(captured[name], returned[i], atol=1e-12)
    name = next(iter(layers))
    with tl.intervene_heads(model, {name: 0}, "zero"):
        assert not torch.equal(model(x)[0], logits)
    with tl.intervene_heads(model, {name: [0, 1]}, "patch", reference=x):
        assert torch.allclose(model(x)[0], logits, atol=1e-12)  # its own activations: nothing changes
    with tl.intervene_heads(model, {name: [0, 1]}, "patch", reference=ids(seed=5)):
        assert not torch.allclose(model(x)[0], logits)
    scored = sum(a != "recurrent" for a in _attentions(model.config.recipe, recurrent="recurrent"))
    if scored:  # a hybrid's multi-head layers
        assert tl.attention_logit_max(model, x).shape == (scored,)
    else:
        with pytest.raises(ValueError, match="score no logits"):
            tl.attention_logit_max(model, x)


def _feed_forward_matrices(recipe):
    """The matrices of one layer's feed-forward network: an MLP's two, SwiGLU's three; experts: the
    router and every expert's three, and the shared experts' three."""
    e = recipe.ffn if isinstance(recipe.ffn, tl.ExpertsSpec) else None
    dense = 2 if recipe.ffn.kind == "mlp" else 3
    return dense if e is None else 1 + dense * e.n_experts + (dense if e.n_shared else 0)


def _attentions(recipe, n_layers=2, recurrent=None):
    """The attention of each layer of a two-layer model of ``recipe`` (``recurrent`` names a recurrence's)."""
    kinds = [recipe.for_layer(i).attention.kind for i in range(n_layers)]
    return [recurrent if recurrent and a in tl.RECURRENT else a for a in kinds]


@pytest.mark.parametrize("name", ["llama", "llama-untied-gqa-qknorm", "gpt2", "experts"])
def test_the_llama_converter_where_it_applies(name):
    model = make(RECIPES[name]).eval()
    if name != "llama":
        setting = {"llama-untied-gqa-qknorm": "qk_norm", "gpt2": "norm", "experts": "experts"}[name]
        with pytest.raises(ValueError, match=setting):
            tl.llama_from_gpt(model)
        return
    llama = tl.llama_from_gpt(model)
    x = ids()
    with torch.no_grad():
        # transformers computes the rotary angles in float32: equal to about 1e-8 in float64
        assert torch.allclose(llama(x).logits, model(x)[0], atol=1e-6)
    back = tl.gpt_from_llama(llama)
    back_recipe = back.config.recipe
    back_recipe = dataclasses.replace(back_recipe, ffn=dataclasses.replace(back_recipe.ffn, d_ff=None))
    assert back_recipe == model.config.recipe  # d_ff: the rule's value
    assert equal_states(back, model)


@pytest.mark.parametrize("name", ["gpt2", "llama", "hybrid"])
def test_an_instruction_run_on_each_named_recipe(name):
    tokenizer = tl.train_bpe(TEXT, 280, specials=["<|endoftext|>"])
    torch.manual_seed(0)
    base = tl.GPT(tl.GPTConfig(tokenizer.vocab_size, 32, 2, 2, 16, **RECIPES[name]))  # 2 layers: a hybrid's both kinds
    pairs = [("cat", "mat"), ("dog", "log")] * 4
    run = tl.instruction_run(base, tokenizer, pairs, pairs[:2], "right", 0, steps=2, batch_size=4, lora_rank=2)
    assert 0 <= run["exact_match"] <= 1 and list(tl.lora_weights(run["model"])) == tl.lora_targets(base)


def test_the_command_line_fine_tunes_a_llama_block_with_lora(tmp_path, capsys):
    (tmp_path / "text.txt").write_text(TEXT)
    tl.write_pairs([("cat", "mat"), ("dog", "log"), ("the", "eht")] * 3, tmp_path / "pairs.jsonl")
    shape = "--n-layers 1 --n-heads 2 --d-model 16 --context-len 16 --batch-size 4 --eval-iters 1".split()
    quick = ["--device", "cpu", "--no-progress", "--max-iters", "2", "--eval-interval", "2"]
    base = tmp_path / "base"
    train = ["train", "--preset", "llama-cpu", *shape, *quick, "--tokenizer", "bpe", "--vocab-size", "280"]
    assert cli.main([*train, "--data", str(tmp_path / "text.txt"), "--out-dir", str(base)]) == 0
    out = tmp_path / "lora"
    finetune = ["finetune", "--ckpt", str(base), "--data", str(tmp_path / "pairs.jsonl"), "--lora-rank", "2"]
    assert cli.main([*finetune, "--out-dir", str(out), *quick, "--batch-size", "4"]) == 0
    assert (out / "adapter.pt").is_file()
    model, _, _ = tl.load_checkpoint(base)
    assert model.config.recipe == tl.LLAMA_BLOCK
    adapted = tl.read_checkpoint(out / "adapter.pt")["weights"]
    assert sorted(adapted) == sorted(tl.lora_targets(model))  # the Llama block's matrices, gate included
    assert "decoder.layers.0.ff.gate_proj.weight" in adapted


def test_the_command_line_trains_resumes_and_samples_a_hybrid(tmp_path, capsys):
    (tmp_path / "text.txt").write_text(TEXT)
    shape = "--n-layers 2 --n-heads 2 --d-model 16 --context-len 16 --batch-size 4 --eval-iters 1".split()
    quick = ["--device", "cpu", "--no-progress", "--eval-interval", "2", "--data", str(tmp_path / "text.txt")]
    hybrid = ["--attention", "gated_delta", "--full-every", "2", "--positions", "rotary"]
    run = ["train", *shape, *hybrid, *quick, "--out-dir", str(tmp_path / "run")]
    assert cli.main([*run, "--max-iters", "2"]) == 0
    assert cli.main(["train", *quick, "--out-dir", str(tmp_path / "run"), "--resume", "--max-iters", "4"]) == 0
    model, _, _ = tl.load_checkpoint(tmp_path / "run")
    kinds = [type(layer.self_attn).__name__ for layer in model.decoder.layers]
    assert kinds == ["GatedDeltaNet", "MultiHeadAttention"] and model.config.full_every == 2
    capsys.readouterr()
    sample = ["sample", "--ckpt", str(tmp_path / "run"), "--prompt", "the ", "--max-new-tokens", "20", "--greedy"]
    assert cli.main(sample) == 0
    assert len(capsys.readouterr().out.rstrip("\n")) == len("the ") + 20  # one character per token
    refused = cli.main(["train", *shape, "--full-every", "2", *quick, "--out-dir", str(tmp_path / "bad")])
    err = capsys.readouterr().err  # a hybrid of what is not a recurrence: one line, nothing written
    assert refused == 2 and not (tmp_path / "bad").exists() and err.count("\n") == 1
    assert "full_every=2 is linear or delta or gated_delta attention's" in err


class SeparateProjections(torch.nn.Module):
    """A new kind of attention, written outside the library: separate Q, K and V matrices (no fused
    matrix, no chapter "Today's block" transforms) and its own cache. It says what it is (role, matrices, heads,
    out_proj, weights) and the recipe makes it by name: chapters "Multi-head attention", "The transformer block" and
    "Generation"'s modules are not edited."""

    part_role = "attention"
    part_matrices = {"q": "q.weight", "k": "k.weight", "v": "v.weight", "out": "out_proj.weight"}

    def __init__(self, d_model, n_heads):
        super().__init__()
        self.n_heads = n_heads
        self.q, self.k, self.v = (torch.nn.Linear(d_model, d_model) for _ in range(3))
        self.out_proj = torch.nn.Linear(d_model, d_model)
        self.callbacks = []

    @contextlib.contextmanager
    def record_scores(self, callback):  # the inspection tools' one hook: each forward's logits and weights
        self.callbacks.append(callback)
        try:
            yield
        finally:
            self.callbacks.remove(callback)

    def new_cache(self, window):
        return tl.KVCache(window=window)

    def _weights(self, x, cache):
        q, k, v = (tl.split_heads(f(x), self.n_heads) for f in (self.q, self.k, self.v))
        if cache is not None:
            k, v = cache.append(k, v)
        T_q, T_k = q.shape[2], k.shape[2]
        logits = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (B, h, T_q, T_k)
        weights = tl.masked_softmax(logits, tl.causal_mask(T_q, T_k))  # end-aligned after a cache
        for callback in self.callbacks:
            callback(logits.detach(), weights.detach())
        return weights @ v, weights

    def attention_weights(self, x, *args, cache=None, **kwargs):
        return self._weights(x, None)[1]

    def forward(self, x, *args, cache=None, need_weights=False, **kwargs):
        out, weights = self._weights(x, cache)
        return self.out_proj(tl.merge_heads(out)), weights if need_weights else None


@dataclasses.dataclass(frozen=True)
class SeparateSpec(tl.Spec):
    """The test's own kind of attention: a spec with its layer, and nothing else."""

    kind = "separate"

    def layer(self, recipe_, d_model, n_heads, *, n_kv_heads, dropout, self_attention):
        return SeparateProjections(d_model, n_heads)


def test_a_new_attention_is_one_module_and_one_recipe_value(monkeypatch):
    from transformer_lib import recipe

    monkeypatch.setitem(recipe.ATTENTIONS, "separate", SeparateSpec)  # the one table row
    model = make({"recipe": "llama", "attention": "separate"}).eval()
    assert all(isinstance(m, SeparateProjections) for m in tl.attention_layers(model).values())
    prompt = ids(1, 5)
    assert torch.equal(model.generate(prompt, 8, top_k=1), model.generate(prompt, 8, top_k=1, use_cache=False))
    targets = tl.lora_targets(model)
    assert "decoder.layers.0.self_attn.q.weight" in targets and "decoder.layers.0.ff.gate_proj.weight" in targets
    x = ids()
    logits, _ = model(x, need_weights=True)
    returned = [layer.self_attn_weights for layer in model.decoder.layers]
    with tl.capture_attention(model) as captured:
        model(x)
    assert all(torch.allclose(w, r) for w, r in zip(captured.values(), returned, strict=True))
    with tl.intervene_heads(model, {"decoder.layers.1.self_attn": 0}, "zero"):
        assert not torch.equal(model(x)[0], logits)
    tl.add_lora(model, targets, rank=2, alpha=4.0)
    assert torch.equal(model(x)[0], logits)


@pytest.mark.slow
@pytest.mark.skipif(
    not os.environ.get("RECIPE_TEST"),
    reason="600 steps (a minute or more): .ci/run runs it after the test command, with RECIPE_TEST=1",
)
def test_the_readmes_dates_recipe_answers_held_out_dates(tmp_path, capsys):
    # the README's commands as written: the chapter's date formats, LoRA and the new token rows on
    # the shipped base, 600 steps at 5e-3; then held-out dates, answered greedily
    formats = ["dd.mm.yyyy", "yyyy.mm.dd", "mm/dd/yyyy"]
    tl.write_pairs(tl.date_pairs(2000, formats=formats), tmp_path / "pairs.jsonl")
    out = tmp_path / "dates"
    flags = ["--lora-rank", "4", "--new-token-rows", "--lr", "5e-3", "--max-iters", "600", "--no-progress"]
    args = ["finetune", "--ckpt", str(tl.PRETRAINED_PATH), "--data", str(tmp_path / "pairs.jsonl")]
    assert cli.main([*args, "--out-dir", str(out), *flags]) == 0
    model, tokenizer, _ = tl.load_run(out)
    held_out = [p for p in tl.date_pairs(60, seed=7, formats=formats)][:40]
    prompts = [tokenizer.encode(p + tl.PROMPT_END) for p, _ in held_out]
    got = tl.answers(model, tokenizer, prompts, max_new_tokens=16)
    right = sum(tokenizer.decode(ids) == r and stopped for (ids, stopped), (_, r) in zip(got, held_out, strict=True))
    assert right >= 0.9 * len(held_out), right
    capsys.readouterr()
    sample = ["sample", "--ckpt", str(tl.PRETRAINED_PATH), "--adapter", str(out / "adapter.pt"), "--greedy"]
    assert cli.main([*sample, "--prompt", "21.11.2026", "--device", "cpu"]) == 0
    assert capsys.readouterr().out.strip() == "2026-11-21"

"""The experiments over seeds of chapter "Latent, sparse and sink attention": what a cache byte buys, sparse attention
against a window of the same width, and attention sinks. The chapter reads the record,
``transformer_lib/data/ch18/attention_today.json`` (``recorded("latent_sparse_sink")``).

Every run is a small Llama-style GPT (RMSNorm, SwiGLU, rotary positions, no biases) on Tiny
Shakespeare's characters: 2 layers, width 64, 300 steps of 16 windows, AdamW at 3e-3 with no
weight decay (the ``token_run`` of chapter "Tokens"), measured on the last 10 %.

The command line (``--dry-run`` prints and writes nothing)::

    # three seeds of every part (about 30 minutes, 1 core)
    python -m transformer_lib.experiments latent_sparse_sink
    # seed 0 of every part, printed, nothing written
    python -m transformer_lib.experiments latent_sparse_sink --seeds 0 --dry-run

Parts:

* ``cache``: 8 heads, context 64: multi-head, grouped-query (4 and 2 key-value heads),
  multi-query and latent attention (latents of 32 and 16); each model's parameters, its measured
  cache bytes per token and its bits per byte;
* ``sparse``: 4 heads, context 128, sparse attention trained dense (``sparse_k`` = the context)
  while its indexer learns to imitate the attention; then the same weights read with each query
  limited to its ``k`` selected keys, or to a sliding window of ``k``, for each ``k`` of
  :data:`KS`; and how often the indexer's keys are the ones the dense attention weighs most;
* ``sinks``: 4 heads, context 128, :data:`SINK_STEPS` steps on windows that open with a start
  token, without and with a learned sink logit per head: the loss of positions past a window of
  :data:`WINDOW` with full attention, a plain window, a window that keeps the first
  :data:`KEEP_FIRST` tokens, and the attention each head gives to position 0.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

import transformer_lib as tl

from .recorder import Experiment, Part
from .tokens import run_settings, split_text

__all__ = ["EXPERIMENT"]

SEEDS = [0, 1, 2]
LLAMA = tl.LLAMA_BLOCK.changes()
# name, GPTConfig settings (with CACHE_HEADS heads of width 8)
CACHE_HEADS = 8
CACHE_KINDS = [
    ("multi-head", {}),
    ("grouped, 4 kv heads", {"n_kv_heads": 4}),
    ("grouped, 2 kv heads", {"n_kv_heads": 2}),
    ("multi-query", {"n_kv_heads": 1}),
    ("latent 32", {"attention": "latent", "kv_latent": 32}),
    ("latent 16", {"attention": "latent", "kv_latent": 16}),
]
LONG = 128  # the context of the sparse and sink parts
KS = [4, 8, 16, 32, 64]
WINDOW, KEEP_FIRST = 16, 4
SINK_STEPS = 2000  # sinks form late: the sink part trains longer
EVAL_WINDOWS = 48  # validation windows of LONG characters for the per-position losses


def _data():
    train_text, val_text = split_text()
    return tl.CharTokenizer.from_text(train_text), train_text, val_text


def cache_bytes_per_token(model: tl.GPT, ids: torch.Tensor) -> float:
    """Bytes the model's cache holds per token after a prefill of ``ids (1, T)`` (all layers)."""
    cache = model.new_cache()
    with torch.no_grad():
        model(ids, cache=cache)
    return cache.nbytes() / ids.shape[1]


def cache_run(name: str, seed: int, steps: int | None = None) -> dict:
    """One model of the ``cache`` part: the attention ``name`` of :data:`CACHE_KINDS`, seed ``seed``."""
    tokenizer, train_text, val_text = _data()
    options = dict(CACHE_KINDS)[name]
    settings = run_settings(steps, n_heads=CACHE_HEADS)
    r = tl.token_run(tokenizer, train_text, val_text, seed, **settings, **LLAMA, **options)
    model = r["model"]
    val = torch.tensor(tokenizer.encode(val_text[:2000]))[None, :64]
    return {
        "seed": seed,
        "params": sum(p.numel() for p in model.parameters()),
        "cache_bytes_per_token": cache_bytes_per_token(model, val),
        "bits_per_byte": r["bits_per_byte"],
    }


def cache(seeds: list[int], steps: int | None = None) -> dict:
    rows = []
    for name, options in CACHE_KINDS:
        runs = []
        for seed in seeds:
            runs.append(cache_run(name, seed, steps))
            print(f"{name:>20} seed {seed}: {runs[-1]['bits_per_byte']:.4f} bits/byte", flush=True)
        rows.append({"name": name, "options": options, "runs": runs})
    return {"cache": {"rows": rows}}


def eval_windows(tokenizer, val_text: str, n: int = EVAL_WINDOWS, T: int = LONG) -> torch.Tensor:
    """``n`` validation windows of ``T + 1`` characters, ``(n, T + 1)``, at fixed random places."""
    ids = torch.tensor(tokenizer.encode(val_text))
    starts = torch.randint(len(ids) - T - 1, (n,), generator=torch.Generator().manual_seed(0))
    return ids[starts[:, None] + torch.arange(T + 1)]


@torch.no_grad()
def position_losses(model: tl.GPT, windows: torch.Tensor) -> torch.Tensor:
    """The next-token loss in bits at each position, averaged over the windows: ``(T,)``."""
    logits, _ = model.eval()(windows[:, :-1])  # (n, T, V)
    each = F.cross_entropy(logits.transpose(1, 2), windows[:, 1:], reduction="none")  # (n, T)
    return each.mean(0) / torch.log(torch.tensor(2.0))


def variant(model: tl.GPT, window: int | None = None, **recipe_changes) -> tl.GPT:
    """The same weights read with another ``window`` or recipe choices (``sparse_k``, ``keep_first``)."""
    c = model.config
    config = tl.GPTConfig(**{**c.__dict__, "window": window, "recipe": tl.as_recipe(c.recipe, **recipe_changes)})
    other = tl.GPT(config)
    other.load_state_dict(model.state_dict())
    return other.eval()


def _layer_inputs(model: tl.GPT, ids: torch.Tensor) -> list[torch.Tensor]:
    """The input of each layer's attention for ``ids (B, T)``: ``(B, T, d_model)`` per layer."""
    seen = []
    hooks = [
        layer.self_attn.register_forward_pre_hook(lambda _m, args: seen.append(args[0]))
        for layer in model.decoder.layers
    ]
    try:
        with torch.no_grad():
            model.eval()(ids)
    finally:
        for h in hooks:
            h.remove()
    return seen


@torch.no_grad()
def agreement(model: tl.GPT, ids: torch.Tensor, k: int) -> float:
    """How often a key the indexer picks is among the ``k`` keys dense attention weighs most (the
    weights summed over heads), over the queries that see more than ``k`` keys and every layer."""
    hits = total = 0
    for layer, x in zip(model.decoder.layers, _layer_inputs(model, ids), strict=True):
        attn = layer.self_attn
        dense = attn.attention_weights(x, x, x, is_causal=True).sum(1)  # (B, T, T)
        top = torch.zeros_like(dense, dtype=torch.bool).scatter_(-1, dense.topk(k, dim=-1).indices, True)
        old_k = attn.top_k
        attn.top_k = k
        try:
            picked = attn.selected(x)  # (B, T, T)
        finally:
            attn.top_k = old_k
        rows = slice(k, None)  # queries with more than k visible keys
        hits += int((picked & top)[:, rows].sum())
        total += int(picked[:, rows].sum())
    return hits / total


def sparse_run(seed: int, steps: int | None = None) -> dict:
    """One model of the ``sparse`` part: trained dense, read with each ``k`` of :data:`KS`."""
    tokenizer, train_text, val_text = _data()
    windows = eval_windows(tokenizer, val_text)
    options = {**LLAMA, "attention": "sparse", "sparse_k": LONG}  # dense while training
    r = tl.token_run(tokenizer, train_text, val_text, seed, **run_settings(steps, context_len=LONG), **options)
    model = r["model"]
    run = {"seed": seed, "dense": float(position_losses(model, windows).mean()), "sparse": {}, "window": {}}
    run["agreement"] = {}
    for k in KS:
        run["sparse"][str(k)] = float(position_losses(variant(model, sparse_k=k), windows).mean())
        run["window"][str(k)] = float(position_losses(variant(model, window=k), windows).mean())
        run["agreement"][str(k)] = agreement(model, windows[:8, :-1], k)
    return run


def sparse(seeds: list[int], steps: int | None = None) -> dict:
    runs = []
    for seed in seeds:
        runs.append(sparse_run(seed, steps))
        r = runs[-1]
        print(f"sparse seed {seed}: dense {r['dense']:.3f}, k=16 {r['sparse']['16']:.3f} bits", flush=True)
    return {"sparse": {"context_len": LONG, "ks": KS, "runs": runs}}


def bos_windows(ids: torch.Tensor, n: int, generator: torch.Generator, bos: int, T: int = LONG) -> torch.Tensor:
    """``n`` random windows of ``T`` characters of ``ids``, each after a start token ``bos``: ``(n, T + 1)``."""
    starts = torch.randint(len(ids) - T, (n,), generator=generator)
    return torch.cat([torch.full((n, 1), bos), ids[starts[:, None] + torch.arange(T)]], dim=1)


def sink_run(learned: bool, seed: int, steps: int | None = None) -> tuple[tl.GPT, torch.Tensor]:
    """A Llama-style GPT trained on windows that open with a start token (as a language model's
    documents open with one), without or with a learned sink logit; and the validation windows."""
    tokenizer, train_text, val_text = _data()
    bos = tokenizer.vocab_size  # one more token: the start
    train_ids, val_ids = (torch.tensor(tokenizer.encode(t)) for t in (train_text, val_text))
    torch.manual_seed(seed)
    config = tl.GPTConfig(bos + 1, LONG, 2, 4, 64, **LLAMA, sinks=learned)
    model = tl.GPT(config)
    optimiser = torch.optim.AdamW(model.parameters(), lr=tl.TOKEN_RUN["lr"], weight_decay=0.0)
    generator = torch.Generator().manual_seed(seed)
    model.train()
    for _ in range(SINK_STEPS if steps is None else steps):
        window = bos_windows(train_ids, tl.TOKEN_RUN["batch_size"], generator, bos, LONG - 1)  # (B, LONG)
        _, loss = model(window[:, :-1], window[:, 1:])
        optimiser.zero_grad(set_to_none=True)
        loss.backward()
        optimiser.step()
    val = bos_windows(val_ids, EVAL_WINDOWS, torch.Generator().manual_seed(0), bos, LONG)  # (n, LONG + 1)
    return model.eval(), val


def sinks(seeds: list[int], steps: int | None = None) -> dict:
    past = slice(WINDOW, None)  # the positions a window hides something from
    runs = []
    for learned in (False, True):
        for seed in seeds:
            model, windows = sink_run(learned, seed, steps)
            run = {"variant": "learned sink" if learned else "plain", "seed": seed}
            run["full"] = float(position_losses(model, windows)[past].mean())
            run["window"] = float(position_losses(variant(model, WINDOW), windows)[past].mean())
            kept = variant(model, WINDOW, keep_first=KEEP_FIRST)
            run["window_keep_first"] = float(position_losses(kept, windows)[past].mean())
            mass = tl.attention_sink_mass(model, windows[:16, :-1], first_query=WINDOW)
            run["mass_on_first"] = [[round(float(v), 6) for v in row] for row in mass]
            print(
                f"{run['variant']} seed {seed}: full {run['full']:.3f}, window {run['window']:.3f}, "
                f"kept {run['window_keep_first']:.3f}",
                flush=True,
            )
            runs.append(run)
    return {
        "sinks": {"context_len": LONG, "window": WINDOW, "keep_first": KEEP_FIRST, "steps": SINK_STEPS, "runs": runs}
    }


EXPERIMENT = Experiment(
    "latent_sparse_sink", {"cache": Part(cache, SEEDS), "sparse": Part(sparse, SEEDS), "sinks": Part(sinks, SEEDS)}
)

r"""The experiments over seeds of chapter "Attention as a recurrence": what a state of fixed size forgets (associative
recall), and hybrids of recurrent and softmax layers on Tiny Shakespeare. The chapter reads the record,
``transformer_lib/data/ch19/recurrence.json`` (``recorded("attention_as_recurrence")``).

Every model is a Llama-style GPT (RMSNorm, SwiGLU, rotary positions in its softmax layers, no
biases, untied head) whose mixer is softmax multi-head attention (``"multi_head"``) or one of the
three modes of the gated DeltaNet layer (``"linear"``, ``"delta"``, ``"gated_delta"``). The three
recurrences have the same parameters (the same layer, another mode); a model with fewer gets a
wider feed-forward network (``d_ff``, :func:`matched_d_ff`) until it is within 2 % of the largest.

The command line (``--dry-run`` prints and writes nothing)::

    # three seeds of both parts (about 30 minutes, 1 core)
    python -m transformer_lib.experiments attention_as_recurrence
    # the learned recall part alone (about 15 minutes, 1 core)
    python -m transformer_lib.experiments attention_as_recurrence \
        --parts recall_learned
    # seed 0 of the recall part, printed, nothing written
    python -m transformer_lib.experiments attention_as_recurrence \
        --parts recall --seeds 0 --dry-run

Parts:

* ``recall``: 2 layers, width 64, 4 heads (``d_k = d_v = 16``: each recurrent head's state is
  16 x 16), trained on associative recall (:func:`transformer_lib.data.recall_batch`, 64 keys, 64
  values). One model per mixer and seed, trained on every pair count of :data:`PAIRS` in each
  step (the same number of queries for each count), then measured at each count on
  :data:`RECALL` ``["eval_queries"]`` held-out queries from a generator of its own. One model
  on the mix costs what one model per count would cost together, and a model trained on many
  pairs alone does not start to learn (in the calibration runs). Each run records its
  parameters, what its memory holds per layer (a recurrence's fixed state; softmax
  attention's keys and values, per token), the accuracy at each count and the training loss;
* ``lm``: 4 layers, width 64, 4 heads, context 128, 300 steps of 16 windows of Tiny
  Shakespeare's characters (the ``token_run`` of chapter "Tokens", AdamW at 3e-3): softmax attention, the
  three recurrences, and the hybrid (gated DeltaNet with ``full_every=4``: layers 0-2
  recurrent, layer 3 softmax, Qwen3-Next's 3:1); bits per byte on the last 10 %.

* ``recall_learned``: a smaller recall task that softmax attention learns within the budget: 16
  keys, 16 values, 2 to 16 pairs, a curriculum (:func:`curriculum`: the pair counts join one by
  one over the first half of the run), 600 steps at 1e-3. Width 64 with 4 heads (``d_k = 16``)
  and with 8 (``d_k = 8``): softmax attention, the three recurrences (the reference decay), and
  gated DeltaNet from ``transformers``' decay too; each measured at every pair count. The
  parameters are not matched (softmax attention has about 10 % fewer: no convolution, gate,
  write-strength or decay maps); a recurrence's state is ``n_heads d_k^2`` numbers per layer,
  1,024 with 4 heads and 512 with 8.

The recall steps are what the budget (both parts in about half an hour on one core) allows, and
they are far from enough. In the calibration runs, the softmax model stayed at what it can do
without matching keys (guess among the values not yet asked for) for 4000 to 6000 steps at every
learning rate from 1e-3 to 1e-2, at batches of 64 to 512 queries per count, at widths 32 to 256
and with 3 or 4 layers: its second layer's heads all settle on the separator. The recurrences
leave their own plateau at a step that depends on the seed (and on the last digits of the
sums). So the recall part records how far each mixer got in 900 steps, not the capacity of its
state.
"""

from __future__ import annotations

import torch

import transformer_lib as tl
from transformer_lib.delta_net import decay_init

from .recorder import Experiment, Part
from .tokens import run_settings, split_text

__all__ = ["EXPERIMENT"]

SEEDS = [0, 1, 2]
LLAMA = tl.LLAMA_BLOCK.changes()
MIXERS = ("multi_head", "linear", "delta", "gated_delta")
PAIRS = [4, 8, 16, 32, 64]  # the numbers of key-value pairs a recall model reads
N_KEYS = N_VALUES = 64  # at least max(PAIRS): the keys of a sequence are distinct
RECALL = {
    "n_layers": 2,
    "n_heads": 4,
    "d_model": 64,
    "steps": 900,
    "lr": 3e-3,
    "queries": 128,  # training queries of each pair count in each step
    "eval_queries": 2048,  # held-out queries of each pair count
}
# the language models: name, GPTConfig options (besides the Llama block's)
LM_MODELS = [
    ("multi_head", {}),
    ("linear", {"attention": "linear"}),
    ("delta", {"attention": "delta"}),
    ("gated_delta", {"attention": "gated_delta"}),
    ("hybrid", {"attention": "gated_delta", "full_every": 4}),
]
LM = {"n_layers": 4, "n_heads": 4, "d_model": 64, "context_len": 128}
LM_STEPS = 300
MATCH = 0.02  # equal parameters: every model within 2 % of the largest
LAST = 50  # the final training loss: the mean over the last LAST steps
# The recorded parts were trained from a fresh transformers layer's decay (GatedDeltaNet's init):
# the random numbers they drew, so their seeds' models, depend on it.
RECORDED_INIT = "transformers"


def n_params(config: tl.GPTConfig) -> int:
    """The parameters of a GPT built from ``config`` (a tied matrix counted once)."""
    return sum(p.numel() for p in tl.GPT(config).parameters())


def matched_d_ff(make, target: int) -> int:
    """The feed-forward width ``d_ff`` whose model, ``make(d_ff)`` (a :class:`~transformer_lib.GPTConfig`),
    has the parameter count nearest ``target``, and at least the recipe's default width. The count
    grows linearly with ``d_ff``: two models give the slope."""
    c = make(None)
    base = tl.swiglu_hidden(c.d_model) if c.ffn == "swiglu" else 4 * c.d_model
    at_base = n_params(make(base))
    slope = n_params(make(base + 1)) - at_base
    guess = base + round((target - at_base) / slope)
    candidates = [d for d in (guess - 1, guess, guess + 1) if d >= base] or [base]
    return min(candidates, key=lambda d: abs(n_params(make(d)) - target))


def matched(configs: dict) -> dict:
    """``{name: make}`` (``make(d_ff)`` a config) -> ``{name: (d_ff, params)}``: each model widened
    to the parameters of the largest at the default width (``d_ff`` None where it is the largest)."""
    plain = {name: n_params(make(None)) for name, make in configs.items()}
    target = max(plain.values())
    out = {}
    for name, make in configs.items():
        d_ff = None if plain[name] == target else matched_d_ff(make, target)
        out[name] = (d_ff, n_params(make(d_ff)))
    params = [p for _, p in out.values()]
    if max(params) > (1 + MATCH) * min(params):
        raise ValueError(f"no feed-forward width brings these models within {MATCH:.0%} of each other: {out}")
    return out


def memory(model: tl.GPT) -> list[dict]:
    """What each layer's cache holds, in numbers: a recurrent layer's fixed state (``n_heads d_k
    d_v``) and its convolution's last inputs; a softmax layer's keys and values, per token."""
    layers = []
    for i, layer in enumerate(model.decoder.layers):
        attn = layer.self_attn
        if isinstance(attn, tl.GatedDeltaNet):
            state, conv = attn.n_heads * attn.d_k * attn.d_v, attn.channels * (attn.conv_kernel - 1)
            mixer = {"gated": "gated_delta"}.get(attn.mode, attn.mode)  # the recipe's name
            layers.append({"layer": i, "mixer": mixer, "state": state, "conv": conv})
        else:
            layers.append({"layer": i, "mixer": "multi_head", "per_token": 2 * attn.n_kv_heads * attn.d_k})
    return layers


# ----- recall -----


def recall_config(mixer: str, d_ff: int | None = None) -> tl.GPTConfig:
    """The recall model of ``mixer`` (:data:`MIXERS`), with a feed-forward width ``d_ff``."""
    r = RECALL
    vocab = tl.recall_vocab_size(N_KEYS, N_VALUES)
    options = {**LLAMA, "attention": mixer, "d_ff": d_ff}
    return tl.GPTConfig(vocab, 4 * max(PAIRS), r["n_layers"], r["n_heads"], r["d_model"], **options)


def recall_widths() -> dict:
    """Each mixer's ``(d_ff, params)`` at equal parameters."""
    return matched({m: (lambda d_ff, m=m: recall_config(m, d_ff)) for m in MIXERS})


def train_recall(model: tl.GPT, seed: int, steps: int) -> list[float]:
    """Train ``model`` on recall: each step one batch of each pair count of :data:`PAIRS` (``queries
    / n`` sequences of ``n`` pairs, every key queried), the loss the mean of theirs. Returns the
    training loss of every step."""
    optimiser = torch.optim.AdamW(model.parameters(), lr=RECALL["lr"], weight_decay=0.0)
    generator = torch.Generator().manual_seed(seed)
    losses = []
    model.train()
    for _ in range(steps):
        loss = 0.0
        for n in PAIRS:
            b = tl.recall_batch(RECALL["queries"] // n, n, n_keys=N_KEYS, n_values=N_VALUES, generator=generator)
            loss = loss + model(b.idx, b.targets, loss_mask=b.loss_mask)[1] / len(PAIRS)
        optimiser.zero_grad(set_to_none=True)
        loss.backward()
        optimiser.step()
        losses.append(loss.item())
    return losses


@torch.no_grad()
def recall_accuracies(model: tl.GPT, seed: int) -> dict:
    """The share of held-out queries answered right at each pair count, ``{str(n): accuracy}``: at
    least :data:`RECALL` ``["eval_queries"]`` queries each, from a generator seeded ``10_000 + seed``
    (never the training one)."""
    generator = torch.Generator().manual_seed(10_000 + seed)
    model.eval()
    out = {}
    for n in PAIRS:
        b = tl.recall_batch(-(-RECALL["eval_queries"] // n), n, n_keys=N_KEYS, n_values=N_VALUES, generator=generator)
        out[str(n)] = tl.recall_accuracy(model, b)
    return out


def recall_run(mixer: str, seed: int, steps: int | None = None, widths: dict | None = None) -> dict:
    """One model of the ``recall`` part: ``mixer`` (:data:`MIXERS`), seed ``seed``."""
    d_ff, params = (widths or recall_widths())[mixer]
    torch.manual_seed(seed)
    with decay_init(RECORDED_INIT):
        model = tl.GPT(recall_config(mixer, d_ff))
    losses = train_recall(model, seed, RECALL["steps"] if steps is None else steps)
    last = losses[-LAST:]
    return {
        "name": mixer,
        "seed": seed,
        "params": params,
        "d_ff": d_ff,
        "memory": memory(model),
        "accuracy": recall_accuracies(model, seed),
        "final_loss": sum(last) / len(last),
    }


def recall(seeds: list[int], steps: int | None = None) -> dict:
    """The ``recall`` part: every mixer of :data:`MIXERS` for each seed."""
    widths = recall_widths()
    runs = []
    for mixer in MIXERS:
        for seed in seeds:
            runs.append(recall_run(mixer, seed, steps, widths))
            acc = " ".join(f"{a:.3f}" for a in runs[-1]["accuracy"].values())
            print(f"recall {mixer:>12} seed {seed}: {acc} (pairs {PAIRS})", flush=True)
    settings = {**RECALL, "pairs": PAIRS, "n_keys": N_KEYS, "n_values": N_VALUES, **LLAMA}
    return {"recall": {"settings": settings, "runs": runs}}


# ----- recall_learned -----

# A setting where softmax attention learns recall (found on seed 0): 16 keys and 16 values, at
# most 16 pairs, a curriculum over the pair counts, AdamW at 1e-3; width 64 with 4 heads
# (d_k = 16, as many as the keys) or 8 (d_k = 8, half the most pairs). The models: (mixer, the
# init of its decay; None for softmax attention, which has none).
LEARNED_MODELS = [
    ("multi_head", None),
    ("linear", "reference"),
    ("delta", "reference"),
    ("gated_delta", "reference"),
    ("gated_delta", "transformers"),
]
LEARNED_PAIRS = [2, 4, 8, 16]
LEARNED_HEADS = [4, 8]  # d_k = d_model / n_heads: 16 and 8
LEARNED = {
    "n_layers": 2,
    "d_model": 64,
    "n_keys": 16,
    "n_values": 16,
    "steps": 600,
    "lr": 1e-3,
    "queries": 128,  # training queries of each pair count in each step
    "eval_queries": 2048,  # held-out queries of each pair count
}


def learned_config(mixer: str, n_heads: int) -> tl.GPTConfig:
    """The model of the ``recall_learned`` part: :data:`LEARNED`'s shape, ``n_heads`` heads."""
    r = LEARNED
    vocab = tl.recall_vocab_size(r["n_keys"], r["n_values"])
    options = {**LLAMA, "attention": mixer}
    return tl.GPTConfig(vocab, 4 * max(LEARNED_PAIRS), r["n_layers"], n_heads, r["d_model"], **options)


def curriculum(step: int, steps: int) -> list[int]:
    """The pair counts trained at ``step`` of ``steps``: the smallest of :data:`LEARNED_PAIRS` from
    the start, the next one joining every ``steps / (2 len(LEARNED_PAIRS))`` steps, all of them for
    the second half."""
    k = len(LEARNED_PAIRS)
    return LEARNED_PAIRS[: 1 + min(k - 1, step * k // max(1, steps // 2))]


def learned_run(mixer: str, init: str | None, n_heads: int, seed: int, steps: int | None = None) -> dict:
    """One model of the ``recall_learned`` part, trained on :func:`curriculum`'s pair counts (each
    step one batch of ``queries / n`` sequences per count ``n``, the loss their mean), then
    measured on held-out queries at each count of :data:`LEARNED_PAIRS`."""
    r = LEARNED
    steps = r["steps"] if steps is None else steps
    data = {"n_keys": r["n_keys"], "n_values": r["n_values"]}
    torch.manual_seed(seed)
    with decay_init(init or "reference"):
        model = tl.GPT(learned_config(mixer, n_heads))
    optimiser = torch.optim.AdamW(model.parameters(), lr=r["lr"], weight_decay=0.0)
    generator = torch.Generator().manual_seed(seed)
    losses = []
    model.train()
    for step in range(steps):
        counts = curriculum(step, steps)
        loss = 0.0
        for n in counts:
            b = tl.recall_batch(r["queries"] // n, n, **data, generator=generator)
            loss = loss + model(b.idx, b.targets, loss_mask=b.loss_mask)[1] / len(counts)
        optimiser.zero_grad(set_to_none=True)
        loss.backward()
        optimiser.step()
        losses.append(loss.item())
    held_out = torch.Generator().manual_seed(10_000 + seed)
    model.eval()
    accuracy = {}
    for n in LEARNED_PAIRS:
        b = tl.recall_batch(-(-r["eval_queries"] // n), n, **data, generator=held_out)
        accuracy[str(n)] = tl.recall_accuracy(model, b)
    last = losses[-LAST:]
    return {
        "name": mixer,
        "variant": init,
        "seed": seed,
        "params": sum(p.numel() for p in model.parameters()),
        "memory": memory(model),
        "accuracy": accuracy,
        "final_loss": sum(last) / len(last),
    }


def recall_learned(seeds: list[int], steps: int | None = None) -> dict:
    """The ``recall_learned`` part: every model of :data:`LEARNED_MODELS` at each head count of
    :data:`LEARNED_HEADS`, for each seed; the runs of ``d_k`` under ``"d_k_<d_k>"``."""
    out = {"settings": {**LEARNED, "n_heads": LEARNED_HEADS, "pairs": LEARNED_PAIRS, "curriculum": True, **LLAMA}}
    for n_heads in LEARNED_HEADS:
        runs = []
        for mixer, init in LEARNED_MODELS:
            for seed in seeds:
                runs.append(learned_run(mixer, init, n_heads, seed, steps))
                acc = " ".join(f"{a:.3f}" for a in runs[-1]["accuracy"].values())
                print(f"recall_learned {n_heads} heads {mixer:>12} {init} seed {seed}: {acc}", flush=True)
        out[f"d_k_{LEARNED['d_model'] // n_heads}"] = {"runs": runs}
    return {"recall_learned": out}


# ----- lm -----


def lm_settings(steps: int | None = None) -> dict:
    """``token_run``'s settings of the ``lm`` part: chapter "Tokens"'s, with :data:`LM`'s shape and steps
    (or ``steps``, a smoke run's)."""
    return run_settings(LM_STEPS if steps is None else steps, **LM)


def lm_config(name: str, d_ff: int | None = None, vocab_size: int = 65) -> tl.GPTConfig:
    """The language model ``name`` (:data:`LM_MODELS`), with a feed-forward width ``d_ff``."""
    s = LM
    options = {**LLAMA, **dict(LM_MODELS)[name], "d_ff": d_ff}
    return tl.GPTConfig(vocab_size, s["context_len"], s["n_layers"], s["n_heads"], s["d_model"], **options)


def lm_widths(vocab_size: int = 65) -> dict:
    """Each language model's ``(d_ff, params)`` at equal parameters."""
    return matched({name: (lambda d_ff, n=name: lm_config(n, d_ff, vocab_size)) for name, _ in LM_MODELS})


def _data():
    train_text, val_text = split_text()
    return tl.CharTokenizer.from_text(train_text), train_text, val_text


def lm_run(name: str, seed: int, steps: int | None = None, widths: dict | None = None) -> dict:
    """One model of the ``lm`` part: ``name`` (:data:`LM_MODELS`), seed ``seed``."""
    tokenizer, train_text, val_text = _data()
    d_ff, params = (widths or lm_widths(tokenizer.vocab_size))[name]
    options = {**LLAMA, **dict(LM_MODELS)[name], "d_ff": d_ff}
    with decay_init(RECORDED_INIT):
        r = tl.token_run(tokenizer, train_text, val_text, seed, **lm_settings(steps), **options)
    assert sum(p.numel() for p in r["model"].parameters()) == params
    last = r["losses"][-LAST:]
    return {
        "name": name,
        "seed": seed,
        "params": params,
        "d_ff": d_ff,
        "bits_per_byte": r["bits_per_byte"],
        "final_loss": sum(last) / len(last),
    }


def lm(seeds: list[int], steps: int | None = None) -> dict:
    """The ``lm`` part: every model of :data:`LM_MODELS` for each seed."""
    widths = lm_widths(_data()[0].vocab_size)
    runs = []
    for name, _ in LM_MODELS:
        for seed in seeds:
            runs.append(lm_run(name, seed, steps, widths))
            print(f"lm {name:>12} seed {seed}: {runs[-1]['bits_per_byte']:.4f} bits/byte", flush=True)
    return {"lm": {"settings": {**lm_settings(), **LLAMA}, "options": dict(LM_MODELS), "runs": runs}}


EXPERIMENT = Experiment(
    "attention_as_recurrence",
    {"recall": Part(recall, SEEDS), "lm": Part(lm, SEEDS), "recall_learned": Part(recall_learned, SEEDS)},
)

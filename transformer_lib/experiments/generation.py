r"""The experiments of chapter "Generation": the small GPT the chapter generates with, and
grouped-query attention over seeds. The chapter loads the model from a shipped float64
checkpoint, ``transformer_lib/data/ch10/small_gpt.pt`` (chapter "Long context and precision" loads the same one), trains
one seed of the sweep live, and reads the rest from the record,
``transformer_lib/data/ch10/generation.json`` (``recorded("generation")``).

Every run is the chapter's ``train_small``: a GPT of 2 layers, 4 query heads, width 48 and
context 32, in float64 (so every machine gets the same numbers), trained with AdamW (3e-3, cosine
to 3e-4 after 20 warm-up steps) on batches of 16 windows of the chapter's agreement language
(:func:`language`: 12,000 sentences whose verb agrees with its subject across a relative clause),
its last 10 % held out.

The command line (``--dry-run`` prints and writes nothing)::

    # both parts (about 45 s, 1 core)
    python -m transformer_lib.experiments generation
    # print only
    python -m transformer_lib.experiments generation \
        --parts gqa --seeds 0 --dry-run
    # the shipped checkpoint, trained again and written (about 10 s, 1 core)
    python -m transformer_lib.experiments.generation

Parts:

* ``model``: the chapter's model, seed 0, 500 steps: its validation loss as training reports it,
  and its mean loss over the first 64 windows of the held-out text (what a loaded checkpoint is
  checked against);
* ``gqa``: the same model with 4 (multi-head), 2 (grouped) and 1 (multi-query) key/value heads,
  five seeds each, 150 steps: the validation loss.
"""

from __future__ import annotations

import random
from pathlib import Path

import torch
import torch.nn.functional as F

import transformer_lib as tl

from ..chapters import data_folder
from .recorder import Experiment, Part

__all__ = ["EXPERIMENT", "checkpoint_model", "language", "train_small", "window_loss", "write_checkpoint"]

SEEDS = [0, 1, 2, 3, 4]
MODEL_SEED, MODEL_STEPS = 0, 500
KV_HEADS = [4, 2, 1]
GQA_STEPS = 150
#: the model and training settings of ``train_small`` (besides the vocabulary and n_kv_heads)
SETTINGS = {
    "context_len": 32,
    "n_layers": 2,
    "n_heads": 4,
    "d_model": 48,
    "batch_size": 16,
    "lr": 3e-3,
    "min_lr": 3e-4,
    "warmup_iters": 20,
    "eval_iters": 10,
    "dtype": "float64",
}
#: the shipped model: its float64 state dict
CHECKPOINT = data_folder("generation") / "small_gpt.pt"
WINDOWS = 64

NOUNS = ["cat", "dog", "bird", "fox", "hen"]
VERBS = ["sleep", "run", "sing", "wait", "hide"]  # intransitive
OBJECT_VERBS = ["see", "chase", "like", "fear"]  # in relative clauses


def language(n_sentences: int = 12_000, seed: int = 0) -> str:
    """Chapter "Generation"'s agreement language, one sentence a line, as its notebook writes it (chapter
    "Generation")."""
    rng = random.Random(seed)

    def noun_phrase(plural):
        det = rng.choice(["the", "some", "two"] if plural else ["the", "a", "one"])
        return f"{det} {rng.choice(NOUNS)}{'s' * plural}"

    def verb(options, plural):
        return rng.choice(options) + ("" if plural else "s")

    def sentence():
        plural = rng.random() < 0.5
        subject = noun_phrase(plural)
        if rng.random() < 0.5:  # a relative clause between subject and verb
            other = rng.random() < 0.5
            subject += f" that {noun_phrase(other)} {verb(OBJECT_VERBS, other)}"
        return f"{subject} {verb(VERBS, plural)}."

    return "\n".join(sentence() for _ in range(n_sentences))


def data() -> tuple[tl.CharTokenizer, torch.Tensor, torch.Tensor]:
    """The language's character tokenizer and its training and held-out ids."""
    text = language()
    tokenizer = tl.CharTokenizer.from_text(text)
    train_ids, val_ids = tl.split_tokens(torch.tensor(tokenizer.encode(text)))
    return tokenizer, train_ids, val_ids


def config(vocab_size: int, n_kv_heads: int | None = None) -> tl.GPTConfig:
    """The small GPT's configuration."""
    s = SETTINGS
    return tl.GPTConfig(
        vocab_size=vocab_size,
        context_len=s["context_len"],
        n_layers=s["n_layers"],
        n_heads=s["n_heads"],
        d_model=s["d_model"],
        n_kv_heads=n_kv_heads,
    )


def train_small(
    train_ids: torch.Tensor, val_ids: torch.Tensor, vocab_size: int, n_kv_heads=None, seed=0, steps=MODEL_STEPS
) -> tuple[tl.GPT, float]:
    """The ``train_small`` of chapter "Generation": the small GPT trained in float64; returns (model in eval mode,
    the validation loss training reports at the end) (chapter "Generation")."""
    s = SETTINGS
    tl.set_seed(seed)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        model = tl.GPT(config(vocab_size, n_kv_heads))
    finally:
        torch.set_default_dtype(default)
    batches = tl.LMBatches(train_ids, val_ids, context_len=s["context_len"], batch_size=s["batch_size"], seed=seed)
    train_config = tl.TrainConfig(
        max_iters=steps,
        lr=s["lr"],
        min_lr=s["min_lr"],
        warmup_iters=s["warmup_iters"],
        eval_interval=steps,
        eval_iters=s["eval_iters"],
        device="cpu",
        progress=False,
        verbose=False,
    )
    history = tl.train(model, batches, train_config)
    return model.eval(), history.val_loss[-1]


def window_loss(model: tl.GPT, val_ids: torch.Tensor, n: int = WINDOWS) -> float:
    """The mean next-character loss of ``model`` over the first ``n`` whole windows of the held-out
    ids, in nats (chapter "Generation")."""
    T = model.config.context_len
    x = val_ids[: n * T].view(n, T)
    y = val_ids[1 : n * T + 1].view(n, T)
    with torch.no_grad():
        logits, _ = model(x)
    return F.cross_entropy(logits.flatten(0, 1), y.flatten()).item()


def checkpoint_model(path: str | Path = CHECKPOINT) -> tl.GPT:
    """The shipped small GPT of chapters "Generation" and "Long context and precision", loaded from its float64 state
    dict, in eval mode (chapter "Generation")."""
    vocab_size = data()[0].vocab_size
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        model = tl.GPT(config(vocab_size))
    finally:
        torch.set_default_dtype(default)
    model.load_state_dict(torch.load(path, weights_only=True))
    return model.eval()


def write_checkpoint(path: str | Path = CHECKPOINT) -> Path:
    """Train the chapter's model (seed 0, 500 steps, one thread) and write its float64 state dict
    to ``path``, atomically (chapter "Generation")."""
    tokenizer, train_ids, val_ids = data()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model, val_loss = train_small(train_ids, val_ids, tokenizer.vocab_size, seed=MODEL_SEED)
    finally:
        torch.set_num_threads(threads)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    tl.utils.atomic_write(path, lambda tmp: torch.save(state, tmp))
    print(f"wrote {path}: validation loss {val_loss:.4f}, window loss {window_loss(model, val_ids):.6f}")
    return Path(path)


def model_part(seeds: list[int], steps: int | None = None) -> dict:
    tokenizer, train_ids, val_ids = data()
    runs = []
    for seed in seeds:
        model, val_loss = train_small(train_ids, val_ids, tokenizer.vocab_size, seed=seed, steps=steps or MODEL_STEPS)
        runs.append({"seed": seed, "val_loss": val_loss, "window_loss": window_loss(model, val_ids)})
        print(f"model seed {seed}: validation loss {val_loss:.4f}", flush=True)
    return {"settings": SETTINGS, "model": {"steps": MODEL_STEPS, "windows": WINDOWS, "runs": runs}}


def gqa(seeds: list[int], steps: int | None = None) -> dict:
    tokenizer, train_ids, val_ids = data()
    rows = []
    for n_kv in KV_HEADS:
        runs = []
        for seed in seeds:
            _, val_loss = train_small(train_ids, val_ids, tokenizer.vocab_size, n_kv, seed, steps or GQA_STEPS)
            runs.append({"seed": seed, "val_loss": val_loss})
            print(f"n_kv_heads {n_kv} seed {seed}: validation loss {val_loss:.4f}", flush=True)
        rows.append({"name": f"n_kv_heads={n_kv}", "n_kv_heads": n_kv, "runs": runs})
    return {"settings": SETTINGS, "gqa": {"steps": GQA_STEPS, "rows": rows}}


EXPERIMENT = Experiment("generation", {"model": Part(model_part, [MODEL_SEED]), "gqa": Part(gqa, SEEDS)})

if __name__ == "__main__":
    write_checkpoint()

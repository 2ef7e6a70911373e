"""The comparison in chapter "Tokens" of a character model and a BPE model over seeds: the chapter trains
seed 0 live and reads the other seeds from the record,
``transformer_lib/data/ch13/token_sweep.json`` (``recorded("tokens")``).

Both models have the same shape (``tl.TOKEN_RUN``: 2 layers, 4 heads, width 64, context 64), take
the same number of steps with the same number of tokens per step, and are measured on the same
validation text (the last 10 % of Tiny Shakespeare; the BPE is trained on the first 90 % only).

The command line (``--dry-run`` prints and writes nothing)::

    # five seeds (a few minutes, 1 core)
    python -m transformer_lib.experiments tokens
    # print only
    python -m transformer_lib.experiments tokens --seeds 0 --dry-run
"""

from __future__ import annotations

from pathlib import Path

import torch

import transformer_lib as tl

from .recorder import Experiment, Part

__all__ = ["EXPERIMENT"]

SEEDS = [0, 1, 2, 3, 4]
KINDS = ("char", "bpe")


def split_text() -> tuple[str, str]:
    """Tiny Shakespeare (the shipped copy) cut into its first 90 % and last 10 %."""
    text = tl.data.SHIPPED_PATH.read_text(encoding="utf-8")
    n = int(len(text) * (1 - tl.TOKEN_RUN["val_fraction"]))
    return text[:n], text[n:]


def char_corpus() -> tuple[tl.CharTokenizer, torch.Tensor, torch.Tensor]:
    """The character tokenizer of :func:`split_text`'s training text, and the training and held-out
    ids ``(N,)``: what the later chapters' character-level experiments read."""
    train_text, val_text = split_text()
    tokenizer = tl.CharTokenizer.from_text(train_text)
    encode = lambda text: torch.tensor(tokenizer.encode(text), dtype=torch.long)
    return tokenizer, encode(train_text), encode(val_text)


def as_float32(model: tl.GPT) -> tl.GPT:
    """A float32 GPT of ``model``'s configuration holding ``model``'s weights, rounded to float32."""
    state = {k: v.detach().float().clone() for k, v in model.state_dict().items()}
    copy = tl.GPT(model.config)
    copy.load_state_dict(state)
    return copy.eval()


def write_float32_state(model: tl.GPT, path: str | Path) -> Path:
    """Write ``model``'s weights as a float32 state dict to ``path``, atomically (a shipped model)."""
    state = as_float32(model).state_dict()
    tl.utils.atomic_write(path, lambda tmp: torch.save(state, tmp))
    return Path(path)


def run_settings(steps: int | None = None, **changes) -> dict:
    """``tl.TOKEN_RUN``'s training settings (not the split or the BPE's size), with ``steps`` and
    ``changes`` applied: the settings of chapters "Tokens" and "Today's block"'s runs."""
    settings = {k: v for k, v in tl.TOKEN_RUN.items() if k not in ("val_fraction", "bpe_vocab")}
    if steps is not None:
        settings["steps"] = steps
    return {**settings, **changes}


def run(kind: str, seed: int, steps: int | None = None, tokenizer=None) -> dict:
    """One model of the comparison: its tokenizer (``kind``), size and measured loss."""
    train_text, val_text = split_text()
    if tokenizer is None:
        tokenizer = tokenizers(train_text)[kind]
    result = tl.token_run(tokenizer, train_text, val_text, seed, **run_settings(steps))
    embedding = result["model"].tok_embed.weight.detach()
    moved = (embedding - result["initial_embedding"]).norm(dim=-1)  # (V,)
    return {
        "tokenizer": kind,
        "seed": seed,
        "vocab_size": tokenizer.vocab_size,
        "params": sum(p.numel() for p in result["model"].parameters()),
        **{k: result[k] for k in ("nats_per_token", "bits_per_byte", "tokens", "bytes", "train_tokens")},
        "embedding_moved_median": float(moved.median()),
    }


def tokenizers(train_text: str) -> dict:
    """The two tokenizers compared, both made from the training text only."""
    return {"char": tl.CharTokenizer.from_text(train_text), "bpe": tl.train_bpe(train_text, tl.TOKEN_RUN["bpe_vocab"])}


def comparison(seeds: list[int], steps: int | None = None) -> dict:
    """Both tokenizers' models for each seed (the tokenizers are made once)."""
    made = tokenizers(split_text()[0])
    runs = []
    for seed in seeds:
        for kind in KINDS:
            runs.append(run(kind, seed, steps, made[kind]))
            r = runs[-1]
            print(f"seed {seed} {kind:>4}: {r['nats_per_token']:.4f} nats/token, {r['bits_per_byte']:.4f} bits/byte")
    return {"settings": tl.TOKEN_RUN, "runs": runs}


EXPERIMENT = Experiment("tokens", {"comparison": Part(comparison, SEEDS)})

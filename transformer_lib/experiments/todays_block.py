r"""The experiments over seeds of chapter "Today's block": GPT-2's block turned into a Llama-style one, one change
at a time. The chapter trains one configuration live and reads the rest from the record,
``transformer_lib/data/ch14/block_sweep.json`` (``recorded("todays_block")``).

Every run is the chapter "Tokens" comparison's small GPT (``tl.TOKEN_RUN``: 2 layers, 4 heads, width
64, context 64, 300 steps of 16 windows, AdamW at 3e-3, no weight decay) on Tiny Shakespeare's
characters, measured on the last 10 % in bits per byte.

The command line (``--dry-run`` prints and writes nothing)::

    # three seeds (about 10 minutes, 1 core)
    python -m transformer_lib.experiments todays_block
    # print only
    python -m transformer_lib.experiments todays_block \
        --parts lr --seeds 0 --dry-run

Parts:

* ``ablation``: GPT-2's block, then each change added to the one before: RMSNorm, SwiGLU (the
  2/3 rule), rotary positions, no biases, query-key normalisation; the validation loss at the
  trained context (64) and, for rotary positions, at twice it (128; learned positions have no
  vector there);
* ``lr``: the Llama-style block at ten times the learning rate (3e-2), without and with query-key
  normalisation: the loss, the largest jump of the training loss over its best so far, and the
  largest attention logit at the end.
"""

from __future__ import annotations

import torch

import transformer_lib as tl

from .recorder import Experiment, Part
from .tokens import run_settings, split_text

__all__ = ["EXPERIMENT"]

SEEDS = [0, 1, 2]
# each row adds one change to the row before; the first is GPT-2's block
ABLATION = [
    ("GPT-2 block", {}),
    ("+ RMSNorm", {"norm": "rmsnorm"}),
    ("+ SwiGLU", {"ffn": "swiglu"}),
    ("+ rotary", {"positions": "rotary"}),
    ("+ no biases", {"bias": False}),
    ("+ QK-norm", {"qk_norm": True}),
]
HIGH_LR = 3e-2


def options(row: int) -> dict:
    """The GPTConfig settings of ablation row ``row`` (the changes of every row up to it)."""
    out: dict = {}
    for _, change in ABLATION[: row + 1]:
        out.update(change)
    return out


def one_run(row_options: dict, seed: int, steps: int | None = None, lr: float | None = None) -> dict:
    """One character model with the block settings ``row_options``: its loss, the largest jump of
    its training loss and its largest attention logit (and, with rotary positions, its loss over
    twice the context it was trained on)."""
    train_text, val_text = split_text()
    tokenizer = tl.CharTokenizer.from_text(train_text)
    settings = run_settings(steps) if lr is None else run_settings(steps, lr=lr)
    r = tl.token_run(tokenizer, train_text, val_text, seed, **settings, **row_options)
    model, losses = r["model"], r["losses"]
    val_ids = torch.tensor(tokenizer.encode(val_text[:20_000]), dtype=torch.long)
    best, jump = float("inf"), 0.0
    for loss in losses:
        jump, best = max(jump, loss - best), min(best, loss)
    out = {
        "seed": seed,
        "params": sum(p.numel() for p in model.parameters()),
        "bits_per_byte": r["bits_per_byte"],
        "largest_jump": jump,
        "final_train_loss": sum(losses[-20:]) / 20,
        "attention_logit_max": float(tl.attention_logit_max(model, val_ids[None, :64]).max()),
    }
    if row_options.get("positions") == "rotary":  # the same weights, read over twice the context
        T = model.config.context_len
        longer = tl.GPT(tl.GPTConfig(**{**model.config.__dict__, "context_len": 2 * T}))
        longer.load_state_dict(model.state_dict())
        val = torch.tensor(tokenizer.encode(val_text))
        out["bits_per_byte_2x"] = tl.bits_per_byte(longer.eval(), val, tl.token_byte_lengths(tokenizer))[
            "bits_per_byte"
        ]
    return out


def ablation(seeds: list[int], steps: int | None = None) -> dict:
    rows = []
    for i, (name, _) in enumerate(ABLATION):
        runs = []
        for seed in seeds:
            runs.append(one_run(options(i), seed, steps))
            print(f"{name:>12} seed {seed}: {runs[-1]['bits_per_byte']:.4f} bits/byte", flush=True)
        rows.append({"name": name, "options": options(i), "runs": runs})
    return {"settings": tl.TOKEN_RUN, "ablation": {"rows": rows}}


def lr(seeds: list[int], steps: int | None = None) -> dict:
    base = options(ABLATION.index(("+ no biases", {"bias": False})))
    out = {"lr": HIGH_LR, "base_lr": tl.TOKEN_RUN["lr"], "options": base, "runs": []}
    for qk_norm in (False, True):
        for seed in seeds:
            r = one_run({**base, "qk_norm": qk_norm}, seed, steps, HIGH_LR)
            out["runs"].append({"qk_norm": qk_norm, **r})
            print(
                f"lr {HIGH_LR} qk_norm={qk_norm} seed {seed}: {r['bits_per_byte']:.4f} bits/byte, "
                f"jump {r['largest_jump']:.3f}, logit {r['attention_logit_max']:.1f}",
                flush=True,
            )
    return {"settings": tl.TOKEN_RUN, "lr": out}


EXPERIMENT = Experiment("todays_block", {"ablation": Part(ablation, SEEDS), "lr": Part(lr, SEEDS)})

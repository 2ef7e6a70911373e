"""The GPT of chapter "A GPT from scratch" trained in full, over seeds, and the model the chapter
reads: the notebook trains the first steps live, to show the loss falling, and takes the rest
from the record, ``transformer_lib/data/ch09/gpt_runs.json`` (``recorded("gpt")``), and the
trained weights from the checkpoint shipped beside it, ``gpt.pt`` (:func:`recorded_model`).

The model and its training are the chapter's: a float64 GPT of 2 blocks, 4 heads, width 64 and
context 32 on the characters of 8,000 sentences of the chapter's invented language
(``tl.grammar_text(8000, seed=0)``, the last 10 % held out), 800 steps of 32 windows, AdamW at
3e-3 with 50 steps of warm-up and a cosine decay to 3e-4, evaluated every 100 steps on 8 batches
of each split. Seed ``s`` draws the initial weights after ``tl.set_seed(s)`` and the windows from
``tl.LMBatches(..., seed=s)``.

The command line (``--dry-run`` prints and writes nothing)::

    # the record, three seeds (about 2 minutes, 1 core)
    python -m transformer_lib.experiments gpt
    # the record and seed 0's weights, the shipped checkpoint
    python -m transformer_lib.experiments.gpt
    # seed 0, printed, nothing written
    python -m transformer_lib.experiments gpt --seeds 0 --dry-run

Parts:

* ``gpt``: for each seed, the loss of every training step, the evaluations (step, training
  split, validation split), the final validation loss and its gap to the entropy rate of the
  language, the seconds the run took; for seed 0 also the SHA-256 of its trained weights, which
  the shipped checkpoint holds.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import asdict
from pathlib import Path

import torch

import transformer_lib as tl

from ..chapters import data_folder
from .recorder import Experiment, Part, run_experiment

__all__ = ["CHECKPOINT", "EXPERIMENT", "SETTINGS", "corpus", "recorded_model", "train_gpt", "weights_sha256"]

SEEDS = [0, 1, 2]
SENTENCES = 8000  # tl.grammar_text(SENTENCES, seed=0): the chapter's text
BATCH = 32
#: the GPTConfig settings of the chapter's model (the vocabulary comes from the text)
MODEL = {"context_len": 32, "n_layers": 2, "n_heads": 4, "d_model": 64}
#: the TrainConfig settings of the chapter's training
TRAIN = {"max_iters": 800, "lr": 3e-3, "min_lr": 3e-4, "warmup_iters": 50, "eval_interval": 100, "eval_iters": 8}
#: what the record's runs were made with
SETTINGS = {"sentences": SENTENCES, "batch_size": BATCH, "model": MODEL, "train": TRAIN}
#: seed 0's trained weights, float64 (a checkpoint :func:`transformer_lib.load_checkpoint` reads)
CHECKPOINT = data_folder("gpt") / "gpt.pt"
#: the models the ``gpt`` part trained in this process, by seed (the checkpoint is written from seed 0's)
TRAINED: dict[int, tl.GPT] = {}


def corpus() -> tuple[tl.CharTokenizer, torch.Tensor, torch.Tensor, float]:
    """The chapter's text as ``(tokenizer, train_ids, val_ids, entropy_rate)`` (chapter "A GPT from scratch"): the
    character tokenizer, the two splits of its id stream (the last 10 % held out) and the entropy
    rate of the language in nats per character, the lowest loss any model can reach."""
    text = tl.grammar_text(SENTENCES, seed=0)
    tokenizer = tl.CharTokenizer.from_text(text)
    train_ids, val_ids = tl.split_tokens(torch.tensor(tokenizer.encode(text)), val_fraction=0.1)
    h_sentence, mean_length = tl.grammar_entropy(tl.TOY_GRAMMAR)
    return tokenizer, train_ids, val_ids, h_sentence / mean_length


def train_gpt(seed: int, steps: int | None = None, until: int | None = None) -> tuple[tl.GPT, tl.History]:
    """The chapter's float64 GPT trained with seed ``seed`` (chapter "A GPT from scratch"): ``(model, history)``.

    ``steps`` replaces the 800 steps (a smoke run, another schedule); ``until`` stops after that
    many steps of the full schedule, as the chapter's live run does."""
    tokenizer, train_ids, val_ids, _ = corpus()
    tl.set_seed(seed)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)  # float64 weights, drawn in float64
    try:
        model = tl.GPT(tl.GPTConfig(vocab_size=tokenizer.vocab_size, **MODEL))
    finally:
        torch.set_default_dtype(previous)
    settings = {**TRAIN, "max_iters": steps or TRAIN["max_iters"]}
    config = tl.TrainConfig(**settings, device="cpu", progress=False, verbose=False)
    batches = tl.LMBatches(train_ids, val_ids, MODEL["context_len"], BATCH, seed=seed)
    history = tl.train(model, batches, config, until=until)
    return model.eval(), history


def weights_sha256(model: torch.nn.Module) -> str:
    """The SHA-256 of ``model``'s state dict: every tensor's name, dtype, shape and bytes, in
    order (chapter "A GPT from scratch"). Equal hashes: bit-for-bit equal weights."""
    digest = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        t = tensor.detach().cpu().contiguous()
        digest.update(f"{name} {t.dtype} {tuple(t.shape)}".encode())
        digest.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return digest.hexdigest()


def r(x: float) -> float:
    return round(float(x), 6)


def run_gpt(seeds: list[int], steps: int | None = None) -> dict:
    """The ``gpt`` part: each seed trained as the chapter trains it, and its losses."""
    entropy_rate = corpus()[3]
    runs = []
    for seed in seeds:
        start = time.time()
        model, history = train_gpt(seed, steps)
        run = {
            "seed": seed,
            "seconds": round(time.time() - start, 1),
            "step_loss": [r(x) for x in history.step_loss],
            "eval_step": list(history.eval_step),
            "train_loss": [r(x) for x in history.train_loss],
            "val_loss": [r(x) for x in history.val_loss],
            "final_val_loss": r(history.val_loss[-1]),
            "gap": r(history.val_loss[-1] - entropy_rate),
        }
        if seed == 0:
            run["weights_sha256"] = weights_sha256(model)
        TRAINED[seed] = model
        runs.append(run)
        print(f"gpt seed {seed}: validation loss {run['final_val_loss']}, gap {run['gap']}, {run['seconds']} s")
    return {"settings": SETTINGS, "gpt": {"runs": runs}}


def recorded_model() -> tuple[tl.GPT, tl.CharTokenizer]:
    """Chapter "A GPT from scratch"'s GPT as the experiment trained it, seed 0, 800 steps: ``(model, tokenizer)``
    read from the shipped float64 checkpoint (:data:`CHECKPOINT`), the model in eval mode."""
    model, tokenizer, _ = tl.load_checkpoint(CHECKPOINT)
    return model, tokenizer


def write_checkpoint(model: tl.GPT, path: str | Path = CHECKPOINT) -> Path:
    """Save ``model`` with the chapter's tokenizer as a checkpoint :func:`recorded_model` reads:
    the weights, the model's settings, the tokenizer and the step, no optimiser state."""
    tokenizer = corpus()[0]
    state = {
        "model_class": "GPT",
        "model_config": model.config.to_dict() if hasattr(model.config, "to_dict") else asdict(model.config),
        "model": model.state_dict(),
        "tokenizer": tokenizer.to_dict(),
        "step": TRAIN["max_iters"],
    }
    return tl.save_checkpoint(state, path)


# the part: ``run(seeds, steps)`` returns the record's entries it fills (``steps``: a smoke run)
EXPERIMENT = Experiment("gpt", {"gpt": Part(run_gpt, SEEDS)})


def main(argv: list[str] | None = None) -> int:
    """``python -m transformer_lib.experiments.gpt [--dry-run]``: every seed of the record and,
    unless a dry run, seed 0's weights written to :data:`CHECKPOINT` (chapter "A GPT from scratch")."""
    import argparse

    parser = argparse.ArgumentParser(
        description="Record chapter \"A GPT from scratch\"'s runs and write seed 0's weights beside them."
    )
    parser.add_argument("--dry-run", action="store_true", help="train and print, write nothing")
    args = parser.parse_args(argv)
    record = run_experiment(EXPERIMENT, dry_run=args.dry_run)
    model = TRAINED[0]
    assert record["gpt"]["runs"][0]["weights_sha256"] == weights_sha256(model)
    if not args.dry_run:
        write_checkpoint(model)
        print(f"wrote {CHECKPOINT} ({CHECKPOINT.stat().st_size / 1e6:.2f} MB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

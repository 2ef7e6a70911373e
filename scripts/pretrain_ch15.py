"""Chapter "Fine-tuning"'s pretrained GPT, made by the book's own training command and shipped with the package.

The chapter fine-tunes a model that has read Shakespeare; pretraining one takes minutes, more
than a chapter's minute, so this script runs the training command once, on the training split
only (the first 90 % of Tiny Shakespeare: the speeches the chapter classifies lie in the last
10 %, which the model never reads), and keeps what the chapter needs: the weights, the
configuration, the tokenizer and a record of how they were made.

    python scripts/pretrain_ch15.py            # about 5 minutes on a 2-core CPU
    python scripts/pretrain_ch15.py --dry-run  # train into a temporary folder, write nothing

Writes ``transformer_lib/data/ch15/pretrained.pt`` (a checkpoint without the optimiser's state,
which :func:`transformer_lib.load_checkpoint` reads) and ``pretrained.json`` beside it: the
command, the commit, the seed and the validation loss that ``tests/test_pretrained_ch15.py``
checks the shipped weights against.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import transformer_lib as tl  # noqa: E402

OUT = ROOT / "transformer_lib" / "data" / "ch15"
FLAGS = ["--preset", "cpu", "--tokenizer", "bpe", "--vocab-size", "512", "--seed", "0", "--max-iters", "6000"]
KEEP = ("model_class", "model_config", "model", "tokenizer", "meta", "step", "train_config")


def commit() -> str:
    """The commit the weights were made at (with ``+changes`` if the tree differed from it)."""
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "transformer_lib"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    return head + ("+changes" if dirty else "")


def val_loss(model: tl.GPT, tokenizer) -> float:
    """The mean next-token loss on the validation split (the last 10 %), on 50 fixed batches of
    random windows (:func:`transformer_lib.window_loss`, generator seed 0)."""
    text = tl.data.SHIPPED_PATH.read_text(encoding="utf-8")
    return tl.window_loss(model, torch.tensor(tokenizer.encode(text[int(len(text) * 0.9) :])), batches=50)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="print the record, write nothing")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        command = [sys.executable, "-m", "transformer_lib", "train", *FLAGS, "--out-dir", tmp]
        subprocess.run(command, cwd=ROOT, check=True)
        ckpt = tl.read_checkpoint(tmp)
    slim = {k: ckpt[k] for k in KEEP if k in ckpt}
    slim["meta"] = {k: v for k, v in slim["meta"].items() if k != "data"}  # no path of this machine
    model, tokenizer, _ = tl.load_checkpoint(slim)
    record = {
        "command": "python -m transformer_lib train " + " ".join(FLAGS) + " --out-dir DIR",
        "commit": commit(),
        "seed": 0,
        "steps": ckpt["step"],
        "params": sum(p.numel() for p in model.parameters()),
        "val_loss": round(val_loss(model, tokenizer), 6),
        "val_loss_how": "mean of 50 batches of 32 random windows of the last 10 %, generator seed 0",
        "best_val_loss_in_training": min(ckpt["history"]["val_loss"]) if ckpt.get("history") else None,
    }
    print(json.dumps(record, indent=2))
    if not args.dry_run:
        OUT.mkdir(parents=True, exist_ok=True)
        tl.save_checkpoint(slim, OUT / "pretrained.pt")
        tl.utils.atomic_write(
            OUT / "pretrained.json", lambda t: Path(t).write_text(json.dumps(record, indent=2) + "\n")
        )
        print(f"wrote {OUT / 'pretrained.pt'} ({(OUT / 'pretrained.pt').stat().st_size / 1e6:.2f} MB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

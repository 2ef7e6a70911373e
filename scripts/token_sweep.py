"""Chapter 13's comparison of a character model and a BPE model over seeds, recorded in one JSON file.

Both models have the same shape (``tl.TOKEN_RUN``: 2 layers, 4 heads, width 64, context 64), take
the same number of steps with the same number of tokens per step, and are measured on the same
validation text (the last 10 % of Tiny Shakespeare; the BPE is trained on the first 90 % only).
The chapter trains seed 0 live and reads the other seeds here; ``tests/test_token_sweep.py``
(marked slow) re-runs seed 0 and compares.

    python scripts/token_sweep.py                 # five seeds, both tokenizers (a few minutes, 1 core)
    python scripts/token_sweep.py --seeds 0 --dry-run   # print only
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import transformer_lib as tl  # noqa: E402

OUT = ROOT / "transformer_lib" / "data" / "ch13" / "token_sweep.json"
SEEDS = [0, 1, 2, 3, 4]


def split_text() -> tuple[str, str]:
    """Tiny Shakespeare (the shipped copy) cut into its first 90 % and last 10 %."""
    text = tl.data.SHIPPED_PATH.read_text(encoding="utf-8")
    n = int(len(text) * (1 - tl.TOKEN_RUN["val_fraction"]))
    return text[:n], text[n:]


def tokenizers(train_text: str) -> dict:
    """The two tokenizers compared, both made from the training text only."""
    return {
        "char": tl.CharTokenizer.from_text(train_text),
        "bpe": tl.train_bpe(train_text, tl.TOKEN_RUN["bpe_vocab"]),
    }


def run(kind: str, seed: int, steps: int | None = None) -> dict:
    train_text, val_text = split_text()
    tokenizer = tokenizers(train_text)[kind]
    settings = {k: v for k, v in tl.TOKEN_RUN.items() if k not in ("val_fraction", "bpe_vocab")}
    if steps is not None:
        settings["steps"] = steps
    result = tl.token_run(tokenizer, train_text, val_text, seed, **settings)
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


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=SEEDS)
    parser.add_argument("--steps", type=int, default=None, help="training steps (a smoke test; not recorded)")
    parser.add_argument("--out", type=Path, default=OUT, help="the JSON to write (default: %(default)s)")
    parser.add_argument("--dry-run", action="store_true", help="print, write nothing")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # the thread count changes the rounding of sums
    runs = []
    for seed in args.seeds:
        for kind in ("char", "bpe"):
            runs.append(run(kind, seed, args.steps))
            r = runs[-1]
            print(f"seed {seed} {kind:>4}: {r['nats_per_token']:.4f} nats/token, {r['bits_per_byte']:.4f} bits/byte")
    result = {"torch": torch.__version__, "threads": 1, "settings": tl.TOKEN_RUN, "runs": runs}
    if not args.dry_run:
        if args.steps is not None:
            parser.error("--steps changes the recorded settings: use it with --dry-run")
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {args.out}")
    return result


if __name__ == "__main__":
    main()

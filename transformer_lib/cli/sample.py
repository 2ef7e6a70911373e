"""The ``sample`` command (chapter 9): ``python -m transformer_lib sample --ckpt out`` prints
text generated from a checkpoint that ``python -m transformer_lib train`` wrote.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

import torch

from ..checkpoint import load_checkpoint
from ..models import GPT
from ..sampling import generate_text
from ..utils import pick_device
from .settings import _check_seed, _Parser
from .train import _saved_tokenizer

__all__ = ["sample_main"]


def sample_main(argv: Sequence[str] | None = None) -> int:
    """``python -m transformer_lib sample``: print text generated from a checkpoint (chapter 9)."""
    parser = _Parser(
        prog="python -m transformer_lib sample",
        description="Generate text from a GPT checkpoint written by python -m transformer_lib train.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--ckpt", default="out", help="a checkpoint file or the folder holding ckpt.pt")
    parser.add_argument("--prompt", default="\n", help="text the sample continues")
    parser.add_argument("--max-new-tokens", type=int, default=500, help="characters to generate")
    parser.add_argument("--temperature", type=float, default=0.8, help="below 1: safer, above 1: wilder")
    parser.add_argument("--top-k", type=int, default=None, help="sample only among the k most likely characters")
    parser.add_argument(
        "--top-p", type=float, default=None, help="sample only among the most likely characters that reach this mass"
    )
    parser.add_argument("--num-samples", type=int, default=1, help="how many samples")
    parser.add_argument("--seed", type=int, default=1337, help="seed of the sampling")
    parser.add_argument("--device", default="auto", help="'auto', 'cpu', 'cuda', 'mps', ...")
    args = parser.parse_args(argv)
    if args.num_samples < 1:
        raise ValueError(f"--num-samples must be a positive int, got {args.num_samples}")
    _check_seed(args.seed)

    device = pick_device(args.device)
    try:
        model, tokenizer, _ = load_checkpoint(args.ckpt, device)
    except FileNotFoundError as e:
        parser.error(str(e))
    if not isinstance(model, GPT) or tokenizer is None:
        parser.error(f"{args.ckpt} does not hold a GPT with its tokenizer")
    folder = Path(args.ckpt) if Path(args.ckpt).is_dir() else Path(args.ckpt).parent
    tokenizer = _saved_tokenizer(tokenizer, folder)
    generator = torch.Generator(device=device).manual_seed(args.seed)
    options = dict(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, generator=generator)
    for i in range(args.num_samples):
        if i:
            print("\n" + "-" * 40)
        try:
            print(generate_text(model, tokenizer, args.prompt, args.max_new_tokens, **options))
        except ValueError as e:  # a prompt character the model never saw, a bad temperature, top-k or top-p
            parser.error(str(e))
    return 0

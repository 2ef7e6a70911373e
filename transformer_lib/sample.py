"""Generate text from a trained character-level GPT (chapter 9, "A GPT from scratch").

::

    python -m transformer_lib.sample --ckpt out --prompt "ROMEO:" --max-new-tokens 200 --temperature 0.8 --top-k 50

(``python -m transformer_lib.train sample ...`` is the same command.)
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import torch

from .data import CharTokenizer
from .models import GPT
from .train import load_checkpoint
from .utils import pick_device

__all__ = ["generate_text", "main"]


def generate_text(
    model: GPT,
    tokenizer: CharTokenizer,
    prompt: str = "\n",
    max_new_tokens: int = 200,
    temperature: float = 1.0,
    top_k: int | None = None,
    generator: torch.Generator | None = None,
) -> str:
    """``prompt`` followed by ``max_new_tokens`` sampled characters (see :meth:`GPT.generate`)."""
    if not prompt:
        raise ValueError("the prompt must have at least one character (for example a newline)")
    device = next(model.parameters()).device
    idx = torch.tensor([tokenizer.encode(prompt)], dtype=torch.long, device=device)  # (1, T)
    was_training = model.training
    model.eval()
    out = model.generate(idx, max_new_tokens, temperature=temperature, top_k=top_k, generator=generator)
    model.train(was_training)
    return tokenizer.decode(out[0])


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m transformer_lib.sample``: print text generated from a checkpoint."""
    parser = argparse.ArgumentParser(
        prog="python -m transformer_lib.sample",
        description="Generate text from a GPT checkpoint written by python -m transformer_lib.train.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--ckpt", default="out", help="a checkpoint file or the folder holding ckpt.pt")
    parser.add_argument("--prompt", default="\n", help="text the sample continues")
    parser.add_argument("--max-new-tokens", type=int, default=500, help="characters to generate")
    parser.add_argument("--temperature", type=float, default=0.8, help="below 1: safer, above 1: wilder")
    parser.add_argument("--top-k", type=int, default=None, help="sample only among the k most likely characters")
    parser.add_argument("--num-samples", type=int, default=1, help="how many samples")
    parser.add_argument("--seed", type=int, default=1337, help="seed of the sampling")
    parser.add_argument("--device", default="auto", help="'auto', 'cpu', 'cuda', 'mps', ...")
    args = parser.parse_args(argv)

    device = pick_device(args.device)
    try:
        model, tokenizer, _ = load_checkpoint(args.ckpt, device)
    except FileNotFoundError as e:
        parser.error(str(e))
    if not isinstance(model, GPT) or tokenizer is None:
        parser.error(f"{args.ckpt} does not hold a GPT with its tokenizer")
    generator = torch.Generator(device=device).manual_seed(args.seed)
    for i in range(args.num_samples):
        if i:
            print("\n" + "-" * 40)
        try:
            print(generate_text(model, tokenizer, args.prompt, args.max_new_tokens, args.temperature, args.top_k,
                                generator))  # fmt: skip
        except ValueError as e:  # a prompt character the model never saw
            parser.error(str(e))
    return 0


if __name__ == "__main__":
    sys.exit(main())

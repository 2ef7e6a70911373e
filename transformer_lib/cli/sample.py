"""The ``sample`` command (chapter "A GPT from scratch"): ``python -m transformer_lib sample --ckpt out`` prints
text generated from a checkpoint that ``python -m transformer_lib train`` wrote. A fine-tuned
model (chapter "Fine-tuning": a ``finetune`` run's checkpoint, LoRA runs too, or a base with ``--adapter``;
chapter "Preferences and rewards": a ``dpo`` or ``grpo`` run's) is given the
prompt in its fine-tuning format, ``prompt + PROMPT_END``, and its response is printed, up to the
end token.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import torch

from ..checkpoint import checkpoint_file, read_checkpoint
from ..data.instructions import PROMPT_END
from ..models import GPT
from ..run import RunRecord, start_model
from ..sampling import generate_tokens
from ..utils import pick_device
from .settings import Parser, check_seed

__all__ = ["sample_main"]


def build_parser() -> argparse.ArgumentParser:
    """The sampling command's argument parser (``python -m transformer_lib sample --help``, chapter "A GPT from
    scratch")."""
    parser = Parser(
        prog="python -m transformer_lib sample",
        description="Generate text from a GPT checkpoint written by python -m transformer_lib train or finetune. A "
        "fine-tuned run is given --prompt in its fine-tuning format and prints its response: it stops at its end "
        "token, not after --max-new-tokens. Ctrl-C prints what was generated so far. Typical time on a laptop: "
        "a few seconds for 500 tokens of a --preset cpu run, with one thread.",
    )
    parser.add_argument(
        "--ckpt", default="out", help="a checkpoint file or the run folder holding ckpt.pt (default: %(default)s)"
    )
    parser.add_argument("--prompt", default="\n", help="text the sample continues (default: a newline)")
    parser.add_argument(
        "--max-new-tokens",
        type=int,
        default=500,
        help="tokens to generate (characters for a character-level run); a fine-tuned model stops earlier, at "
        "its end token (default: %(default)s)",
    )
    parser.add_argument(
        "--temperature", type=float, default=0.8, help="below 1: safer, above 1: wilder (default: %(default)s)"
    )
    parser.add_argument(
        "--top-k", type=int, default=None, help="sample only among the k most likely tokens (default: all)"
    )
    parser.add_argument(
        "--top-p",
        type=float,
        default=None,
        help="sample only among the most likely tokens that reach this probability mass (default: all)",
    )
    parser.add_argument("--num-samples", type=int, default=1, help="how many samples (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=1337, help="seed of the sampling (default: %(default)s)")
    parser.add_argument("--device", default="auto", help="'auto', 'cpu', 'cuda', 'mps', ... (default: %(default)s)")
    parser.add_argument(
        "--adapter",
        default=None,
        help="a LoRA adapter file of python -m transformer_lib finetune, "
        'added to the model of --ckpt, the base it was trained on (chapter "Fine-tuning"; default: '
        "none)",
    )
    parser.add_argument("--greedy", action="store_true", help="always the most likely token (top-k 1; default: off)")
    return parser


def sample_main(argv: Sequence[str] | None = None) -> int:
    """``python -m transformer_lib sample``: print text generated from a checkpoint (chapter "A GPT from scratch").
    A Ctrl-C while generating prints the text so far, then ``interrupted (Ctrl-C)`` on stderr:
    exit status 130."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.num_samples < 1:
        raise ValueError(f"--num-samples must be a positive int, got {args.num_samples}")
    check_seed(args.seed)

    device = pick_device(args.device)
    try:
        ckpt = read_checkpoint(args.ckpt)
    except FileNotFoundError as e:
        parser.error(str(e))
    model, tokenizer = start_model(ckpt, checkpoint_file(args.ckpt), args.adapter, device)  # a LoRA run's too
    if not isinstance(model, GPT) or tokenizer is None:
        parser.error(f"{args.ckpt} does not hold a GPT with its tokenizer")
    model.eval()
    finetuned = args.adapter is not None or RunRecord.from_meta(ckpt.get("meta")).kind != "pretrain"
    generator = torch.Generator(device=device).manual_seed(args.seed)
    top_k = 1 if args.greedy else args.top_k
    options = dict(temperature=args.temperature, top_k=top_k, top_p=args.top_p, generator=generator)
    for i in range(args.num_samples):
        if i:
            print("\n" + "-" * 40)
        text = None
        try:
            text = _Sample(tokenizer, args.prompt, finetuned)
            idx = torch.tensor([text.prompt_ids], dtype=torch.long, device=device)  # (1, T)
            stop_id = tokenizer.eos_id if finetuned else None
            for token in generate_tokens(model, idx, args.max_new_tokens, stop_id=stop_id, **options):
                text.new.append(token)
        except KeyboardInterrupt:
            if text is not None:
                print(text.shown(), flush=True)
            print("interrupted (Ctrl-C)", file=sys.stderr)
            return 130
        except ValueError as e:  # a prompt character the model never saw, a bad temperature, top-k or top-p
            parser.error(str(e))
        print(text.shown())
    return 0


class _Sample:
    """One sample as it grows: a pretrained model's text is the prompt and its continuation; a
    fine-tuned model's (chapter "Fine-tuning") is its response to ``prompt + PROMPT_END``, up to the end token."""

    def __init__(self, tokenizer, prompt: str, finetuned: bool) -> None:
        if not prompt:
            raise ValueError("--prompt must have at least one character (for example a newline)")
        self.tokenizer, self.finetuned = tokenizer, finetuned
        self.prompt_ids = tokenizer.encode(prompt + PROMPT_END if finetuned else prompt)
        self.new: list[int] = []

    def shown(self) -> str:
        if not self.finetuned:
            return self.tokenizer.decode(self.prompt_ids + self.new)
        eos = self.tokenizer.eos_id
        return self.tokenizer.decode(self.new[: self.new.index(eos)] if eos in self.new else self.new)

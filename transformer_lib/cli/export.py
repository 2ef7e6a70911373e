"""The ``export`` command (chapters "Generation", "Today's block" and "Fine-tuning"): ``python -m transformer_lib export
--ckpt RUN --out-dir DIR`` writes a run's model and tokenizer in Hugging Face's format
(:func:`~transformer_lib.export.export_hf`), which ``transformers`` loads offline.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..export import export_hf
from .settings import Parser

__all__ = ["export_main"]


def export_main(argv: Sequence[str] | None = None) -> int:
    """``python -m transformer_lib export``: write a run in Hugging Face's format (chapters "Generation", "Today's
    block" and "Fine-tuning")."""
    parser = Parser(
        prog="python -m transformer_lib export",
        description="Write a model the book trained (a run folder or checkpoint of train or finetune) with its "
        "tokenizer into a folder that transformers' AutoModelForCausalLM.from_pretrained and "
        "AutoTokenizer.from_pretrained load offline: a GPT-2-style model as GPT2LMHeadModel, a Llama-style one "
        "(--preset llama-cpu) as LlamaForCausalLM, one with experts routed as Mixtral's (--experts N) as "
        "MixtralForCausalLM, one with latent attention (--preset llama-cpu --attention latent --norm-eps 1e-6) "
        "as a dense DeepseekV3ForCausalLM, one with attention sinks or a window (--sinks, --window N) as "
        "GptOssForCausalLM, a hybrid of gated DeltaNet and multi-head layers with query-key norm (--attention "
        "gated_delta --full-every N --qk-norm) as Qwen3NextForCausalLM; any other block is refused by the "
        "setting no format writes. The "
        "end-of-text id is the tokenizer's <|endoftext|> (BPE runs), or none for a character run.",
    )
    parser.add_argument("--ckpt", required=True, help="the run's folder or checkpoint file (required)")
    parser.add_argument(
        "--out-dir",
        "--output-dir",
        required=True,
        help="the folder to write (required); a folder that holds files is refused unless --force",
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="write into a folder that holds files, replacing the "
        "exported files of the same names and keeping every other file (default: refuse)",
    )
    adapter = parser.add_mutually_exclusive_group()
    adapter.add_argument(
        "--merge-adapter",
        action="store_true",
        help="a LoRA run: merge its adapters into the weights and write one model (default: a LoRA run is refused)",
    )
    adapter.add_argument(
        "--peft-adapter",
        action="store_true",
        help="a LoRA run: write its base model and, in "
        "OUT_DIR/adapter, its adapters in peft's format (peft.PeftModel.from_pretrained)",
    )
    args = parser.parse_args(argv)
    files = export_hf(
        args.ckpt, args.out_dir, merge_adapter=args.merge_adapter, peft_adapter=args.peft_adapter, force=args.force
    )
    print(f"wrote {len(files)} files to {args.out_dir}: {', '.join(sorted(str(f.name) for f in files))}")
    print(
        f"load them with AutoModelForCausalLM.from_pretrained({str(args.out_dir)!r}) and "
        f"AutoTokenizer.from_pretrained({str(args.out_dir)!r})"
    )
    if args.peft_adapter:
        print(f"and the adapters with peft.PeftModel.from_pretrained(model, {str(args.out_dir) + '/adapter'!r})")
    return 0

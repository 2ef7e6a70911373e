"""transformer_lib: the library the book "Attention, Executed" builds chapter by chapter.

Concept modules, in chapter order (each imports only the ones before it), each with the chapter
that introduces it (:mod:`transformer_lib.chapters` lists the chapters; none is named by its
number): ``attention`` (chapters "Queries, keys and values" and "Why divide by sqrt(d_k)"),
``masks`` ("Masking"), ``kv_cache`` (the key-value cache of "Generation", which ``multihead``
reads), ``multihead`` ("Multi-head attention", with the grouped-query attention of "Generation" and
the sliding windows of "Long context and precision"), ``positional`` ("Positional encoding"),
``blocks`` ("The transformer block"), ``encoder_decoder`` ("Encoder-decoder and cross-attention"),
``sampling`` and ``models`` ("A GPT from scratch") and ``long_context`` ("Long context and
precision": the online softmax and tiled attention), ``inspect_heads`` ("What attention learns":
capturing attention weights, intervening on heads, scoring patterns), ``bpe`` ("Tokens": byte-level
BPE), ``modern_block`` and ``recipe`` ("Today's block": the block and the recipe that assembles it),
``latent_attention``, ``sparse_attention`` and ``sinks`` ("Latent, sparse and sink attention": the
cache compressed three ways), ``linear_attention`` and ``delta_net`` ("Attention as a recurrence":
a fixed-size state), ``experts`` ("Experts": a mixture of experts in place of a feed-forward
network), ``rope_scaling`` ("Longer than trained": rotary frequencies rescaled past the trained
length).
Tools above them: ``induction`` ("What attention learns": the attention-only model and its
training on repeats), ``tokens`` ("Tokens": bits per byte, the character-against-BPE run), ``cost``
(every cost formula: receptive fields, attention FLOPs, MFU, memory), ``data``, ``train_config``
and ``train``, ``checkpoint``, ``lora`` and ``finetune`` ("Fine-tuning": low-rank adapters, a
classifier on a GPT), ``pretrained`` (GPT-2 and nanoGPT weights), ``pretrained_experts`` (the
experts of Qwen3-MoE, Mixtral and DeepSeek-V3), ``pretrained_latent`` (a latent-attention GPT as a
dense DeepSeek-V3), ``pretrained_gpt_oss`` (a GPT with learned sinks as gpt-oss),
``pretrained_qwen3_next`` (the gated-DeltaNet hybrid as Qwen3-Next), ``export`` (a run in Hugging
Face's format), ``evaluate`` and ``quantize`` ("Measuring a model": the report card, multiple
choice, pass@k, intervals; int8 and NF4 weights), ``preference`` and ``preference_runs``
("Preferences and rewards": DPO's and GRPO's losses, equal to TRL's, and their runs), ``viz``
(figures), ``utils``, ``chapters`` (the chapters' names, in the book's order), ``exercises`` (the
chapters' exercise checks), and, not imported here, ``cli`` (the command line) and ``student`` (the
student edition and nbgrader course of the notebooks).

The flat namespace holds every name in the ``__all__`` of the modules listed in ``_MODULES``, so
``tl.name`` works for each of them and a new public name is one edit, in its own module's
``__all__``. ``exercises`` and ``viz`` are reached as ``tl.exercises.<chapter>``
(``tl.exercises.masking``) and ``tl.viz``.
Mask convention everywhere: boolean, ``True`` means "may attend".
"""

import sys as _sys
import warnings as _warnings
from importlib import import_module as _import_module

if _sys.argv[:1] == ["-m"]:  # being imported by `python -m transformer_lib.<module>`, which is not yet found
    # `python -m transformer_lib.train` runs the training command (the end of train.py); this
    # package, imported first, already holds the module, and runpy's warning about that says
    # nothing a user can act on. The filter is added only then (the test of quiet imports checks
    # it) and matches runpy's message alone.
    _warnings.filterwarnings(
        "ignore", r"'transformer_lib\.train' found in sys\.modules", RuntimeWarning, module="runpy"
    )

# The library's layout, which tests/test_layout.py checks. Concept modules, in the order a reader
# meets them: each imports only the ones before it, and never a tool. `parts` (what a part's role is)
# imports nothing of the book; `models` assembles the GPT from the parts of chapters "A GPT from scratch" to
# "Fine-tuning" and "Latent, sparse and sink attention", so it comes after them.
_CONCEPTS = (
    "_checks",
    "_specs",
    "parts",
    "attention",
    "masks",
    "kv_cache",
    "multihead",
    "positional",
    "blocks",
    "encoder_decoder",
    "sampling",
    "long_context",
    "inspect_heads",
    "bpe",
    "modern_block",
    "latent_attention",
    "sparse_attention",
    "sinks",
    "linear_attention",
    "delta_net",
    "experts",
    "rope_scaling",
    "recipe",
    "models",
)
# Tools: they may import any concept module and each other (without a cycle).
_TOOLS = (
    "__main__",
    "utils",
    "chapters",
    "cost",
    "data",
    "train_config",
    "train",
    "checkpoint",
    "cli",
    "viz",
    "exercises",
    "student",
    "pretrained",
    "pretrained_llama",
    "pretrained_experts",
    "pretrained_latent",
    "pretrained_gpt_oss",
    "pretrained_qwen3_next",
    "induction",
    "tokens",
    "lora",
    "token_rows",
    "finetune",
    "run",
    "resume",
    "export",
    "evaluate",
    "quantize",
    "quantized_cache",
    "preference",
    "preference_runs",
    "experiments",
)
# Each of these modules' public names joins the flat namespace (the layout test checks that no two
# modules export the same name).
# reached as tl.<module>, or not
_NOT_FLAT = ("_checks", "_specs", "__main__", "cli", "exercises", "student", "experiments", "chapters")
_MODULES = tuple(m for m in (*_CONCEPTS, *_TOOLS) if m not in _NOT_FLAT)

__all__ = []
for _name in _MODULES:
    _module = _import_module(f".{_name}", __name__)
    globals().update({name: getattr(_module, name) for name in _module.__all__})
    __all__ += _module.__all__
del _name, _module

__version__ = "0.1.0"

# last: the exercise checks compare against the names above
from . import data, exercises, viz  # noqa: E402, I001

__all__ += ["data", "exercises", "viz"]

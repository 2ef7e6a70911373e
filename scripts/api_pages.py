"""Write the book's API reference pages (``api/*.md``) from one table: a page per module.

Each page lets Sphinx's autodoc render the module's docstrings, so the reference is always the
library's own text. When a module is added, moved or renamed, edit ``PAGES`` and run

    python scripts/api_pages.py          # rewrite api/*.md and print the toc entries
    python scripts/api_pages.py --check  # exit 1 if a page is missing or out of date

``tests/test_book_apparatus.py`` runs the check and also fails when a public module of
``transformer_lib`` has no page.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
API = ROOT / "api"


def _chapters_module():
    """``transformer_lib/chapters.py`` alone, without importing the library (and PyTorch)."""
    spec = importlib.util.spec_from_file_location("_chapters", ROOT / "transformer_lib" / "chapters.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # a NamedTuple's class looks its module up while it is made
    spec.loader.exec_module(module)
    return module


#: the book's chapters in order (transformer_lib/chapters.py), each a slug with its title
CHAPTERS = _chapters_module().CHAPTERS
TITLES = {c.slug: c.title for c in CHAPTERS}


def chapter_modules(package: str) -> list[str]:
    """The modules of ``transformer_lib.<package>`` named after a chapter (its slug, or its slug and a
    suffix: ``fine_tuning_diagnosis``), in the book's order: each chapter that has one joins the
    page by having it, with no list to edit."""
    names = sorted(p.stem for p in (ROOT / "transformer_lib" / package).glob("*.py"))
    found = []
    for chapter in CHAPTERS:
        found += [n for n in names if n == chapter.slug]
        found += [
            n for n in names if n.startswith(chapter.slug + "_") and n.removeprefix(chapter.slug + "_") not in TITLES
        ]
    return [f"transformer_lib.{package}.{n}" for n in found]


def chapters_text(chapters: str) -> str:
    """The PAGES table's chapters, slugs (``"masking generation"``, or ``"gpt to experts"``), as the
    pages print them: the chapters' titles."""
    words = chapters.split()
    if len(words) == 3 and words[1] == "to":
        return f'"{TITLES[words[0]]}" to "{TITLES[words[2]]}"'
    titles = [f'"{TITLES[w]}"' for w in words]
    return titles[0] if len(titles) == 1 else ", ".join(titles[:-1]) + " and " + titles[-1]


# (page name, modules documented on the page, chapters, one line on what the page holds),
# in chapter order; tools after the concept modules. The chapters are named by their slugs
# (transformer_lib/chapters.py), separated by spaces, or "all", or a phrase that names no chapter.
PAGES: list[tuple[str, list[str], str, str]] = [
    (
        "cost",
        ["transformer_lib.cost"],
        "why_attention multihead gpt generation",
        "Every cost formula: receptive fields, attention's parameters and FLOPs, FLOPs per token, model FLOPs "
        "utilisation, the key-value cache's bytes and peak memory.",
    ),
    (
        "attention",
        ["transformer_lib.attention"],
        "queries_keys_values scaling",
        "Scaled dot-product and additive attention, masked softmax, the softmax's entropy, Jacobian and temperature.",
    ),
    (
        "masks",
        ["transformer_lib.masks"],
        "masking generation",
        "Causal, padding, sequence-to-sequence and sliding-window masks (`True` = may attend).",
    ),
    (
        "multihead",
        ["transformer_lib.multihead"],
        "multihead generation",
        "Multi-head and grouped-query attention and the head reshapes.",
    ),
    (
        "positional",
        ["transformer_lib.positional"],
        "positional_encoding",
        "Sinusoidal, learned and rotary position encodings.",
    ),
    (
        "blocks",
        ["transformer_lib.blocks"],
        "transformer_block generation",
        "Feed-forward network, encoder and decoder layers and stacks.",
    ),
    (
        "encoder_decoder",
        ["transformer_lib.encoder_decoder"],
        "encoder_decoder generation",
        "The encoder-decoder `Transformer`, its configuration and the checks of token ids.",
    ),
    (
        "data",
        [
            "transformer_lib.data",
            "transformer_lib.data.tokenizer",
            "transformer_lib.data.tasks",
            "transformer_lib.data.grammar",
            "transformer_lib.data.corpus",
            "transformer_lib.data.batches",
            "transformer_lib.data.repeats",
            "transformer_lib.data.recall",
            "transformer_lib.data.speeches",
            "transformer_lib.data.instructions",
            "transformer_lib.data.mc_tasks",
            "transformer_lib.data.verifiable",
        ],
        "encoder_decoder gpt what_attention_learns fine_tuning measuring_a_model preferences_and_rewards "
        "attention_as_recurrence",
        'The character tokenizer, the synthetic and dates tasks, the toy grammar of chapter "A GPT from scratch", '
        "the text corpus, batches, the sequences with a repeated segment, the labelled speeches and prompt/response "
        'pairs of chapter "Fine-tuning", the multiple-choice tasks of chapter "Measuring a model" and their lm-eval '
        'files, the verifiable dates of chapter "Preferences and rewards" (rewards, preference pairs, a checkable '
        'scratchpad), and the associative recall of chapter "Attention as a recurrence".',
    ),
    (
        "train_config",
        ["transformer_lib.train_config"],
        "encoder_decoder gpt",
        "The settings of a training run and the presets.",
    ),
    ("train", ["transformer_lib.train"], "encoder_decoder gpt", "The training loop and the exact-match score."),
    ("checkpoint", ["transformer_lib.checkpoint"], "gpt", "Checkpoints written atomically and checked on loading."),
    (
        "run",
        ["transformer_lib.run", "transformer_lib.resume"],
        "gpt fine_tuning",
        "A run's folder, the record of what the run is, the model a command starts from, `load_run`, and "
        "what `--resume` may change.",
    ),
    (
        "sampling",
        ["transformer_lib.sampling"],
        "gpt generation",
        "Temperature, top-k and top-p filtering, and generating text.",
    ),
    ("models", ["transformer_lib.models"], "gpt generation", "The decoder-only `GPT` and its configuration."),
    (
        "cli",
        [
            "transformer_lib.cli",
            "transformer_lib.cli.train",
            "transformer_lib.cli.sample",
            "transformer_lib.cli.finetune",
            "transformer_lib.cli.export",
            "transformer_lib.cli.evaluate",
            "transformer_lib.cli.tune",
            "transformer_lib.cli.settings",
        ],
        "gpt fine_tuning measuring_a_model preferences_and_rewards",
        "The command line, `python -m transformer_lib train`, `sample`, `finetune`, `export`, `evaluate`, `dpo` "
        "and `grpo`: one module per command (`dpo` and `grpo` share one), and the flags and settings they share.",
    ),
    (
        "kv_cache",
        ["transformer_lib.kv_cache"],
        "generation",
        "The key-value cache of one attention layer and of a decoder stack.",
    ),
    ("long_context", ["transformer_lib.long_context"], "generation", "The online softmax and tiled attention."),
    (
        "pretrained",
        ["transformer_lib.pretrained"],
        "generation",
        "GPT-2 and nanoGPT weights loaded into the book's GPT.",
    ),
    (
        "pretrained_llama",
        ["transformer_lib.pretrained_llama"],
        "todays_block",
        "Llama's weights (`transformers`' `LlamaForCausalLM`) in the book's GPT and back: the rotary convention, "
        "grouped-query attention, the settings refused by name.",
    ),
    (
        "export",
        ["transformer_lib.export"],
        "generation todays_block fine_tuning",
        "A run in Hugging Face's format: the GPT as `GPT2LMHeadModel` or `LlamaForCausalLM`, its tokenizer for "
        "`AutoTokenizer`, and LoRA adapters to and from `peft`.",
    ),
    (
        "inspect_heads",
        ["transformer_lib.inspect_heads"],
        "what_attention_learns",
        "Capturing every head's attention weights, interventions on heads (zero, mean, patch) and the "
        "previous-token, induction and copying scores.",
    ),
    (
        "induction",
        ["transformer_lib.induction"],
        "what_attention_learns",
        "The attention-only transformer, its heads' OV circuits, the training run on repeated sequences and its "
        'phase change, the loss at each position, and chapter "A GPT from scratch"\'s agreement sentences.',
    ),
    (
        "bpe",
        ["transformer_lib.bpe"],
        "tokens",
        "Byte-level BPE: the pre-split patterns, training with incremental pair counts, encoding by merge rank, "
        "decoding, special tokens; tokenizer files are in `transformer_lib.data`.",
    ),
    (
        "modern_block",
        ["transformer_lib.modern_block"],
        "todays_block",
        "Today's block: RMSNorm, the gated SwiGLU network and the 2/3 rule, rotary positions and query-key "
        "normalisation applied to the heads' queries and keys.",
    ),
    (
        "latent_attention",
        ["transformer_lib.latent_attention"],
        "latent_sparse_sink",
        "Multi-head latent attention: one cached latent per token and a shared rotary key, the folded decoding "
        "path, and the converter from DeepSeek-V3's attention.",
    ),
    (
        "sparse_attention",
        ["transformer_lib.sparse_attention"],
        "latent_sparse_sink",
        "Sparse attention by selection: the indexer that scores every key, the top-k each query reads, the "
        "indexer's training by imitation, and its cache.",
    ),
    (
        "sinks",
        ["transformer_lib.sinks"],
        "latent_sparse_sink",
        "Attention sinks: the softmax with a sink logit per head, attention that keeps the first tokens beside a "
        "sliding window, and the weight trained heads put on the first token.",
    ),
    (
        "linear_attention",
        ["transformer_lib.linear_attention"],
        "attention_as_recurrence",
        "Attention as a recurrence: linear attention and the (gated) delta rule in their parallel, recurrent and "
        "chunked forms, and the attention matrices they equal.",
    ),
    (
        "delta_net",
        ["transformer_lib.delta_net"],
        "attention_as_recurrence",
        "Gated DeltaNet, Qwen3-Next's recurrent layer: a short convolution, normalised queries and keys, decay "
        "and write gates, a gated output norm, its fixed-size state as its cache, and the converter.",
    ),
    (
        "experts",
        ["transformer_lib.experts"],
        "experts",
        "A mixture of experts: the spec of its choices, the router (softmax or sigmoid, top k within groups, a "
        "bias that moves the choice only), the experts combined plainly, by expert and grouped with a capacity, "
        "the balancing loss in its conventions, the router z-loss, and the bias update.",
    ),
    (
        "pretrained_experts",
        ["transformer_lib.pretrained_experts"],
        "experts",
        "The experts of transformers' Qwen3-MoE, Mixtral and DeepSeek-V3 blocks as the book's layer, their "
        "routing in its spec.",
    ),
    (
        "pretrained_latent",
        ["transformer_lib.pretrained_latent"],
        "latent_sparse_sink",
        "A GPT with latent attention written as a dense DeepSeek-V3 model (`transformers`' "
        "`DeepseekV3ForCausalLM`), every setting it cannot hold refused by name.",
    ),
    (
        "pretrained_gpt_oss",
        ["transformer_lib.pretrained_gpt_oss"],
        "latent_sparse_sink",
        "A GPT with learned sinks (or a window) written as gpt-oss (`transformers`' `GptOssForCausalLM`), its "
        "SwiGLU as one expert, every setting it cannot hold refused by name.",
    ),
    (
        "pretrained_qwen3_next",
        ["transformer_lib.pretrained_qwen3_next"],
        "attention_as_recurrence",
        "The gated-DeltaNet hybrid written as Qwen3-Next (`transformers`' `Qwen3NextForCausalLM`), every layer's "
        "MLP dense, every setting it cannot hold refused by name.",
    ),
    (
        "rope_scaling",
        ["transformer_lib.rope_scaling"],
        "longer_than_trained",
        "Rotary frequencies rescaled past the trained length: position interpolation, NTK-aware and dynamic NTK "
        "scaling, YaRN's ramp and attention factor, Llama 3's bands; the spec a recipe holds.",
    ),
    (
        "quantized_cache",
        ["transformer_lib.quantized_cache"],
        "longer_than_trained",
        "A key-value cache in 8 or 4 bits: keys per channel, values per token, the newest tokens in full "
        "precision, its bytes as a formula.",
    ),
    (
        "recipe",
        ["transformer_lib.recipe"],
        "todays_block",
        "A block's recipe: every choice of GPT-2's or Llama's block in one frozen object, the parts it makes, "
        "and the named recipes.",
    ),
    (
        "parts",
        ["transformer_lib.parts"],
        "fine_tuning",
        "A model's parts by role (attention, feed-forward, norm, embedding, head): what LoRA, the inspection "
        "tools and the converters ask for instead of attribute paths.",
    ),
    (
        "tokens",
        ["transformer_lib.tokens"],
        "tokens",
        "Bits per byte, the loss that compares models across vocabularies, and the training run that compares a "
        "character model with a BPE model.",
    ),
    (
        "lora",
        ["transformer_lib.lora"],
        "fine_tuning",
        "Low-rank adapters on any weight matrix, by name: the update (alpha / r) B A, merging and unmerging, "
        "and adapter files that refuse a model of another shape.",
    ),
    (
        "token_rows",
        ["transformer_lib.token_rows"],
        "fine_tuning",
        "Trainable token rows beside LoRA's adapters: the rows of tokens pretraining never used, "
        "re-initialised and trained while every other row stays frozen; tied heads stay tied.",
    ),
    (
        "finetune",
        ["transformer_lib.finetune"],
        "fine_tuning",
        "A classifier on a pretrained GPT, what to train (head, LoRA, everything), a labelled task's batches, "
        "accuracy with its Wilson interval, and greedy answers up to the end token.",
    ),
    (
        "evaluate",
        ["transformer_lib.evaluate"],
        "measuring_a_model",
        "The report card: one loss in three units, multiple choice scored by log-likelihood as lm-eval scores "
        "it, pass@k's unbiased estimator, intervals over items and windows, paired differences and the items "
        "they need, a judge's position bias.",
    ),
    (
        "quantize",
        ["transformer_lib.quantize"],
        "measuring_a_model",
        "Weights in int8 per output channel (equal to PyTorch's quantisation) and in NF4 (equal to "
        "bitsandbytes'), a model's quantised copy and the bytes it takes.",
    ),
    (
        "preference",
        ["transformer_lib.preference", "transformer_lib.preference_runs"],
        "preferences_and_rewards",
        "Preferences and rewards: an answer's log-probability after its prompt, DPO's loss (equal to TRL's "
        "DPOTrainer), the reference with LoRA's adapters off, GRPO's group advantages, KL estimate and clipped loss "
        "(equal to TRL's GRPOTrainer), and the batches that train them with the book's loop.",
    ),
    (
        "experiments",
        ["transformer_lib.experiments", "transformer_lib.experiments.recorder"] + chapter_modules("experiments"),
        "encoder_decoder to longer_than_trained",
        "The chapters' recorded experiments over seeds, one module per chapter, their recorder (parts, seeds, "
        "merging by key, atomic writes, smoke runs that write nothing) and `recorded`, which the chapters read.",
    ),
    (
        "viz",
        [
            "transformer_lib.viz",
            "transformer_lib.viz.diagrams",
            "transformer_lib.viz.head_tables",
            "transformer_lib.viz.tokens",
        ],
        "all",
        "Attention heatmaps, interactive figures that work without a kernel, diagrams of heads and whole models, "
        "and tables of per-head statistics against uniform attention.",
    ),
    ("utils", ["transformer_lib.utils"], "all", "Seeding, device and dtype choice, atomic writes."),
    (
        "chapters",
        ["transformer_lib.chapters"],
        "all",
        "The book's chapters in order, each by its slug and title, never its number; the old names by number.",
    ),
    (
        "exercises",
        ["transformer_lib.exercises"] + chapter_modules("exercises"),
        "all",
        "The checks the exercises call, one module per chapter.",
    ),
    (
        "student",
        [
            "transformer_lib.student",
            "transformer_lib.student.edition",
            "transformer_lib.student.notebooks",
            "transformer_lib.student.nbgrader",
            "transformer_lib.student.cli",
        ],
        "the instructor's guide",
        "The student edition of the notebooks and the nbgrader course.",
    ),
]


#: the chapters column's values that name no chapter by its slug
SPECIAL = ("all", "the instructor's guide")


def page_text(name: str, modules: list[str], chapters: str, summary: str) -> str:
    head = modules[0]
    lines = [
        "<!-- Written by scripts/api_pages.py from its PAGES table; edit the table, not this page. -->",
        f"# `{head}`",
        "",
        f"Used in {chapters}. {summary}" if chapters in SPECIAL else f"Chapters {chapters_text(chapters)}. {summary}",
        "",
    ]
    for i, module in enumerate(modules):
        if i:
            lines += [f"## `{module}`", ""]
        lines += [
            "```{eval-rst}",
            f".. automodule:: {module}",
            "   :members:",
            "   :member-order: bysource",
            "```",
            "",
        ]
    return "\n".join(lines)


def index_text() -> str:
    lines = [
        "<!-- Written by scripts/api_pages.py from its PAGES table; edit the table, not this page. -->",
        "# Library reference",
        "",
        "The reference of `transformer_lib`, the library the chapters build, generated from its",
        "docstrings: one page per module, in the order of the chapters that introduce them. Every",
        "public name is also in the package's flat namespace (`import transformer_lib as tl`, then",
        "`tl.name`); the pages list each name under the module that defines it.",
        "",
        "| module | chapters | what it holds |",
        "| --- | --- | --- |",
    ]
    for name, modules, chapters, summary in PAGES:
        shown = chapters if chapters in SPECIAL else chapters_text(chapters)
        lines.append(f"| {{doc}}`{modules[0]} <{name}>` | {shown} | {summary} |")
    return "\n".join(lines) + "\n"


def expected() -> dict[Path, str]:
    out = {API / "index.md": index_text()}
    for name, modules, chapters, summary in PAGES:
        out[API / f"{name}.md"] = page_text(name, modules, chapters, summary)
    return out


def documented_modules() -> set[str]:
    return {m for _, modules, _, _ in PAGES for m in modules}


def main(argv: list[str]) -> int:
    pages = expected()
    if "--check" in argv:
        stale = [
            str(p.relative_to(ROOT))
            for p, text in pages.items()
            if not p.is_file() or p.read_text(encoding="utf-8") != text
        ]
        extra = sorted(str(p.relative_to(ROOT)) for p in API.glob("*.md") if p not in pages)
        for p in stale:
            print(f"error: {p} is missing or out of date; run python scripts/api_pages.py", file=sys.stderr)
        for p in extra:
            print(f"error: {p} is not in scripts/api_pages.py's PAGES table", file=sys.stderr)
        return 1 if stale or extra else 0
    API.mkdir(exist_ok=True)
    for path, text in pages.items():
        path.write_text(text, encoding="utf-8")
    print("      - file: api/index\n        sections:")
    for name, *_ in PAGES:
        print(f"          - file: api/{name}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""A model the book trained, in Hugging Face's format (chapters "Generation", "Today's block" and "Fine-tuning").

:func:`export_hf` writes a run's model and tokenizer into a folder that ``transformers`` loads
offline (``transformers``, ``tokenizers`` and ``safetensors`` are imported only when called)::

    tl.export_hf("out/bpe", "hf/bpe")
    model = AutoModelForCausalLM.from_pretrained("hf/bpe")  # the GPT's logits
    tokenizer = AutoTokenizer.from_pretrained("hf/bpe")  # the run's ids

- **The model.** A GPT-2-style GPT (LayerNorm, GELU MLP, learned positions) becomes a
  ``GPT2LMHeadModel`` (:func:`gpt2_from_gpt`, the reverse of chapter "Generation"'s
  :func:`~transformer_lib.pretrained.gpt_from_hf`); a Llama-style one (RMSNorm, SwiGLU, rotary
  positions, no biases) a ``LlamaForCausalLM`` (chapter "Today's block"'s
  :func:`~transformer_lib.pretrained_llama.llama_from_gpt`); one with experts routed as Mixtral
  routes a ``MixtralForCausalLM`` (:func:`~transformer_lib.pretrained_experts.mixtral_from_gpt`,
  chapter "Experts"); one with latent attention (and ``norm_eps=1e-6``) a dense
  ``DeepseekV3ForCausalLM`` (:func:`~transformer_lib.pretrained_latent.deepseek_v3_from_gpt`,
  chapter "Latent, sparse and sink attention"); one with learned sinks, or a window, a
  ``GptOssForCausalLM`` (:func:`~transformer_lib.pretrained_gpt_oss.gpt_oss_from_gpt`, the same
  chapter); a hybrid of gated DeltaNet and multi-head layers with query-key norms a
  ``Qwen3NextForCausalLM`` (:func:`~transformer_lib.pretrained_qwen3_next.qwen3_next_from_gpt`,
  chapter "Attention as a recurrence"). Each format names every setting of the GPT
  (``pretrained_llama.check_settings``); any other block is refused by the setting that has no
  counterpart, never written as a model that computes something else.
- **The tokenizer** (:func:`hf_tokenizer`). The byte-level BPE (chapter "Tokens") becomes a
  ``tokenizers`` BPE over GPT-2's byte alphabet, split by the same pattern, with
  ``<|endoftext|>`` as its end token; the character tokenizer becomes a BPE with no merges over
  its characters (one token per character). Both load as a ``PreTrainedTokenizerFast``.
- **The end token.** The model's ``eos_token_id`` is the tokenizer's end token (``<|endoftext|>``
  of a BPE run), or None for a character tokenizer that has none; never a number by default.
- **LoRA** (chapter "Fine-tuning"). A LoRA run is written with its adapters merged into the weights
  (``merge_adapter``), or as its base model plus the adapters in ``peft``'s format
  (``peft_adapter``, :func:`save_peft_adapter`); :func:`load_peft_adapter` reads such an
  adapter back into the book's GPT. The book keeps Q, K and V fused in one matrix with one LoRA:
  ``B A`` with ``A (r, d_model)`` shared. Written out it is three LoRAs of rank ``r`` on
  ``q_proj``, ``k_proj`` and ``v_proj`` that share ``A`` (exact); read back, peft's three
  LoRAs with their own ``A`` are one LoRA of rank ``3 r`` on the fused matrix (``A`` stacked,
  ``B`` block-diagonal: exact too, with ``alpha`` tripled so the scale ``alpha / r`` is kept).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
from torch import Tensor, nn

from .data.instructions import PROMPT_END
from .lora import add_lora, lora_weights, remove_lora
from .models import GPT
from .positional import half_split_rows
from .pretrained_experts import mixtral_from_gpt
from .pretrained_gpt_oss import gpt_oss_from_gpt
from .pretrained_latent import deepseek_v3_from_gpt
from .pretrained_llama import ANY, check_settings, llama_from_gpt
from .pretrained_qwen3_next import qwen3_next_from_gpt
from .run import load_run, read_record
from .token_rows import remove_token_rows, token_rows

__all__ = [
    "export_hf",
    "gpt2_from_gpt",
    "hf_model",
    "hf_tokenizer",
    "instruction_chat_template",
    "load_peft_adapter",
    "save_peft_adapter",
]

# The book's activation -> GPT-2's name for it (the reverse of pretrained.py's table)
_GPT2_ACTIVATIONS = {"gelu": "gelu", "gelu_tanh": "gelu_new"}
# Within block i: the book's parameter -> GPT-2's (after "transformer.h.i."); True: a Conv1D weight (in, out)
_GPT2_BLOCK = {
    "res_self.norm.weight": ("ln_1.weight", False),
    "res_self.norm.bias": ("ln_1.bias", False),
    "self_attn.in_proj_weight": ("attn.c_attn.weight", True),
    "self_attn.in_proj_bias": ("attn.c_attn.bias", False),
    "self_attn.out_proj.weight": ("attn.c_proj.weight", True),
    "self_attn.out_proj.bias": ("attn.c_proj.bias", False),
    "res_ff.norm.weight": ("ln_2.weight", False),
    "res_ff.norm.bias": ("ln_2.bias", False),
    "ff.net.0.weight": ("mlp.c_fc.weight", True),
    "ff.net.0.bias": ("mlp.c_fc.bias", False),
    "ff.net.2.weight": ("mlp.c_proj.weight", True),
    "ff.net.2.bias": ("mlp.c_proj.bias", False),
}
# The book's adapted matrix (after "decoder.layers.i.") -> the Hugging Face module that peft adapts
_PEFT_GPT2 = {
    "self_attn.in_proj_weight": "attn.c_attn",
    "self_attn.out_proj.weight": "attn.c_proj",
    "ff.net.0.weight": "mlp.c_fc",
    "ff.net.2.weight": "mlp.c_proj",
}
_PEFT_LLAMA = {
    "self_attn.out_proj.weight": "self_attn.o_proj",
    "ff.gate_proj.weight": "mlp.gate_proj",
    "ff.up_proj.weight": "mlp.up_proj",
    "ff.down_proj.weight": "mlp.down_proj",
}
_QKV = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")  # Llama's three, fused in the book's in_proj
# The models whose modules _PEFT_GPT2 and _PEFT_LLAMA name: a run written as another is merged, not adapted
_PEFT_CLASSES = ("GPT2LMHeadModel", "LlamaForCausalLM")


# What GPT-2's format writes of each setting (check_settings): ANY, or the one value it computes. Without
# biases it writes zero ones; the rotary base is not read with learned positions.
GPT2_SETTINGS = {
    "n_kv_heads": None,
    "window": None,
    "norm": "layernorm",
    "norm_eps": ANY,
    "ffn": "mlp",
    "activation": ANY,
    "d_ff": ANY,
    "positions": "learned",
    "rotary_base": ANY,
    "attention": "multi_head",
    "qk_norm": False,
    "bias": ANY,
    "tie_embeddings": ANY,
    "kv_latent": None,
    "q_latent": None,
    "rope_dim": None,
    "sparse_k": None,
    "sinks": False,
    "keep_first": 0,
    "full_every": 0,
    "experts": None,
    "rope_scaling": None,
}


def _is_llama(gpt: GPT) -> bool:
    return gpt.config.positions == "rotary"


def gpt2_from_gpt(gpt: GPT) -> nn.Module:
    """A ``transformers`` ``GPT2LMHeadModel`` with the weights of a GPT-2-style :class:`GPT` (chapter "Generation").

    The reverse of :func:`~transformer_lib.pretrained.gpt_from_hf`: ``nn.Linear`` weights
    ``(out, in)`` become ``Conv1D`` weights ``(in, out)`` and the rows ``W_q, W_k, W_v`` of
    ``in_proj_weight`` the columns ``q | k | v`` of ``c_attn``. A GPT without biases gets zero
    biases (the same function). The GPT needs LayerNorm, the GELU MLP, learned positions, one
    key/value head per query head, multi-head attention without sinks, no ``qk_norm`` and no
    ``window``; anything else (a sparse, latent or recurrent attention included) raises a
    ``ValueError`` naming the setting. The model is in the GPT's dtype, in eval mode, and maps
    ``input_ids (B, T)`` to the GPT's logits ``(B, T, vocab_size)``.
    """
    from transformers import GPT2Config, GPT2LMHeadModel

    if not isinstance(gpt, GPT):
        inner = " (convert its .gpt: a classifier's head has no GPT-2 counterpart)" if hasattr(gpt, "gpt") else ""
        raise TypeError(f"gpt2_from_gpt takes a GPT, got a {type(gpt).__name__}{inner}")
    c = gpt.config
    check_settings(c, GPT2_SETTINGS, "GPT-2's format")
    if c.activation not in _GPT2_ACTIVATIONS:
        raise ValueError(f"GPT-2's format has no activation {c.activation!r} (it has {sorted(_GPT2_ACTIVATIONS)})")
    book = gpt.state_dict()
    d_ff = book["decoder.layers.0.ff.net.0.weight"].shape[0] if c.n_layers else 4 * c.d_model
    cfg = GPT2Config(
        vocab_size=c.vocab_size,
        n_positions=c.context_len,
        n_embd=c.d_model,
        n_layer=c.n_layers,
        n_head=c.n_heads,
        n_inner=d_ff,
        activation_function=_GPT2_ACTIVATIONS[c.activation],
        layer_norm_epsilon=c.norm_eps,
        resid_pdrop=c.dropout,
        embd_pdrop=c.dropout,
        attn_pdrop=c.dropout,
        tie_word_embeddings=c.tie_embeddings,
        bos_token_id=None,
        eos_token_id=None,
        attn_implementation="sdpa",
    )
    hf = GPT2LMHeadModel(cfg).to(book["tok_embed.weight"].dtype)
    state = {
        "transformer.wte.weight": book["tok_embed.weight"],
        "transformer.wpe.weight": book["pos_embed.embedding.weight"],
        "transformer.ln_f.weight": book["decoder.norm.weight"],
        "lm_head.weight": book["lm_head.weight"],
    }
    state["transformer.ln_f.bias"] = book.get("decoder.norm.bias", torch.zeros_like(book["decoder.norm.weight"]))
    expected = hf.state_dict()
    for i in range(c.n_layers):
        for ours, (theirs, conv) in _GPT2_BLOCK.items():
            name, key = f"decoder.layers.{i}.{ours}", f"transformer.h.{i}.{theirs}"
            value = book.get(name, torch.zeros_like(expected[key]))  # no biases: zero ones, the same function
            state[key] = value.t() if conv else value
    missing, unexpected = hf.load_state_dict({k: v.contiguous() for k, v in state.items()}, strict=False)
    missing = [k for k in missing if not k.endswith((".attn.bias", ".attn.masked_bias"))]
    if unexpected or missing:
        raise ValueError(f"GPT-2's format: tensors left over {unexpected} or missing {missing}")
    return hf.eval()


def hf_model(gpt: GPT) -> nn.Module:
    """The ``transformers`` model that computes what ``gpt`` computes (chapters "Generation", "Today's block" and
    "Experts"): a ``GPT2LMHeadModel`` for GPT-2's block (:func:`gpt2_from_gpt`), a ``LlamaForCausalLM`` for
    Llama's (:func:`~transformer_lib.pretrained_llama.llama_from_gpt`), a ``MixtralForCausalLM`` for
    Llama's with experts routed as Mixtral's (:func:`~transformer_lib.pretrained_experts.mixtral_from_gpt`),
    a dense ``DeepseekV3ForCausalLM`` for Llama's with latent attention (chapter "Latent, sparse and sink attention",
    :func:`~transformer_lib.pretrained_latent.deepseek_v3_from_gpt`), a ``GptOssForCausalLM`` for Llama's
    with learned sinks or a window (chapter "Latent, sparse and sink attention",
    :func:`~transformer_lib.pretrained_gpt_oss.gpt_oss_from_gpt`), a ``Qwen3NextForCausalLM`` for the gated-DeltaNet
    hybrid with query-key norms (chapter "Attention as a recurrence",
    :func:`~transformer_lib.pretrained_qwen3_next.qwen3_next_from_gpt`).
    Each format checks every setting of the GPT (``pretrained_llama.check_settings``); a GPT that no
    format computes is refused with a ``ValueError`` that gives each format's first refusal, by name."""
    if not isinstance(gpt, GPT):
        inner = (
            " (convert its .gpt: a classifier's head has no Hugging Face counterpart)" if hasattr(gpt, "gpt") else ""
        )
        raise TypeError(f"hf_model takes a GPT, got a {type(gpt).__name__}{inner}")
    if lora_weights(gpt):
        raise ValueError(
            "the GPT has LoRA adapters: merge them (remove_lora(model)) or save them with save_peft_adapter"
        )
    refusals = []
    for convert in _FORMATS:
        try:
            return convert(gpt)
        except ValueError as refusal:
            refusals.append(str(refusal))
    raise ValueError("no Hugging Face format computes this GPT: " + "; ".join(refusals))


# The formats hf_model tries, in order; each refuses, by name, a GPT it cannot compute.
_FORMATS = (
    gpt2_from_gpt,
    llama_from_gpt,
    mixtral_from_gpt,
    deepseek_v3_from_gpt,
    gpt_oss_from_gpt,
    qwen3_next_from_gpt,
)


def _byte_names() -> list[str]:
    """GPT-2's printable character for each byte 0..255, as byte-level ``tokenizers`` spells bytes."""
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    names, extra = {}, 0
    for b in range(256):
        if b in kept:
            names[b] = chr(b)
        else:
            names[b], extra = chr(256 + extra), extra + 1
    return [names[b] for b in range(256)]


def instruction_chat_template() -> str:
    """The Jinja chat template of a run fine-tuned on instructions (chapter "Fine-tuning"), for ``transformers``'
    ``apply_chat_template``: a user's message is written as the book writes a prompt, followed by
    :data:`~transformer_lib.data.instructions.PROMPT_END`, and an assistant's as a response,
    followed by the end token, so ``[{"role": "user", "content": q}]`` gives ``q + PROMPT_END``
    (with or without ``add_generation_prompt``: the cue always ends a prompt) and a conversation the
    book's ``prompt, PROMPT_END, response, <|endoftext|>`` rows. Another role (``system``) is refused:
    the book's instructions have none."""
    cue = json.dumps(PROMPT_END)  # a Jinja string literal: the same escapes as JSON's
    return (
        "{%- for message in messages -%}"
        "{%- if message['role'] == 'user' -%}{{ message['content'] }}{{ " + cue + " }}"
        "{%- elif message['role'] == 'assistant' -%}{{ message['content'] }}{{ eos_token }}"
        "{%- else -%}{{ raise_exception('an instruction run knows the roles user and assistant, not ' "
        "~ message['role']) }}"
        "{%- endif -%}"
        "{%- endfor -%}"
    )


def hf_tokenizer(tokenizer, context_len: int | None = None, chat_template: str | None = None):
    """The book's tokenizer (chapter "Encoder-decoder and cross-attention"'s characters or chapter "Tokens"'s byte-level
    BPE) as a ``transformers`` ``PreTrainedTokenizerFast`` that gives the same ids for the same text and the
    same text back; its ``eos_token`` is the tokenizer's end token (None if it has none), its
    ``chat_template`` the one given (an instruction run's: :func:`instruction_chat_template`).

    A BPE whose two merges make the same bytes (two ids, one string) cannot be written in the
    ``tokenizers`` format and is refused. The book refuses text that spells a special token; the
    exported tokenizer, as every ``transformers`` tokenizer, reads it as that token.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    if tokenizer.kind == "bpe":
        names = _byte_names()
        strings = ["".join(names[b] for b in token) for token in tokenizer.token_bytes]
        if len(set(strings)) < len(strings):
            raise ValueError("the BPE makes the same bytes twice (two merges, one token): tokenizers cannot hold it")
        vocab = {s: i for i, s in enumerate(strings)} | tokenizer.special_ids
        merges = [(strings[a], strings[b]) for a, b in tokenizer.merges]
        tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(tokenizer.pattern), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
        tok.decoder = decoders.ByteLevel()
    elif tokenizer.kind == "char":
        vocab = {s: i for i, s in enumerate(tokenizer.itos)}
        tok = Tokenizer(models.BPE(vocab=vocab, merges=[], fuse_unk=False))  # no merges: one token per character
        tok.decoder = decoders.Fuse()
    else:
        raise ValueError(f"no Hugging Face form for a tokenizer of kind {tokenizer.kind!r}")
    specials = tuple(tokenizer.specials)
    tok.add_special_tokens(list(specials))
    named = {"eos_token": tokenizer.eos_id, "bos_token": tokenizer.bos_id, "pad_token": tokenizer.pad_id}
    tokens = {k: tok.id_to_token(i) for k, i in named.items() if i is not None}
    if chat_template is not None:
        tokens["chat_template"] = chat_template
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, clean_up_tokenization_spaces=False, model_max_length=context_len or int(1e30), **tokens
    )


def _set_special_ids(hf: nn.Module, tokenizer) -> None:
    """The model's and its generation settings' bos/eos/pad ids: the tokenizer's, or None."""
    ids = {"bos_token_id": tokenizer.bos_id, "eos_token_id": tokenizer.eos_id, "pad_token_id": tokenizer.pad_id}
    for settings in (hf.config, getattr(hf, "generation_config", None)):
        for key, value in ids.items():
            if settings is not None:
                setattr(settings, key, value)


def _free_folder(folder: Path, force: bool) -> None:
    if folder.exists() and not folder.is_dir():
        raise FileExistsError(f"{folder} is a file, not a folder: choose a folder for the exported model")
    if folder.is_dir() and any(folder.iterdir()) and not force:
        names = sorted(p.name for p in folder.iterdir())
        raise FileExistsError(
            f"{folder} is not empty ({', '.join(names[:4])}{', ...' if len(names) > 4 else ''}): "
            f"choose a new folder, or --force to replace the exported files there "
            f"(its other files are kept)"
        )


def _move_into(written: Path, folder: Path) -> list[Path]:
    """Every file under ``written`` moved to the same place under ``folder`` (replacing a file of
    that name, nothing else); returns the files."""
    moved = []
    for source in sorted(p for p in written.rglob("*") if p.is_file()):
        target = folder / source.relative_to(written)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(source, target)
        moved.append(target)
    return moved


def export_hf(
    run: str | os.PathLike,
    folder: str | os.PathLike,
    *,
    merge_adapter: bool = False,
    peft_adapter: bool = False,
    force: bool = False,
) -> list[Path]:
    """Write the run in ``run`` (a run folder or checkpoint file) to ``folder`` in Hugging Face's
    format (chapters "Generation", "Today's block" and "Fine-tuning"): ``config.json``, ``generation_config.json``,
    ``model.safetensors`` and the tokenizer's files, which ``AutoModelForCausalLM`` and
    ``AutoTokenizer`` load offline. Returns the files written.

    A LoRA run needs ``merge_adapter`` (one model, the adapters merged into its weights) or
    ``peft_adapter`` (its base model, and the adapters in ``folder/adapter`` in peft's format; a
    GPT-2 or Llama model only: another format's modules are not the ones the adapter names).
    Everything is written to a temporary folder beside ``folder`` first, so a failure leaves
    ``folder`` as it was; a folder that holds files is refused unless ``force``, which replaces
    the files of those names only.
    """
    if merge_adapter and peft_adapter:
        raise ValueError("give merge_adapter or peft_adapter, not both: one model merged, or a base and its adapter")
    folder = Path(folder)
    _free_folder(folder, force)
    model, tokenizer, adapters = load_run(run)
    if tokenizer is None:
        raise ValueError(f"{run} holds no tokenizer: a model without one cannot be used by transformers")
    if adapters and not (merge_adapter or peft_adapter):
        raise ValueError(
            f"{run} is a LoRA run: export it with --merge-adapter (one model with the adapters "
            f"merged into its weights) or --peft-adapter (its base, and the adapters in peft's "
            f"format)"
        )
    if not adapters and (merge_adapter or peft_adapter):
        raise ValueError(f"{run} has no LoRA adapters to merge or save: leave out --merge-adapter/--peft-adapter")
    base = model
    if adapters and peft_adapter:
        if token_rows(model) is not None:
            raise ValueError(
                f"{run} trained token rows beside its adapters, which peft's LoRA files do not hold: "
                f"export it with --merge-adapter"
            )
        base = GPT(model.config).to(next(model.parameters()).dtype)
        base.load_state_dict(_base_state(model))
    elif adapters:
        remove_lora(model, merge=True)
        if token_rows(model) is not None:  # the token rows trained beside the adapters, into the embedding
            remove_token_rows(model, merge=True)
    hf = hf_model(base.eval())
    if adapters and peft_adapter and type(hf).__name__ not in _PEFT_CLASSES:
        raise ValueError(
            f"{run} is written as a {type(hf).__name__}, whose modules are not the GPT-2 or Llama ones "
            f"peft's adapter files name here (gpt-oss's feed-forward network is an expert, Qwen3-Next's "
            f"query holds its gate): export it with --merge-adapter"
        )
    _set_special_ids(hf, tokenizer)
    folder.parent.mkdir(parents=True, exist_ok=True)
    written = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    try:
        hf.save_pretrained(written)
        chat = instruction_chat_template() if read_record(run).kind != "pretrain" else None  # chapter "Fine-tuning"'s
        # prompts
        hf_tokenizer(tokenizer, model.config.context_len, chat).save_pretrained(written)
        settings = json.loads((written / "tokenizer_config.json").read_text(encoding="utf-8"))
        settings["tokenizer_class"] = "PreTrainedTokenizerFast"  # the name every version of transformers knows
        (written / "tokenizer_config.json").write_text(json.dumps(settings, indent=2) + "\n", encoding="utf-8")
        if adapters and peft_adapter:
            save_peft_adapter(model, written / "adapter")
        folder.mkdir(exist_ok=True)
        return _move_into(written, folder)
    finally:
        shutil.rmtree(written, ignore_errors=True)


def _base_state(model: nn.Module) -> dict[str, Tensor]:
    """The frozen weights of a model with adapters, under the plain names."""
    return {
        k.replace(".parametrizations.", ".").removesuffix(".original"): v
        for k, v in model.state_dict().items()
        if not k.endswith((".0.A", ".0.B"))
    }


def _qkv_rows(gpt: GPT) -> list[tuple[str, slice, Tensor | None]]:
    """Llama's q, k, v projections: their rows of the fused matrix and each one's row order (None: as is)."""
    c = gpt.config
    d_k, n_kv = c.d_model // c.n_heads, c.n_kv_heads or c.n_heads
    sizes = [c.d_model, n_kv * d_k, n_kv * d_k]
    starts = [0, sizes[0], sizes[0] + sizes[1]]
    orders = [half_split_rows(c.n_heads, d_k), half_split_rows(n_kv, d_k), None]
    return [(n, slice(s, s + k), o) for n, s, k, o in zip(_QKV, starts, sizes, orders, strict=True)]


def save_peft_adapter(model: GPT, folder: str | os.PathLike, base_name: str | None = None) -> Path:
    """Write the LoRA adapters of ``model`` (a GPT with adapters, chapter "Fine-tuning") as a ``peft`` adapter
    folder (``adapter_config.json`` and ``adapter_model.safetensors``) for the model that
    :func:`hf_model` makes of its base; ``peft.PeftModel.from_pretrained(that_model, folder)``
    then computes what ``model`` computes. The fused Q/K/V adapter of a Llama-style GPT becomes
    three, on ``q_proj``, ``k_proj`` and ``v_proj``, sharing ``A``. Returns the folder."""
    from safetensors.torch import save_file

    adapters = lora_weights(model)
    if not adapters:
        raise ValueError("the model has no LoRA adapters (add them with add_lora, or load a LoRA run)")
    if token_rows(model) is not None:
        raise ValueError("the model trained token rows beside its adapters: export it merged (--merge-adapter)")
    settings = {(lora.rank, lora.alpha) for lora in adapters.values()}
    if len(settings) != 1:
        raise ValueError(f"the adapters differ in rank or alpha ({sorted(settings)}): peft's config holds one of each")
    ((rank, alpha),) = settings
    llama = _is_llama(model)
    table, top = (_PEFT_LLAMA, "model.layers") if llama else (_PEFT_GPT2, "transformer.h")
    tensors, modules = {}, []
    for name, lora in adapters.items():
        layer, _, leaf = name.removeprefix("decoder.layers.").partition(".")
        A, B = lora.A.detach().cpu(), lora.B.detach().cpu()
        if llama and leaf == "self_attn.in_proj_weight":
            parts = [
                (f"{top}.{layer}.{m}", B[rows] if order is None else B[rows][torch.argsort(order)])
                for m, rows, order in _qkv_rows(model)
            ]
        elif leaf in table:
            parts = [(f"{top}.{layer}.{table[leaf]}", B)]
        else:
            raise ValueError(f"{name} has an adapter that no module of the Hugging Face model matches")
        for module, b in parts:
            tensors[f"base_model.model.{module}.lora_A.weight"] = A.clone()  # its own copy for each module
            tensors[f"base_model.model.{module}.lora_B.weight"] = b.contiguous()
            modules.append(module)
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": rank,
        "lora_alpha": alpha,
        "target_modules": modules,
        "lora_dropout": 0.0,
        "bias": "none",
        "fan_in_fan_out": not llama,
        "use_rslora": False,
        "use_dora": False,
        "init_lora_weights": True,
        "inference_mode": True,
        "modules_to_save": None,
        "base_model_name_or_path": base_name,
    }
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "adapter_config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    return folder


def load_peft_adapter(model: GPT, folder: str | os.PathLike) -> list[str]:
    """Add the LoRA adapters of a ``peft`` adapter folder, written for the model :func:`hf_model`
    makes of ``model``, to the book's ``model`` (chapter "Fine-tuning"); returns the names adapted.

    peft's adapters on Llama's ``q_proj``, ``k_proj`` and ``v_proj`` (any of them) become one
    LoRA on the fused matrix, of rank ``r`` times their number: ``A`` stacked, ``B``
    block-diagonal, ``alpha`` scaled alike, so the sum is exact. A setting the book's LoRA has
    not (rsLoRA, DoRA, per-module ranks, trained biases, saved modules) and an adapter on a module
    the book does not adapt (the embeddings, the head) are refused by name.
    """
    from safetensors.torch import load_file

    folder = Path(folder)
    config = json.loads((folder / "adapter_config.json").read_text(encoding="utf-8"))
    needed = {"peft_type": "LORA", "use_rslora": False, "use_dora": False, "bias": "none"}
    for key, ok in needed.items():
        if config.get(key, ok) != ok:
            raise ValueError(
                f"{folder}: the adapter setting {key}={config[key]!r} has no counterpart in the book's LoRA"
            )
    for key in ("rank_pattern", "alpha_pattern", "modules_to_save", "layers_to_transform"):
        if config.get(key):
            raise ValueError(
                f"{folder}: the adapter setting {key}={config[key]!r} has no counterpart in the book's LoRA"
            )
    rank, alpha = int(config["r"]), float(config["lora_alpha"])
    llama = _is_llama(model)
    table, top = (_PEFT_LLAMA, "model.layers.") if llama else (_PEFT_GPT2, "transformer.h.")
    ours = {theirs: leaf for leaf, theirs in table.items()}
    found: dict[str, dict[str, Tensor]] = {}
    for key, value in load_file(str(folder / "adapter_model.safetensors")).items():
        module, _, kind = key.removeprefix("base_model.model.").rpartition(".lora_")
        if not module:
            raise ValueError(f"{folder}: {key} is a whole weight, not a LoRA matrix: the book loads adapters only")
        found.setdefault(module, {})[kind.removesuffix(".weight")] = value
    weights: dict[str, tuple[Tensor, Tensor, int]] = {}  # book name: A, B, how many rank-r LoRAs are stacked
    qkv: dict[str, dict[str, tuple[Tensor, Tensor]]] = {}
    for module, ab in found.items():
        layer, _, leaf = module.removeprefix(top).partition(".")
        if not module.startswith(top) or (leaf not in ours and not (llama and leaf in _QKV)) or set(ab) != {"A", "B"}:
            raise ValueError(f"{folder}: an adapter on {module}, which the book's GPT does not adapt with LoRA")
        if leaf in ours:
            weights[f"decoder.layers.{layer}.{ours[leaf]}"] = (ab["A"], ab["B"], 1)
        else:
            qkv.setdefault(layer, {})[leaf] = (ab["A"], ab["B"])
    for layer, parts in qkv.items():
        present = [(m, rows, order) for m, rows, order in _qkv_rows(model) if m in parts]
        A = torch.cat([parts[m][0] for m, _, _ in present])  # (n r, d_model)
        B = torch.zeros(_qkv_rows(model)[-1][1].stop, len(present) * rank, dtype=A.dtype)  # (q + k + v rows, n r)
        for j, (m, rows, order) in enumerate(present):
            b = parts[m][1]
            B[rows, j * rank : (j + 1) * rank] = b if order is None else b[order]
        weights[f"decoder.layers.{layer}.self_attn.in_proj_weight"] = (A, B, len(present))
    names = []
    for n in sorted({k for _, _, k in weights.values()}):
        group = [name for name, (_, _, k) in weights.items() if k == n]
        names += add_lora(model, group, rank=n * rank, alpha=n * alpha)
        adapters = lora_weights(model)
        with torch.no_grad():
            for name in group:
                adapters[name].A.copy_(weights[name][0])
                adapters[name].B.copy_(weights[name][1])
    return names

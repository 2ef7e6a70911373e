"""Pretrained weights in the book's GPT (chapter "Generation"): GPT-2 from Hugging Face's layout, and nanoGPT
checkpoints.

The book's :class:`~transformer_lib.models.GPT` *is* GPT-2's architecture: learned positions,
pre-LN blocks, fused Q/K/V projections, a GELU feed-forward four times as wide, a final LayerNorm
and an output head tied to the token embedding. Loading GPT-2 is then only a renaming of tensors,
with two details: Hugging Face stores GPT-2's linear layers as ``Conv1D`` modules whose weights
are ``(in, out)``, the transpose of ``nn.Linear``'s ``(out, in)``, and GPT-2 uses the tanh
approximation of GELU (``activation="gelu_tanh"``). nanoGPT's checkpoints use ``nn.Linear`` and
the exact GELU. Anything else a GPT-2 configuration can ask for and the book's GPT cannot do
(another LayerNorm epsilon, another activation, scores scaled by the layer index, an untied head)
raises an error rather than giving a model that is silently wrong.

This is a tool module; ``transformers`` and ``safetensors`` are imported only when needed. Only
weights and the forward pass are concerned: the returned model computes GPT-2's logits.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import Tensor

from .models import GPT, GPTConfig

__all__ = ["gpt_from_hf", "gpt_from_nanogpt", "load_gpt2"]

# GPT-2's activation names (Hugging Face) -> the book's
_HF_ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu"}

# Within block i: GPT-2's name -> the book's name; True where the GPT-2 tensor is a Conv1D weight
_BLOCK = {
    "ln_1.weight": ("res_self.norm.weight", False),
    "ln_1.bias": ("res_self.norm.bias", False),
    "attn.c_attn.weight": ("self_attn.in_proj_weight", True),  # columns q | k | v -> rows W_q, W_k, W_v
    "attn.c_attn.bias": ("self_attn.in_proj_bias", False),
    "attn.c_proj.weight": ("self_attn.out_proj.weight", True),
    "attn.c_proj.bias": ("self_attn.out_proj.bias", False),
    "ln_2.weight": ("res_ff.norm.weight", False),
    "ln_2.bias": ("res_ff.norm.bias", False),
    "mlp.c_fc.weight": ("ff.net.0.weight", True),
    "mlp.c_fc.bias": ("ff.net.0.bias", False),
    "mlp.c_proj.weight": ("ff.net.2.weight", True),
    "mlp.c_proj.bias": ("ff.net.2.bias", False),
}
_TOP = {
    "wte.weight": "tok_embed.weight",
    "wpe.weight": "pos_embed.embedding.weight",
    "ln_f.weight": "decoder.norm.weight",
    "ln_f.bias": "decoder.norm.bias",
}


def _book_name(key: str) -> tuple[str, bool] | None:
    """The book's parameter name for GPT-2's ``key`` (without ``transformer.``), and whether it is a Conv1D weight."""
    if key in _TOP:
        return _TOP[key], False
    found = re.fullmatch(r"h\.(\d+)\.(.+)", key)
    if found and found[2] in _BLOCK:
        name, conv = _BLOCK[found[2]]
        return f"decoder.layers.{found[1]}.{name}", conv
    return None


def _clean(state: Mapping[str, Tensor], strip: str) -> dict[str, Tensor]:
    """Keys without ``strip`` prefixes and ``transformer.``; causal-mask buffers (``attn.bias``,
    ``attn.masked_bias``) dropped; a tied ``lm_head.weight`` checked and dropped."""
    out: dict[str, Tensor] = {}
    for key, value in state.items():
        if not isinstance(key, str) or not isinstance(value, Tensor):
            raise TypeError(f"a state dict maps names to tensors, got {key!r}: {type(value).__name__}")
        key = key.removeprefix(strip).removeprefix("transformer.")
        if re.fullmatch(r"h\.\d+\.attn\.(bias|masked_bias)", key):
            continue  # the causal mask as a buffer, not a weight
        out[key] = value
    head = out.pop("lm_head.weight", None)
    if head is not None and "wte.weight" in out and not torch.equal(head, out["wte.weight"]):
        raise ValueError(
            "lm_head.weight differs from the token embedding wte.weight: the book's GPT ties its output head "
            "to the embedding and cannot hold an untied head"
        )
    return out


def _layers_in(state: Mapping[str, Tensor]) -> int:
    return 1 + max((int(m[1]) for k in state if (m := re.match(r"h\.(\d+)\.", k))), default=-1)


def _build(config: GPTConfig, state: dict[str, Tensor], transposed: bool, origin: str) -> GPT:
    """A :class:`GPT` of ``config`` holding ``state`` (GPT-2 names, Conv1D weights if ``transposed``)."""
    dtype = state["wte.weight"].dtype if "wte.weight" in state else torch.float32
    if not dtype.is_floating_point:
        raise TypeError(f"{origin}: wte.weight must be floating point, got {dtype}")
    model = GPT(config).to(dtype)
    expected = model.state_dict()
    expected.pop("lm_head.weight")  # tied to tok_embed.weight
    keys = _expected_gpt2_keys(config)
    unknown = sorted(set(state) - set(keys))
    missing = [k for k in keys if k not in state]
    if unknown:
        raise ValueError(f"{origin}: unexpected tensors for a GPT-2 of this shape: {', '.join(unknown[:8])}")
    if missing:
        raise ValueError(f"{origin}: missing tensors: {', '.join(missing[:8])}{' ...' if len(missing) > 8 else ''}")
    mapped = {}
    for key, value in state.items():
        name, conv = _book_name(key)
        value = value.t() if conv and transposed and value.dim() == 2 else value
        if value.shape != expected[name].shape:
            want = tuple(expected[name].shape)
            want = want[::-1] if conv and transposed else want
            raise ValueError(f"{origin}: {key} has shape {tuple(state[key].shape)}, expected {want}")
        if not bool(torch.isfinite(value).all()):  # read once, at load time
            raise ValueError(
                f"{origin}: {key} holds values that are not finite (NaN or inf): a damaged or diverged model"
            )
        mapped[name] = value.to(dtype)
    mapped["lm_head.weight"] = mapped["tok_embed.weight"]
    model.load_state_dict(mapped, strict=True)
    return model.eval()


def _expected_gpt2_keys(config: GPTConfig) -> list[str]:
    keys = ["wte.weight", "wpe.weight", "ln_f.weight"] + (["ln_f.bias"] if config.bias else [])
    for i in range(config.n_layers):
        keys += [f"h.{i}.{k}" for k in _BLOCK if config.bias or not k.endswith(".bias")]
    return keys


def _check_hf_config(cfg: Mapping) -> str:
    """Raise for what the book's GPT cannot express; return its activation name."""
    problems = []
    if cfg.get("model_type", "gpt2") != "gpt2":
        problems.append(f"model_type is {cfg.get('model_type')!r}, not 'gpt2'")
    act = cfg.get("activation_function", "gelu_new")
    if act not in _HF_ACTIVATIONS:
        problems.append(f"activation_function {act!r} is not one of {sorted(_HF_ACTIVATIONS)}")
    if cfg.get("layer_norm_epsilon", 1e-5) != 1e-5:
        problems.append(f"layer_norm_epsilon is {cfg.get('layer_norm_epsilon')!r}, the book's LayerNorm uses 1e-05")
    if cfg.get("scale_attn_by_inverse_layer_idx", False):
        problems.append("scale_attn_by_inverse_layer_idx=True divides scores by the layer index")
    if not cfg.get("scale_attn_weights", True):
        problems.append("scale_attn_weights=False leaves out the 1/sqrt(d_k) scaling")
    n_inner, n_embd = cfg.get("n_inner"), cfg.get("n_embd")
    if n_inner is not None and n_inner != 4 * n_embd:
        problems.append(f"n_inner={n_inner} is not 4 * n_embd={4 * n_embd}")
    if cfg.get("add_cross_attention", False):
        problems.append("add_cross_attention=True adds cross-attention layers")
    if not cfg.get("tie_word_embeddings", True):
        problems.append("tie_word_embeddings=False gives an untied output head")
    if problems:
        raise ValueError("this GPT-2 configuration cannot be expressed by the book's GPT: " + "; ".join(problems))
    return _HF_ACTIVATIONS[act]


def _broken_download(path: Path) -> str | None:
    """What is wrong with a weights file that is no weights file at all, in words, or None."""
    with open(path, "rb") as f:
        head = f.read(64)
    if not head:
        return "it is empty (0 bytes): download it again"
    if head.startswith(b"version https://git-lfs"):
        return "it is a Git LFS pointer, not the weights: fetch them with `git lfs pull` (or download the file itself)"
    return None


def _load_safetensors(path: Path) -> dict[str, Tensor]:
    try:
        from safetensors.torch import load_file
    except ImportError as e:  # pragma: no cover - safetensors comes with transformers
        raise ImportError("reading .safetensors files needs the safetensors package (pip install safetensors)") from e
    problem = _broken_download(path)
    if problem:
        raise ValueError(f"{path} cannot be read: {problem}")
    try:
        return load_file(str(path))
    except Exception as e:  # safetensors' own error classes
        cause = " ".join(str(e).split()) or type(e).__name__
        raise ValueError(f"{path} is not a readable .safetensors file ({cause}): truncated or damaged?") from None


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as e:
        raise ValueError(f"{path} is not UTF-8 text (byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not valid JSON ({e.msg}, line {e.lineno}, column {e.colno})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path} holds a JSON {type(data).__name__}, not an object of settings")
    return data


def _read_hf_path(path: Path) -> tuple[dict | None, dict[str, Tensor]]:
    """``(config dict or None, state dict)`` from a ``save_pretrained`` folder or a ``.safetensors`` file."""
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"{path} has no config.json: is it a folder written by save_pretrained?")
        config = _read_json(path / "config.json")
        index = path / "model.safetensors.index.json"
        if (path / "model.safetensors").is_file():
            return config, _load_safetensors(path / "model.safetensors")
        if index.is_file():  # a checkpoint in shards
            state: dict[str, Tensor] = {}
            weight_map = _read_json(index).get("weight_map")
            if not isinstance(weight_map, dict):
                raise ValueError(f"{index} has no weight_map")
            for shard in sorted(set(weight_map.values())):
                state.update(_load_safetensors(path / shard))
            return config, state
        raise FileNotFoundError(f"{path} has no model.safetensors (nor a sharded model.safetensors.index.json)")
    if path.suffix != ".safetensors":
        raise ValueError(f"expected a .safetensors file or a save_pretrained folder, got {path}")
    if not path.is_file():
        raise FileNotFoundError(f"no such file: {path}")
    beside = path.parent / "config.json"
    return (_read_json(beside) if beside.is_file() else None), _load_safetensors(path)


def gpt_from_hf(source, *, n_heads: int | None = None) -> GPT:
    """The book's :class:`GPT` holding the weights of a Hugging Face GPT-2 (chapter "Generation").

    ``source`` is a ``transformers.GPT2LMHeadModel`` (or ``GPT2Model``), its state dict, a
    ``.safetensors`` file or a folder written by ``save_pretrained``. The result has
    ``GPTConfig(vocab_size, context_len=n_positions, n_layers, n_heads, d_model=n_embd,
    dropout=0.0, bias=True, activation="gelu_tanh")`` (``"gelu"`` for a GPT-2 configured with
    the exact GELU), the dtype of the source's weights, is in eval mode, and maps ``idx (B, T)``
    to the same logits ``(B, T, vocab_size)`` as the source. ``Conv1D`` weights ``(in, out)``
    are transposed into ``nn.Linear``'s ``(out, in)``; ``c_attn``'s columns ``q | k | v`` become
    the rows ``W_q, W_k, W_v`` of ``in_proj_weight``; the head is tied to the embedding.

    A state dict, or a ``.safetensors`` file without a ``config.json`` beside it, does not say
    how many heads the model has: pass ``n_heads`` (the other sizes come from the shapes, and
    GPT-2's defaults are assumed for the rest). A configuration the book's GPT cannot express,
    missing or unexpected tensors and wrong shapes raise ``ValueError`` naming the problem.
    """
    if isinstance(source, torch.nn.Module) and hasattr(getattr(source, "config", None), "model_type"):  # transformers
        if type(source).__name__ not in ("GPT2LMHeadModel", "GPT2Model"):
            raise TypeError(
                f"gpt_from_hf takes a transformers GPT2LMHeadModel or GPT2Model, got {type(source).__name__} "
                f"(model_type {source.config.model_type!r})"
            )
        config, state = source.config.to_dict(), source.state_dict()
        origin = type(source).__name__
    elif isinstance(source, Mapping):
        config, state, origin = None, dict(source), "the state dict"
    elif isinstance(source, (str, Path)):
        config, state = _read_hf_path(Path(source))
        origin = str(source)
    else:
        raise TypeError(
            "source must be a transformers GPT-2 model, its state dict, or a path to a .safetensors file "
            f"or a save_pretrained folder; got {type(source).__name__}"
        )
    state = _clean(state, strip="")
    if "wte.weight" not in state or "wpe.weight" not in state:
        raise ValueError(f"{origin}: missing tensors: the embeddings wte.weight and wpe.weight (is this GPT-2?)")
    if config is not None:
        if "n_head" not in config and n_heads is not None:
            config = {**config, "n_head": n_heads}
        absent = [k for k in ("vocab_size", "n_positions", "n_layer", "n_head", "n_embd") if k not in config]
        if absent:
            raise ValueError(
                f"{origin}: the configuration lacks {absent[0]} (transformers would assume GPT-2's default): "
                f"add it to config.json{', or pass n_heads' if absent[0] == 'n_head' else ''}"
            )
        activation = _check_hf_config(config)
        if n_heads is not None and n_heads != config["n_head"]:
            raise ValueError(f"n_heads={n_heads} disagrees with the configuration's n_head={config['n_head']}")
        sizes = dict(
            vocab_size=config["vocab_size"],
            context_len=config["n_positions"],
            n_layers=config["n_layer"],
            n_heads=config["n_head"],
            d_model=config["n_embd"],
        )
    else:
        if n_heads is None:
            raise ValueError(f"{origin} does not say how many heads the model has: pass n_heads (12 for GPT-2 small)")
        activation = "gelu_tanh"
        (vocab_size, d_model), context_len = state["wte.weight"].shape, state["wpe.weight"].shape[0]
        sizes = dict(
            vocab_size=vocab_size, context_len=context_len, n_layers=_layers_in(state), n_heads=n_heads, d_model=d_model
        )
    gpt_config = GPTConfig(**sizes, dropout=0.0, bias=True, activation=activation)
    return _build(gpt_config, state, transposed=True, origin=origin)


_NANOGPT_ARGS = ("n_layer", "n_head", "n_embd", "block_size", "bias", "vocab_size")


def gpt_from_nanogpt(source) -> GPT:
    """The book's :class:`GPT` holding the weights of a nanoGPT checkpoint (chapter "Generation").

    ``source`` is the dict nanoGPT's ``train.py`` saves, ``{"model": state_dict, "model_args":
    {"n_layer", "n_head", "n_embd", "block_size", "bias", "vocab_size", ...}, ...}``, or a path
    to its ``ckpt.pt``. Keys may carry the ``_orig_mod.`` prefix that ``torch.compile`` adds.
    nanoGPT uses ``nn.Linear`` (no transpose), the exact GELU and LayerNorm with epsilon 1e-5,
    and ``bias=False`` drops every bias of the linear layers and LayerNorms, as in the book's
    GPT. Returns a :class:`GPT` (``context_len=block_size``, ``dropout=0.0``,
    ``activation="gelu"``) in eval mode, mapping ``idx (B, T)`` to logits ``(B, T, vocab_size)``.
    Missing ``model_args``, missing or unexpected tensors and wrong shapes raise ``ValueError``.
    """
    origin = "the checkpoint"
    if isinstance(source, (str, Path)):
        origin = str(source)
        if not Path(source).is_file():
            raise FileNotFoundError(f"no such checkpoint file: {source}")
        problem = _broken_download(Path(source))
        if problem:
            raise ValueError(f"{origin} cannot be read: {problem}")
        try:
            source = torch.load(source, map_location="cpu", weights_only=True)
        except Exception as e:
            if "GLOBAL" in str(e) or "weights_only" in str(e):
                raise ValueError(
                    f"{origin} holds objects other than tensors and plain data: refused, as loading them could run code"
                ) from None
            size = Path(origin).stat().st_size
            raise ValueError(f"{origin} is not a readable checkpoint ({size} bytes; truncated or damaged)") from None
    if not isinstance(source, Mapping) or "model" not in source or "model_args" not in source:
        got = sorted(source) if isinstance(source, Mapping) else type(source).__name__
        raise ValueError(f"{origin}: expected nanoGPT's checkpoint dict with 'model' and 'model_args', got {got}")
    args = source["model_args"]
    absent = [a for a in _NANOGPT_ARGS if a not in args]
    if absent:
        raise ValueError(f"{origin}: model_args lacks {', '.join(absent)}")
    config = GPTConfig(
        vocab_size=args["vocab_size"],
        context_len=args["block_size"],
        n_layers=args["n_layer"],
        n_heads=args["n_head"],
        d_model=args["n_embd"],
        dropout=0.0,
        bias=args["bias"],
        activation="gelu",
    )
    state = _clean(source["model"], strip="_orig_mod.")
    return _build(config, state, transposed=False, origin=origin)


def load_gpt2(name_or_path: str | Path = "gpt2") -> GPT:
    """GPT-2 from the Hugging Face hub (``"gpt2"``, ``"gpt2-medium"``, ...) or a local folder, as
    the book's :class:`GPT` (chapter "Generation").

    Calls ``transformers.GPT2LMHeadModel.from_pretrained(name_or_path)`` (a hub name needs the
    network the first time; the files are cached) and then :func:`gpt_from_hf`. The model maps
    ``idx (B, T)`` to logits ``(B, T, vocab_size)``.
    """
    try:
        from transformers import GPT2LMHeadModel
    except ImportError as e:
        raise ImportError("load_gpt2 needs Hugging Face transformers (pip install transformers)") from e
    return gpt_from_hf(GPT2LMHeadModel.from_pretrained(str(name_or_path)))

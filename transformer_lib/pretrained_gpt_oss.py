"""A GPT with learned sinks as gpt-oss (chapter "Latent, sparse and sink attention").

The book's recipe ``"sinks"`` is Llama's block (chapter "Today's block") whose attention gives each head one
more softmax logit, a learned sink with no value (:class:`~transformer_lib.sinks.SinkAttention`).
``transformers``' ``GptOssForCausalLM`` computes the same model once its mixture of experts is
made a dense SwiGLU network:

- **one expert, chosen by every token.** ``num_local_experts = num_experts_per_tok = 1``, the
  router's weights zero: the softmax over the one chosen logit is exactly 1;
- **gpt-oss's activation.** Its expert computes ``(up + 1) * g * sigmoid(alpha g)`` with ``g``
  clamped above and ``up`` on both sides at ``swiglu_limit``. With ``swiglu_alpha = 1`` the gated
  half is SiLU exactly; the up bias is ``-1`` (or the book's up bias minus 1), so ``up + 1`` is
  the book's up projection up to one rounding of the added 1; the limit is float32's largest
  number, so no finite pre-activation is clamped (an infinite one would be, where the book's
  would stay infinite). The gate and up columns of ``gate_up_proj`` are interleaved (gate at the
  even columns), and the expert's matrices are stored ``(in, out)``;
- **the rotary pairs.** gpt-oss rotates dimension ``i`` with ``i + d_k / 2`` (half-split), the
  book its neighbouring pairs: the rows of each head of ``W_q`` and ``W_k`` are reordered as for
  Llama (:func:`~transformer_lib.positional.half_split_rows`). The frequencies are the plain ones
  (``rope_type="default"``, gpt-oss's YaRN switched off) with the recipe's base;
- **the window.** gpt-oss's sliding window ``W`` shows each query itself and the ``W - 1`` keys
  before it, as the book's ``window``: a GPT with a window has every layer
  ``"sliding_attention"``, one without it every layer ``"full_attention"``;
- **no sinks.** A GPT without sinks is written with sinks of ``-inf``, whose softmax column is
  exactly 0 (plain attention);
- **biases.** With ``bias=True`` the attention's four maps keep theirs (``attention_bias=True``,
  the query's and key's reordered with their rows) and the SwiGLU's three are the expert's (the up
  bias minus 1); without, the expert's biases are zero but the up one's ``-1``;
- **a rotary rescaling** (chapter "Longer than trained") is written as Llama's
  ``rope_parameters`` (the Llama converter's): gpt-oss
  computes its frequencies with the same functions;
- the norms have the recipe's ``norm_eps``.

A setting gpt-oss cannot compute is refused by name (``pretrained_llama.check_settings``):
``keep_first`` (gpt-oss's window drops the first tokens), query-key norms, the book's experts,
any other attention or block.
This is :func:`~transformer_lib.sinks.sink_attention_from_gpt_oss` read backwards, for a whole
model. ``transformers`` is imported only when called.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from .models import GPT
from .positional import half_split_rows
from .pretrained_llama import (
    _LLAMA_NORMS,
    ANY,
    SETTINGS,
    _layer_names,
    _llama_rope_parameters,
    check_convertible,
    check_settings,
)
from .recipe import LLAMA_BLOCK

__all__ = ["GPT_OSS_SETTINGS", "gpt_oss_from_gpt"]

# What gpt-oss's format writes of each setting (check_settings): Llama's block, with or without sinks,
# with or without a window (sliding layers) and biases (its attention's and its expert's), any widths,
# a rotary rescaling as Llama's rope_parameters.
_GPT_OSS_ANY = (
    *("n_kv_heads", "window", "norm_eps", "activation", "d_ff", "rotary_base", "tie_embeddings", "sinks"),
    *("bias", "rope_scaling"),
)
GPT_OSS_SETTINGS = {name: LLAMA_BLOCK.flat().get(name) for name in SETTINGS} | dict.fromkeys(_GPT_OSS_ANY, ANY)
_WHY = {"keep_first": "gpt-oss's sliding window drops the first tokens as it drops every old one"}
# float32's largest number: gpt-oss's clamp at swiglu_limit then changes no finite pre-activation
_NO_LIMIT = float(torch.finfo(torch.float32).max)


def _bias(weight_name: str) -> str:
    """The name of the bias beside a weight (``in_proj_weight`` or ``...proj.weight``)."""
    return weight_name.removesuffix("weight") + "bias"


def gpt_oss_from_gpt(gpt: GPT) -> nn.Module:
    """A ``transformers`` ``GptOssForCausalLM`` with the weights of a Llama-style :class:`GPT` with
    learned sinks (chapter "Latent, sparse and sink attention"), mapping ``input_ids (B, T)`` to the GPT's logits ``(B,
    T, vocab_size)``.

    The GPT needs Llama's block (RMSNorm, SwiGLU, rotary positions), with or without biases, with
    multi-head attention, with or without sinks and a ``window``; no ``keep_first``, ``qk_norm`` or
    experts. Anything else raises a ``ValueError`` naming the setting. Each layer's
    SwiGLU becomes gpt-oss's one expert (``swiglu_alpha=1``, ``swiglu_limit`` float32's largest
    number: a pre-activation reaching it, which only an infinite one does, would be clamped). The
    model is in the GPT's dtype, in eval mode, with eager attention and experts (``transformers``'
    default for the experts, a grouped matrix product, refuses float64: read a float64 model back
    with ``from_pretrained(folder, experts_implementation="eager")``).
    """
    check_convertible(gpt, "gpt_oss_from_gpt", "gpt-oss")
    c = gpt.config
    check_settings(c, GPT_OSS_SETTINGS, "gpt-oss's format", _WHY)
    from transformers import GptOssConfig, GptOssForCausalLM

    book = gpt.state_dict()
    d_k, n_kv = c.d_model // c.n_heads, c.n_kv_heads or c.n_heads
    d_ff = book[_layer_names(gpt, 0)["feed_forward", "in"]].shape[0] if c.n_layers else c.d_ff or 1
    kind = "full_attention" if c.window is None else "sliding_attention"
    cfg = GptOssConfig(
        vocab_size=c.vocab_size,
        hidden_size=c.d_model,
        intermediate_size=d_ff,
        num_hidden_layers=c.n_layers,
        num_attention_heads=c.n_heads,
        num_key_value_heads=n_kv,
        head_dim=d_k,
        num_local_experts=1,  # one expert that every token takes: the dense SwiGLU
        num_experts_per_tok=1,
        swiglu_alpha=1.0,  # g * sigmoid(g): SiLU
        swiglu_limit=_NO_LIMIT,
        sliding_window=c.window or c.context_len,  # gpt-oss builds the sliding mask even when no layer reads it
        layer_types=[kind] * c.n_layers,
        rope_parameters=_llama_rope_parameters(c),
        max_position_embeddings=c.context_len,
        rms_norm_eps=c.norm_eps,
        attention_bias=c.bias,
        tie_word_embeddings=c.tie_embeddings,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
        attn_implementation="eager",
        experts_implementation="eager",  # the loop over experts: PyTorch's grouped product takes no float64
    )
    q_back, k_back = torch.argsort(half_split_rows(c.n_heads, d_k)), torch.argsort(half_split_rows(n_kv, d_k))
    state = {
        "model.embed_tokens.weight": book["tok_embed.weight"],
        "model.norm.weight": book["decoder.norm.weight"],
        "lm_head.weight": book["lm_head.weight"],
    }
    for i, layer in enumerate(gpt.decoder.layers):
        hf, names = f"model.layers.{i}.", _layer_names(gpt, i)
        q, k, v = book[names["attention", "qkv"]].split([c.d_model, n_kv * d_k, n_kv * d_k])
        sinks = layer.self_attn.sinks if getattr(layer.self_attn, "sinks", None) is not None else None
        state |= {
            hf + "self_attn.q_proj.weight": q[q_back],
            hf + "self_attn.k_proj.weight": k[k_back],
            hf + "self_attn.v_proj.weight": v,
            hf + "self_attn.o_proj.weight": book[names["attention", "out"]],
            hf + "self_attn.sinks": (
                sinks.detach() if sinks is not None else torch.full((c.n_heads,), -math.inf, dtype=q.dtype)
            ),
        }
        if c.bias:
            q_bias, k_bias, v_bias = book[_bias(names["attention", "qkv"])].split([c.d_model, n_kv * d_k, n_kv * d_k])
            state |= {
                hf + "self_attn.q_proj.bias": q_bias[q_back],
                hf + "self_attn.k_proj.bias": k_bias[k_back],
                hf + "self_attn.v_proj.bias": v_bias,
                hf + "self_attn.o_proj.bias": book[_bias(names["attention", "out"])],
            }
        state |= {hf + theirs: book[ours] for ours, theirs in zip(names["norms"], _LLAMA_NORMS, strict=True)}
        ff = [names["feed_forward", role] for role in ("gate", "in", "out")]
        gate, up, down = (book[name] for name in ff)  # (d_ff, d), (d_ff, d), (d, d_ff)
        gate_bias, up_bias, down_bias = (book.get(_bias(name), torch.zeros(len(book[name]))) for name in ff)
        # (d, d_ff, 2) -> (d, 2 d_ff): the columns gate, up, gate, up, ...
        gate_up = torch.stack([gate.t(), up.t()], dim=-1).reshape(c.d_model, 2 * d_ff)
        # (d_ff, 2) -> (2 d_ff): the up bias 1 lower, since gpt-oss adds 1 to the up projection
        gate_up_bias = torch.stack([gate_bias, up_bias - 1], dim=-1).reshape(2 * d_ff)
        state |= {
            hf + "mlp.router.weight": torch.zeros(1, c.d_model),
            hf + "mlp.router.bias": torch.zeros(1),
            hf + "mlp.experts.gate_up_proj": gate_up[None],
            hf + "mlp.experts.gate_up_proj_bias": gate_up_bias[None],
            hf + "mlp.experts.down_proj": down.t()[None],
            hf + "mlp.experts.down_proj_bias": down_bias[None],
        }
    dtype = book["tok_embed.weight"].dtype
    model = GptOssForCausalLM(cfg).to(dtype)
    model.load_state_dict({k: v.to(dtype).contiguous() for k, v in state.items()}, strict=not c.tie_embeddings)
    return model.eval()

"""The decoder-only :class:`GPT` language model (chapter "A GPT from scratch"), configured by
a small dataclass. It runs on any device (``model.to(device)``); nothing in it assumes one. The
encoder-decoder :class:`~transformer_lib.encoder_decoder.Transformer` of chapter "Encoder-decoder and cross-attention"
and the token-id checks both models share are in :mod:`transformer_lib.encoder_decoder`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ._checks import check_bool, check_int, check_temperature, check_window, plain_number
from .blocks import Decoder
from .encoder_decoder import _as_index, _check_id_tensor, _check_shared, _check_targets, _init_weights, check_token_ids
from .experts import FLAT_SPEC as EXPERTS_FLAT
from .experts import Experts
from .experts import training_loss as experts_training_loss
from .kv_cache import DecoderCache
from .positional import LearnedPositionalEmbedding
from .recipe import GPT2_BLOCK, RECURRENT, BlockRecipe, as_recipe
from .rope_scaling import FLAT_SPEC as ROPE_FLAT
from .sampling import _sample, check_top_p

__all__ = ["GPT", "GPTConfig"]

# The recipe's choices by their flat names (``config.norm``, ``config.kv_latent``): the names before the
# recipe held its specs, read on the config as aliases of ``config.recipe.flat()``.
RECIPE_FIELDS = tuple(GPT2_BLOCK.flat())


def _check_loss_mask(loss_mask, targets: Tensor) -> Tensor:
    """``loss_mask``, checked: a bool tensor of ``targets``' shape that marks at least one target."""
    if not isinstance(loss_mask, Tensor) or loss_mask.dtype != torch.bool:
        raise TypeError(
            f"loss_mask must be a bool tensor (True: the target counts), got {type(loss_mask).__name__}"
            + (f" of {loss_mask.dtype}" if isinstance(loss_mask, Tensor) else "")
        )
    if loss_mask.shape != targets.shape:
        raise ValueError(f"loss_mask has shape {tuple(loss_mask.shape)}, the targets {tuple(targets.shape)}")
    if not bool(loss_mask.any()):
        raise ValueError("loss_mask marks no target: the loss would be 0 / 0")
    return loss_mask.to(targets.device)


# The settings GPTConfig keeps itself (the model's shape); the block's choices are its recipe.
_SHAPE = ("vocab_size", "context_len", "n_layers", "n_heads", "d_model", "dropout", "n_kv_heads", "window")


@dataclass(init=False)
class GPTConfig:
    """Sizes of a :class:`GPT` (chapter "A GPT from scratch"; defaults: nanoGPT's CPU-sized "baby" shape) and its
    block's recipe (chapter "Today's block": :class:`~transformer_lib.recipe.BlockRecipe`, GPT-2's by default).

    ``GPTConfig(vocab_size, context_len=64, n_layers=4, n_heads=4, d_model=128, dropout=0.0, *,
    n_kv_heads=None, window=None, recipe=None, **choices)``. ``recipe`` is a ``BlockRecipe``, a name
    (``"gpt2"``, ``"llama"``) or a checkpoint's dict; ``choices`` are the recipe's fields
    (``norm="rmsnorm"``, ``bias=False``, ...) applied on top of it, so ``GPTConfig(65,
    positions="rotary")`` works as before the recipe existed, and so does reading a choice,
    ``config.norm`` (an alias of ``config.recipe.norm``).
    """

    vocab_size: int
    context_len: int  # the longest sequence the model reads
    n_layers: int
    n_heads: int
    d_model: int
    dropout: float
    n_kv_heads: int | None  # chapter "Generation": grouped-query attention; None: n_heads (standard)
    window: int | None  # chapter "Long context and precision": sliding-window attention over the last `window`
    # positions
    recipe: BlockRecipe  # chapter "Today's block": the block's choices

    def __init__(
        self,
        vocab_size: int,
        context_len: int = 64,
        n_layers: int = 4,
        n_heads: int = 4,
        d_model: int = 128,
        dropout: float = 0.0,
        *,
        n_kv_heads: int | None = None,
        window: int | None = None,
        recipe=None,
        **choices,
    ):
        shape = (vocab_size, context_len, n_layers, n_heads, d_model, dropout, n_kv_heads, window)
        for name, value in zip(_SHAPE, shape, strict=True):
            setattr(self, name, plain_number(value))  # NumPy's numbers kept as Python's, as a checkpoint loads them
        self.recipe = as_recipe(recipe, **choices)
        for name in ("vocab_size", "context_len"):
            check_int(getattr(self, name), name)
        check_int(self.n_layers, "n_layers", minimum=0)
        _check_shared(self)
        check_window(self.window)
        _check_layers(self)
        if self.recipe.positions.kind == "rotary" and (self.d_model // self.n_heads) % 2:
            raise ValueError(
                f"positions='rotary' rotates pairs of dimensions: the head width d_model / n_heads = "
                f"{self.d_model // self.n_heads} must be even"
            )

    def __getattr__(self, name: str):
        """A choice of the recipe read on the config by its flat name (``config.norm``,
        ``config.kv_latent``): the names before the recipe of chapter "Today's block", and before its specs."""
        recipe = self.__dict__.get("recipe")
        if recipe is not None and name in RECIPE_FIELDS:
            # a pattern no flag can say has no full_every: reading it is refused by name; the rest
            # are the recipe's own parts
            return recipe.flat(strict=name == "full_every")[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def to_dict(self) -> dict:
        """The sizes and the recipe as a plain dict, the recipe's specs nested (what a checkpoint stores)."""
        return {**{name: getattr(self, name) for name in _SHAPE}, "recipe": self.recipe.to_dict()}

    def settings(self) -> dict:
        """Every setting by its flat name, the recipe's choices too (what the command line's flags set);
        the experts' spec as ``experts`` (its number, 0: none) and ``experts_<option>``, the rotary
        rescaling as ``rope_scaling`` (its kind, None: none) and ``rope_<option>``."""
        recipe = self.recipe.flat()
        specs = {}
        for spec in (EXPERTS_FLAT, ROPE_FLAT):  # chapters "Experts" and "Longer than trained"
            value = recipe.pop(spec.key)
            specs.update({k: v for k, v in spec.settings(value).items() if k not in recipe})
        return {**{name: getattr(self, name) for name in _SHAPE}, **recipe, **specs}


def _check_layers(config: GPTConfig) -> None:
    """The recipe's layers against the config's shape: kept first tokens need a window, a recurrence
    has none, and every rule of the per-layer pattern covers a layer of the stack."""
    recipe = config.recipe
    attentions = recipe.attentions()
    keep_first = max(getattr(a, "keep_first", 0) for a in attentions)
    if keep_first and config.window is None:
        raise ValueError(f"keep_first={keep_first} keeps the first tokens in a sliding window's view: give a window")
    recurrent = [a.kind for a in attentions if a.kind in RECURRENT]
    if config.window is not None and recurrent:
        raise ValueError(
            f"window={config.window} slides an attention's view: attention="
            f"{recurrent[0]!r} is a recurrence whose state sums every token"
        )
    for rule in recipe.layers:
        if config.n_layers > 0 and not any(rule.covers(i) for i in range(config.n_layers)):
            start = rule.layers.split(":")[0]
            if recipe.attention.kind in RECURRENT and start and len(recipe.layers) == 1:  # a hybrid's full_every
                every = int(start) + 1
                raise ValueError(
                    f"full_every={every} makes every {every}th layer multi-head attention: a model of "
                    f"n_layers={config.n_layers} would have none (use at most {config.n_layers})"
                )
            raise ValueError(f"the rule for layers {rule.layers!r} covers no layer of n_layers={config.n_layers}")


class GPT(nn.Module):
    """Decoder-only language model (chapter "A GPT from scratch"): causal self-attention blocks, pre-LN.

    ``forward(idx (B, T), targets=None)`` returns ``(logits (B, T, vocab_size), loss or None)``
    with the next-token cross-entropy loss when ``targets (B, T)`` are given.

    Chapter "Generation": ``config.n_kv_heads`` (grouped-query attention); chapter "Long context and precision":
    ``config.window`` (sliding-window attention); chapter "Today's block": ``config.recipe``
    (:class:`~transformer_lib.recipe.BlockRecipe`) hands every layer its parts, GPT-2's or Llama's
    (:mod:`~transformer_lib.modern_block`). Chapter "Generation": ``forward(idx, cache=model.new_cache())`` runs only
    the new tokens ``idx (B, T_new)``, placed after the ``cache.position`` tokens already cached, and
    :meth:`generate` uses it.
    """

    part_roles = {"tok_embed": "embedding", "lm_head": "head"}  # by role: transformer_lib.parts

    def __init__(self, config: GPTConfig):
        super().__init__()
        if not isinstance(config, GPTConfig):
            raise TypeError(f"config must be a GPTConfig, got {type(config).__name__}")
        c = self.config = config
        r = c.recipe  # chapter "Today's block": the block's parts are the recipe's
        self.tok_embed = nn.Embedding(c.vocab_size, c.d_model)
        learned = r.positions.kind == "learned"  # chapter "Today's block": rotary positions are applied inside
        # attention instead
        self.pos_embed = LearnedPositionalEmbedding(c.d_model, c.context_len, dropout=c.dropout) if learned else None
        self.decoder = Decoder(
            c.d_model,
            c.n_heads,
            c.n_layers,
            dropout=c.dropout,
            norm_first=True,
            cross_attention=False,
            n_kv_heads=c.n_kv_heads,
            window=c.window,
            parts=r,
            _checked=True,  # GPTConfig checked them
        )
        self.lm_head = nn.Linear(c.d_model, c.vocab_size, bias=False)
        _init_weights(self)
        # chapter "Experts": whether a training step adds the experts layers' balancing terms
        self._has_experts = any(isinstance(m, Experts) for m in self.decoder.modules())
        if r.tie_embeddings:
            self.lm_head.weight = self.tok_embed.weight  # weight tying

    def num_params(self, non_embedding: bool = True) -> int:
        """Parameter count; by default without the position embeddings (as in MFU estimates)."""
        n = sum(p.numel() for p in self.parameters())
        return n - self.pos_embed.embedding.weight.numel() if non_embedding and self.pos_embed is not None else n

    def new_cache(self) -> DecoderCache:
        """An empty :class:`~transformer_lib.blocks.DecoderCache` for ``forward(..., cache=)``
        (chapter "Generation"); with ``config.window`` (chapter "Long context and precision") each layer keeps only the
        last ``window - 1`` keys."""
        return self.decoder.new_cache()

    def forward(
        self,
        idx: Tensor,
        targets: Tensor | None = None,
        need_weights: bool = False,
        cache: DecoderCache | None = None,
        *,
        loss_mask: Tensor | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """``idx (B, T)`` token ids -> ``(logits (B, T, vocab_size), loss)``: the mean next-token
        cross-entropy when ``targets (B, T)`` (ids in ``[0, vocab_size)``) are given, else None.
        ``loss_mask (B, T)`` (chapter "Fine-tuning", booleans): the mean is over the targets it marks
        ``True`` only (a response's tokens, not its prompt's or the padding).
        ``need_weights``: each layer keeps its attention weights ``(B, h, T, T)`` (in
        ``model.decoder.layers[i].self_attn_weights``). ``cache`` (chapter "Generation", from
        :meth:`new_cache`): ``idx (B, T_new)`` holds only the new tokens, after the
        ``cache.position`` already cached, and the logits are theirs, ``(B, T_new, vocab_size)``."""
        c = self.config
        check_token_ids(idx, c.vocab_size, c.context_len, "idx")
        start = 0 if cache is None else self._cached_positions(idx, cache)
        logits = self.lm_head(self._hidden(idx, start, need_weights, cache))  # (B, T, vocab_size)
        loss = None
        if targets is not None:
            targets = _check_targets(targets, idx, "idx", c.vocab_size)
            if loss_mask is None:
                loss = F.cross_entropy(logits.reshape(-1, c.vocab_size), targets.reshape(-1))
            else:
                keep = _check_loss_mask(loss_mask, targets).reshape(-1)
                each = F.cross_entropy(logits.reshape(-1, c.vocab_size), targets.reshape(-1), reduction="none")
                loss = each[keep].mean()  # the mean over the marked targets only
            if self.training and self._has_experts:  # chapter "Experts": its experts layers' balancing terms
                balancing = experts_training_loss(self)
                loss = loss if balancing is None else loss + balancing
        elif loss_mask is not None:
            raise ValueError("loss_mask is given without targets: it marks which targets count in the loss")
        return logits, loss

    def hidden(self, idx: Tensor) -> Tensor:
        """``idx (B, T)`` -> the last layer's output after the final norm, ``(B, T, d_model)``: the
        features the output head reads, and a classifier's input (chapter "Fine-tuning")."""
        check_token_ids(idx, self.config.vocab_size, self.config.context_len, "idx")
        return self._hidden(idx, 0, False, None)

    def _hidden(self, idx: Tensor, start: int, need_weights: bool, cache: DecoderCache | None) -> Tensor:
        """``(B, T, d_model)`` for ids and a cache already checked (once per call, here or by
        :meth:`generate`), the first id at position ``start``."""
        x = self.tok_embed(_as_index(idx))  # (B, T_new, d_model)
        if self.pos_embed is not None:
            x = self.pos_embed(x, start=start)
        elif self.config.dropout and self.training:  # rotary positions (chapter "Today's block"): dropout only
            x = F.dropout(x, self.config.dropout)
        return self.decoder(x, need_weights=need_weights, cache=cache, _trusted=True)  # checked once, above

    def _cached_positions(self, idx: Tensor, cache: DecoderCache) -> int:
        """The position of the first new token of ``idx (B, T_new)``: the ``cache.position``
        tokens cached before it, checked against this model's layers and context."""
        if not isinstance(cache, DecoderCache) or len(cache) != len(self.decoder.layers):
            raise TypeError(f"cache must be this model's DecoderCache (model.new_cache()), got {cache!r}")
        start, end = cache.position, cache.position + idx.shape[1]
        if end > self.config.context_len:
            raise ValueError(
                f"the cache holds {start} positions and idx adds {idx.shape[1]}: {end} is longer than "
                f"context_len={self.config.context_len}"
            )
        return start

    def generate(
        self,
        idx: Tensor,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: int | None = None,
        *,
        top_p: float | None = None,
        generator: torch.Generator | None = None,
        use_cache: bool = True,
    ) -> Tensor:
        """Append ``max_new_tokens`` sampled tokens to ``idx (B, T)``; returns ``(B, T + max_new_tokens)``.

        Logits are divided by ``temperature`` (lower is greedier) and, with ``top_k``, all but the
        ``k`` most likely tokens are removed before sampling
        (:func:`~transformer_lib.sampling.sample_next`). The context is cropped to the last
        ``context_len`` tokens. ``idx`` needs at least one token, ``max_new_tokens`` is an
        int >= 0, ``temperature`` a finite number > 0 and ``top_k`` None or a positive int.

        Chapter "Generation": ``top_p`` (nucleus sampling, a number in ``(0, 1]``) keeps only the most
        likely tokens that together reach probability ``top_p``. With ``use_cache`` (default)
        the prompt is run once (prefill) and then each step runs only the newest token, reading
        the earlier keys and values from a :class:`~transformer_lib.blocks.DecoderCache`. Once
        the sequence is longer than ``context_len``, the uncached model sees a window that slides
        by one token per step, so every position shifts and no cached key stays valid: from then
        on each step re-runs the cropped window without the cache, exactly as ``use_cache=False``
        does. Cached and uncached generation give the same tokens (the same logits up to
        rounding); the model's train/eval mode is left as it is.
        """
        _check_id_tensor(idx, "idx")
        check_int(max_new_tokens, "max_new_tokens", minimum=0)
        check_temperature(temperature)
        if top_k is not None:
            check_int(top_k, "top_k")
        if top_p is not None:
            check_top_p(top_p)
        check_bool(use_cache, "use_cache")
        with torch.inference_mode():  # no autograd bookkeeping (version counters, views) at any step
            idx = self._generate(idx, max_new_tokens, temperature, top_k, top_p, generator, use_cache)
        return idx.clone()  # outside inference mode: a plain tensor the caller may use anywhere

    def _generate(
        self,
        idx: Tensor,
        max_new_tokens: int,
        temperature: float,
        top_k: int | None,
        top_p: float | None,
        generator: torch.Generator | None,
        use_cache: bool,
    ) -> Tensor:
        """:meth:`generate`'s loop, its settings checked."""
        L = self.config.context_len
        if not use_cache:
            for _ in range(max_new_tokens):
                logits, _ = self(idx[:, -L:])  # (B, T, vocab_size)
                nxt = _sample(logits[:, -1, :], temperature, top_k, generator, top_p)  # (B, 1)
                idx = torch.cat([idx, nxt], dim=1)
            return idx
        cache = self.new_cache()
        for step in range(max_new_tokens):
            if step == 0:
                logits, _ = self(idx[:, -L:], cache=cache)  # prefill, the prompt checked: (B, T, vocab_size)
            elif idx.shape[1] <= L:  # the model's own token, at the position after the cache
                logits = self.lm_head(self._hidden(idx[:, -1:], idx.shape[1] - 1, False, cache))  # (B, 1, vocab)
            else:
                logits, _ = self(idx[:, -L:])  # past context_len: the cropped window, uncached
            nxt = _sample(logits[:, -1, :], temperature, top_k, generator, top_p)  # (B, 1)
            idx = torch.cat([idx, nxt], dim=1)
        return idx

"""Preferences and rewards (chapter "Preferences and rewards"): tuning a model from pairs of
answers one of which is preferred (DPO), and from rewards on groups of its own sampled answers
(GRPO), computing the quantities that TRL's ``DPOTrainer`` and ``GRPOTrainer`` compute.

- **An answer's score** (:func:`sequence_logprobs`): the summed log-probability of the answer's
  tokens after its prompt, in float64; the prompt and the padding are never counted. Rows are laid
  out as chapter "Fine-tuning" lays them (:func:`~transformer_lib.data.encode_pair`: ``prompt + PROMPT_END``,
  the answer, the end token) and right-padded (:func:`pad_rows`).
- **DPO** (Rafailov et al., 2023). The KL-regularised objective
  ``max_pi E_{y ~ pi}[r(x, y)] - beta KL(pi(.|x) || pi_ref(.|x))`` is maximised by
  ``pi*(y|x) = pi_ref(y|x) exp(r(x, y) / beta) / Z(x)``, so the reward is ``r = beta log(pi* /
  pi_ref) + beta log Z(x)``. Under the Bradley-Terry model a preferred answer ``y_w`` beats ``y_l``
  with probability ``sigmoid(r(x, y_w) - r(x, y_l))``, where ``Z(x)`` cancels: the policy is its own
  reward model, and the loss is the negative log-likelihood of the preferences,
  ``-log sigmoid(beta [(log pi(y_w) - log pi_ref(y_w)) - (log pi(y_l) - log pi_ref(y_l))])``
  (:func:`dpo_loss`). At the start ``pi = pi_ref``, the argument is 0 and the loss is ``ln 2``.
- **The reference** (:func:`reference_logprobs`, :func:`adapters_off`): a LoRA policy's base
  weights with its adapters switched off, no copy; a fully fine-tuned policy needs a frozen copy.
- **GRPO** (Shao et al., 2024): no value model. Each prompt's ``n`` sampled answers are rewarded, an
  answer's advantage is its reward minus its group's mean (divided by the group's std,
  :func:`group_advantages`), and every answer token gets PPO's clipped surrogate with it, plus
  ``beta`` times the k3 estimate of the KL to the reference (:func:`grpo_loss`, :func:`kl_k3`;
  :func:`exact_kl` is the sum over the vocabulary that it estimates).

Where TRL 1.16 departs from the papers (its tests pin it, ``tests/test_preference.py``): the std is
Bessel-corrected and ``1e-4`` is added to it; the default ``loss_type`` is ``"dapo"`` (one mean over
all tokens), not GRPO's mean per answer; the default ``beta`` is 0 (DeepSeekMath used 0.04); each
token's KL is multiplied by its ratio (``use_bias_correction_kl=True``: ``kl_ratio`` here); the
log-probabilities are computed in float32 at the sampling temperature; DPO appends the end token
to both answers and tokenises ``prompt + answer`` whole.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ._checks import check_bool, is_real
from .lora import LoRA
from .token_rows import TokenRows

__all__ = [
    "ADVANTAGE_SCALES",
    "GRPO_LOSS_TYPES",
    "adapters_off",
    "answer_mask",
    "dpo_loss",
    "exact_kl",
    "group_advantages",
    "grpo_loss",
    "kl_k3",
    "pad_rows",
    "reference_logprobs",
    "sequence_logprobs",
    "token_logprobs",
]

#: How :func:`group_advantages` scales the centred rewards (TRL's ``scale_rewards``).
ADVANTAGE_SCALES = ("group", "batch", "none")
#: How :func:`grpo_loss` averages its per-token losses (TRL's ``loss_type`` of the same name).
GRPO_LOSS_TYPES = ("grpo", "bnpo", "dapo")


def _number(value, name: str, *, positive: bool) -> float:
    """``value`` as a float: a finite number, > 0 (``positive``) or >= 0."""
    if not is_real(value):
        raise TypeError(f"{name} must be a number, got {value!r} ({type(value).__name__})")
    if not (math.isfinite(value) and (value > 0 if positive else value >= 0)):
        raise ValueError(f"{name} must be a finite number {'> 0' if positive else '>= 0'}, got {value!r}")
    return float(value)


def _float_tensor(t, name: str, dim: int) -> Tensor:
    if not isinstance(t, Tensor) or not t.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got {type(t).__name__}")
    if t.dim() != dim:
        raise ValueError(f"{name} must have {dim} dimension(s), got shape {tuple(t.shape)}")
    return t


# An answer's score ------------------------------------------------------------------------------


def _check_ids(ids) -> None:
    if not isinstance(ids, Tensor) or ids.dim() != 2 or ids.shape[1] < 2 or ids.is_floating_point():
        raise ValueError(f"ids must be a (B, T) tensor of token ids with T >= 2, got {getattr(ids, 'shape', ids)!r}")


def pad_rows(rows: Sequence[tuple[Sequence[int], int]], pad_id: int = 0) -> tuple[Tensor, Tensor, Tensor]:
    """``rows``, a list of ``(ids, n_prompt)`` as :func:`~transformer_lib.data.encode_pair` makes them,
    as one batch (chapter "Preferences and rewards"): ``ids (B, T)`` right-padded with
    ``pad_id``, ``n_prompt (B,)`` and ``lengths (B,)`` (each row's ids before its padding)."""
    if not rows:
        raise ValueError("rows is empty: give at least one (ids, n_prompt)")
    lengths = [len(row) for row, _ in rows]
    width = max(lengths)
    ids = torch.tensor([list(row) + [pad_id] * (width - len(row)) for row, _ in rows], dtype=torch.long)
    return ids, torch.tensor([n for _, n in rows], dtype=torch.long), torch.tensor(lengths, dtype=torch.long)


def answer_mask(n_prompt, lengths, T: int) -> Tensor:
    """``(B, T - 1)`` booleans, aligned with :func:`token_logprobs`: entry ``t`` is True where token
    ``t + 1`` is an answer token, ``n_prompt <= t + 1 < lengths`` (chapter "Preferences and rewards"). ``n_prompt (B,)``
    counts each row's prompt ids, ``lengths (B,)`` its ids before the
    padding; every row needs ``1 <= n_prompt < lengths <= T``."""
    n_prompt, lengths = (torch.as_tensor(v, dtype=torch.long).reshape(-1) for v in (n_prompt, lengths))
    if n_prompt.shape != lengths.shape:
        raise ValueError(f"n_prompt and lengths need one number per row, got {len(n_prompt)} and {len(lengths)}")
    bad = ((n_prompt < 1) | (lengths <= n_prompt) | (lengths > T)).nonzero()
    if len(bad):
        i = int(bad[0])
        raise ValueError(
            f"row {i} has n_prompt={int(n_prompt[i])} and lengths={int(lengths[i])}: every row needs "
            f"1 <= n_prompt < lengths <= T={T} (a prompt token and an answer token at least)"
        )
    position = torch.arange(1, T)  # the position of the token each entry predicts
    return (position >= n_prompt[:, None]) & (position < lengths[:, None])


def token_logprobs(model: nn.Module, ids: Tensor, temperature: float = 1.0) -> Tensor:
    """``ids (B, T)`` -> ``(B, T - 1)`` float64: the log-probability that ``model`` gives each token
    ``ids[:, t + 1]`` after ``ids[:, :t + 1]`` (chapter "Preferences and rewards"), from the
    logits in float64 divided by ``temperature`` (``log_softmax``, then the token's entry): the
    distribution answers were sampled from at that temperature."""
    _check_ids(ids)
    temperature = _number(temperature, "temperature", positive=True)
    logits, _ = model(ids)  # (B, T, vocab)
    logp = torch.log_softmax(logits[:, :-1].double() / temperature, dim=-1)  # (B, T - 1, vocab)
    return logp.gather(-1, ids[:, 1:, None]).squeeze(-1)


def sequence_logprobs(model: nn.Module, ids: Tensor, n_prompt, lengths, *, average: bool = False) -> Tensor:
    """Each row's log-probability of its answer given its prompt (chapter "Preferences and rewards"): ``(B,)`` float64,
    the sum over the answer's tokens (with its end token), or their mean
    per token (``average``). ``ids (B, T)`` holds ``prompt + answer`` right-padded (:func:`pad_rows`);
    ``n_prompt (B,)`` and ``lengths (B,)`` say where each answer starts and ends. The prompt's and the
    padding's own tokens are never counted: the padding changes nothing, the prompt only what the
    answer's tokens read."""
    check_bool(average, "average")
    _check_ids(ids)
    mask = answer_mask(n_prompt, lengths, ids.shape[1])  # (B, T - 1)
    if mask.shape[0] != ids.shape[0]:
        raise ValueError(f"n_prompt and lengths need one number per row of ids ({ids.shape[0]}), got {mask.shape[0]}")
    logp = torch.where(mask, token_logprobs(model, ids), 0.0)
    total = logp.sum(-1)
    return total / mask.sum(-1) if average else total


# DPO -----------------------------------------------------------------------------------------------


def dpo_loss(
    policy_chosen: Tensor, policy_rejected: Tensor, ref_chosen: Tensor, ref_rejected: Tensor, beta: float
) -> dict[str, Tensor]:
    """DPO's loss from the summed log-probabilities ``(B,)`` of each pair's chosen and rejected answers
    under the policy and the reference (:func:`sequence_logprobs`; chapter "Preferences and rewards"), as TRL's
    ``loss_type="sigmoid"``. Returns ``loss``, the mean over the pairs of
    ``-logsigmoid(beta ((pc - rc) - (pr - rr)))`` (with the graph), and, detached, the implicit rewards
    ``chosen_reward = beta (pc - rc)`` and ``rejected_reward`` ``(B,)``, their ``margin (B,)`` and
    ``accuracy``, the share of pairs whose margin is > 0. With the policy equal to the reference the
    loss is ``ln 2`` exactly."""
    beta = _number(beta, "beta", positive=True)
    named = {
        "policy_chosen": policy_chosen,
        "policy_rejected": policy_rejected,
        "ref_chosen": ref_chosen,
        "ref_rejected": ref_rejected,
    }
    for name, t in named.items():
        _float_tensor(t, name, 1)
    shapes = [tuple(t.shape) for t in named.values()]
    if len(set(shapes)) > 1:
        raise ValueError(f"the four log-probabilities need one shape (B,), got {shapes}")
    chosen = policy_chosen - ref_chosen  # log pi(y_w) / pi_ref(y_w)
    rejected = policy_rejected - ref_rejected
    loss = -F.logsigmoid(beta * (chosen - rejected)).mean()
    chosen_reward, rejected_reward = beta * chosen.detach(), beta * rejected.detach()
    margin = chosen_reward - rejected_reward
    return {
        "loss": loss,
        "chosen_reward": chosen_reward,
        "rejected_reward": rejected_reward,
        "margin": margin,
        "accuracy": (margin > 0).to(margin.dtype).mean(),
    }


# The reference -------------------------------------------------------------------------------------


@contextmanager
def adapters_off(model: nn.Module) -> Iterator[nn.Module]:
    """Within the block, ``model`` computes with its base weights: every LoRA adapter (and the token
    rows trained beside them) returns the frozen weight unchanged, a merged adapter the weight it
    was merged into (chapter "Preferences and rewards"). Nothing is copied and no parameter is
    written, so a graph already built through the adapters can still be back-propagated; leaving
    the block switches them on again, even after an error. A model without adapters is refused."""
    parts = [m for m in model.modules() if isinstance(m, (LoRA, TokenRows))]
    if not any(isinstance(m, LoRA) for m in parts):
        raise ValueError(
            "the model has no LoRA adapters to switch off: for a fully fine-tuned policy the reference is a frozen "
            "copy made before training (copy.deepcopy(model)), scored with sequence_logprobs"
        )
    try:
        for m in parts:  # an instance attribute shadows the class's forward, which parametrize calls
            if isinstance(m, LoRA):
                m.forward = lambda weight, lora=m: weight if lora.frozen is None else lora.frozen
            else:
                m.forward = lambda weight: weight
        yield model
    finally:
        for m in parts:
            m.__dict__.pop("forward", None)


def reference_logprobs(model: nn.Module, ids: Tensor, n_prompt, lengths, *, average: bool = False) -> Tensor:
    """The reference's :func:`sequence_logprobs` ``(B,)`` for a LoRA policy (chapter "Preferences and rewards"): the
    same model with its adapters off (:func:`adapters_off`), under
    ``torch.no_grad()``; it equals the base model's log-probabilities exactly. It is DPO's reference
    when the adapters were added for this tuning (``B = 0``, so the policy starts at the reference);
    to tune on from a LoRA fine-tune, merge that one first (``remove_lora``) and add new adapters. A
    fully fine-tuned policy has no adapters: its reference is a frozen copy the caller keeps,
    scored with :func:`sequence_logprobs` under ``torch.no_grad()``. For GRPO's per-token
    reference, ``with torch.no_grad(), adapters_off(model): token_logprobs(model, ids)``."""
    with torch.no_grad(), adapters_off(model):
        return sequence_logprobs(model, ids, n_prompt, lengths, average=average)


# GRPO ----------------------------------------------------------------------------------------------


def _group_sizes(rewards) -> list[int] | None:
    """The size of each group of ``rewards`` when it is a sequence of sized groups, else None."""
    try:
        return [len(group) for group in rewards]
    except TypeError:
        return None


def group_advantages(rewards, *, scale: str = "group", eps: float = 1e-4) -> Tensor:
    """Each answer's advantage from ``rewards (G, n)``, ``n`` answers to each of ``G`` prompts
    (chapter "Preferences and rewards"): its reward minus its group's mean, divided by
    ``std + eps`` where ``std`` is its group's (``scale="group"``: DeepSeekMath's and R1's), the
    whole batch's (``"batch"``), or not divided (``"none"``: Dr. GRPO's). The std is Bessel-corrected
    and ``eps = 1e-4`` as TRL's. A group whose rewards are all equal gets advantages of exactly 0 (it
    teaches nothing), never NaN. Returns ``(G, n)``, in the rewards' dtype (float64 for numbers)."""
    if scale not in ADVANTAGE_SCALES:
        raise ValueError(f"scale must be one of {ADVANTAGE_SCALES}, got {scale!r}")
    eps = _number(eps, "eps", positive=False)
    try:
        r = rewards if isinstance(rewards, Tensor) else torch.as_tensor(rewards, dtype=torch.float64)
    except (TypeError, ValueError, RuntimeError):  # groups of other sizes, or something not a number
        sizes = _group_sizes(rewards)
        if sizes is not None and len(set(sizes)) > 1:
            i = next(i for i, size in enumerate(sizes) if size != sizes[0])
            raise ValueError(
                f"rewards must be numbers in G groups of one size n, got groups of sizes {sizes[0]} (group 0) "
                f"and {sizes[i]} (group {i}): score every answer of a group"
            ) from None
        shown = repr(rewards)
        shown = shown if len(shown) <= 80 else shown[:77] + "..."
        raise ValueError(f"rewards must be numbers in G groups of one size n, got {shown}") from None
    r = r if r.is_floating_point() else r.double()
    if r.dim() != 2 or r.shape[1] < 2:
        raise ValueError(f"rewards must be (G groups, n answers per group) with n >= 2, got shape {tuple(r.shape)}")
    if not torch.isfinite(r).all():
        raise ValueError("rewards must be finite: give an unscored answer a number (or leave its group out)")
    centred = r - r.mean(dim=1, keepdim=True)
    if scale == "group":
        centred = centred / (r.std(dim=1, keepdim=True) + eps)
    elif scale == "batch":
        centred = centred / (r.std() + eps)
    same = (r == r[:, :1]).all(dim=1, keepdim=True)  # (G, 1)
    return centred.masked_fill(same, 0.0)


def kl_k3(logp_new: Tensor, logp_ref: Tensor) -> Tensor:
    """The k3 estimate of ``KL(pi_new || pi_ref)`` per sampled token (chapter "Preferences and rewards"): ``exp(d) - d -
    1`` with ``d = logp_ref - logp_new``, of the inputs' shape (any, such as
    ``(B, T)``). It is >= 0 for each token, 0 where the two agree, and its mean over tokens drawn from
    ``pi_new`` is the KL (:func:`exact_kl`). Computed as ``expm1(d) - d``, exact near ``d = 0``."""
    d = logp_ref - logp_new
    return torch.expm1(d) - d


def exact_kl(logits_new: Tensor, logits_ref: Tensor, mask: Tensor | None = None) -> Tensor:
    """``KL(pi_new || pi_ref)`` at each position, summed over the whole vocabulary (chapter "Preferences and rewards"):
    ``logits (B, T, vocab)`` -> ``(B, T)`` float64,
    ``sum_v p_new(v) (log p_new(v) - log p_ref(v))``; 0 where ``mask (B, T)`` is False."""
    if logits_new.shape != logits_ref.shape or logits_new.dim() < 2:
        raise ValueError(
            f"logits_new and logits_ref need one shape (..., vocab), got "
            f"{tuple(logits_new.shape)} and {tuple(logits_ref.shape)}"
        )
    logp = torch.log_softmax(logits_new.double(), dim=-1)
    logq = torch.log_softmax(logits_ref.double(), dim=-1)
    kl = (logp.exp() * (logp - logq)).sum(-1)
    if mask is None:
        return kl
    if mask.shape != kl.shape:
        raise ValueError(f"mask must have shape {tuple(kl.shape)}, got {tuple(mask.shape)}")
    return kl.masked_fill(~mask.bool(), 0.0)


def grpo_loss(
    logp_new: Tensor,
    logp_old: Tensor,
    logp_ref: Tensor | None,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip: float = 0.2,
    clip_high: float | None = None,
    beta: float = 0.04,
    loss_type: str = "grpo",
    kl_ratio: bool = False,
    n_tokens: int | None = None,
) -> dict[str, Tensor]:
    """GRPO's loss (chapter "Preferences and rewards") from the per-token log-probabilities
    ``(B, T)`` of ``B`` sampled answers under the policy being trained (``logp_new``, with its graph),
    the policy that sampled them (``logp_old``) and the reference (``logp_ref``, None when
    ``beta=0``), each answer's advantage ``(B,)`` (:func:`group_advantages`, flattened) and ``mask
    (B, T)``, True at the answer tokens; any layout of the tokens will do if the four agree.

    Per token, with ``r = exp(logp_new - logp_old)``: ``-min(r A, clip(r, 1 - clip, 1 + clip_high) A)
    + beta k3`` (:func:`kl_k3`; ``clip_high`` defaults to ``clip``; ``kl_ratio`` multiplies k3 by
    ``r``, as TRL 1.16 does by default). ``loss_type`` averages as TRL's of that name: ``"grpo"`` the
    mean over each answer's tokens, then over the answers (the paper's); ``"bnpo"`` one mean over all
    the tokens; ``"dapo"`` the sum over the tokens divided by ``n_tokens``, the answer tokens of the
    whole batch this one is a part of (TRL's ``num_items_in_batch``; None: this batch's, as ``"bnpo"``).

    Returns ``loss`` and, detached, ``kl`` (the mean of the KL term over the answer tokens) and
    ``clipped`` (the share of answer tokens whose ratio the clip holds back). On the first step
    (``logp_new == logp_old == logp_ref``) the ratio is 1 and k3 is 0, so the loss is minus the mean
    advantage, each answer weighted by the loss type: 0 for ``"grpo"`` with group-centred advantages
    whatever the answers' lengths, 0 for ``"dapo"`` only if the lengths are equal; the gradient is
    not 0 (it is the advantage-weighted gradient of the log-probabilities)."""
    if loss_type not in GRPO_LOSS_TYPES:
        raise ValueError(f"loss_type must be one of {GRPO_LOSS_TYPES}, got {loss_type!r}")
    clip = _number(clip, "clip", positive=True)
    clip_high = clip if clip_high is None else _number(clip_high, "clip_high", positive=True)
    beta = _number(beta, "beta", positive=False)
    check_bool(kl_ratio, "kl_ratio")
    named = {"logp_new": logp_new, "logp_old": logp_old} | ({"logp_ref": logp_ref} if beta else {})
    if beta and logp_ref is None:
        raise ValueError(f"beta={beta} needs logp_ref, the reference's log-probabilities (or beta=0)")
    for name, t in named.items():
        _float_tensor(t, name, 2)
        if t.shape != logp_new.shape:
            raise ValueError(f"{name} has shape {tuple(t.shape)}, logp_new {tuple(logp_new.shape)}: they must agree")
    if not isinstance(mask, Tensor) or mask.shape != logp_new.shape:
        raise ValueError(f"mask must be a tensor of shape {tuple(logp_new.shape)}, got {getattr(mask, 'shape', mask)}")
    _float_tensor(advantages, "advantages", 1)
    if advantages.shape[0] != logp_new.shape[0]:
        raise ValueError(f"advantages must have one number per answer, {logp_new.shape[0]}, got {advantages.shape[0]}")
    if n_tokens is not None and loss_type != "dapo":
        raise ValueError(f"n_tokens is for loss_type='dapo' only, got loss_type={loss_type!r}")
    keep = mask.bool()
    A = advantages[:, None]  # (B, 1)
    ratio = torch.exp(logp_new - logp_old)  # (B, T)
    per_token = -torch.min(ratio * A, torch.clamp(ratio, 1 - clip, 1 + clip_high) * A)
    kl = torch.zeros_like(per_token)
    if beta:
        kl = kl_k3(logp_new, logp_ref) * (ratio if kl_ratio else 1.0)
        per_token = per_token + beta * kl
    per_token = torch.where(keep, per_token, 0.0)
    count = keep.sum().clamp(min=1)
    if loss_type == "grpo":
        loss = (per_token.sum(-1) / keep.sum(-1).clamp(min=1)).mean()
    elif loss_type == "bnpo" or n_tokens is None:
        loss = per_token.sum() / count
    else:
        loss = per_token.sum() / _number(n_tokens, "n_tokens", positive=True)
    clipped = ((ratio < 1 - clip) & (A < 0)) | ((ratio > 1 + clip_high) & (A > 0))
    return {
        "loss": loss,
        "kl": torch.where(keep, kl.detach(), 0.0).sum() / count,
        "clipped": (clipped & keep).sum().to(per_token.dtype) / count,
    }

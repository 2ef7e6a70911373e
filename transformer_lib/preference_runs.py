"""Preference and reward tuning as training runs (chapter "Preferences and rewards"): batches
that :func:`~transformer_lib.train.train` steps on unchanged, because they score the model
themselves (their ``loss(model, batch)``, :func:`~transformer_lib.train.batch_loss`).

- :class:`DPOBatches`: pairs of a chosen and a rejected answer; the loss is
  :func:`~transformer_lib.preference.dpo_loss` of the policy's and the reference's summed (or
  averaged) log-probabilities of each answer.
- :class:`GRPOBatches`: each batch is sampled from the policy being trained, ``group_size``
  answers to each of ``batch_size`` prompts, scored by a reward (``reward(answer, target)``,
  :data:`~transformer_lib.data.verifiable.REWARDS`); the loss is :func:`~transformer_lib.preference.grpo_loss`
  with the group's advantages. Its evaluation "loss" is ``1 - the mean reward`` of answers sampled
  to the split's prompts, so that the run's validation curve reads as a reward.

The reference is :class:`Reference`: the policy with its adapters off, for a LoRA policy whose
adapters were added for this tuning (:func:`make_policy`), or a frozen copy of the start for full
tuning. Both samplers keep their random state in the checkpoint, so a resumed run is the run that
never stopped::

    reference = make_policy(model, "lora", rank=4, alpha=8.0, seed=0)
    batches = GRPOBatches(model, tokenizer, train, val, 8,
                          reference=reference, reward="exact")
    train(model, batches, config)
"""

from __future__ import annotations

import copy
import math
import numbers
from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn

from ._checks import check_int
from .data.batches import _Batches
from .data.instructions import encode_pair
from .data.verifiable import REWARDS
from .finetune import lora_targets
from .lora import add_lora, lora_weights, remove_lora
from .preference import (
    ADVANTAGE_SCALES,
    GRPO_LOSS_TYPES,
    adapters_off,
    answer_mask,
    dpo_loss,
    group_advantages,
    grpo_loss,
    pad_rows,
    token_logprobs,
)
from .token_rows import remove_token_rows, token_rows

__all__ = ["PREFERENCE_METHODS", "DPOBatches", "GRPOBatches", "Reference", "make_policy"]

#: What a preference or reward run trains: fresh low-rank adapters, or every weight.
PREFERENCE_METHODS = ("lora", "full")


class Reference:
    """The frozen reference of a preference or reward run (chapter "Preferences and rewards"): ``frozen`` is a copy of
    the start (full tuning), or None for a policy whose adapters are switched off instead (LoRA)."""

    def __init__(self, policy: nn.Module, frozen: nn.Module | None = None):
        self.policy, self.frozen = policy, frozen

    @torch.no_grad()
    def token_logprobs(self, ids: Tensor, temperature: float = 1.0) -> Tensor:
        """The reference's :func:`~transformer_lib.preference.token_logprobs` of ``ids (B, T)``."""
        if self.frozen is None:
            with adapters_off(self.policy):
                return token_logprobs(self.policy, ids, temperature)
        self.frozen.to(ids.device).eval()
        return token_logprobs(self.frozen, ids, temperature)


def make_policy(model: nn.Module, method: str, *, rank: int = 4, alpha: float = 8.0, seed: int = 0) -> Reference:
    """Make ``model`` the policy of a preference or reward run, in place, and return its
    :class:`Reference` (chapter "Preferences and rewards"). Adapters and token rows it already has (a LoRA fine-tune,
    the start) are merged into its weights first. ``"lora"`` then adds fresh adapters to the attention
    and feed-forward weights (the reference: the same model with them off); ``"full"`` trains every
    weight and keeps a frozen copy of the start as the reference."""
    if method not in PREFERENCE_METHODS:
        raise ValueError(f"method must be one of {PREFERENCE_METHODS}, got {method!r}")
    if lora_weights(model):
        remove_lora(model, merge=True)
    if token_rows(model) is not None:
        remove_token_rows(model, merge=True)
    if method == "full":
        frozen = copy.deepcopy(model).requires_grad_(False).eval()
        model.requires_grad_(True)  # a merged fine-tune's weights were frozen under its adapters
        return Reference(model, frozen)
    add_lora(model, lora_targets(model), rank=rank, alpha=alpha, seed=seed)
    return Reference(model)


def _answer_rows(tokenizer, prompt: str, answers: Sequence[str]) -> list[tuple[list[int], int]]:
    return [encode_pair(tokenizer, prompt, answer) for answer in answers]


class DPOBatches(_Batches):
    """Batches of preference pairs for DPO (chapter "Preferences and rewards"): ``train`` and ``val`` are lists of
    ``(prompt, chosen, rejected)`` texts, each answer laid out as the responses of chapter "Fine-tuning" (with the
    end token). ``batches(split)`` draws ``batch_size`` pairs: ``{"ids": (2B, T), "n_prompt":
    (2B,), "lengths": (2B,)}``, the chosen rows first. ``loss(model, batch)`` is DPO's with
    ``beta``, on summed log-probabilities, or per-token means (``average=True``); ``last`` holds
    the last batch's mean chosen and rejected rewards, margin and accuracy."""

    def __init__(
        self,
        tokenizer,
        train: Sequence,
        val: Sequence,
        batch_size: int,
        *,
        reference: Reference,
        beta: float = 0.1,
        average: bool = False,
        **sampling,
    ):
        super().__init__(batch_size, **sampling)
        self.reference, self.beta, self.average, self.last = reference, beta, average, {}
        self.pad_id = tokenizer.eos_id
        self.rows = {}
        for name, triples in (("train", train), ("val", val)):
            if not triples:
                raise ValueError(f"the {name} split holds no pair")
            self.rows[name] = [(_answer_rows(tokenizer, p, (c, r))) for p, c, r in triples]

    def __call__(self, split: str = "train") -> dict[str, Tensor]:
        self._check_split(split)
        picked = [self.rows[split][int(i)] for i in self._rows(split, len(self.rows[split]))]
        ids, n_prompt, lengths = pad_rows([c for c, _ in picked] + [r for _, r in picked], self.pad_id)
        return {"ids": ids.to(self.device), "n_prompt": n_prompt.to(self.device), "lengths": lengths.to(self.device)}

    def loss(self, model: nn.Module, batch: dict) -> Tensor:
        ids, n_prompt, lengths = batch["ids"], batch["n_prompt"], batch["lengths"]
        mask = answer_mask(n_prompt, lengths, ids.shape[1])

        def score(logp: Tensor) -> Tensor:
            total = torch.where(mask, logp, 0.0).sum(-1)
            return total / mask.sum(-1) if self.average else total

        policy, ref = score(token_logprobs(model, ids)), score(self.reference.token_logprobs(ids))
        B = len(ids) // 2
        out = dpo_loss(policy[:B], policy[B:], ref[:B], ref[B:], self.beta)
        self.last = {k: float(v.mean()) for k, v in out.items() if k != "loss"}
        return out["loss"]


class GRPOBatches(_Batches):
    """Batches sampled from the policy for GRPO (chapter "Preferences and rewards"). ``train`` and ``val`` are lists of
    ``(prompt, target)``; each batch draws ``batch_size`` prompts and samples ``group_size``
    answers to each from ``policy`` at ``temperature`` (at most ``max_new_tokens``, cut after the
    end token), scored by ``reward(answer, target)`` (a function or a name in
    :data:`~transformer_lib.data.verifiable.REWARDS`). ``batches(split)`` returns ``{"ids", "n_prompt",
    "lengths", "advantages", "rewards"}`` (one row per answer, :func:`group_advantages` with
    ``scale``). ``loss(model, batch)`` is :func:`grpo_loss` (``loss_type``, ``clip``, ``beta``) with
    one update per batch (the sampling policy's log-probabilities are the policy's own, detached),
    in training; in evaluation, ``1 - the mean reward``. ``last`` holds the last training batch's
    mean reward, KL estimate and the share of groups that taught nothing (all rewards equal)."""

    def __init__(
        self,
        policy: nn.Module,
        tokenizer,
        train: Sequence,
        val: Sequence,
        batch_size: int,
        *,
        reward: str | Callable[[str, str], float],
        reference: Reference | None = None,
        group_size: int = 8,
        temperature: float = 1.0,
        max_new_tokens: int = 16,
        beta: float = 0.04,
        loss_type: str = "grpo",
        scale: str = "group",
        clip: float = 0.2,
        **sampling,
    ):
        super().__init__(batch_size, **sampling)
        check_int(group_size, "group_size", minimum=2)
        check_int(max_new_tokens, "max_new_tokens")
        if isinstance(reward, str) and reward not in REWARDS:
            raise ValueError(f"reward must be one of {sorted(REWARDS)} or a function, got {reward!r}")
        if loss_type not in GRPO_LOSS_TYPES or scale not in ADVANTAGE_SCALES:
            raise ValueError(
                f"loss_type must be one of {GRPO_LOSS_TYPES} and scale one of {ADVANTAGE_SCALES}, "
                f"got {loss_type!r} and {scale!r}"
            )
        if beta and reference is None:
            raise ValueError(f"beta={beta} needs a reference (make_policy), or beta=0")
        self.policy, self.tokenizer, self.reference = policy, tokenizer, reference
        self.reward = REWARDS[reward] if isinstance(reward, str) else reward
        self.group_size, self.temperature, self.max_new_tokens = group_size, temperature, max_new_tokens
        self.beta, self.loss_type, self.scale, self.clip, self.last = beta, loss_type, scale, clip, {}
        self.pairs = {"train": list(train), "val": list(val)}
        room = policy.config.context_len
        for name, pairs in self.pairs.items():
            if not pairs:
                raise ValueError(f"the {name} split holds no prompt")
            longest = max(len(encode_pair(tokenizer, p, "", end=False)[0]) for p, _ in pairs)
            if longest + max_new_tokens > room:
                raise ValueError(
                    f"a {name} prompt of {longest} tokens and {max_new_tokens} new ones exceed the "
                    f"model's context of {room}: lower max_new_tokens"
                )

    @torch.no_grad()
    def sample(self, prompt: str, generator: torch.Generator) -> tuple[list[tuple[list[int], int]], list[str]]:
        """``group_size`` answers of the policy to ``prompt``: their rows (prompt, answer, end token
        if written) and their texts."""
        eos, device = self.tokenizer.eos_id, next(self.policy.parameters()).device
        ids, n_prompt = encode_pair(self.tokenizer, prompt, "", end=False)
        idx = torch.tensor([ids] * self.group_size, dtype=torch.long, device=device)
        was_training = self.policy.training
        self.policy.eval()
        new = self.policy.generate(idx, self.max_new_tokens, temperature=self.temperature, generator=generator)
        self.policy.train(was_training)
        rows, texts = [], []
        for answer in new[:, n_prompt:].tolist():
            cut = answer[: answer.index(eos) + 1] if eos in answer else answer
            rows.append((ids + cut, n_prompt))
            texts.append(self.tokenizer.decode(cut[:-1] if cut and cut[-1] == eos else cut))
        return rows, texts

    def _score(self, text: str, target: str) -> float:
        """The reward of one answer, refused by name unless it is a finite number."""
        value = self.reward(text, target)
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
            name = getattr(self.reward, "__name__", repr(self.reward))
            raise ValueError(f"the reward {name}({text!r}, {target!r}) must return a finite number, got {value!r}")
        return float(value)

    def __call__(self, split: str = "train") -> dict[str, Tensor]:
        self._check_split(split)
        rows, rewards = [], []
        for i in self._rows(split, len(self.pairs[split])):
            prompt, target = self.pairs[split][int(i)]
            group, texts = self.sample(prompt, self.generators[split])
            rows += group
            rewards.append([self._score(text, target) for text in texts])
        ids, n_prompt, lengths = pad_rows(rows, self.tokenizer.eos_id)
        rewards = torch.tensor(rewards, dtype=torch.float64)  # (batch_size, group_size)
        advantages = group_advantages(rewards, scale=self.scale).reshape(-1)
        batch = {
            "ids": ids,
            "n_prompt": n_prompt,
            "lengths": lengths,
            "advantages": advantages,
            "rewards": rewards.reshape(-1),
        }
        return {k: v.to(self.device) for k, v in batch.items()}

    def eval_line(self, step: int, losses: dict[str, float]) -> str:
        """The line a verbose run prints after an evaluation: the mean reward of each split (the
        evaluation's "loss" is ``1 -`` it, so that lower is better as for every loss)."""
        return f"step {step}: train reward {1 - losses['train']:.4f}, val reward {1 - losses['val']:.4f}"

    def loss(self, model: nn.Module, batch: dict) -> Tensor:
        rewards = batch["rewards"]
        if not model.training:
            return 1.0 - rewards.mean()
        ids = batch["ids"]
        mask = answer_mask(batch["n_prompt"], batch["lengths"], ids.shape[1])
        logp = token_logprobs(model, ids, self.temperature)
        ref = self.reference.token_logprobs(ids, self.temperature) if self.beta else None
        out = grpo_loss(
            logp,
            logp.detach(),
            ref,
            batch["advantages"],
            mask,
            clip=self.clip,
            beta=self.beta,
            loss_type=self.loss_type,
        )
        still = (rewards.reshape(-1, self.group_size) == rewards.reshape(-1, self.group_size)[:, :1]).all(1)
        self.last = {"reward": float(rewards.mean()), "kl": float(out["kl"]), "no_signal": float(still.double().mean())}
        return out["loss"]

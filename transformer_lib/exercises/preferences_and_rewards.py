"""Checks for chapter "Preferences and rewards": DPO's loss from four log-probabilities, and
GRPO's advantages, centred and scaled within each prompt's group.

Each check prints one verdict line and returns a :class:`~transformer_lib.exercises.CheckResult`.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from ..preference import dpo_loss, group_advantages
from ._core import ExerciseFailure, call_student, check, fmt, require_finite, require_tensor

__all__ = ["check_dpo_loss", "check_group_advantages"]


# ---------------------------------------------------------------------------------------------
# Exercise 1 of chapter "Preferences and rewards": the DPO loss


def _dpo_mistakes(pc: Tensor, pr: Tensor, rc: Tensor, rr: Tensor, beta: float) -> list[tuple[str, Tensor]]:
    rule = "the loss is the mean over the pairs of -log sigmoid(beta ((pc - rc) - (pr - rr)))"
    margin = beta * ((pc - rc) - (pr - rr))
    return [
        (
            f"you left out the reference: the margin must be measured against where the policy started; {rule}",
            -F.logsigmoid(beta * (pc - pr)).mean(),
        ),
        (
            f"you left out beta, which sets how far the preferences may pull the policy; {rule}",
            -F.logsigmoid((pc - rc) - (pr - rr)).mean(),
        ),
        (f"the sign is reversed: this loss falls as the rejected answer gains; {rule}", -F.logsigmoid(-margin).mean()),
        (f"you summed over the pairs instead of taking their mean; {rule}", -F.logsigmoid(margin).sum()),
        (
            f"you returned log sigmoid without the minus sign: a loss to minimise is its negative; {rule}",
            F.logsigmoid(margin).mean(),
        ),
        (f"you used sigmoid where the loss takes the log of it; {rule}", -torch.sigmoid(margin).mean()),
    ]


@check("check_dpo_loss")
def check_dpo_loss(fn: Callable) -> None:
    """Chapter "Preferences and rewards", exercise 1: check ``fn(pc, pr, rc, rr, beta) -> loss``, DPO's loss.

    ``fn`` is given ``pc``, ``pr``, ``rc`` and ``rr``, float64 tensors ``(B,)``, the summed log-probabilities of
    each pair's chosen and rejected answers under the policy and under the reference. ``fn`` returns
    the mean over the pairs of ``-log sigmoid(beta ((pc - rc) - (pr - rr)))`` as a tensor whose
    gradient reaches ``pc`` and ``pr``; tried with the policy at the reference (the loss is ln 2),
    with large margins (where ``log(sigmoid(x))`` underflows) and with two betas.
    """
    g = torch.Generator().manual_seed(17)
    base = -20 - 5 * torch.rand(4, generator=g, dtype=torch.float64)
    cases = [
        ("the policy at the reference, beta 0.1", (base.clone(), base - 1, base.clone(), base - 1), 0.1),
        ("a policy that moved, beta 0.1", (base + 2, base - 3, base, base - 1), 0.1),
        (
            "a policy that moved, beta 0.5",
            (base + torch.tensor([1.0, -1, 2, 0], dtype=torch.float64), base - 2, base, base - 1),
            0.5,
        ),
        ("a margin of -800 (beta 1)", (base - 400, base + 400, base, base), 1.0),
    ]
    for desc, tensors, beta in cases:
        where = f"for {desc}"
        pc, pr, rc, rr = (t.clone().requires_grad_(i < 2) for i, t in enumerate(tensors))
        got = call_student(fn, (pc, pr, rc, rr, beta), where, inputs="pc, pr, rc, rr", crash_hint="")
        require_tensor(got, where, (), what="the loss", layout="a single number (a 0-dimensional tensor)")
        want = dpo_loss(pc.detach(), pr.detach(), rc, rr, beta)["loss"]
        require_finite(
            got.detach().double(),
            where,
            what="the loss",
            hint="; log(sigmoid(x)) underflows for large negative x: use F.logsigmoid",
        )
        if not math.isclose(got.item(), want.item(), rel_tol=1e-9, abs_tol=1e-9):
            mistake = next(
                (
                    m
                    for m, w in _dpo_mistakes(pc.detach(), pr.detach(), rc, rr, beta)
                    if math.isclose(got.item(), w.item(), rel_tol=1e-9, abs_tol=1e-9)
                ),
                None,
            )
            detail = f"the loss should be {want.item():.6f}, your function returned {got.item():.6f}"
            raise ExerciseFailure(f"{where}, {mistake}; {detail}." if mistake else f"{where}, {detail}.")
        if not got.requires_grad:
            raise ExerciseFailure(
                f"{where}, the loss has no gradient: compute it with torch operations on pc and "
                "pr, without .item() or .detach()."
            )


# ---------------------------------------------------------------------------------------------
# Exercise 2 of chapter "Preferences and rewards": advantages by group


def _advantage_mistakes(r: Tensor) -> list[tuple[str, Tensor]]:
    rule = "each reward minus its group's mean (a row), divided by the group's standard deviation with n - 1, plus 1e-4"
    centred = r - r.mean(1, keepdim=True)
    return [
        (
            f"you centred over the whole batch: a prompt then scores for being easy, not an answer for being good; "
            f"{rule}",
            (r - r.mean()) / (r.std() + 1e-4),
        ),
        (
            f"you divided by the batch's standard deviation; the group's own sets each prompt's scale; {rule}",
            centred / (r.std() + 1e-4),
        ),
        (
            f"you divided by the standard deviation over n (unbiased=False); TRL's uses n - 1; {rule}",
            centred / (r.std(1, unbiased=False, keepdim=True) + 1e-4),
        ),
        (f"you did not divide by the standard deviation (Dr. GRPO's choice, not GRPO's); {rule}", centred),
        (
            f"you did not subtract the group's mean, so every answer of a prompt is pushed the same way; {rule}",
            r / (r.std(1, keepdim=True) + 1e-4),
        ),
        (
            "you left out the 1e-4 added to the standard deviation: a group whose rewards are all equal then "
            f"divides 0 by 0, NaN; {rule}",
            centred / r.std(1, keepdim=True),
        ),
    ]


@check("check_group_advantages")
def check_group_advantages(fn: Callable) -> None:
    """Chapter "Preferences and rewards", exercise 2: check ``fn(rewards (G, n)) -> advantages (G, n)``.

    ``fn`` is given ``rewards``, a float64 tensor ``(G, n)``: the rewards of ``n`` answers to each of
    ``G`` prompts. It returns each reward minus its group's mean (a row), divided by that group's
    standard deviation with Bessel's correction plus ``1e-4``, as TRL's ``scale_rewards="group"``;
    a group whose rewards are all equal gets zeros, never NaN. Compared with
    :func:`transformer_lib.group_advantages`; ``rewards`` must be left unchanged.
    """
    cases = [
        ("rewards (2, 4)", torch.tensor([[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 0.0, 0.5]], dtype=torch.float64)),
        (
            "rewards (3, 4) with an easy, a hard and a mixed prompt",
            torch.tensor([[1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0], [1.0, 0.0, 1.0, 0.0]], dtype=torch.float64),
        ),
        (
            "rewards (2, 8) of partial credit",
            torch.rand(2, 8, generator=torch.Generator().manual_seed(17), dtype=torch.float64),
        ),
    ]
    for desc, r in cases:
        where = f"for {desc}"
        got = call_student(fn, (r.clone(),), where, inputs="rewards", crash_hint="")
        require_tensor(got, where, tuple(r.shape), what="the advantages", layout="(G, n)")
        require_finite(
            got.double(),
            where,
            what="the advantages",
            hint="; a group whose rewards are all equal has std 0: the 1e-4 keeps 0 / 0 away",
        )
        want = group_advantages(r)
        if not torch.allclose(got.double(), want, rtol=1e-6, atol=1e-9):
            mistake = next(
                (m for m, w in _advantage_mistakes(r) if torch.allclose(got.double(), w, rtol=1e-6, atol=1e-9)), None
            )
            detail = f"the advantages should be {fmt(want)}, got {fmt(got.double())}"
            raise ExerciseFailure(f"{where}, {mistake}." if mistake else f"{where}, {detail}.")

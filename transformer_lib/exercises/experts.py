"""Checks for the chapter "Experts": a router's top-k choice with renormalised weights, and the
Switch Transformer's load-balancing loss.

Each check prints one verdict line and returns a :class:`~transformer_lib.exercises.CheckResult`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from ._core import (
    ExerciseFailure,
    call_student,
    check,
    close,
    fmt,
    require_dtype,
    require_finite,
    require_shape,
    require_tensor,
    require_tensors,
)

__all__ = ["check_balancing_loss", "check_route"]


# ---------------------------------------------------------------------------------------------
# Exercise 1 of chapter "Experts": the router's choice and weights


def _top(probs: Tensor, k: int, *, largest: bool = True, renormalise: bool = True) -> tuple[Tensor, Tensor]:
    """``(weights (N, k), chosen (N, k))``: the top (or bottom) k of each row, renormalised or not."""
    values, chosen = probs.topk(k, dim=-1, largest=largest)
    return (values / values.sum(-1, keepdim=True) if renormalise else values), chosen


def _routing(logits: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """The right answer: a softmax over the experts, the top k, their probabilities renormalised."""
    return _top(logits.softmax(-1), k)


def _by_expert(weights: Tensor, chosen: Tensor) -> tuple[Tensor, Tensor]:
    """Each row's k slots sorted by expert index, so that routings in any slot order compare equal."""
    order = chosen.argsort(dim=-1)
    return weights.detach().double().gather(-1, order), chosen.gather(-1, order)


def _same_routing(weights: Tensor, chosen: Tensor, other_weights: Tensor, other_chosen: Tensor) -> bool:
    (w, c), (ow, oc) = _by_expert(weights, chosen), _by_expert(other_weights, other_chosen)
    return torch.equal(c.long(), oc.long()) and close(w, ow)


def _route_mistakes(logits: Tensor, k: int) -> list[tuple[str, Tensor, Tensor]]:
    """Likely wrong routings of ``logits (N, E)``, each ``(what went wrong, weights, chosen)``."""
    probs = logits.softmax(-1)
    _, chosen = probs.topk(k, dim=-1)
    raw = logits.gather(-1, chosen)
    over_tokens = (
        "you took the softmax over the tokens (dim 0); it goes over the experts, the last dimension: "
        "probs = logits.softmax(dim=-1), one distribution over the E experts for each token"
    )
    from_logits = (
        "you took the weights from the logits; take them from the probabilities, softmax(logits) at the "
        "chosen experts, and renormalise those k"
    )
    smallest = (
        "you chose the k smallest; a token goes to its k most probable experts: topk(..., k, dim=-1), whose "
        "default is largest=True"
    )
    per_token = logits.softmax(0)  # (N, E): each expert's distribution over the tokens
    renormalise = " (and renormalise the k chosen weights to sum to 1)"
    return [
        (over_tokens, *_top(per_token, k)),
        (over_tokens + renormalise, *_top(per_token, k, renormalise=False)),
        (
            "you left the weights unnormalised: divide the k chosen probabilities by their sum, so that each "
            "token's weights add up to 1 (Qwen3-MoE's norm_topk_prob, Mixtral)",
            *_top(probs, k, renormalise=False),
        ),
        (from_logits, raw, chosen),
        (from_logits, raw / raw.sum(-1, keepdim=True), chosen),
        (smallest, *_top(probs, k, largest=False)),
        (smallest + renormalise, *_top(probs, k, largest=False, renormalise=False)),
    ]


def _token_detail(logits: Tensor, weights: Tensor, chosen: Tensor, right_w: Tensor, right_c: Tensor) -> str:
    """The first token routed wrongly: its logits, the experts and weights expected and got."""
    (w, c), (rw, rc) = _by_expert(weights, chosen), _by_expert(right_w, right_c)
    bad = (c.long() != rc).any(-1) | ~torch.isclose(w, rw, atol=1e-5, rtol=1e-4).all(-1)
    i = int(bad.nonzero()[0, 0]) if bool(bad.any()) else 0
    return (
        f"token {i} (logits {fmt(logits[i])}) should go to experts {fmt(rc[i])} with weights {fmt(rw[i])}, "
        f"got experts {fmt(c[i])} with weights {fmt(w[i])}"
    )


def _require_experts(chosen: Tensor, E: int, where: str) -> None:
    """Fail unless every row of ``chosen`` holds k different experts in ``0 .. E-1``."""
    outside = (chosen < 0) | (chosen >= E)
    if bool(outside.any()):
        i, j = (int(x) for x in outside.nonzero()[0])
        raise ExerciseFailure(
            f"{where}, chosen[{i}, {j}] = {int(chosen[i, j])} is not an expert: the experts are 0 to E-1 = {E - 1} "
            "(chosen holds the indices of the top k along the experts' dimension)."
        )
    ordered = chosen.sort(dim=-1).values
    repeated = (ordered[:, 1:] == ordered[:, :-1]).any(-1)
    if bool(repeated.any()):
        i = int(repeated.nonzero()[0, 0])
        raise ExerciseFailure(
            f"{where}, token {i} is sent to the same expert twice (chosen[{i}] = {fmt(chosen[i])}); its k experts "
            "must be k different ones."
        )


@check("check_route")
def check_route(fn: Callable) -> None:
    """Chapter "Experts", exercise 1: check ``fn(logits (N, E), k) -> (weights (N, k), chosen (N, k))``, a router.

    ``fn`` is given the router's logits, one row of ``E`` per token, and ``k``, the experts each
    token goes to. It returns the pair ``(weights, chosen)``: a softmax over the experts (the last
    dimension), the ``k`` most probable experts of each token as indices (an integer tensor), and
    their probabilities renormalised to sum to 1 (Qwen3-MoE with ``norm_topk_prob``, Mixtral). The
    ``k`` slots may come in any order, as long as ``weights[i, j]`` is the weight of expert
    ``chosen[i, j]``. Compared with that routing on a few tokens, ``k = 1``, ``k = E``, a larger
    float64 batch and logits near 100, which overflow an unguarded ``exp``; ``logits`` must be left
    unchanged.
    """
    g = torch.Generator().manual_seed(20)
    r = lambda *shape, dtype=torch.float32: torch.randn(*shape, generator=g, dtype=dtype)  # noqa: E731
    cases = [
        ("3 tokens, 4 experts, k = 2", r(3, 4), 2),
        ("k = 1: 4 tokens, 3 experts", r(4, 3), 1),
        ("k = E: every expert chosen, 2 tokens, 3 experts", r(2, 3), 3),
        ("float64 logits of 16 tokens, 8 experts, k = 3", r(16, 8, dtype=torch.float64), 3),
        ("logits near 100: 3 tokens, 4 experts, k = 2", 100 + 3 * r(3, 4), 2),
    ]
    for desc, logits, k in cases:
        where = f"for {desc}"
        N, E = logits.shape
        out = call_student(
            fn,
            (logits, k),
            where,
            inputs="the logits",
            crash_hint="The logits are (N, E), one row per token: the softmax and the top k both run along the "
            "last dimension (dim=-1), and topk returns (values, indices), each (N, k).",
            in_place_hint="use logits.softmax(-1), not logits.softmax_ or exp_ (the router keeps its logits)",
        )
        weights, chosen = require_tensors(out, where, ("weights", "chosen"))
        if not weights.is_floating_point() and chosen.is_floating_point():
            raise ExerciseFailure(
                f"{where}, the weights are integers and chosen is floating-point: you returned (chosen, weights); "
                "return (weights, chosen)."
            )
        hint = f": one {{}} for each of a token's k experts, (N, k) = ({N}, {k})" + (
            ", not every expert's" if weights.shape == logits.shape and k != E else ""
        )
        require_shape(weights, (N, k), where, what="the weights", hint=hint.format("weight"))
        require_shape(chosen, (N, k), where, what="chosen", hint=hint.format("expert index"))
        require_dtype(weights, logits.dtype, where, what="the weights", hint="; keep the logits' dtype")
        require_dtype(
            chosen,
            "integer",
            where,
            what="chosen",
            hint=": chosen holds the experts' indices, as topk's .indices (torch.int64)",
        )
        _require_experts(chosen, E, where)
        if not torch.isfinite(weights).all():
            raise ExerciseFailure(
                f"{where}, the weights hold NaN or inf ({fmt(weights)}); exp of a large logit overflows: use "
                "torch.softmax, which subtracts each row's largest logit first."
            )
        l64 = logits.double()
        right_w, right_c = _routing(l64, k)
        if _same_routing(weights, chosen, right_w, right_c):
            continue
        detail = _token_detail(l64, weights, chosen, right_w, right_c)
        for mistake, wrong_w, wrong_c in _route_mistakes(l64, k):
            differs = not _same_routing(wrong_w, wrong_c, right_w, right_c)
            if differs and _same_routing(weights, chosen, wrong_w, wrong_c):
                raise ExerciseFailure(f"{where}, {mistake}; {detail}.")
        c, rc = _by_expert(weights, chosen)[1], _by_expert(right_w, right_c)[1]
        if torch.equal(c.long(), rc) and close(weights.detach().double().sort(-1).values, right_w.sort(-1).values):
            raise ExerciseFailure(
                f"{where}, the weights and chosen disagree: weights[i, j] must be the weight of expert chosen[i, j] "
                f"(the k slots may come in any order, the same in both); {detail}."
            )
        sums = weights.detach().double().sum(-1)
        if not close(sums, torch.ones_like(sums)):
            i = int((~torch.isclose(sums, torch.ones_like(sums), atol=1e-5)).nonzero()[0, 0])
            raise ExerciseFailure(
                f"{where}, {detail}; a token's k weights must add up to 1, token {i}'s add up to {float(sums[i]):.4g}."
            )
        raise ExerciseFailure(f"{where}, {detail}.")


# ---------------------------------------------------------------------------------------------
# Exercise 2 of chapter "Experts": the Switch Transformer's load-balancing loss


def _counts(chosen: Tensor, E: int) -> Tensor:
    """``(E,)`` float64: how many of the ``N k`` assignments each expert got."""
    return torch.bincount(chosen.reshape(-1).long(), minlength=E).double()


def _balancing_loss(scores: Tensor, chosen: Tensor) -> Tensor:
    """``E * sum_i f_i P_i``, ``f_i`` expert i's share of the ``N k`` assignments, ``P_i`` its mean score."""
    (N, E), k = scores.shape, chosen.shape[1]
    return E * (_counts(chosen, E) / (N * k) * scores.mean(0)).sum()


def _balancing_mistakes(scores: Tensor, chosen: Tensor) -> list[tuple[str, Tensor]]:
    """Likely wrong losses of ``scores (N, E)`` (float64) and ``chosen (N, k)``, each ``(what went wrong, value)``."""
    (N, E), k = scores.shape, chosen.shape[1]
    counts, P = _counts(chosen, E), scores.mean(0)
    f = counts / (N * k)
    picked = F.one_hot(chosen.long(), E).sum(1).double() * scores  # (N, E): the scores of the chosen experts only
    per_chooser = torch.where(counts > 0, picked.sum(0) / counts.clamp(min=1), 0.0)
    only_chosen = (
        "you took P_i from the chosen experts' weights only; P_i is expert i's mean score over all N tokens, "
        "scores.mean(dim=0), whether or not a token chose it: that part is what carries the gradient to every "
        "expert's score"
    )
    return [
        (
            f"you counted per token: f_i is expert i's share of the N k assignments, counts / (N k), not of the "
            f"N tokens (transformers' load_balancing_loss_func counts so, and its balanced router scores k = {k})",
            E * (counts / N * P).sum(),
        ),
        (
            "the factor E is missing: the loss is E * sum_i f_i P_i, which makes a perfectly balanced router score "
            "1 whatever the number of experts",
            (f * P).sum(),
        ),
        (only_chosen, E * (f * picked.sum(0) / N).sum()),
        (only_chosen, E * (f * per_chooser).sum()),
        (
            "you used the raw counts as f_i; f_i is a share: expert i's count of assignments divided by N k, "
            "the number of assignments",
            E * (counts * P).sum(),
        ),
    ]


def _no_gradient(where: str, how: str) -> ExerciseFailure:
    return ExerciseFailure(
        f"{where}, {how}: no gradient reaches the scores. The loss must be differentiable in scores, through "
        "P_i = scores.mean(dim=0) (f_i comes from counts and carries none): do not .detach() it, .item() it, "
        "rebuild it with torch.tensor(...) or compute it under torch.no_grad()."
    )


@check("check_balancing_loss")
def check_balancing_loss(fn: Callable) -> None:
    """Chapter "Experts", exercise 2: check ``fn(scores (N, E), chosen (N, k)) -> ()``, the Switch balancing loss.

    ``fn`` is given the router's scores (each token's probabilities over the ``E`` experts) and
    the experts each token was sent to (integer indices); it returns ``E * sum_i f_i P_i``, a
    0-dimensional tensor, where ``f_i`` is expert ``i``'s share of the ``N k`` assignments and
    ``P_i`` its mean score over the ``N`` tokens. A perfectly balanced router scores 1. The loss
    must be differentiable in ``scores``: its gradient is ``E f_i / N`` in column ``i`` (``f_i``,
    made of counts, carries none). Compared on a perfectly balanced router, a random one, ``k =
    1``, an expert that no token chose and float64; the inputs must be left unchanged.
    """
    g = torch.Generator().manual_seed(202)

    def router(N: int, E: int, k: int, dtype=torch.float32, avoid: int | None = None) -> tuple[Tensor, Tensor]:
        logits = torch.randn(N, E, generator=g, dtype=dtype)
        if avoid is not None:
            logits[:, avoid] -= 10.0
        scores = logits.softmax(-1)
        return scores, scores.topk(k, dim=-1).indices

    balanced = torch.tensor([[0.3, 0.3, 0.2, 0.2], [0.2, 0.2, 0.3, 0.3]]), torch.tensor([[0, 1], [2, 3]])
    cases = [
        ("a perfectly balanced router: 2 tokens, 4 experts, k = 2", *balanced),
        ("5 tokens, 4 experts, k = 2", *router(5, 4, 2)),
        ("k = 1: 6 tokens, 3 experts", *router(6, 3, 1)),
        ("an expert that no token chose: 4 tokens, 4 experts, k = 1", *router(4, 4, 1, avoid=3)),
        ("float64 scores of 16 tokens, 8 experts, k = 3", *router(16, 8, 3, torch.float64)),
    ]
    for desc, scores, chosen in cases:
        where = f"for {desc}"
        (N, E), k = scores.shape, chosen.shape[1]
        leaf = scores.clone().requires_grad_(True)
        loss = call_student(
            fn,
            (leaf, chosen),
            where,
            inputs="scores or chosen",
            crash_hint="scores is (N, E) and chosen (N, k), integer indices: count each expert's assignments "
            "(torch.bincount(chosen.flatten(), minlength=E), or F.one_hot(chosen, E)), and average scores over "
            "the tokens (dim 0).",
            in_place_hint="build new tensors (the router's scores are used again)",
        )
        if isinstance(loss, float | int) and not isinstance(loss, bool):
            raise _no_gradient(where, f"your function returned {type(loss).__name__} {loss:.6g}, not a tensor")
        require_tensor(loss, where, what="the loss")
        require_shape(
            loss, (), where, what="the loss value", hint=": a single number, E * sum_i f_i P_i summed over the experts"
        )
        require_dtype(
            loss,
            scores.dtype,
            where,
            what="the loss value",
            hint="; keep the scores' dtype (turn the counts into it with .to(scores.dtype))",
        )
        require_finite(
            loss,
            where,
            what="the loss",
            hint="; an expert that no token chose has f_i = 0: divide its count by N k, never by its own count",
        )
        s64 = scores.double()
        right = _balancing_loss(s64, chosen)
        if not close(loss, right):
            got = float(loss.detach())
            detail = f"the loss should be {float(right):.6g}, got {got:.6g}"
            if desc.startswith("a perfectly balanced"):
                detail = (
                    f"a perfectly balanced router (f_i = P_i = 1/E = {1 / E:.4g} for every expert) scores 1, "
                    f"got {got:.6g}"
                )
            for mistake, wrong in _balancing_mistakes(s64, chosen):
                if close(loss, wrong) and not close(wrong, right):
                    raise ExerciseFailure(f"{where}, {mistake}; {detail}.")
            raise ExerciseFailure(f"{where}, {detail}.")
        if not loss.requires_grad:
            raise _no_gradient(where, "your loss has no gradient (requires_grad is False)")
        (grad,) = torch.autograd.grad(loss, leaf, allow_unused=True)
        if grad is None:
            raise _no_gradient(where, "your loss does not depend on scores")
        expected = (E * _counts(chosen, E) / (N * k) / N).expand(N, E)
        if not close(grad, expected):
            raise ExerciseFailure(
                f"{where}, the loss is right but its gradient is not: d loss / d scores[n, i] must be E f_i / N, "
                f"{fmt(expected[0])} in every row, got {fmt(grad[0])} in row 0; only P_i = scores.mean(dim=0) "
                "carries the gradient, f_i (counts) carries none."
            )

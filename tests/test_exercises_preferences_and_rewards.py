"""The chapter "Preferences and rewards" checks accept right answers and reject plausible wrong ones with the right
message."""

import pytest
import torch
import torch.nn.functional as F
from _exercise_cases import FIELDS, Table, assert_verdict, case, stub

import transformer_lib as tl
from transformer_lib.exercises import preferences_and_rewards

DPO, ADV = preferences_and_rewards.check_dpo_loss, preferences_and_rewards.check_group_advantages
CASES = Table()


# --- exercise 1 of chapter "Preferences and rewards": the DPO loss
# ---------------------------------------------------------------


@CASES.add(DPO, "passed")
def dpo_model_answer(pc, pr, rc, rr, beta):
    return -F.logsigmoid(beta * ((pc - rc) - (pr - rr))).mean()


@CASES.add(DPO, "passed")
def dpo_softplus(pc, pr, rc, rr, beta):
    return F.softplus(-beta * ((pc - rc) - (pr - rr))).mean()


@CASES.add(DPO, "failed", "left out the reference")
def dpo_no_reference(pc, pr, rc, rr, beta):
    return -F.logsigmoid(beta * (pc - pr)).mean()


@CASES.add(DPO, "failed", "left out beta")
def dpo_no_beta(pc, pr, rc, rr, beta):
    return -F.logsigmoid((pc - rc) - (pr - rr)).mean()


@CASES.add(DPO, "failed", "sign is reversed")
def dpo_reversed(pc, pr, rc, rr, beta):
    return -F.logsigmoid(beta * ((pr - rr) - (pc - rc))).mean()


@CASES.add(DPO, "failed", "summed over the pairs")
def dpo_summed(pc, pr, rc, rr, beta):
    return -F.logsigmoid(beta * ((pc - rc) - (pr - rr))).sum()


@CASES.add(DPO, "failed", "without the minus sign")
def dpo_no_minus(pc, pr, rc, rr, beta):
    return F.logsigmoid(beta * ((pc - rc) - (pr - rr))).mean()


@CASES.add(DPO, "failed", "NaN or inf", "F.logsigmoid")
def dpo_log_of_sigmoid(pc, pr, rc, rr, beta):
    return -torch.log(torch.sigmoid(beta * ((pc - rc) - (pr - rr)))).mean()


@CASES.add(DPO, "failed", "has no gradient")
def dpo_detached(pc, pr, rc, rr, beta):
    return dpo_model_answer(pc, pr, rc, rr, beta).detach()


@CASES.add(DPO, "failed", "returned a float")
def dpo_float(pc, pr, rc, rr, beta):
    return dpo_model_answer(pc, pr, rc, rr, beta).item()


# --- exercise 2 of chapter "Preferences and rewards": advantages by group
# --------------------------------------------------------


@CASES.add(ADV, "passed")
def adv_model_answer(rewards):
    return (rewards - rewards.mean(1, keepdim=True)) / (rewards.std(1, keepdim=True) + 1e-4)


@CASES.add(ADV, "failed", "centred over the whole batch")
def adv_batch(rewards):
    return (rewards - rewards.mean()) / (rewards.std() + 1e-4)


@CASES.add(ADV, "failed", "batch's standard deviation")
def adv_batch_std(rewards):
    return (rewards - rewards.mean(1, keepdim=True)) / (rewards.std() + 1e-4)


@CASES.add(ADV, "failed", "unbiased=False")
def adv_population_std(rewards):
    return (rewards - rewards.mean(1, keepdim=True)) / (rewards.std(1, unbiased=False, keepdim=True) + 1e-4)


@CASES.add(ADV, "failed", "Dr. GRPO")
def adv_not_scaled(rewards):
    return rewards - rewards.mean(1, keepdim=True)


@CASES.add(ADV, "failed", "did not subtract the group's mean")
def adv_not_centred(rewards):
    return rewards / (rewards.std(1, keepdim=True) + 1e-4)


@CASES.add(ADV, "failed", "left out the 1e-4")
def adv_no_eps(rewards):
    return (rewards - rewards.mean(1, keepdim=True)) / rewards.std(1, keepdim=True)


@CASES.add(ADV, "failed", "changed rewards in place")
def adv_in_place(rewards):
    out = adv_model_answer(rewards)
    rewards.zero_()
    return out


@CASES.add(ADV, "failed", "shape")
def adv_flat(rewards):
    return adv_model_answer(rewards).flatten()


def test_the_library_passes_its_own_checks():
    assert DPO(lambda pc, pr, rc, rr, beta: tl.dpo_loss(pc, pr, rc, rr, beta)["loss"], verbose=False)
    assert ADV(tl.group_advantages, verbose=False)


STUB_CASES = [case(DPO, stub, "not implemented"), case(ADV, stub, "not implemented")]


@pytest.mark.parametrize(FIELDS, CASES + STUB_CASES)
def test_verdict(check, fn, status, phrases):
    assert_verdict(check, fn, status, phrases)

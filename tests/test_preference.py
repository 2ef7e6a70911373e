"""Tests of the chapter on preferences and rewards (transformer_lib/preference.py): an answer's
log-probability, DPO's loss and GRPO's, each equal to TRL 1.16's ``DPOTrainer`` and
``GRPOTrainer`` on chapter "Fine-tuning"'s shipped GPT (exported to ``transformers``), and their properties:
``ln 2`` at the start, the prompt and the padding never counted, a LoRA policy's reference equal to
its base model bit for bit, zero advantages for a group of equal rewards, the k3 estimator against
the exact KL, and what GRPO's loss is at its first step.

How TRL is driven (no sampling, and no training loop but for DPO's first logged loss):

- **DPO.** A ``DPOTrainer`` over three (prompt, chosen, rejected) texts tokenises them as it trains
  (its ``train_dataset``); its own collator makes the batch, ``compute_ref_log_probs(model, batch)``
  gives its summed answer log-probabilities for a model, and ``compute_loss`` its loss.
- **GRPO.** ``GRPOTrainer._compute_loss(model, inputs)`` on an ``inputs`` dict built here as its
  sampling step builds it (prompt and completion ids and masks, advantages, the old and reference
  per-token log-probabilities, ``num_items_in_batch``). For the advantages, its sampling step
  ``_generate_and_score_completions`` runs with ``_generate`` replaced by a function returning fixed
  completions, and a reward function that returns a column of the dataset.

TRL computes every log-probability in float32 (its fused LM head rounds the logits to float32, even
for a float64 model), so the book's float64 values agree with it to float32's precision; fed TRL's
own log-probabilities, the book's losses agree with TRL's to float64's (GRPO) or float32's (DPO,
whose loss TRL computes in float32). The parity tests keep the models in eval mode: TRL's "eval"
mode divides by no gradient-accumulation count. Two settings matter: ``bf16=False`` (TRL's configs
turn bf16 on wherever fp16 is off, and on a CPU its autocast would compute the log-probabilities in
bfloat16), and GRPO's prompts of one length in tokens: TRL left-pads the prompts and its loss passes
the model no positions, so a GPT-2's learned positions shift with the padding (by about 2 nats per
token on this model) where the sampler's did not.
"""

import copy
import math

import pytest
import torch

import transformer_lib as tl
from transformer_lib.data import PROMPT_END
from transformer_lib.preference import (
    adapters_off,
    answer_mask,
    dpo_loss,
    exact_kl,
    group_advantages,
    grpo_loss,
    kl_k3,
    pad_rows,
    reference_logprobs,
    sequence_logprobs,
    token_logprobs,
)

pytestmark = pytest.mark.usefixtures("one_thread")

LN2 = math.log(2)
LN2_FLOAT32 = float(torch.tensor(LN2, dtype=torch.float32))
# the dates of chapter "Fine-tuning": the answers start with a digit, so that the prompt's last token (the space of
# PROMPT_END) never merges with the answer's first when TRL tokenises prompt + answer whole
TRIPLES = [
    ("3 March 2021", "2021-03-03", "2021-03-30"),
    ("9 March 2018", "2018-03-09", "2018-3-9"),
    ("12/05/1999", "1999-12-05", "05/12/1999"),
]
# GRPO's rollouts: two prompts of the same number of tokens (no left padding, see test below) with
# four answers of several lengths each, and their rewards
PROMPTS = ["3 March 2021", "9 March 2018"]
ANSWERS = [["2021-03-03", "2021-3-3", "03/03/2021", "2021-03-30"], ["2018-03-09", "2018-09-03", "2018-3-9", "9/3/18"]]
REWARDS = [[1.0, 0.5, 0.0, 0.0], [1.0, 0.0, 0.5, 0.25]]


@pytest.fixture(scope="module")
def base():
    model, tokenizer, _ = tl.load_checkpoint(tl.PRETRAINED_PATH)
    return model.double().eval(), tokenizer


def perturbed(model, seed, scale=0.02):
    """A copy of ``model`` with every weight moved by ``scale`` times Gaussian noise: a trained policy."""
    g = torch.Generator().manual_seed(seed)
    copied = copy.deepcopy(model)
    with torch.no_grad():
        for p in copied.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return copied


def pair_batches(tokenizer, triples=TRIPLES):
    """``(chosen, rejected)``, each ``(ids, n_prompt, lengths)`` from the layout of chapter "Fine-tuning"."""
    chosen = pad_rows([tl.encode_pair(tokenizer, p, c) for p, c, _ in triples], tokenizer.eos_id)
    rejected = pad_rows([tl.encode_pair(tokenizer, p, r) for p, _, r in triples], tokenizer.eos_id)
    return chosen, rejected


# An answer's log-probability ---------------------------------------------------------------------


def test_an_answers_log_probability_is_the_chain_rule_over_its_tokens_only(base):
    model, tokenizer = base
    (ids, n_prompt, lengths), _ = pair_batches(tokenizer)
    got = sequence_logprobs(model, ids, n_prompt, lengths)
    assert got.dtype == torch.float64 and got.shape == (3,)
    for i in range(3):
        row = ids[i : i + 1, : lengths[i]]
        logp = torch.log_softmax(model(row)[0][0].double(), -1)
        want = sum(logp[t - 1, row[0, t]].item() for t in range(int(n_prompt[i]), int(lengths[i])))
        assert got[i].item() == pytest.approx(want, abs=1e-12)
        # the prompt's own tokens are not counted: the whole row's log-probability minus the prompt's
        whole = sequence_logprobs(model, row, [1], [lengths[i]])
        prompt = sequence_logprobs(model, row[:, : n_prompt[i]], [1], [n_prompt[i]])
        assert got[i].item() == pytest.approx((whole - prompt).item(), abs=1e-12)
    mean = sequence_logprobs(model, ids, n_prompt, lengths, average=True)
    torch.testing.assert_close(mean, got / (lengths - n_prompt), rtol=0, atol=1e-15)


def test_the_padding_and_the_other_rows_change_nothing(base):
    model, tokenizer = base
    (ids, n_prompt, lengths), _ = pair_batches(tokenizer)
    want = sequence_logprobs(model, ids, n_prompt, lengths)
    noisy = ids.clone()
    for i in range(len(ids)):
        noisy[i, lengths[i] :] = torch.arange(int(ids.shape[1] - lengths[i])) + 7  # any padding
    wider = torch.cat([noisy, torch.full((3, 5), 3)], dim=1)
    # equal up to float64 rounding: a wider batch may block the matrix products' sums differently
    # (with AVX-512 kernels they differ in the last bits), but no padding token is ever read
    torch.testing.assert_close(sequence_logprobs(model, wider, n_prompt, lengths), want, rtol=1e-12, atol=0)
    for i in range(3):  # each row alone, unpadded
        alone = sequence_logprobs(model, ids[i : i + 1, : lengths[i]], n_prompt[i : i + 1], lengths[i : i + 1])
        assert alone.item() == pytest.approx(want[i].item(), abs=1e-12)


def test_the_answer_mask_marks_the_answer_tokens_as_token_logprobs_lays_them():
    mask = answer_mask([2, 1], [4, 3], 5)
    assert mask.tolist() == [[False, True, True, False], [True, True, False, False]]
    model = tl.GPT(tl.GPTConfig(vocab_size=11, context_len=8, n_layers=1, d_model=8, n_heads=2)).double()
    assert token_logprobs(model, torch.zeros(2, 5, dtype=torch.long)).shape == (2, 4)


# DPO ---------------------------------------------------------------------------------------------


def test_dpo_loss_is_the_formula_and_ln2_where_the_policy_is_the_reference(gen):
    pc, pr, rc, rr = (-10 * torch.rand(5, generator=gen, dtype=torch.float64) for _ in range(4))
    out = dpo_loss(pc, pr, rc, rr, beta=0.3)
    z = 0.3 * ((pc - rc) - (pr - rr))
    assert out["loss"].item() == pytest.approx(torch.log1p(torch.exp(-z)).mean().item(), abs=1e-15)
    torch.testing.assert_close(out["margin"], out["chosen_reward"] - out["rejected_reward"], rtol=0, atol=0)
    assert out["accuracy"].item() == (z > 0).double().mean().item()
    assert dpo_loss(pc, pr, pc, pr, beta=0.3)["loss"].item() == LN2  # exactly
    assert dpo_loss(pc, pr, pc.clone(), pr.clone(), beta=123.0)["loss"].item() == LN2


def test_the_dpo_gradient_raises_the_chosen_and_lowers_the_rejected(gen):
    pc, pr = (torch.full((3,), -5.0, dtype=torch.float64, requires_grad=True) for _ in range(2))
    ref = torch.full((3,), -5.0, dtype=torch.float64)
    dpo_loss(pc, pr, ref, ref, beta=0.1)["loss"].backward()
    # at the start sigmoid(0) = 1/2, so each pair's gradient is beta / 2, over the batch of 3
    torch.testing.assert_close(pc.grad, torch.full((3,), -0.1 / 2 / 3, dtype=torch.float64))
    torch.testing.assert_close(pr.grad, -pc.grad)


# The reference -------------------------------------------------------------------------------------


def lora_policy(model, randomise=True):
    policy = copy.deepcopy(model)
    tl.add_lora(policy, tl.lora_targets(policy), rank=4, alpha=8)
    if randomise:
        g = torch.Generator().manual_seed(3)
        with torch.no_grad():
            for lora in tl.lora_weights(policy).values():
                lora.B.copy_(0.05 * torch.randn(lora.B.shape, generator=g, dtype=lora.B.dtype))
    return policy


def test_a_lora_policys_reference_is_its_base_model_bit_for_bit(base):
    model, tokenizer = base
    chosen, _ = pair_batches(tokenizer)
    want = sequence_logprobs(model, *chosen)
    policy = lora_policy(model)
    assert not torch.allclose(sequence_logprobs(policy, *chosen), want)  # the adapters do change it
    assert torch.equal(reference_logprobs(policy, *chosen), want)
    tl.add_token_rows(policy, [3, 5, 7], reinit=True)  # the rows trained beside the adapters are off too
    assert torch.equal(reference_logprobs(policy, *chosen), want)
    tl.merge_lora(policy)  # a merged adapter gives back the weight it was merged into
    assert torch.equal(reference_logprobs(policy, *chosen), want)
    with pytest.raises(ValueError, match="no LoRA adapters.*frozen copy"):
        reference_logprobs(model, *chosen)


def test_dpo_starts_at_ln2_with_new_adapters_and_its_graph_survives_the_reference(base):
    model, tokenizer = base
    chosen, rejected = pair_batches(tokenizer)
    policy = lora_policy(model, randomise=False)  # B = 0: the policy starts at the reference
    pc, pr = sequence_logprobs(policy, *chosen), sequence_logprobs(policy, *rejected)
    rc, rr = reference_logprobs(policy, *chosen), reference_logprobs(policy, *rejected)
    assert not rc.requires_grad and pc.requires_grad
    out = dpo_loss(pc, pr, rc, rr, beta=0.1)
    assert out["loss"].item() == LN2 and out["margin"].abs().max().item() == 0
    out["loss"].backward()  # the adapters were switched off and on again in between: nothing was written
    grads = [lora.B.grad for lora in tl.lora_weights(policy).values()]
    assert all(g is not None for g in grads) and any(g.abs().max() > 0 for g in grads)
    assert torch.equal(sequence_logprobs(policy, *chosen), pc.detach())  # the adapters are on again
    with pytest.raises(RuntimeError, match="inside"), adapters_off(policy):
        raise RuntimeError("inside")
    assert all(type(lora).forward is lora.forward.__func__ for lora in tl.lora_weights(policy).values())


# GRPO: advantages, KL, the loss -------------------------------------------------------------------


def test_group_advantages_centre_and_scale_each_group():
    r = torch.tensor([[1.0, 0.0, 0.5, 0.0], [0.1, 0.1, 0.1, 0.1], [3.0, 1.0, 2.0, 6.0]], dtype=torch.float64)
    centred = r - r.mean(1, keepdim=True)
    group = group_advantages(r)
    assert group[1].tolist() == [0.0] * 4  # equal rewards: exactly 0 (their mean is not exactly 0.1), no NaN
    torch.testing.assert_close(group[[0, 2]], (centred / (r.std(1, keepdim=True) + 1e-4))[[0, 2]])
    torch.testing.assert_close(group.sum(1), torch.zeros(3, dtype=torch.float64), rtol=0, atol=1e-15)
    none = group_advantages(r, scale="none")
    assert none[1].tolist() == [0.0] * 4 and torch.allclose(none[[0, 2]], centred[[0, 2]], rtol=0, atol=0)
    batch = group_advantages(r, scale="batch", eps=0.0)
    torch.testing.assert_close(batch[[0, 2]], (centred / r.std())[[0, 2]])
    assert group_advantages([[2, 2], [0.5, 1]]).dtype == torch.float64
    assert group_advantages(torch.tensor([[2, 2], [0, 1]])).dtype == torch.float64
    assert group_advantages(torch.ones(2, 3, dtype=torch.float32)).dtype == torch.float32
    for ragged in ([[1.0, 0.0], [1.0]], [[1.0, "a"], [0.0, 1.0]]):
        with pytest.raises(ValueError, match="rewards must be numbers in G groups of one size n, got"):
            group_advantages(ragged)


def test_k3_is_never_negative_and_its_mean_over_samples_is_the_exact_kl(gen):
    d = torch.cat([torch.randn(10_000, generator=gen, dtype=torch.float64) * s for s in (1e-12, 1e-6, 1e-2, 3.0)])
    assert (kl_k3(torch.zeros_like(d), d) >= 0).all() and kl_k3(d, d).abs().max().item() == 0
    logits_new, logits_ref = (2 * torch.randn(50, generator=gen, dtype=torch.float64) for _ in range(2))
    p = torch.softmax(logits_new, -1)
    exact = exact_kl(logits_new[None, None], logits_ref[None, None]).item()
    torch.testing.assert_close(exact, (p * (p.log() - torch.log_softmax(logits_ref, -1))).sum().item())
    tokens = torch.multinomial(p, 200_000, replacement=True, generator=gen)
    logp_new, logp_ref = torch.log_softmax(logits_new, -1)[tokens], torch.log_softmax(logits_ref, -1)[tokens]
    k3 = kl_k3(logp_new, logp_ref)
    assert abs(k3.mean().item() - exact) < 4 * k3.std().item() / math.sqrt(len(k3))  # unbiased
    mask = torch.tensor([[True, False]])
    assert exact_kl(torch.stack([logits_new, logits_new])[None], torch.stack([logits_ref] * 2)[None], mask)[0, 1] == 0


def first_step(lengths, rewards, loss_type, beta=0.04):
    """GRPO's loss where ``logp_new == logp_old == logp_ref``, and the gradient on ``logp_new``."""
    g = torch.Generator().manual_seed(0)
    T = max(lengths) + 2
    logp = -torch.rand(len(lengths), T, generator=g, dtype=torch.float64)
    logp.requires_grad_(True)
    mask = torch.arange(T)[None] < torch.tensor(lengths)[:, None]
    A = group_advantages(torch.tensor(rewards, dtype=torch.float64)).flatten()
    out = grpo_loss(logp, logp.detach(), logp.detach(), A, mask, beta=beta, loss_type=loss_type)
    out["loss"].backward()
    return out, A, mask, logp.grad


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dapo"])
def test_at_the_first_step_the_loss_is_minus_the_weighted_mean_advantage(loss_type):
    lengths, rewards = [3, 5, 2, 7, 4, 4], [[1.0, 0.0, 0.3], [0.2, 0.9, 0.4]]
    out, A, mask, grad = first_step(lengths, rewards, loss_type)
    n = torch.tensor(lengths, dtype=torch.float64)
    weights = torch.full_like(n, 1 / len(n)) if loss_type == "grpo" else n / n.sum()  # per answer, per token
    assert out["kl"].item() == 0 and out["clipped"].item() == 0
    assert out["loss"].item() == pytest.approx(-(weights * A).sum().item(), abs=1e-15)
    if loss_type == "grpo":  # the answers' advantages sum to 0 in each group, whatever their lengths
        assert abs(out["loss"].item()) < 1e-15
    else:  # one mean over the tokens: a longer answer weighs more, and the loss is not 0
        assert abs(out["loss"].item()) > 1e-3
        equal, A2, _, _ = first_step([4] * 6, rewards, loss_type)
        assert abs(equal["loss"].item()) < 1e-15
    # the gradient is not 0: -A / (its length x B) per answer token ("grpo"), -A / all tokens (the others)
    per_token = -A[:, None] * (1 / (n[:, None] * len(n)) if loss_type == "grpo" else 1 / n.sum())
    torch.testing.assert_close(grad, torch.where(mask, per_token, 0.0), rtol=0, atol=1e-15)
    assert grad.abs().max() > 0.01


def test_the_clip_stops_the_gradient_of_a_token_that_moved_too_far():
    logp_old = torch.zeros(2, 3, dtype=torch.float64)
    logp_new = torch.tensor([[0.5, 0.0, -0.5], [0.5, 0.0, -0.5]], dtype=torch.float64, requires_grad=True)
    mask = torch.ones(2, 3, dtype=torch.bool)
    out = grpo_loss(logp_new, logp_old, None, torch.tensor([1.0, -1.0], dtype=torch.float64), mask, beta=0.0)
    out["loss"].backward()
    # A > 0: a ratio above 1.2 is clipped (no gradient); A < 0: one below 0.8 is
    r = torch.exp(logp_new.detach())
    want = torch.tensor([[0, -1, -1], [1, 1, 0]], dtype=torch.float64) * r / 6
    torch.testing.assert_close(logp_new.grad, want, rtol=0, atol=1e-15)
    assert out["clipped"].item() == pytest.approx(2 / 6)


# Bad input ---------------------------------------------------------------------------------------


def test_bad_input_is_refused_by_name():
    x = torch.zeros(3, dtype=torch.float64)
    for beta in (0, -0.1, math.inf):
        with pytest.raises(ValueError, match=r"beta must be a finite number > 0, got"):
            dpo_loss(x, x, x, x, beta)
    with pytest.raises(TypeError, match="beta must be a number"):
        dpo_loss(x, x, x, x, "0.1")
    with pytest.raises(ValueError, match=r"one shape \(B,\)"):
        dpo_loss(x, x, x, torch.zeros(4, dtype=torch.float64), 0.1)
    with pytest.raises(ValueError, match="must have 1 dimension"):
        dpo_loss(x[None], x[None], x[None], x[None], 0.1)
    with pytest.raises(ValueError, match=r"scale must be one of \('group', 'batch', 'none'\), got 'std'"):
        group_advantages([[1.0, 0.0]], scale="std")
    with pytest.raises(ValueError, match=r"n >= 2, got shape \(2, 1\)"):
        group_advantages([[1.0], [0.0]])
    with pytest.raises(ValueError, match="finite"):
        group_advantages([[1.0, math.nan]])
    lp, mask, A = torch.zeros(2, 3, dtype=torch.float64), torch.ones(2, 3, dtype=torch.bool), x[:2]
    with pytest.raises(ValueError, match=r"loss_type must be one of \('grpo', 'bnpo', 'dapo'\), got 'dr_grpo'"):
        grpo_loss(lp, lp, lp, A, mask, loss_type="dr_grpo")
    with pytest.raises(ValueError, match="beta must be a finite number >= 0, got -1"):
        grpo_loss(lp, lp, lp, A, mask, beta=-1)
    with pytest.raises(ValueError, match="beta=0.04 needs logp_ref"):
        grpo_loss(lp, lp, None, A, mask)
    with pytest.raises(ValueError, match=r"logp_old has shape \(2, 4\)"):
        grpo_loss(lp, torch.zeros(2, 4, dtype=torch.float64), lp, A, mask)
    with pytest.raises(ValueError, match="one number per answer, 2, got 3"):
        grpo_loss(lp, lp, lp, x, mask)
    with pytest.raises(ValueError, match=r"mask must be a tensor of shape \(2, 3\)"):
        grpo_loss(lp, lp, lp, A, mask[:, :2])
    with pytest.raises(ValueError, match="n_tokens is for loss_type='dapo' only"):
        grpo_loss(lp, lp, lp, A, mask, n_tokens=10)
    with pytest.raises(ValueError, match="clip must be a finite number > 0"):
        grpo_loss(lp, lp, lp, A, mask, clip=0)
    with pytest.raises(ValueError, match=r"row 1 has n_prompt=3 and lengths=3: every row needs 1 <= n_prompt"):
        answer_mask([1, 3], [4, 3], 5)
    with pytest.raises(ValueError, match="lengths=9.*T=5"):
        answer_mask([1], [9], 5)


# Parity with TRL: DPO ----------------------------------------------------------------------------


def dpo_trainer(trl, policy, ref, tokenizer, folder, triples=TRIPLES):
    """TRL's DPOTrainer on the book's GPTs as ``transformers`` models (float64, in memory)."""
    from datasets import Dataset

    prompts, chosen, rejected = zip(*triples, strict=True)
    data = Dataset.from_dict({"prompt": [p + PROMPT_END for p in prompts], "chosen": chosen, "rejected": rejected})
    args = trl.DPOConfig(
        output_dir=str(folder), loss_type="sigmoid", beta=0.1, report_to=[], use_cpu=True, save_strategy="no",
        bf16=False,  # TRL's configs default to bf16 where fp16 is not set: on a CPU its autocast would round
        gradient_checkpointing=False, per_device_train_batch_size=len(triples), max_steps=1, logging_steps=1,
        disable_tqdm=True,
    )  # fmt: skip
    return trl.DPOTrainer(model=tl.hf_model(policy), ref_model=tl.hf_model(ref), args=args, train_dataset=data,
                          processing_class=tl.hf_tokenizer(tokenizer))  # fmt: skip


def test_trl_tokenises_prompt_and_answer_whole_and_adds_the_end_token(base, tmp_path):
    trl = pytest.importorskip("trl", minversion="1.16")
    model, tokenizer = base
    trainer = dpo_trainer(trl, model, model, tokenizer, tmp_path)
    for row, (p, c, r) in zip(trainer.train_dataset, TRIPLES, strict=True):
        chosen, n = tl.encode_pair(tokenizer, p, c)  # encoded apart, the end token after the answer
        rejected, _ = tl.encode_pair(tokenizer, p, r)
        assert (row["prompt_ids"], row["chosen_ids"], row["rejected_ids"]) == (chosen[:n], chosen[n:], rejected[n:])
    # an answer that starts with a letter joins PROMPT_END's space when encoded whole: TRL's prompt
    # then loses its last token, and its rows differ from the book's (which encodes the parts apart)
    trainer = dpo_trainer(trl, model, model, tokenizer, tmp_path, [("Who speaks first?", "ROMEO", "JULIET")])
    row = trainer.train_dataset[0]
    head = tokenizer.encode("Who speaks first?" + PROMPT_END)
    assert row["prompt_ids"] == head[:-1]
    assert row["prompt_ids"] + row["chosen_ids"] == tokenizer.encode("Who speaks first?\n=> ROMEO") + [tokenizer.eos_id]


def test_dpo_equals_trls_dpo_trainer(base, tmp_path):
    trl = pytest.importorskip("trl", minversion="1.16")
    ref, tokenizer = base
    policy = perturbed(ref, seed=1)
    trainer = dpo_trainer(trl, policy, ref, tokenizer, tmp_path)
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(len(TRIPLES))])
    with torch.no_grad():
        pc, pr = trainer.compute_ref_log_probs(trainer.model, batch)  # TRL's summed answer log-probabilities
        rc, rr = trainer.compute_ref_log_probs(trainer.ref_model, batch)
        theirs = trainer.compute_loss(trainer.model, batch)
    chosen, rejected = pair_batches(tokenizer)
    ours = [sequence_logprobs(m, *rows) for m in (policy, ref) for rows in (chosen, rejected)]
    for a, b in zip(ours, (pc, pr, rc, rr), strict=True):  # float32's precision: ~1e-7 of values near -190
        torch.testing.assert_close(a, b.double(), rtol=2e-7, atol=0)
    book = dpo_loss(*ours[:2], *ours[2:], beta=0.1)
    assert 0.05 < abs(book["loss"].item() - LN2)  # the policy is not the reference
    assert book["loss"].item() == pytest.approx(theirs.item(), abs=1e-5)
    fed = dpo_loss(pc.double(), pr.double(), rc.double(), rr.double(), beta=0.1)  # TRL's own log-probabilities
    assert fed["loss"].item() == pytest.approx(theirs.item(), abs=1e-7)  # TRL's float32 loss
    logged = trainer._metrics["eval"]
    for key, ours_key in (("margins", "margin"), ("chosen", "chosen_reward"), ("rejected", "rejected_reward")):
        assert logged[f"rewards/{key}"][-1] == pytest.approx(fed[ours_key].mean().item(), abs=1e-6)
        assert logged[f"rewards/{key}"][-1] == pytest.approx(book[ours_key].mean().item(), abs=1e-5)
    assert book["accuracy"].item() == fed["accuracy"].item() == 2 / 3
    assert logged["rewards/accuracies"][-1] == pytest.approx(2 / 3, abs=1e-7)  # a float32 mean


def test_trls_first_logged_dpo_loss_is_ln2_as_the_books(base, tmp_path):
    trl = pytest.importorskip("trl", minversion="1.16")
    model, tokenizer = base
    policy = perturbed(model, seed=2)  # any policy, its reference a copy of it
    trainer = dpo_trainer(trl, policy, copy.deepcopy(policy), tokenizer, tmp_path)
    trainer.train()  # one step
    assert trainer.state.log_history[0]["loss"] == LN2_FLOAT32  # ln 2 rounded to float32: TRL's loss is float32
    chosen, rejected = pair_batches(tokenizer)
    pc, pr = sequence_logprobs(policy, *chosen), sequence_logprobs(policy, *rejected)
    assert dpo_loss(pc, pr, pc.detach(), pr.detach(), beta=0.1)["loss"].item() == LN2


# Parity with TRL: GRPO ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory):
    """The shipped GPT as a saved ``transformers`` model: GRPOTrainer builds its reference from the
    policy's path (a model held only in memory has none, and is refused when ``beta > 0``)."""
    pytest.importorskip("trl")
    folder = tmp_path_factory.mktemp("grpo") / "hf"
    tl.export_hf(tl.PRETRAINED_PATH, folder)
    return folder


@pytest.fixture(scope="module")
def rollouts(base):
    """The rollouts in both layouts: the book's right-padded rows and TRL's prompt and completion
    columns (the prompts have one length, so TRL's left padding adds nothing), the book's float64
    per-token log-probabilities of the completions ``(B, C)``, made-up old and reference ones, and
    the advantages."""
    model, tokenizer = base
    rows = [tl.encode_pair(tokenizer, p, a) for p, group in zip(PROMPTS, ANSWERS, strict=True) for a in group]
    ids, n_prompt, lengths = pad_rows(rows, tokenizer.eos_id)
    P = int(n_prompt[0])
    assert (n_prompt == P).all()
    mask = answer_mask(n_prompt, lengths, ids.shape[1])[:, P - 1 :]  # (B, C): the completion columns
    with torch.no_grad():
        new = token_logprobs(model, ids)[:, P - 1 :]
    g = torch.Generator().manual_seed(5)
    old = new + 0.3 * torch.randn(new.shape, generator=g, dtype=torch.float64)  # some ratios are clipped
    ref = new + 0.2 * torch.randn(new.shape, generator=g, dtype=torch.float64)
    return {"ids": ids, "P": P, "mask": mask, "new": new, "old": old, "ref": ref,
            "advantages": group_advantages(REWARDS).flatten()}  # fmt: skip


def grpo_trainer(trl, folder, out, **settings):
    from datasets import Dataset
    from transformers import AutoTokenizer

    args = trl.GRPOConfig(
        output_dir=str(out), report_to=[], use_cpu=True, save_strategy="no", bf16=False,
        gradient_checkpointing=False, per_device_train_batch_size=8, num_generations=4, temperature=1.0,
        model_init_kwargs={"dtype": torch.float64}, disable_tqdm=True, **settings,
    )  # fmt: skip
    data = Dataset.from_dict({"prompt": [p + PROMPT_END for p in PROMPTS], "reward": [0.0, 0.0]})
    reward = lambda prompts, completions, completion_ids, reward, **kwargs: reward  # the dataset's column
    return trl.GRPOTrainer(model=str(folder), reward_funcs=reward, args=args, train_dataset=data,
                           processing_class=AutoTokenizer.from_pretrained(folder))  # fmt: skip


def trl_inputs(rollouts, beta):
    """``_compute_loss``'s inputs, as ``_generate_and_score_completions`` returns them."""
    P, mask = rollouts["P"], rollouts["mask"]
    inputs = {"prompt_ids": rollouts["ids"][:, :P], "prompt_mask": torch.ones_like(rollouts["ids"][:, :P]),
              "completion_ids": rollouts["ids"][:, P:], "completion_mask": mask.long(),
              "advantages": rollouts["advantages"], "num_items_in_batch": mask.sum(),
              "old_per_token_logps": rollouts["old"]}  # fmt: skip
    if beta:
        inputs["ref_per_token_logps"] = rollouts["ref"]
    return inputs


def trl_logprobs(trainer, inputs):
    """TRL's per-token log-probabilities of the completions ``(B, C)``, as its loss computes them."""
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    attention = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
    C = inputs["completion_ids"].shape[1]
    return trainer._get_per_token_logps_and_entropies(trainer.model, ids, attention, C)[0]


@pytest.mark.parametrize(
    "loss_type, beta, kl_ratio, clip_high",
    [("grpo", 0.0, False, None), ("grpo", 0.04, True, None), ("grpo", 0.04, False, None),
     ("dapo", 0.0, False, 0.28), ("dapo", 0.04, True, 0.28), ("bnpo", 0.04, False, None)],
)  # fmt: skip
def test_grpo_loss_equals_trls_grpo_trainer(loss_type, beta, kl_ratio, clip_high, hf_folder, rollouts, tmp_path):
    trl = pytest.importorskip("trl", minversion="1.16")
    trainer = grpo_trainer(trl, hf_folder, tmp_path, loss_type=loss_type, beta=beta, epsilon=0.2,
                           epsilon_high=clip_high, use_bias_correction_kl=kl_ratio)  # fmt: skip
    inputs = trl_inputs(rollouts, beta)
    with torch.no_grad():
        theirs = trainer._compute_loss(trainer.model, inputs).item()
        trl_new = trl_logprobs(trainer, inputs)
    mask = rollouts["mask"]
    assert trl_new.dtype == torch.float32  # TRL's fused LM head: float32 whatever the model's dtype
    torch.testing.assert_close(rollouts["new"][mask], trl_new.double()[mask], rtol=0, atol=3e-6)
    options = dict(clip=0.2, clip_high=clip_high, beta=beta, loss_type=loss_type, kl_ratio=kl_ratio)
    args = (rollouts["old"], rollouts["ref"] if beta else None, rollouts["advantages"], mask)
    fed = grpo_loss(trl_new.double(), *args, **options)  # TRL's own log-probabilities: float64 from there on
    assert fed["loss"].item() == pytest.approx(theirs, rel=0, abs=1e-15)
    ours = grpo_loss(rollouts["new"], *args, **options)
    assert ours["loss"].item() == pytest.approx(theirs, rel=0, abs=1e-6)
    logged = trainer._metrics["eval"]
    assert logged["clip_ratio/region_mean"][-1] == pytest.approx(ours["clipped"].item(), abs=1e-7)  # float32
    assert 0 < ours["clipped"].item() < 1
    if beta:
        assert logged["kl"][-1] == pytest.approx(fed["kl"].item(), abs=1e-7)
    if loss_type == "dapo":  # with num_items_in_batch the whole batch's tokens: here this batch's
        whole = grpo_loss(trl_new.double(), *args, **options, n_tokens=int(mask.sum()))
        assert whole["loss"].item() == pytest.approx(theirs, abs=1e-15)


@pytest.mark.parametrize(
    "scale_rewards, scale, loss_type",
    [("group", "group", "grpo"), ("group", "group", "dapo"), ("batch", "batch", "grpo"), (False, "none", "grpo")],
)
def test_advantages_and_the_first_step_equal_trls(scale_rewards, scale, loss_type, base, hf_folder, tmp_path):
    trl = pytest.importorskip("trl", minversion="1.16")
    model, tokenizer = base
    beta = 0.04 if scale == "group" else 0.0  # with beta > 0 TRL loads its reference from the policy's folder
    trainer = grpo_trainer(trl, hf_folder, tmp_path, loss_type=loss_type, beta=beta, scale_rewards=scale_rewards)
    rows = [tl.encode_pair(tokenizer, p, a) for p, group in zip(PROMPTS, ANSWERS, strict=True) for a in group]
    # TRL's sampling step with its sampler replaced by these completions (prompt ids, completion ids,
    # no tool mask, texts, no sampler log-probabilities, no extra fields, no images)
    prompt_ids, completion_ids = [ids[:n] for ids, n in rows], [ids[n:] for ids, n in rows]
    texts = [tokenizer.decode(c) for c in completion_ids]
    trainer._generate = lambda prompts: (prompt_ids, completion_ids, None, texts, None, None, None, None)
    rewards = [[1.0, 0.5, 0.0, 0.0], [0.25, 0.25, 0.25, 0.25]]  # the second group teaches nothing
    examples = [{"prompt": p + PROMPT_END, "reward": r} for p, rs in zip(PROMPTS, rewards, strict=True) for r in rs]
    inputs = trainer._generate_and_score_completions(examples)
    ours = group_advantages(rewards, scale=scale).flatten()
    assert inputs["advantages"].dtype == torch.float32  # TRL's rewards are float32
    torch.testing.assert_close(inputs["advantages"].double(), ours, rtol=0, atol=1e-6)
    assert inputs["advantages"][4:].tolist() == [0.0] * 4
    # the first step: no old log-probabilities (TRL uses the new ones, detached) and the reference
    # equal to the policy, so the ratio is exactly 1 and k3 exactly 0: the loss is minus the mean
    # advantage, per answer ("grpo": 0 whatever the lengths) or per token ("dapo": not 0, the
    # answers' lengths differ), up to float32's rounding in TRL (its advantages and loss are float32)
    assert "old_per_token_logps" not in inputs
    theirs = trainer._compute_loss(trainer.model, inputs)
    assert theirs.dtype == torch.float32
    if beta:
        assert trainer._metrics["eval"]["kl"][-1] == 0.0
    theirs.backward()
    P = len(prompt_ids[0])
    ids, n_prompt, lengths = pad_rows(rows, tokenizer.eos_id)
    policy = copy.deepcopy(model)
    new = token_logprobs(policy, ids)[:, P - 1 :]
    mask = answer_mask(n_prompt, lengths, ids.shape[1])[:, P - 1 :]
    book = grpo_loss(new, new.detach(), new.detach(), ours, mask, beta=beta, loss_type=loss_type)
    n = mask.sum(-1).double()
    want = -ours.mean() if loss_type == "grpo" else -(n * ours).sum() / n.sum()
    assert book["loss"].item() == pytest.approx(want.item(), abs=1e-15)
    assert (abs(book["loss"].item()) < 1e-15) == (loss_type == "grpo")
    assert theirs.item() == pytest.approx(book["loss"].item(), abs=1e-6)
    book["loss"].backward()  # the gradient is not 0, and it is TRL's
    ours_grad, their_grad = policy.tok_embed.weight.grad, trainer.model.transformer.wte.weight.grad
    assert ours_grad.abs().max() > 1e-4
    torch.testing.assert_close(their_grad, ours_grad, rtol=0, atol=1e-5 * ours_grad.abs().max().item())

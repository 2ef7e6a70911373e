"""The parity of chapter "Preferences and rewards" with TRL (``trl``, from ``requirements-eval.txt``): its DPO and GRPO
losses on fixed inputs (:data:`PARITY`), recorded by the ``trl`` part of the experiment of chapter "Preferences and
rewards", and the inputs themselves, which the chapter builds again to compare the book's numbers with TRL's:
chapter "Fine-tuning"'s base as the reference, a copy with every weight moved a little as the policy
(:func:`perturbed`), three date pairs, and rollouts of two prompts with four answers each.
"""

from __future__ import annotations

import copy
import tempfile

import torch

import transformer_lib as tl

__all__ = ["PARITY", "parity_models", "parity_rollouts", "perturbed", "trl_parity"]

#: DPO's pairs (prompt, chosen, rejected) and GRPO's rollouts: prompts of one length in tokens, each
#: with four answers and their rewards (the second group's rewards differ in one answer only)
PARITY = {
    "triples": [
        ["03.03.2021", "2021-03-03", "2021-03-30"],
        ["2018.09.03", "2018-09-03", "2018-03-09"],
        ["12/05/1999", "1999-12-05", "1999-05-12"],
    ],
    "prompts": ["03.03.2021", "09.03.2018"],
    "answers": [
        ["2021-03-03", "2021-3-3", "03/03/2021", "2021-03-30"],
        ["2018-03-09", "2018-09-03", "2018-3-9", "9/3/18"],
    ],
    "rewards": [[1.0, 0.5, 0.0, 0.0], [1.0, 0.0, 0.5, 0.25]],
    "grpo": [["grpo", 0.04], ["dapo", 0.04], ["grpo", 0.0]],
}


def perturbed(model, seed: int, scale: float = 0.02):
    """A copy of ``model`` with every weight moved by ``scale`` times Gaussian noise (a policy a few
    steps away from its reference)."""
    g = torch.Generator().manual_seed(seed)
    out = copy.deepcopy(model)
    with torch.no_grad():
        for p in out.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return out


def parity_models():
    """The reference (the base of chapter "Fine-tuning", float64) and the policy (it, perturbed with seed 1)."""
    model, tokenizer, _ = tl.load_checkpoint(tl.PRETRAINED_PATH)
    ref = model.double().eval()
    return perturbed(ref, seed=1), ref, tokenizer


def parity_rollouts(model, tokenizer) -> dict:
    """GRPO's fixed rollouts: the rows, the policy's float64 log-probabilities of the completions and
    made-up old and reference ones (seeded), the completion mask and the advantages."""
    rows = [
        tl.encode_pair(tokenizer, p, a)
        for p, group in zip(PARITY["prompts"], PARITY["answers"], strict=True)
        for a in group
    ]
    ids, n_prompt, lengths = tl.pad_rows(rows, tokenizer.eos_id)
    P = int(n_prompt[0])
    mask = tl.answer_mask(n_prompt, lengths, ids.shape[1])[:, P - 1 :]
    with torch.no_grad():
        new = tl.token_logprobs(model, ids)[:, P - 1 :]
    g = torch.Generator().manual_seed(5)
    old = new + 0.3 * torch.randn(new.shape, generator=g, dtype=torch.float64)
    ref = new + 0.2 * torch.randn(new.shape, generator=g, dtype=torch.float64)
    return {
        "ids": ids,
        "P": P,
        "mask": mask,
        "new": new,
        "old": old,
        "ref": ref,
        "advantages": tl.group_advantages(PARITY["rewards"]).flatten(),
    }


def trl_parity(seeds: list[int], steps: int | None = None) -> dict:
    """TRL's DPO loss and log-probabilities on :data:`PARITY`'s pairs, and its GRPO loss on the fixed
    rollouts for each (loss type, beta) (``seeds`` and ``steps`` are unused: nothing is drawn)."""
    import trl
    from datasets import Dataset
    from transformers import AutoTokenizer

    policy, ref, tokenizer = parity_models()
    out = {"trl_version": trl.__version__}
    with tempfile.TemporaryDirectory() as tmp:
        prompts, chosen, rejected = zip(*PARITY["triples"], strict=True)
        data = Dataset.from_dict(
            {"prompt": [p + tl.PROMPT_END for p in prompts], "chosen": chosen, "rejected": rejected}
        )
        args = trl.DPOConfig(
            output_dir=tmp,
            loss_type="sigmoid",
            beta=0.1,
            report_to=[],
            use_cpu=True,
            save_strategy="no",
            bf16=False,
            gradient_checkpointing=False,
            per_device_train_batch_size=3,
            max_steps=1,
            disable_tqdm=True,
        )
        trainer = trl.DPOTrainer(
            model=tl.hf_model(policy),
            ref_model=tl.hf_model(ref),
            args=args,
            train_dataset=data,
            processing_class=tl.hf_tokenizer(tokenizer),
        )
        batch = trainer.data_collator([trainer.train_dataset[i] for i in range(3)])
        with torch.no_grad():
            pc, pr = trainer.compute_ref_log_probs(trainer.model, batch)
            rc, rr = trainer.compute_ref_log_probs(trainer.ref_model, batch)
            loss = trainer.compute_loss(trainer.model, batch)
        out["dpo"] = {"beta": 0.1, "loss": loss.item(), "logprobs": [t.double().tolist() for t in (pc, pr, rc, rr)]}
        folder = f"{tmp}/hf"
        tl.export_hf(tl.PRETRAINED_PATH, folder)
        rollouts = parity_rollouts(ref, tokenizer)
        out["grpo"] = []
        for loss_type, beta in PARITY["grpo"]:
            gargs = trl.GRPOConfig(
                output_dir=tmp,
                report_to=[],
                use_cpu=True,
                save_strategy="no",
                bf16=False,
                gradient_checkpointing=False,
                per_device_train_batch_size=8,
                num_generations=4,
                temperature=1.0,
                model_init_kwargs={"dtype": torch.float64},
                disable_tqdm=True,
                loss_type=loss_type,
                beta=beta,
                epsilon=0.2,
                use_bias_correction_kl=False,
            )
            data = Dataset.from_dict({"prompt": [p + tl.PROMPT_END for p in PARITY["prompts"]], "r": [0.0, 0.0]})
            g = trl.GRPOTrainer(
                model=folder,
                reward_funcs=lambda completions, **kw: [0.0] * len(completions),
                args=gargs,
                train_dataset=data,
                processing_class=AutoTokenizer.from_pretrained(folder),
            )
            P, mask = rollouts["P"], rollouts["mask"]
            inputs = {
                "prompt_ids": rollouts["ids"][:, :P],
                "prompt_mask": torch.ones_like(rollouts["ids"][:, :P]),
                "completion_ids": rollouts["ids"][:, P:],
                "completion_mask": mask.long(),
                "advantages": rollouts["advantages"],
                "num_items_in_batch": mask.sum(),
                "old_per_token_logps": rollouts["old"],
            }
            if beta:
                inputs["ref_per_token_logps"] = rollouts["ref"]
            with torch.no_grad():
                value = g._compute_loss(g.model, inputs).item()
            out["grpo"].append({"loss_type": loss_type, "beta": beta, "loss": value})
    return {"trl": out}

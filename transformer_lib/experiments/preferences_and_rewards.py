r"""The experiments over seeds of chapter "Preferences and rewards": DPO and GRPO from the shipped dates model (chapter
"Measuring a model"'s ``DATES_ADAPTER_PATH``: chapter "Fine-tuning"'s base with a LoRA fine-tune that is right about
half the time), against more supervised steps, the reward a model learns to fool, and a scratchpad's steps as the
reward. The chapter reads the record, ``transformer_lib/data/ch17/preferences.json``
(``recorded("preferences_and_rewards")``).

The command line (``--dry-run`` prints and writes nothing)::

    # three seeds of every part (about an hour, 1 core)
    python -m transformer_lib.experiments preferences_and_rewards
    # seed 0 of GRPO, printed, nothing written (add --steps 20 for a smoke run)
    python -m transformer_lib.experiments preferences_and_rewards \
        --parts grpo --seeds 0 --dry-run

Every run starts from the dates model with its adapter merged and trains fresh LoRA adapters of
rank 4 (the reference: the start, adapters off), in float32, for :data:`SETTINGS` ``steps``
steps. Every :data:`SETTINGS` ``eval_every`` steps it is measured on the first ``eval_pairs`` of
chapter "Fine-tuning"'s held-out dates: pass@1 and pass@8 from 8 answers sampled at temperature 0.3, the
share of answers that are a real ISO date (the format), and the KL to the reference (the exact
sum over the vocabulary, averaged over the sampled answers' tokens).

Parts: ``dpo`` (pairs of the right date against one with a field moved,
:func:`transformer_lib.data.preference_triples`: beta 0.1 and 0.5 on summed log-probabilities,
beta 0.1 on averaged ones; the chosen and rejected answers' log-probabilities on held-out pairs),
``grpo`` (the exact-match reward, 8 prompts x 8 answers at temperature 0.3; and ``sft``, the
supervised loss on the right answers, 64 rows a step: as many rows through the model per step),
``hacking`` (GRPO on the format-only reward, with the answers it writes), ``scratchpad`` (a start
fine-tuned to write its steps, then GRPO, 4 prompts x 8 answers, on the steps' reward against the
answer's alone) and ``trl`` (needs ``trl``, from ``requirements-eval.txt``: TRL's DPO and GRPO
losses on the fixed inputs of :data:`PARITY`, which the chapter computes again and compares)
and ``grpo_lr`` (``grpo`` at each learning rate of :data:`GRPO_LR`, without the supervised
baseline or report cards, every measurement adding the mean reward on a fixed draw of 16 training
dates, :func:`train_prompts`, 8 answers each at the evaluation temperature) and ``dpo_pairs``
(DPO beta 0.1, summed, at each rate of :data:`DPO_PAIRS` on task-built pairs and on on-policy
ones, the start model's own wrong answers as the rejected side, :func:`on_policy_triples`) and
``hole`` (GRPO on :func:`year_reward`, which any real date in the right year passes, at
:data:`HOLE`'s rate, measured also on the answers to :func:`train_prompts` with both rewards).
For seed 0 each run also records the answers to the first prompts at every measurement and its
report card (bits per byte, greedy exact match on 200 dates) before and after.
"""

from __future__ import annotations

import copy
import tempfile
import time
from dataclasses import replace

import torch

import transformer_lib as tl

from . import fine_tuning
from .preferences_and_rewards_parity import trl_parity
from .recorder import Experiment, Part

__all__ = [
    "DPO_PAIRS",
    "EXPERIMENT",
    "GRPO_LR",
    "HOLE",
    "SETTINGS",
    "dpo_run",
    "on_policy_triples",
    "start_model",
    "train_prompts",
    "train_reward",
    "year_reward",
]

SEEDS = [0, 1, 2]
SETTINGS = {
    "steps": 100,
    "eval_every": 25,
    "eval_pairs": 50,
    "samples": 8,
    "eval_temperature": 0.3,
    "lora_rank": 4,
    "grpo": {
        "batch_size": 8,
        "group_size": 8,
        "temperature": 0.3,
        "max_new_tokens": 12,
        "beta": 0.04,
        "loss_type": "grpo",
        "scale": "group",
        "lr": 3e-3,
    },
    "dpo": {
        "batch_size": 16,
        "lr": 1e-3,
        "runs": [["beta 0.1", 0.1, False], ["beta 0.5", 0.5, False], ["beta 0.1 averaged", 0.1, True]],
    },
    "sft": {"batch_size": 64, "lr": 3e-3},
    "scratchpad": {"sft_steps": 350, "sft_lr": 5e-3, "max_new_tokens": 36, "pairs": 2000, "batch_size": 4},
    "prompts_shown": 4,
}
#: the ``grpo_lr`` part: GRPO as in ``grpo`` at its rate (run again: its held-out curve must equal
#: the ``grpo`` part's) and two smaller ones, also measured on a fixed draw of training prompts
GRPO_LR = {"lrs": [3e-3, 1e-3, 3e-4], "train_prompts": 16, "train_seed": 17, "sample_seed": 4321}
#: the ``dpo_pairs`` part: DPO beta 0.1 on summed log-probabilities, as the ``dpo`` part's first
#: run, on task-built pairs and on on-policy ones (:func:`on_policy_triples`), at each rate
DPO_PAIRS = {"lrs": [1e-3, 3e-4], "pairs": ["task", "on-policy"], "beta": 0.1, "sample_seed": 2468}
#: the ``hole`` part: GRPO as in ``grpo`` on :func:`year_reward`, at the rate that moved it most
HOLE = {"lr": 3e-3, "reward": "year_reward"}


def year_reward(answer: str, target: str) -> float:
    """1.0 for any real date written ``yyyy-mm-dd`` in ``target``'s year, else 0.0: a verifier with
    a hole, which a wrong month or day passes."""
    final = answer.rpartition(" = ")[2].strip()
    return float(tl.data.format_reward(final, target) == 1.0 and final[:4] == target[:4])


def start_model(adapter=None):
    """The shipped base with ``adapter`` (default: the dates adapter) loaded, in float32."""
    model, tokenizer, _ = tl.load_checkpoint(tl.PRETRAINED_PATH)
    tl.load_adapter(model, tl.DATES_ADAPTER_PATH if adapter is None else adapter)
    return model.float(), tokenizer


def _config(steps: int, lr: float, batch_size: int) -> tl.TrainConfig:
    return tl.short_run_config(steps, lr, batch_size)


@torch.no_grad()
def measure(model, reference, tokenizer, pairs: list, reward=tl.data.exact_reward, max_new_tokens: int = 12) -> dict:
    """pass@1 and pass@8 (the task's reward of 1), the format share, mean reward and the exact KL."""
    model.eval()
    prompts = [p for p, _ in pairs]
    answers = tl.sample_answers(
        model,
        tokenizer,
        prompts,
        SETTINGS["samples"],
        temperature=SETTINGS["eval_temperature"],
        max_new_tokens=max_new_tokens,
        seed=1234,
    )
    n, right, fmt, rewards, kl, tokens = SETTINGS["samples"], [], 0.0, 0.0, 0.0, 0
    for (prompt, target), group in zip(pairs, answers, strict=True):
        right.append(int(sum(tl.data.exact_reward(a, target) for a in group)))
        fmt += sum(tl.data.format_reward(a, target) for a in group)
        rewards += sum(reward(a, target) for a in group)
        rows = [tl.encode_pair(tokenizer, prompt, a) for a in group]
        ids, n_prompt, lengths = tl.pad_rows(rows, tokenizer.eos_id)
        mask = tl.answer_mask(n_prompt, lengths, ids.shape[1])
        logits = model(ids)[0][:, :-1]
        if reference.frozen is None:
            with tl.adapters_off(model):
                ref_logits = model(ids)[0][:, :-1]
        else:
            ref_logits = reference.frozen(ids)[0][:, :-1]
        kl += float(tl.exact_kl(logits, ref_logits, mask).sum())
        tokens += int(mask.sum())
    model.train()
    total = len(pairs) * n
    return {
        "pass@1": sum(tl.pass_at_k(n, c, 1) for c in right) / len(pairs),
        "pass@8": sum(tl.pass_at_k(n, c, 8) for c in right) / len(pairs),
        "format": fmt / total,
        "reward": rewards / total,
        "kl": kl / tokens,
    }


def _card(model, tokenizer) -> dict:
    """Bits per byte on the held-out text and greedy exact match on chapter "Fine-tuning"'s 200 held-out dates."""
    model.eval()
    card = tl.report_card(
        model, tokenizer, text=tl.data.held_out_text(fine_tuning.text()), pairs=fine_tuning.date_splits()[1]
    )
    model.train()
    return {
        "bits_per_byte": card["text"]["bits_per_byte"],
        "exact_match": card["exact"]["exact_match"],
        "exact_match_interval": list(card["exact"]["exact_match_interval"]),
    }


def _run(
    model,
    reference,
    tokenizer,
    batches,
    lr: float,
    batch_size: int,
    steps: int,
    test,
    seed: int = 0,
    cards: bool = True,
    train_check=None,
    **measure_kw,
) -> dict:
    """Train in chunks of ``eval_every`` steps (one schedule), measuring after each; returns the
    curve (seed 0: with the answers to the first prompts at each point) and, for seed 0 when
    ``cards``, the report card before and after. ``train_check``, when given, is called with the
    model and tokenizer at every measurement and its dict joins the point."""
    longest = measure_kw.get("max_new_tokens", 12)
    shown = (lambda: {"answers": _shown(model, tokenizer, test, longest)}) if seed == 0 else dict
    checked = (lambda: train_check(model, tokenizer)) if train_check is not None else dict

    def point(step: int) -> dict:
        return {"step": step, **measure(model, reference, tokenizer, test, **measure_kw), **checked(), **shown()}

    curve = [point(0)]
    cards = {"start": _card(model, tokenizer)} if seed == 0 and cards else {}
    every = SETTINGS["eval_every"]
    with tempfile.TemporaryDirectory() as tmp:
        config = replace(_config(steps, lr, batch_size), out_dir=tmp)
        done, extra = 0, []
        while done < steps:
            until = min(done + every, steps)
            tl.train(model, batches, config, resume=done > 0, until=until)
            done = until
            if hasattr(batches, "last") and batches.last:
                extra.append({"step": done, **batches.last})
            curve.append(point(done))
            print({k: round(v, 3) for k, v in curve[-1].items() if k != "answers"}, flush=True)
    if cards:
        cards["end"] = _card(model, tokenizer)
    return {"curve": curve, "batch": extra, **({"cards": cards} if cards else {})}


def _policy(seed: int, adapter=None):
    model, tokenizer = start_model(adapter)
    torch.manual_seed(seed)
    reference = tl.make_policy(model, "lora", rank=SETTINGS["lora_rank"], alpha=2.0 * SETTINGS["lora_rank"], seed=seed)
    return model.train(), tokenizer, reference


def _shown(model, tokenizer, test: list, max_new_tokens: int = 12) -> list:
    model.eval()
    prompts = [p for p, _ in test[: SETTINGS["prompts_shown"]]]
    got = tl.sample_answers(
        model, tokenizer, prompts, 4, temperature=SETTINGS["eval_temperature"], max_new_tokens=max_new_tokens, seed=7
    )
    return [{"prompt": p, "target": t, "answers": a} for (p, t), a in zip(test, got, strict=False)]


def grpo(
    seeds: list[int],
    steps: int | None = None,
    reward="exact",
    name: str = "grpo",
    lr: float | None = None,
    cards: bool = True,
    train_check=None,
) -> dict:
    """GRPO runs for ``seeds`` (at ``lr``, default ``SETTINGS["grpo"]["lr"]``), each a dict with
    its curve; for the ``grpo`` part each followed by its supervised baseline."""
    train_pairs, test_pairs = fine_tuning.date_splits()
    test = test_pairs[: SETTINGS["eval_pairs"]]
    g, steps = SETTINGS["grpo"], steps or SETTINGS["steps"]
    lr = g["lr"] if lr is None else lr
    runs = []
    for seed in seeds:
        start = time.perf_counter()
        model, tokenizer, reference = _policy(seed)
        batches = tl.GRPOBatches(
            model,
            tokenizer,
            train_pairs,
            test,
            g["batch_size"],
            reward=reward,
            reference=reference,
            group_size=g["group_size"],
            temperature=g["temperature"],
            max_new_tokens=g["max_new_tokens"],
            beta=g["beta"],
            loss_type=g["loss_type"],
            scale=g["scale"],
            seed=seed,
        )
        row = {
            "name": name,
            "seed": seed,
            "steps": steps,
            **_run(
                model,
                reference,
                tokenizer,
                batches,
                lr,
                g["batch_size"],
                steps,
                test,
                seed,
                cards=cards,
                train_check=train_check,
                reward=tl.data.REWARDS[reward] if isinstance(reward, str) else reward,
            ),
        }
        if name != "grpo":
            row["lr"] = lr
        row["answers"] = _shown(model, tokenizer, test)
        row["seconds"] = time.perf_counter() - start
        runs.append(row)
        if name == "grpo":  # the supervised baseline, the same rows through the model per step
            runs.append(sft(seed, steps, train_pairs, test))
    return {name: {"settings": SETTINGS, "runs": runs}}


def train_prompts() -> list:
    """The ``grpo_lr`` part's fixed training pairs: ``GRPO_LR["train_prompts"]`` of chapter "Fine-tuning"'s
    training dates, drawn once with ``GRPO_LR["train_seed"]``."""
    train_pairs = fine_tuning.date_splits()[0]
    g = torch.Generator().manual_seed(GRPO_LR["train_seed"])
    picked = torch.randperm(len(train_pairs), generator=g)[: GRPO_LR["train_prompts"]]
    return [train_pairs[int(i)] for i in picked]


@torch.no_grad()
def train_reward(model, tokenizer, pairs: list) -> dict:
    """The mean exact-match reward on ``pairs`` (training dates): 8 answers each at the
    evaluation temperature, sampled from a generator seeded with ``GRPO_LR["sample_seed"]``."""
    model.eval()
    answers = tl.sample_answers(
        model,
        tokenizer,
        [p for p, _ in pairs],
        SETTINGS["samples"],
        temperature=SETTINGS["eval_temperature"],
        max_new_tokens=SETTINGS["grpo"]["max_new_tokens"],
        seed=GRPO_LR["sample_seed"],
    )
    model.train()
    got = [tl.data.exact_reward(a, t) for (_, t), group in zip(pairs, answers, strict=True) for a in group]
    return {"train_reward": sum(got) / len(got)}


def grpo_lr(seeds: list[int], steps: int | None = None) -> dict:
    """GRPO at each of ``GRPO_LR["lrs"]`` for ``seeds``: the ``grpo`` part's code and settings but
    the rate, no report cards, and at every measurement the mean reward on :func:`train_prompts`."""
    pairs = train_prompts()

    def check(model, tokenizer):
        return train_reward(model, tokenizer, pairs)

    runs = []
    for lr in GRPO_LR["lrs"]:
        name = f"grpo lr {lr:g}"  # the rate in the name: the record keys runs by name and seed
        runs += grpo(seeds, steps, name=name, lr=lr, cards=False, train_check=check)[name]["runs"]
    return {"grpo_lr": {"settings": SETTINGS, "grpo_lr": GRPO_LR, "runs": runs}}


def sft(seed: int, steps: int, train_pairs: list, test: list) -> dict:
    s = SETTINGS["sft"]
    start = time.perf_counter()
    model, tokenizer, reference = _policy(seed)
    rows = [tl.encode_pair(tokenizer, p, r) for p, r in train_pairs]
    batches = tl.InstructionBatches(
        rows, rows[:16], model.config.context_len, s["batch_size"], tokenizer.eos_id, seed=seed
    )
    row = {
        "name": "sft",
        "seed": seed,
        "steps": steps,
        **_run(model, reference, tokenizer, batches, s["lr"], s["batch_size"], steps, test, seed),
    }
    row["seconds"] = time.perf_counter() - start
    return row


@torch.no_grad()
def _pair_logprobs(model, tokenizer, triples: list) -> dict:
    rows = [tl.encode_pair(tokenizer, p, c) for p, c, _ in triples] + [
        tl.encode_pair(tokenizer, p, r) for p, _, r in triples
    ]
    ids, n_prompt, lengths = tl.pad_rows(rows, tokenizer.eos_id)
    model.eval()
    logp = tl.sequence_logprobs(model, ids, n_prompt, lengths)
    model.train()
    n = len(triples)
    return {"chosen": float(logp[:n].mean()), "rejected": float(logp[n:].mean())}


def on_policy_triples(model, tokenizer, pairs: list) -> list:
    """``(prompt, target, wrong)`` for each ``(prompt, target)`` of ``pairs`` where ``model`` writes
    a wrong answer: ``SETTINGS["samples"]`` answers each at the evaluation temperature (seeded with
    ``DPO_PAIRS["sample_seed"]``), the first non-empty one that is not ``target`` rejected. Prompts
    it always gets right are left out."""
    model.eval()
    answers = tl.sample_answers(
        model,
        tokenizer,
        [p for p, _ in pairs],
        SETTINGS["samples"],
        temperature=SETTINGS["eval_temperature"],
        max_new_tokens=SETTINGS["grpo"]["max_new_tokens"],
        seed=DPO_PAIRS["sample_seed"],
    )
    model.train()
    out = []
    for (prompt, target), group in zip(pairs, answers, strict=True):
        wrong = [a for a in group if a.strip() and a != target and not tl.data.exact_reward(a, target)]
        if wrong:
            out.append((prompt, target, wrong[0]))
    return out


def dpo_run(
    name: str,
    beta: float,
    average: bool,
    seed: int,
    steps: int | None = None,
    triples: list | None = None,
    lr: float | None = None,
    cards: bool = True,
) -> dict:
    """One DPO run of the ``dpo`` part: its curve, the held-out pairs' log-probabilities before and
    after. ``triples`` (default: task-built pairs drawn with ``seed``) and ``lr`` (default: the
    ``dpo`` part's) are for the ``dpo_pairs`` part."""
    train_pairs, test_pairs = fine_tuning.date_splits()
    test = test_pairs[: SETTINGS["eval_pairs"]]
    held = tl.data.preference_triples(test, seed=99)
    d, steps = SETTINGS["dpo"], steps or SETTINGS["steps"]
    lr = d["lr"] if lr is None else lr
    start = time.perf_counter()
    model, tokenizer, reference = _policy(seed)
    if triples is None:
        triples = tl.data.preference_triples(train_pairs, seed=seed)
    batches = tl.DPOBatches(
        tokenizer, triples, held, d["batch_size"], reference=reference, beta=beta, average=average, seed=seed
    )
    first = _pair_logprobs(model, tokenizer, held)
    out = _run(model, reference, tokenizer, batches, lr, d["batch_size"], steps, test, seed, cards=cards)
    last = _pair_logprobs(model, tokenizer, held)
    return {
        "name": name,
        "seed": seed,
        "steps": steps,
        "beta": beta,
        "average": average,
        **out,
        "held_logprobs": {"start": first, "end": last},
        "seconds": time.perf_counter() - start,
    }


def dpo(seeds: list[int], steps: int | None = None) -> dict:
    runs = [
        dpo_run(name, beta, average, seed, steps) for name, beta, average in SETTINGS["dpo"]["runs"] for seed in seeds
    ]
    return {"dpo": {"settings": SETTINGS, "runs": runs}}


def dpo_pairs(seeds: list[int], steps: int | None = None) -> dict:
    """DPO (``DPO_PAIRS["beta"]``, summed) on task-built pairs and on the start model's own wrong
    answers (:func:`on_policy_triples` of chapter "Fine-tuning"'s training dates), at each of
    ``DPO_PAIRS["lrs"]``, for ``seeds``, without report cards; the run's name holds its pairs and
    rate."""
    train_pairs = fine_tuning.date_splits()[0]
    model, tokenizer = start_model()
    t0 = time.perf_counter()
    own = on_policy_triples(model, tokenizer, train_pairs)
    sampled = {
        "prompts": len(train_pairs),
        "kept": len(own),
        # what the rejected answers are: the right date run on past its end, another real date
        "rejected_right_date_run_on": sum(r.startswith(c) for _, c, r in own),
        "rejected_real_date": sum(tl.data.format_reward(r, c) == 1.0 for _, c, r in own),
        "examples": [list(t) for t in own[: SETTINGS["prompts_shown"] * 2]],
        "seconds": time.perf_counter() - t0,
    }
    del model
    runs = []
    for kind in DPO_PAIRS["pairs"]:
        for lr in DPO_PAIRS["lrs"]:
            name = f"{kind} lr {lr:g}"
            for seed in seeds:
                triples = own if kind == "on-policy" else None
                row = dpo_run(name, DPO_PAIRS["beta"], False, seed, steps, triples=triples, lr=lr, cards=False)
                runs.append({**row, "pairs": kind, "lr": lr})
    return {"dpo_pairs": {"settings": SETTINGS, "dpo_pairs": DPO_PAIRS, "on_policy": sampled, "runs": runs}}


def hole(seeds: list[int], steps: int | None = None) -> dict:
    """GRPO on :func:`year_reward` at ``HOLE["lr"]`` for ``seeds``, no report cards: each point
    measures the held-out exact match and the year reward (``reward``), and both rewards on the
    same answers to :func:`train_prompts` (``train_year``, ``train_exact``); the last training
    batch's mean year reward of every ``eval_every`` steps is recorded under ``batch``."""
    pairs = train_prompts()

    @torch.no_grad()
    def check(model, tokenizer):  # both rewards on the same answers to the fixed training dates
        model.eval()
        answers = tl.sample_answers(
            model,
            tokenizer,
            [p for p, _ in pairs],
            SETTINGS["samples"],
            temperature=SETTINGS["eval_temperature"],
            max_new_tokens=SETTINGS["grpo"]["max_new_tokens"],
            seed=GRPO_LR["sample_seed"],
        )
        model.train()
        scored = [(a, t) for (_, t), group in zip(pairs, answers, strict=True) for a in group]
        return {
            "train_year": sum(year_reward(a, t) for a, t in scored) / len(scored),
            "train_exact": sum(tl.data.exact_reward(a, t) for a, t in scored) / len(scored),
        }

    runs = grpo(seeds, steps, reward=year_reward, name="hole", lr=HOLE["lr"], cards=False, train_check=check)
    runs = runs["hole"]["runs"]
    return {"hole": {"settings": SETTINGS, "hole": HOLE, "runs": runs}}


def hacking(seeds: list[int], steps: int | None = None) -> dict:
    return grpo(seeds, steps, reward="format", name="hacking")


def scratchpad_start(seed: int = 0):
    """The base fine-tuned (LoRA and new token rows, as the dates adapter) to write scratchpads."""
    s = SETTINGS["scratchpad"]
    model, tokenizer = fine_tuning.base()
    model = model.float()
    pairs = tl.data.scratchpad_pairs(s["pairs"], seed=0, formats=fine_tuning.SETTINGS["date_formats"])
    torch.manual_seed(seed)
    tl.add_lora(model, tl.lora_targets(model), rank=4, alpha=8.0, seed=seed)
    text = fine_tuning.text()
    used = "".join(p + tl.PROMPT_END + r for p, r in pairs)
    tl.add_token_rows(
        model, tl.unseen_token_rows(tokenizer, text[: int(len(text) * 0.9)], among=used), reinit=True, seed=seed
    )
    rows = [tl.encode_pair(tokenizer, p, r) for p, r in pairs]
    batches = tl.InstructionBatches(rows, rows[:16], model.config.context_len, 16, tokenizer.eos_id, seed=seed)
    tl.train(model, batches, _config(s["sft_steps"], s["sft_lr"], 16))
    return model, tokenizer


def scratchpad(seeds: list[int], steps: int | None = None) -> dict:
    s, g = SETTINGS["scratchpad"], SETTINGS["grpo"]
    start_model_, tokenizer = scratchpad_start()
    tl.remove_lora(start_model_, merge=True)  # merged once: a parametrized model cannot be deep-copied
    tl.remove_token_rows(start_model_, merge=True)
    train_pairs, test_pairs = fine_tuning.date_splits()
    test = test_pairs[: SETTINGS["eval_pairs"]]
    steps = steps or SETTINGS["steps"]
    runs = []
    for reward in ("steps", "exact"):
        for seed in seeds:
            t0 = time.perf_counter()
            model = copy.deepcopy(start_model_)
            torch.manual_seed(seed)
            reference = tl.make_policy(model, "lora", rank=4, alpha=8.0, seed=seed)
            batches = tl.GRPOBatches(
                model,
                tokenizer,
                train_pairs,
                test,
                s["batch_size"],
                reward=reward,
                reference=reference,
                group_size=g["group_size"],
                temperature=g["temperature"],
                max_new_tokens=s["max_new_tokens"],
                beta=g["beta"],
                seed=seed,
            )
            out = _run(
                model,
                reference,
                tokenizer,
                batches,
                g["lr"],
                s["batch_size"],
                steps,
                test,
                seed,
                reward=tl.data.step_reward,
                max_new_tokens=s["max_new_tokens"],
            )
            runs.append(
                {
                    "name": f"scratchpad {reward}",
                    "seed": seed,
                    "steps": steps,
                    **out,
                    "seconds": time.perf_counter() - t0,
                }
            )
    return {"scratchpad": {"settings": SETTINGS, "runs": runs}}


EXPERIMENT = Experiment(
    "preferences_and_rewards",
    {
        "dpo": Part(dpo, SEEDS),
        "grpo": Part(grpo, SEEDS),
        "hacking": Part(hacking, SEEDS),
        "scratchpad": Part(scratchpad, SEEDS),
        "trl": Part(trl_parity, [0]),
        "grpo_lr": Part(grpo_lr, SEEDS),
        "dpo_pairs": Part(dpo_pairs, SEEDS),
        "hole": Part(hole, SEEDS),
    },
)

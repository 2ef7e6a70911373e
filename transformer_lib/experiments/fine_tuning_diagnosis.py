"""The diagnosis, in chapter "Fine-tuning", of a failed fine-tune (part ``diagnosis`` of
:mod:`transformer_lib.experiments.fine_tuning`): why LoRA learned the dates' format and never the dates, and the fix.

The dates are digits, and Tiny Shakespeare, the base's pretraining text, has one digit: the rows of
the other nine never trained and ended nearly one vector (their cosines are recorded). LoRA freezes
the embedding, so the adapted model reads inputs it cannot tell apart. The runs, three seeds each:
full fine-tuning with the embedding frozen (does it fail the same way?), LoRA at its own, higher
learning rate alone, LoRA with the new tokens' rows re-initialised and trained
(:func:`~transformer_lib.token_rows.add_token_rows`), and full fine-tuning for the forgetting at
matched accuracy. Each run records the answers to three fixed prompts every 50 steps, what a
reader would have watched while it trained.
"""

from __future__ import annotations

import copy
import time

import torch

import transformer_lib as tl

__all__ = ["DIAGNOSIS", "diagnosis"]

#: The fine-tunes of the dates that look for why LoRA learned the format and not the dates: the
#: name, what trains, the learning rate; ``rows``: the token rows the base never saw in pretraining
#: but the pairs use, re-initialised and trained beside the adapters.
DIAGNOSIS = [
    ("full, embedding frozen", dict(method="full", freeze_embedding=True, lr=1e-3)),
    ("lora at 5e-3", dict(method="lora", lr=5e-3)),
    ("lora + new rows at 5e-3", dict(method="lora", rows=True, lr=5e-3)),
    ("full", dict(method="full", lr=1e-3)),
]
#: Three prompts whose answers are recorded every SNAPSHOT_EVERY steps (what a reader would have
#: watched while the run trained).
WATCHED = 3
SNAPSHOT_EVERY = 50


def new_rows(tokenizer, train_pairs) -> list[int]:
    """The tokens the pairs use (prompt, separator, response) that the base's pretraining text (the
    first 90 % of Tiny Shakespeare) never produced."""
    t = tl.data.SHIPPED_PATH.read_text(encoding="utf-8")
    used = "".join(p + tl.PROMPT_END + r for p, r in train_pairs)
    return tl.unseen_token_rows(tokenizer, t[: int(len(t) * 0.9)], among=used)


def diagnosed_run(model, tokenizer, train_pairs, test_pairs, how: dict, seed: int, steps: int, settings: dict) -> dict:
    """One fine-tune of the dates as ``how`` says, with the answers to the first :data:`WATCHED` test
    prompts every :data:`SNAPSHOT_EVERY` steps (read greedily between steps; nothing random is used,
    so the run is the one it would be without them)."""
    torch.manual_seed(seed)
    tuned = copy.deepcopy(model).train()
    added = 0
    if how["method"] == "lora":
        tl.add_lora(
            tuned, tl.lora_targets(tuned), rank=settings["lora_rank"], alpha=2.0 * settings["lora_rank"], seed=seed
        )
        if how.get("rows"):
            added = tl.add_token_rows(tuned, new_rows(tokenizer, train_pairs), reinit=True, seed=seed)
    elif how.get("freeze_embedding"):
        tuned.tok_embed.weight.requires_grad_(False)  # tied: the head's matrix is frozen with it
    encoded = [tl.encode_pair(tokenizer, p, r) for p, r in train_pairs]
    batch = settings["instruction_batch"]
    batches = tl.InstructionBatches(
        encoded, encoded[:batch], model.config.context_len, batch, tokenizer.eos_id, seed=seed
    )
    prompts = []
    for p, r in test_pairs:
        ids, n_prompt = tl.encode_pair(tokenizer, p, r, end=False)
        prompts.append(ids[:n_prompt])
    watched, step = [], [0]

    def get_batch(split: str):
        if split == "train":
            if step[0] % SNAPSHOT_EVERY == 0:
                watched.append(snapshot(tuned, tokenizer, prompts[:WATCHED], step[0], settings["max_new_tokens"]))
            step[0] += 1
        return batches(split)

    get_batch.state_dict, get_batch.load_state_dict = batches.state_dict, batches.load_state_dict
    config = tl.short_run_config(steps, how["lr"], batch)
    start = time.perf_counter()
    tl.train(tuned, get_batch, config)
    tuned.eval()
    watched.append(snapshot(tuned, tokenizer, prompts[:WATCHED], steps, settings["max_new_tokens"]))
    got = tl.answers(tuned, tokenizer, prompts, settings["max_new_tokens"])
    texts = [tokenizer.decode(ids) for ids, _ in got]
    want = [r for _, r in test_pairs]
    n = len(test_pairs)
    return {
        "seconds": time.perf_counter() - start,
        "exact_match": sum(t == w and s for t, w, (_, s) in zip(texts, want, got, strict=True)) / n,
        "distinct_answers": len(set(texts)),
        "answers": texts[:5],
        "trainable": tl.count_parameters(tuned),
        "token_rows": added,
        "watched": watched,
        "model": tuned,
    }


def snapshot(model, tokenizer, prompts, step: int, max_new_tokens: int) -> dict:
    was = model.training
    model.eval()
    got = tl.answers(model, tokenizer, prompts, max_new_tokens)
    model.train(was)
    return {"step": step, "answers": [tokenizer.decode(ids) for ids, _ in got]}


def diagnosis(seeds: list[int], steps: int | None, chapter) -> dict:
    """The runs of :data:`DIAGNOSIS` over ``seeds``; ``chapter`` is
    :mod:`transformer_lib.experiments.fine_tuning` (its base model, dates, validation text and settings)."""
    settings = chapter.SETTINGS
    model, tokenizer = chapter.base()
    train_pairs, test_pairs = chapter.date_splits()
    val = chapter.val_tokens(tokenizer)
    digits = [tokenizer.encode_ordinary(str(d))[0] for d in range(10)]
    unit = torch.nn.functional.normalize(model.tok_embed.weight.detach()[digits].double(), dim=-1)
    cos = unit @ unit.T
    part = {
        "watched_prompts": [p for p, _ in test_pairs[:WATCHED]],
        "watched_responses": [r for _, r in test_pairs[:WATCHED]],
        "new_rows": new_rows(tokenizer, train_pairs),
        "digit_cosines": cos.tolist(),
        "runs": [],
    }
    for name, how in DIAGNOSIS:
        for seed in seeds:
            r = diagnosed_run(
                model, tokenizer, train_pairs, test_pairs, how, seed, steps or settings["instruction_steps"], settings
            )
            tuned = r.pop("model")
            row = {"name": name, "seed": seed, **how, **r, "val_loss_after": tl.window_loss(tuned, val)}
            if name.startswith("lora"):  # the adapters and rows off: the base, unchanged
                tl.remove_lora(tuned, merge=False)
                if tl.token_rows(tuned) is not None:
                    tl.remove_token_rows(tuned, merge=False)
                state, base_state = tuned.state_dict(), model.state_dict()
                row["base_unchanged"] = state.keys() == base_state.keys() and all(
                    torch.equal(state[k], base_state[k]) for k in state
                )
            part["runs"].append(row)
            print({k: v for k, v in row.items() if k != "watched"}, flush=True)
    return {"settings": settings, "diagnosis": part}

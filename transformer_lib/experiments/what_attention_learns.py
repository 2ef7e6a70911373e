r"""The experiments over seeds of chapter "What attention learns": the chapter trains one seed of
each live; the claims that need several seeds read the record,
``transformer_lib/data/ch12/induction_sweep.json`` (``recorded("what_attention_learns")``).

The command line (``--dry-run`` prints and writes nothing)::

    # everything (about 15 minutes, 1 core)
    python -m transformer_lib.experiments what_attention_learns
    # one part, merged into the record
    python -m transformer_lib.experiments what_attention_learns --parts repeats
    # print only
    python -m transformer_lib.experiments what_attention_learns \
        --parts repeats --dry-run

Parts:

* ``repeats``: attention-only models of one and two layers (width 64, 4 heads, vocabulary 48,
  context 48, repeat of 10 tokens at a random distance), five seeds each: the history of the
  loss on the repeat and of the best head's scores, the step of the phase change, and for the
  two-layer models the loss on the repeat with the circuit's heads mean-ablated (layer 1's
  previous-token heads, layer 2's induction heads, the best induction head alone) and the best
  induction head's score with layer 1's heads ablated;
* ``fixed``: one-layer models trained with the repeat always at the same distance (the
  positional shortcut), scored at that distance and at random distances;
* ``agreement``: chapter "A GPT from scratch"'s GPT on its invented language, three seeds: the probability that the
  verb agrees with its subject, with each head mean-ablated, and with the most important head
  patched from singular into plural sentences;
* ``shakespeare``: the character GPT of the shipped checkpoint's command, three seeds: every
  head's previous-token score on real text and induction score on a repeated real passage.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

import transformer_lib as tl

from .recorder import Experiment, Part

__all__ = ["EXPERIMENT"]

SEEDS = [0, 1, 2, 3, 4]
# the repeat task of the chapter
VOCAB, CONTEXT, REPEAT, WIDTH, HEADS = 48, 48, 10, 64, 4
STEPS, LOG_EVERY, THRESHOLD = 1000, 25, 0.3
FIXED_DISTANCE, FIXED_STEPS = 20, 400
# chapter "A GPT from scratch"'s GPT on its invented language
AGREE_SEEDS, AGREE_STEPS, AGREE_PAIRS = [0, 1, 2], 400, 64
# the Shakespeare character model: the command that made the shipped checkpoint, per seed
SHAKESPEARE_SEEDS = [1337, 1, 2]
SHAKESPEARE_FLAGS = (
    "--preset cpu --n-layers 2 --n-heads 4 --d-model 64 --context-len 128 --dropout 0 --batch-size 32 "
    "--max-iters 3000 --lr 3e-3 --min-lr 3e-4 --warmup-iters 100 --eval-interval 1000 --eval-iters 20 "
    "--device cpu --no-compile --no-progress"
).split()


def r(x: float, digits: int = 4) -> float:
    return round(float(x), digits)


def repeat_model(n_layers: int, seed: int) -> tl.AttentionOnly:
    tl.set_seed(seed)
    return tl.AttentionOnly(VOCAB, CONTEXT, n_layers=n_layers, n_heads=HEADS, d_model=WIDTH)


def held_out(seed: int, n: int = 256, **spread) -> tuple[torch.Tensor, ...]:
    """A held-out batch of repeats, drawn from its own generator (not the training one)."""
    gen = torch.Generator().manual_seed(10_000 + seed)
    return tl.repeat_batch(n, CONTEXT, VOCAB, REPEAT, generator=gen, return_distance=True, **spread)


def circuit_heads(model: torch.nn.Module, batch) -> dict:
    """Every head's scores, and the heads of the circuit: layer 1's previous-token heads and the last
    layer's induction heads (each: the heads scoring at least THRESHOLD, and at least the best one)."""
    scores = tl.head_scores(model, batch[0], batch[2], batch[3])
    names = list(scores["induction"])
    prev = scores["previous_token"][names[0]]
    ind = scores["induction"][names[-1]]

    def chosen(s):
        best = max(range(HEADS), key=s.__getitem__)
        return sorted({best, *(h for h in range(HEADS) if s[h] >= THRESHOLD)})

    return {
        "previous_token_heads": [names[0], chosen(prev)],
        "induction_heads": [names[-1], chosen(ind)],
        "best_induction_head": [names[-1], max(range(HEADS), key=ind.__getitem__)],
        "scores": {k: {n: [r(x) for x in v] for n, v in s.items()} for k, s in scores.items()},
    }


@torch.no_grad()
def repeat_loss(model, batch, heads: dict | None = None, reference=None) -> float:
    """The loss on the repeat of ``batch``, with ``heads`` mean-ablated over ``reference``."""
    model.eval()
    if not heads:
        return model(batch[0], batch[1], batch[2])[1].item()
    with tl.intervene_heads(model, heads, "mean", reference=reference):
        return model(batch[0], batch[1], batch[2])[1].item()


@torch.no_grad()
def induction_with(model, batch, layer: str, head: int, heads: dict, reference) -> float:
    """The induction score of ``layer``'s ``head`` while ``heads`` are mean-ablated."""
    model.eval()
    with tl.intervene_heads(model, heads, "mean", reference=reference), tl.capture_attention(model) as w:
        model(batch[0])
    score = tl.induction_score(w[layer][:, head], batch[3], batch[2]).mean()
    return score.item()


def run_repeats(seeds=SEEDS, steps=STEPS, layers=(1, 2)) -> dict:
    runs = []
    for seed in seeds:
        for n_layers in layers:
            model = repeat_model(n_layers, seed)
            start = time.time()
            history = tl.train_on_repeats(model, steps, repeat_len=REPEAT, seed=seed, log_every=LOG_EVERY)
            run = {
                "seed": seed,
                "n_layers": n_layers,
                "seconds": r(time.time() - start, 1),
                "step": [h["step"] for h in history],
                "loss": [r(h["loss"]) for h in history],
                "best_induction": [r(max(max(v) for v in h["induction"].values())) for h in history],
                "best_previous_token": [r(max(max(v) for v in h["previous_token"].values())) for h in history],
                "phase_change_step": tl.phase_change_step(history, THRESHOLD),
                "final_loss": r(history[-1]["loss"]),
            }
            run["best_induction_score"] = max(run["best_induction"])
            if n_layers == 2:
                batch, reference = held_out(seed), held_out(seed + 100)[0]
                heads = circuit_heads(model, batch)
                (l1, prev_heads), (l2, ind_heads) = heads["previous_token_heads"], heads["induction_heads"]
                best = heads["best_induction_head"][1]
                run["heads"] = heads
                run["ablation"] = {
                    "none": r(repeat_loss(model, batch)),
                    "previous_token_heads": r(repeat_loss(model, batch, {l1: prev_heads}, reference)),
                    "induction_heads": r(repeat_loss(model, batch, {l2: ind_heads}, reference)),
                    "best_induction_head_alone": r(repeat_loss(model, batch, {l2: best}, reference)),
                    "induction_score": r(induction_with(model, batch, l2, best, {}, reference)),
                    "induction_score_layer_1_heads_ablated": r(
                        induction_with(model, batch, l2, best, {l1: prev_heads}, reference)
                    ),
                }
            runs.append(run)
            print(
                f"repeats seed {seed}, {n_layers} layer(s): phase change at {run['phase_change_step']}, best "
                f"induction {run['best_induction_score']}, loss {run['final_loss']} ({run['seconds']} s)"
            )
    return {"threshold": THRESHOLD, "steps": steps, "log_every": LOG_EVERY, "runs": runs}


def run_fixed(seeds=SEEDS, steps=FIXED_STEPS) -> dict:
    runs = []
    fixed = {"min_distance": FIXED_DISTANCE, "max_distance": FIXED_DISTANCE}
    for seed in seeds:
        model = repeat_model(1, seed)
        tl.train_on_repeats(model, steps, repeat_len=REPEAT, seed=seed, log_every=steps, **fixed)
        scores = {}
        for name, spread in (("fixed", fixed), ("random", {})):
            batch = held_out(seed, **spread)
            s = tl.head_scores(model, batch[0], batch[2], batch[3])["induction"]["layers.0"]
            scores[name] = {"best_induction": r(max(s)), "loss": r(repeat_loss(model, batch))}
        runs.append({"seed": seed, **scores})
        print(f"fixed distance seed {seed}: {scores}")
    return {"distance": FIXED_DISTANCE, "steps": steps, "runs": runs}


def agreement_model(seed: int, steps: int = AGREE_STEPS):
    """The GPT of chapter "A GPT from scratch" (2 layers, 4 heads, width 64, context 32) trained on its invented
    language."""
    text = tl.agreement_text(8000, seed=0)
    tokenizer = tl.CharTokenizer.from_text(text)
    train_ids, val_ids = tl.split_tokens(torch.tensor(tokenizer.encode(text)), val_fraction=0.1)
    config = tl.GPTConfig(vocab_size=tokenizer.vocab_size, context_len=32, n_layers=2, n_heads=4, d_model=64)
    tl.set_seed(seed)
    model = tl.GPT(config)
    train_config = tl.TrainConfig(
        max_iters=steps,
        lr=3e-3,
        min_lr=3e-4,
        warmup_iters=50,
        eval_interval=0,
        device="cpu",
        progress=False,
        verbose=False,
    )
    tl.train(model, tl.LMBatches(train_ids, val_ids, 32, 32, seed=seed), train_config)
    return model.eval(), tokenizer


def agreement_batch(tokenizer, seed: int = 1, n: int = AGREE_PAIRS):
    pairs = tl.agreement_prompts(n, 24, seed=seed)
    singular = torch.tensor([tokenizer.encode(a) for a, _ in pairs])  # (n, 24)
    plural = torch.tensor([tokenizer.encode(b) for _, b in pairs])  # (n, 24)
    return singular, plural


@torch.no_grad()
def agreement_experiment(model, tokenizer) -> dict:
    """Agreement probabilities: plain, each head mean-ablated, the top head patched."""
    singular, plural = agreement_batch(tokenizer)
    idx = torch.cat([singular, plural])
    is_singular = torch.arange(len(idx)) < len(singular)
    s = tokenizer.stoi["s"]

    def agree(heads=None, mode="mean", reference=None, x=idx, which=is_singular):
        if heads is None:
            return tl.agreement_probability(model, x, which, s).mean().item()
        with tl.intervene_heads(model, heads, mode, reference=reference):
            return tl.agreement_probability(model, x, which, s).mean().item()

    names = list(tl.attention_layers(model))
    ablated = {n: [r(agree({n: h}, reference=idx)) for h in range(4)] for n in names}
    layer, head = min(((n, h) for n in names for h in range(4)), key=lambda nh: ablated[nh[0]][nh[1]])
    plural_only = torch.zeros(len(plural), dtype=torch.bool)
    return {
        "base": r(agree()),
        "ablated": ablated,
        "top_head": [layer, head],
        "plural_base": r(agree(x=plural, which=plural_only)),
        "plural_patched_from_singular": r(agree({layer: head}, "patch", singular, plural, plural_only)),
    }


def run_agreement(seeds=AGREE_SEEDS, steps=AGREE_STEPS) -> dict:
    runs = []
    for seed in seeds:
        model, tokenizer = agreement_model(seed, steps)
        run = {"seed": seed, **agreement_experiment(model, tokenizer)}
        runs.append(run)
        print(
            f"agreement seed {seed}: {run['base']} -> top head {run['top_head']} ablated "
            f"{run['ablated'][run['top_head'][0]][run['top_head'][1]]}; plural {run['plural_base']} -> patched "
            f"{run['plural_patched_from_singular']}"
        )
    return {"steps": steps, "pairs": AGREE_PAIRS, "runs": runs}


def shakespeare_batches(tokenizer, context_len: int, n: int = 64, seed: int = 0):
    """``(real (n, T), repeated (n, T))`` from the validation text: windows, and half-windows twice."""
    text = tl.load_corpus().text
    _, val = tl.split_tokens(torch.tensor(tokenizer.encode(text)), val_fraction=0.1)
    gen = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, len(val) - context_len - 1, (n,), generator=gen)
    real = torch.stack([val[s : s + context_len + 1] for s in starts])  # (n, T + 1)
    half = torch.stack([val[s : s + context_len // 2] for s in starts])  # (n, T / 2)
    return real, torch.cat([half, half], dim=1)


@torch.no_grad()
def shakespeare_scores(model, tokenizer) -> dict:
    T = model.config.context_len
    real, repeated = shakespeare_batches(tokenizer, T)
    with tl.capture_attention(model) as w_real:
        model(real[:, :-1])
    with tl.capture_attention(model) as w_rep:
        model(repeated)
    names = list(w_real)
    by_pos = tl.loss_by_position(model, repeated[:, :-1], repeated[:, 1:])  # (T - 1,)
    return {
        "previous_token": {n: [r(x) for x in tl.previous_token_score(w_real[n]).mean(0)] for n in names},
        "induction": {n: [r(x) for x in tl.induction_score(w_rep[n], T // 2).mean(0)] for n in names},
        "loss_first_copy": r(by_pos[: T // 2 - 1].mean()),
        "loss_second_copy": r(by_pos[T // 2 :].mean()),
        "val_loss": r(tl.loss_by_position(model, real[:, :-1], real[:, 1:]).mean()),
    }


def run_shakespeare(seeds=SHAKESPEARE_SEEDS, steps: int | None = None) -> dict:
    """The character GPT of the shipped checkpoint's command, trained by that command for each seed
    (``steps``: a smoke run of that many iterations), and every head's scores on real text."""
    flags = SHAKESPEARE_FLAGS if steps is None else [*SHAKESPEARE_FLAGS, "--max-iters", str(steps)]
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in seeds:
            out = Path(tmp) / f"seed{seed}"
            cmd = [sys.executable, "-m", "transformer_lib", "train", *flags, "--seed", str(seed), "--out-dir", str(out)]
            subprocess.run(cmd, check=True, cwd=Path(tl.__file__).parent.parent, capture_output=True)
            model, tokenizer, _ = tl.load_checkpoint(out)
            run = {"seed": seed, **shakespeare_scores(model, tokenizer)}
            runs.append(run)
            print(f"shakespeare seed {seed}: {run}")
    return {"flags": flags, "runs": runs}


# each part: ``run(seeds, steps)`` returns the record's entries it fills (``steps``: a smoke run)
EXPERIMENT = Experiment(
    "what_attention_learns",
    {
        "repeats": Part(lambda seeds, steps: {"repeats": run_repeats(seeds, steps or STEPS)}, SEEDS),
        "fixed": Part(lambda seeds, steps: {"fixed": run_fixed(seeds, steps or FIXED_STEPS)}, SEEDS),
        "agreement": Part(lambda seeds, steps: {"agreement": run_agreement(seeds, steps or AGREE_STEPS)}, AGREE_SEEDS),
        "shakespeare": Part(lambda seeds, steps: {"shakespeare": run_shakespeare(seeds, steps)}, SHAKESPEARE_SEEDS),
    },
)

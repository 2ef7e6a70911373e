"""The experiment over seeds of chapter "Longer than trained": where a model read past the length it was
trained at fails (loss by position out to 4 and 8 times that length, rotary and learned
positions), and what each rescaling of the rotary frequencies recovers at 4 times the length,
with no training, after a short fine-tune at the new length, and against two controls. The
chapter reads the record, ``transformer_lib/data/longer_than_trained/longer_sweep.json``
(``recorded("longer_than_trained")``), and computes loss by position live with seed 0's rotary
model, shipped beside it as a float32 state dict, ``base_seed0.pt`` (:func:`checkpoint_model`).

Every model is a Llama-style GPT (RMSNorm, SwiGLU, no biases, untied head) of 2 layers, width 64,
4 heads (``d_k = 16``: 8 rotated pairs) on Tiny Shakespeare's characters (the split of chapter "Tokens": the
last 10 % held out), trained in float64 at context 64 for 600 steps of 16 random windows with
AdamW at a constant 3e-3 and no weight decay, as the ``token_run`` of chapter "Tokens". Every step at any
length reads the same 1024 tokens (4 windows at 256), so that the controls differ from the
fine-tune in length alone. Seed ``s`` draws the initial weights after ``torch.manual_seed(s)``
and the windows from a generator seeded ``s``. The parts:

* ``positions`` (S-126): the rotary model and the same model with learned positions
  (:data:`POSITIONS`), each read at 64, 256 and 512 tokens with no rescaling. A learned table
  has no rows past 64: :func:`at_length` draws the new ones ``N(0, 0.02)``, as the model's
  initialisation draws the others, from a generator seeded ``s``.
* ``rescaling`` (S-128): the rotary model read at 256 with each rescaling of :data:`METHODS`
  (``RopeScaling(kind, factor=4, original_context=64)``, the other fields the module's
  defaults), in the four conditions of :data:`CONDITIONS`: no training; 100 more steps at 256
  with the rescaling in place; control (a), the same 100 steps at 64, then read at 256 with each
  rescaling; control (b), the model trained at 256 from the start (600 steps at 3e-3, then the
  100 steps of a fine-tune). The 100 extra steps start a fresh AdamW at 1e-3 and read the
  windows the base's generator draws next.

Each run records bits per byte on every full held-out window of the length read, overall and by
bucket of 16 positions, with the seconds it trained and read for; a positions run also records
the final training loss (the mean of the last 50 steps), the parameters and ``probe_loss`` (the
first 8 held-out windows, at 64 and, ``probe_loss_long``, at 256), and seed 0's rotary run the
SHA-256 of its float32 weights (``checkpoint_sha256``): what the shipped checkpoint is checked
against.

The command line (``--dry-run`` prints and writes nothing)::

    # the record (27 trainings, about 9 minutes, 1 core)
    python -m transformer_lib.experiments longer_than_trained
    # the record and seed 0's rotary model, the shipped checkpoint
    python -m transformer_lib.experiments.longer_than_trained
    # one seed of everything, 12 steps (2 extra), printed, nothing written
    python -m transformer_lib.experiments longer_than_trained \\
        --seeds 0 --steps 12 --dry-run

Calibration (seed 0, one thread). Float64 costs about twice float32's time and the whole record
still fits in about 9 minutes on one core; a 600-step float64 training is still moved by another
CPU's kernels (the slow test's docstring says by how much). At first every step read 16 windows
at any length (four times the tokens at 256): by the time of a few steps, the record would have
taken about 19 minutes. The
fine-tune's learning rate, on the same base model, bits per byte at 256 for none, linear, ntk,
yarn, llama3: 3e-3 (the base's) 2.828, 2.959, 2.809, 2.820, 2.806; 1e-3 2.776, 2.998, 2.756,
2.765, 2.778; 1e-2 3.015, 3.271, 2.978, 3.049, 3.009. So 1e-3, for control (a)'s steps too. The
unigram entropy of the held-out characters (the training text's frequencies) is 4.83 bits.

The record (three seeds; bits per byte, median and range):

* S-126. Rotary positions: 2.897 (2.870-2.906) at 64, 3.638 (3.383-3.751) at 256, 4.140
  (3.888-4.325) at 512. By position the failure is gradual: positions 64-79 read as well as
  those within 64 (2.83-2.88 on the three seeds), 80-95 a little worse (2.91-2.98), then the
  loss climbs (seed 0 slowest), and from about 176 on it stands at 4.1-4.8 (at 512, up to 5.1,
  above the unigram entropy on seed 2). Learned positions: 3.082 (3.064-3.094) at 64, 4.205
  (4.139-4.260) at 256, 4.385 (4.307-4.473) at 512; the failure is at once: the first bucket past
  64 is at 4.44-4.57 on every seed, and everything after it stays at 4.4-4.8.
* S-128, no training: ntk 3.113 (3.022-3.221), yarn 3.145 (3.136-3.189), llama3 3.203
  (3.154-3.335), none 3.638 (3.383-3.751), linear 4.744 (4.431-4.749). Each of ntk, yarn and
  llama3 beats none on every seed (by 0.23 to 0.62); their order changes with the seed. Linear
  is worse than none on every seed (by 0.68 to 1.36), and the first 64 positions with it read
  at 4.2-4.8 (unscaled, 2.8-3.0): it divides every frequency by 4, the fastest pair's too. The
  rescalings cost the trained positions more or less (positions 16-63 on every seed: none
  2.82-2.89, ntk 2.87-2.91, yarn 2.96-3.04, llama3 3.02-3.35); ntk, which keeps the fastest
  pairs nearly as trained, costs them least, and its loss climbs from about 128 on (median 3.64
  at 240-255) where yarn's and llama3's stay flat near 3.2.
* After 100 steps at 256: ntk 2.778 (2.756-2.784), yarn 2.781 (2.765-2.782), llama3 2.785
  (2.778-2.788), none 2.822 (2.776-2.828), linear 2.956 (2.880-2.998). Ntk, yarn and llama3 are
  within 0.023 of each other on each seed (0.003 on seed 2), their order changing with the seed;
  none is behind all three by 0.037-0.050 on seeds 1 and 2, but on seed 0 only 0.011-0.020
  behind ntk and yarn and 0.003 ahead of llama3; linear is the worst on every seed (0.06-0.22
  behind none). So "any rescaling plus a few steps recovers" holds for ntk, yarn and llama3,
  nearly for no rescaling at all, and not for linear in 100 steps.
* Control (a), the same 100 steps at 64 and then read at 256: none 3.700 (3.348-3.778), linear
  4.828 (4.623-5.144), ntk 3.084 (2.910-3.175), yarn 3.106 (3.090-3.153), llama3 3.188
  (3.142-3.359): within 0.12 of no training for every rescaling but linear (0.08-0.40 worse),
  and 0.15 to 2.1 behind the fine-tune at 256 on every seed and method. The recovery is the
  length, not the steps.
* Control (b), trained at 256 from the start: 2.819 (2.800-2.845). The fine-tune with ntk, yarn
  or llama3 beats it on every seed, by 0.022 to 0.063; with none it is level (-0.024 to +0.010).
  With the same steps and tokens, 600 steps at 64 and 100 at 256 are no worse than 700 at 256,
  in about 70 % of the training time here (28 s against 39 s).
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import transformer_lib as tl

from ..chapters import data_folder
from .gpt import weights_sha256
from .recorder import Experiment, Part, run_experiment
from .tokens import as_float32, run_settings, write_float32_state
from .tokens import char_corpus as corpus

__all__ = [
    "CHECKPOINT",
    "CONDITIONS",
    "EXPERIMENT",
    "METHODS",
    "POSITIONS",
    "SETTINGS",
    "at_length",
    "base_model",
    "checkpoint_model",
    "config",
    "corpus",
    "loss_by_position",
    "probe_loss",
    "reading",
    "write_checkpoint",
]

SEEDS = [0, 1, 2]
LLAMA = tl.LLAMA_BLOCK.changes()
#: the two kinds of positions read past their length: each one's GPTConfig options besides Llama's block
POSITIONS = {"rotary": {}, "learned": {"positions": "learned"}}
#: the shape and training of every run (chapter "Tokens"'s ``token_run`` settings, for 600 steps), in float64
SETTINGS = {
    **run_settings(steps=600),
    "dtype": "float64",
    "long_context": 256,  # the length the rescalings are read at: 4 times the trained one
    "longest": 512,  # the positions part also reads 8 times the trained length
    "extra_steps": 100,  # the short fine-tune, and control (a)'s steps at the old length
    "finetune_lr": 1e-3,  # the extra steps' constant learning rate, a fresh AdamW (the base's: lr)
    "tokens_per_step": 1024,  # every step at any length: batch_size = tokens_per_step / length
    "bucket": 16,  # loss by position: buckets of this many positions
    "last": 50,  # the final training loss: the mean over the last this many steps
    "probe_windows": 8,  # probe_loss: the first this many held-out windows
    "init_std": 0.02,  # a learned table's new rows: N(0, init_std), as the model's initialisation draws them
}
FACTOR = SETTINGS["long_context"] // SETTINGS["context_len"]
#: each rescaling read at ``long_context`` (its RopeScaling's fields besides the defaults; None: as trained)
METHODS = {
    "none": None,
    **{
        kind: {"kind": kind, "factor": FACTOR, "original_context": SETTINGS["context_len"]}
        for kind in ("linear", "ntk", "yarn", "llama3")
    },
}
#: the rescaling part's conditions: how the rotary model came to be read at ``long_context``
CONDITIONS = {
    "no_training": "the base model (trained at context_len) read with each rescaling, no step taken",
    "finetune_long": "the base model with each rescaling, trained extra_steps more at long_context, read so",
    "more_steps_short": "control (a): the base model trained extra_steps more at context_len (no rescaling), "
    "then read at long_context with each rescaling",
    "trained_long": "control (b): a model trained at long_context from the start, steps at lr then extra_steps "
    "at finetune_lr, read at long_context with no rescaling",
}
DTYPE = torch.float64
NOTES = (
    "bits_per_byte: over every full held-out window of the length read (windows that overlap by one, so each "
    "token after the first is predicted once); by_position: the same per bucket of `bucket` positions, bucket 0 "
    "holding positions 0..bucket-1 of each window. A learned table is extended past context_len with rows drawn "
    "N(0, init_std) from a generator seeded with the run's seed. Every step reads tokens_per_step tokens: "
    "batch_size windows at context_len, tokens_per_step / long_context at long_context. The extra steps start a "
    "fresh AdamW at finetune_lr and read the windows the base's generator draws next. train_seconds is the training "
    "of the run (more_steps_short: the one shared fine-tune; no_training: 0), eval_seconds its reading; "
    "seconds are the recording machine's, one thread: compare them within the record only."
)
#: seed 0's rotary model trained at ``context_len``, float32 (a state dict :func:`checkpoint_model` loads)
CHECKPOINT = data_folder("longer_than_trained") / "base_seed0.pt"
#: the base models trained in this process: (positions, seed, steps) -> (model, generator state, log)
BASES: dict[tuple[str, int, int], tuple[tl.GPT, torch.Tensor, dict]] = {}


def config(positions: str = "rotary", context_len: int | None = None, method: str = "none", vocab_size: int = 65):
    """The GPT configuration of a model with ``positions`` (a key of :data:`POSITIONS`) reading
    ``context_len`` tokens (default: the trained length) with rescaling ``method`` (:data:`METHODS`)."""
    if positions not in POSITIONS:
        raise ValueError(f"no positions {positions!r}: the positions are {', '.join(POSITIONS)}")
    if method not in METHODS:
        raise ValueError(f"no rescaling {method!r}: the methods are {', '.join(METHODS)}")
    if method != "none" and positions != "rotary":
        raise ValueError(f"the rescaling {method!r} changes rotary frequencies: positions {positions!r} have none")
    s = SETTINGS
    T = s["context_len"] if context_len is None else context_len
    options = {**LLAMA, **POSITIONS[positions], "rope_scaling": METHODS[method]}
    return tl.GPTConfig(vocab_size, T, s["n_layers"], s["n_heads"], s["d_model"], **options)


def train(model: tl.GPT, train_ids: torch.Tensor, steps: int, generator: torch.Generator, lr: float) -> dict:
    """Train ``model`` in place for ``steps`` steps of ``tokens_per_step`` tokens, windows of its
    ``context_len`` drawn by ``generator``, with a fresh AdamW at a constant ``lr`` and no weight
    decay; returns the ``losses`` of each step and the ``seconds`` the steps took."""
    T = model.config.context_len
    B = SETTINGS["tokens_per_step"] // T
    optimiser = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    losses, start = [], time.perf_counter()
    model.train()
    for _ in range(steps):
        starts = torch.randint(len(train_ids) - T, (B,), generator=generator)
        window = train_ids[starts[:, None] + torch.arange(T + 1)]  # (B, T + 1)
        _, loss = model(window[:, :-1], window[:, 1:])
        optimiser.zero_grad(set_to_none=True)
        loss.backward()
        optimiser.step()
        losses.append(loss.item())
    model.eval()
    return {"losses": losses, "seconds": time.perf_counter() - start}


def final_loss(log: dict) -> float:
    """The mean training loss of the last ``last`` steps of ``log``."""
    last = log["losses"][-SETTINGS["last"] :]
    return sum(last) / len(last)


def base_model(positions: str, seed: int, steps: int | None = None, data=None) -> tuple[tl.GPT, torch.Tensor, dict]:
    """The model with ``positions`` trained at ``context_len`` for ``steps`` (default
    :data:`SETTINGS`') from seed ``seed`` (weights drawn after ``torch.manual_seed(seed)``, windows
    from a generator seeded ``seed``): ``(model in eval mode, the generator's state after training,
    the training log)``. Trained once per process; the parts share it (do not train it further)."""
    steps = SETTINGS["steps"] if steps is None else steps
    key = (positions, seed, steps)
    if key not in BASES:
        _, train_ids, _ = data or corpus()
        torch.manual_seed(seed)
        model = tl.GPT(config(positions)).to(DTYPE)
        generator = torch.Generator().manual_seed(seed)
        log = train(model, train_ids, steps, generator, SETTINGS["lr"])
        BASES[key] = (model, generator.get_state(), log)
    return BASES[key]


def at_length(model: tl.GPT, context_len: int, method: str = "none", seed: int = 0) -> tl.GPT:
    """A new GPT holding ``model``'s weights (its dtype) that reads ``context_len`` tokens with the
    rescaling ``method``. Rotary positions have no table: the state dict loads as it is. A learned
    table shorter than ``context_len`` gets its missing rows drawn ``N(0, init_std)`` from a
    generator seeded ``seed``, as the model's initialisation draws them."""
    c = model.config
    positions = "learned" if c.positions == "learned" else "rotary"
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    table = state.get("pos_embed.embedding.weight")  # (context_len, d_model), learned positions only
    if table is not None and context_len > len(table):
        generator = torch.Generator().manual_seed(seed)
        new = torch.randn(context_len - len(table), c.d_model, generator=generator, dtype=torch.float64)
        state["pos_embed.embedding.weight"] = torch.cat([table, (new * SETTINGS["init_std"]).to(table.dtype)])
    elif table is not None:
        state["pos_embed.embedding.weight"] = table[:context_len]
    longer = tl.GPT(config(positions, context_len, method, c.vocab_size)).to(next(model.parameters()).dtype)
    longer.load_state_dict(state)
    return longer.eval()


@torch.no_grad()
def loss_by_position(model: tl.GPT, ids: torch.Tensor, byte_lengths: torch.Tensor, batch_size: int = 64):
    """The summed next-token loss (nats) and bytes at each position of the full windows of
    ``model.config.context_len`` tokens cut from ``ids (N,)`` (overlapping by one, so every token
    after the first is predicted once): ``(nats (T,) float64, bytes (T,) long, windows)``."""
    T = model.config.context_len
    n = (len(ids) - 1) // T
    x, y = ids[: n * T].view(n, T), ids[1 : n * T + 1].view(n, T)  # (n, T) each
    nats = torch.zeros(T, dtype=torch.float64)
    for i in range(0, n, batch_size):
        logits, _ = model(x[i : i + batch_size])  # (b, T, V)
        nats += F.cross_entropy(logits.double().transpose(1, 2), y[i : i + batch_size], reduction="none").sum(0)
    return nats, byte_lengths[y].sum(0), n


def reading(model: tl.GPT, val_ids: torch.Tensor, byte_lengths: torch.Tensor) -> dict:
    """Bits per byte of ``model`` at its ``context_len`` on the held-out ids, overall and by bucket
    of ``bucket`` positions (``by_position``), the tokens it predicted and the seconds it took."""
    start = time.perf_counter()
    nats, n_bytes, windows = loss_by_position(model, val_ids, byte_lengths)
    k = SETTINGS["bucket"]
    bits = nats / math.log(2)
    return {
        "length": model.config.context_len,
        "bits_per_byte": bits.sum().item() / n_bytes.sum().item(),
        "by_position": (bits.view(-1, k).sum(1) / n_bytes.view(-1, k).sum(1)).tolist(),
        "tokens": windows * model.config.context_len,
        "eval_seconds": time.perf_counter() - start,
    }


@torch.no_grad()
def probe_loss(model: tl.GPT, val_ids: torch.Tensor) -> float:
    """The mean next-character loss of ``model`` (eval mode) on the first ``probe_windows`` held-out
    windows of its ``context_len``, in nats: what the float32 checkpoint is checked against."""
    T, n = model.config.context_len, SETTINGS["probe_windows"]
    x, y = val_ids[: n * T].view(n, T), val_ids[1 : n * T + 1].view(n, T)
    logits, _ = model(x)
    return F.cross_entropy(logits.double().flatten(0, 1), y.flatten()).item()


def _steps(steps: int | None) -> tuple[int, int]:
    """The base's steps and the extra steps: :data:`SETTINGS`', or a smoke run's ``steps`` and the
    same proportion of extra ones."""
    s = SETTINGS
    if steps is None:
        return s["steps"], s["extra_steps"]
    return steps, max(1, steps * s["extra_steps"] // s["steps"])


# ----- positions: where a model read past its length fails -----


def positions_run(positions: str, seed: int, steps: int | None = None, data=None) -> dict:
    """One run of the ``positions`` part: the base model with ``positions`` read at its length, at 4
    and at 8 times it (no rescaling); the record's entry."""
    data = data or corpus()
    tokenizer, _, val_ids = data
    byte_lengths = tl.token_byte_lengths(tokenizer)
    model, _, log = base_model(positions, seed, _steps(steps)[0], data)
    s = SETTINGS
    reads = [
        reading(at_length(model, T, seed=seed), val_ids, byte_lengths)
        for T in (s["context_len"], s["long_context"], s["longest"])
    ]
    entry = {
        "name": positions,
        "seed": seed,
        "params": sum(p.numel() for p in model.parameters()),
        "final_loss": final_loss(log),
        "train_seconds": log["seconds"],
        "probe_loss": probe_loss(model, val_ids),
        "probe_loss_long": probe_loss(at_length(model, s["long_context"], seed=seed), val_ids),
        "reads": reads,
    }
    if (positions, seed) == ("rotary", 0):  # the shipped checkpoint's weights: float32
        entry["checkpoint_sha256"] = weights_sha256(as_float32(model))
    return entry


def positions_part(seeds: list[int], steps: int | None = None) -> dict:
    """The ``positions`` part: rotary and learned positions for each seed."""
    data = corpus()
    runs = []
    for name in POSITIONS:
        for seed in seeds:
            runs.append(positions_run(name, seed, steps, data))
            by = ", ".join(f"{r['length']}: {r['bits_per_byte']:.3f}" for r in runs[-1]["reads"])
            print(f"positions {name:>7} seed {seed}: bits/byte {by}", flush=True)
    settings = {**SETTINGS, **LLAMA, "lengths": [SETTINGS[k] for k in ("context_len", "long_context", "longest")]}
    return {"positions": {"settings": settings, "positions": POSITIONS, "notes": NOTES, "runs": runs}}


# ----- rescaling: what each rescaling recovers at 4 times the length -----


def rescaling_runs(seed: int, steps: int | None = None, data=None) -> list[dict]:
    """Every run of the ``rescaling`` part for seed ``seed``: each condition of :data:`CONDITIONS`
    with each method of :data:`METHODS` (``trained_long``: ``"none"`` only)."""
    data = data or corpus()
    tokenizer, train_ids, val_ids = data
    byte_lengths = tl.token_byte_lengths(tokenizer)
    base_steps, extra = _steps(steps)
    base, state, log = base_model("rotary", seed, base_steps, data)
    T, L = SETTINGS["context_len"], SETTINGS["long_context"]
    runs = []

    def record(condition, method, model, train_log=None):
        entry = {"name": condition, "method": method, "seed": seed, **reading(model, val_ids, byte_lengths)}
        entry["train_seconds"] = train_log["seconds"] if train_log else 0.0
        if train_log:
            entry["final_loss"] = final_loss(train_log)
        runs.append(entry)

    for method in METHODS:
        record("no_training", method, at_length(base, L, method))
    lr, tune_lr = SETTINGS["lr"], SETTINGS["finetune_lr"]
    after_base = lambda: torch.Generator().set_state(state)  # the windows the base's generator draws next
    for method in METHODS:
        tuned = at_length(base, L, method)
        tuned_log = train(tuned, train_ids, extra, after_base(), tune_lr)
        record("finetune_long", method, tuned, tuned_log)
    more = at_length(base, T)
    more_log = train(more, train_ids, extra, after_base(), tune_lr)
    for method in METHODS:
        record("more_steps_short", method, at_length(more, L, method), more_log)
    # control (b): the base's recipe at long_context throughout: the same initial weights (rotary
    # positions have no table), the base's steps at lr, then the extra steps as a fine-tune
    torch.manual_seed(seed)
    long = tl.GPT(config("rotary", L)).to(DTYPE)
    generator = torch.Generator().manual_seed(seed)
    first, then = train(long, train_ids, base_steps, generator, lr), train(long, train_ids, extra, generator, tune_lr)
    record("trained_long", "none", long, {"losses": then["losses"], "seconds": first["seconds"] + then["seconds"]})
    return runs


def rescaling_part(seeds: list[int], steps: int | None = None) -> dict:
    """The ``rescaling`` part: every condition and method for each seed."""
    data = corpus()
    runs = []
    for seed in seeds:
        for r in rescaling_runs(seed, steps, data):
            runs.append(r)
            print(f"rescaling {r['name']:>16} {r['method']:>6} seed {seed}: {r['bits_per_byte']:.4f} bits/byte")
    order = {(c, m): i for i, (c, m) in enumerate((c, m) for c in CONDITIONS for m in METHODS)}
    runs.sort(key=lambda r: (order[r["name"], r["method"]], seeds.index(r["seed"])))
    return {
        "rescaling": {
            "settings": {**SETTINGS, **LLAMA},
            "methods": METHODS,
            "conditions": CONDITIONS,
            "notes": NOTES,
            "runs": runs,
        }
    }


# ----- the shipped checkpoint -----


def checkpoint_model(path: str | Path = CHECKPOINT, context_len: int | None = None, method: str = "none"):
    """Seed 0's rotary model as the sweep trained it at ``context_len`` 64, loaded from its float32
    state dict into :func:`config` ``("rotary", context_len, method)`` (default: the trained length,
    no rescaling), in eval mode, and the tokenizer it reads."""
    tokenizer = corpus()[0]
    model = tl.GPT(config("rotary", context_len, method, tokenizer.vocab_size))
    model.load_state_dict(torch.load(path, weights_only=True))
    return model.eval(), tokenizer


def write_checkpoint(model: tl.GPT, path: str | Path = CHECKPOINT) -> Path:
    """Write ``model``'s weights as a float32 state dict to ``path``, atomically."""
    return write_float32_state(model, path)


EXPERIMENT = Experiment(
    "longer_than_trained", {"positions": Part(positions_part, SEEDS), "rescaling": Part(rescaling_part, SEEDS)}
)


def main(argv: list[str] | None = None) -> int:
    """``python -m transformer_lib.experiments.longer_than_trained [--dry-run]``: every run of the
    record and, unless a dry run, seed 0's rotary base model written to :data:`CHECKPOINT`."""
    import argparse

    parser = argparse.ArgumentParser(description="Record the longer-than-trained sweep and write seed 0's model.")
    parser.add_argument("--dry-run", action="store_true", help="train and print, write nothing")
    args = parser.parse_args(argv)
    record = run_experiment(EXPERIMENT, dry_run=args.dry_run)
    model = BASES["rotary", 0, SETTINGS["steps"]][0]
    seed0 = next(r for r in record["positions"]["runs"] if (r["name"], r["seed"]) == ("rotary", 0))
    if not args.dry_run:
        write_checkpoint(model)
        assert weights_sha256(checkpoint_model()[0]) == seed0["checkpoint_sha256"]
        print(f"wrote {CHECKPOINT} ({CHECKPOINT.stat().st_size / 1e6:.2f} MB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

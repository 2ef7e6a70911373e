"""The experiment over seeds of chapter "Experts": does a mixture of experts beat a dense model of equal
*active* parameters (the same computation per token) and one of equal *total* parameters (the
same memory), and what happens to the experts' loads without a balancing term, with the Switch
loss and with DeepSeek-V3's bias update. The chapter reads the record,
``transformer_lib/data/experts/experts_sweep.json`` (``recorded("experts")``), and routes text
through seed 0's ``experts`` model, shipped beside it as a float32 state dict,
``experts_seed0.pt`` (:func:`checkpoint_model`).

Every model is a Llama-style GPT (RMSNorm, SwiGLU, rotary positions, no biases, untied head) of
2 layers, width 64, 4 heads and context 64 on Tiny Shakespeare's characters (the split of chapter "Tokens":
the last 10 % held out), trained in float64 (so that another CPU gets the same numbers: a
router's top k is a discrete choice that float32's rounding would flip) for 600 steps of 16
random windows with AdamW at a constant 3e-3 and no weight decay, as the ``token_run`` of chapter "Tokens";
seed ``s`` draws the initial weights after ``torch.manual_seed(s)`` and the windows from a
generator seeded ``s``, so the five models of a seed read the same batches. The models
(:data:`MODELS`):

* ``dense_active``: SwiGLU of width ``top_k * d_expert`` = 128, the parameters one token of the
  experts model uses (less the router's 8 x 64 per layer): equal computation per token;
* ``dense_total``: SwiGLU of width ``n_experts * d_expert`` = 512, all the experts' parameters:
  equal memory;
* ``experts``: 8 SwiGLU experts of width 64, 2 per token (softmax scores renormalised over the
  two, as Mixtral), with the Switch loss at weight 0.01;
* ``experts_free``: the same with no balancing term;
* ``experts_bias``: no balancing loss, DeepSeek-V3's bias update (``bias_rate`` 0.001 per step,
  DeepSeek-V3's own).

Each run records bits per byte on the held-out text, the final training loss (the language
model's, without the balancing term: the mean of the last 50 steps), the total and active
parameters (:func:`transformer_lib.experts.active_parameters`), and the seconds per step (the
median; they are the recording machine's, one thread, comparable within the record only). An
experts run also records its loads: each layer's experts' shares of the ``N k`` assignments of
the *training* batch, read from ``layer.loads`` after the training forward of step 1 and of
every 25th step (``load_steps``; ``shares``: ``[layer][logged step][expert]``); their shares of
the assignments over the whole held-out text after training, in eval mode (``held_out_shares``:
``[layer][expert]``); and the largest of those (``max_share``; balance is 1/8, and with two
experts per token no expert can take more than 1/2). ``probe_loss`` is the loss on the first 8
held-out windows, and seed 0's ``experts`` run holds the SHA-256 of its float32 weights
(``checkpoint_sha256``): what the shipped checkpoint is checked against.

The command line (``--dry-run`` prints and writes nothing)::

    # the record (15 runs, about 10 minutes, 1 core)
    python -m transformer_lib.experiments experts
    # the record and seed 0's experts model, the shipped checkpoint
    python -m transformer_lib.experiments.experts
    # one seed of everything, 20 steps, printed, nothing written
    python -m transformer_lib.experiments experts --seeds 0 --steps 20 --dry-run

Calibration (seed 0 only, one thread; bits per byte on the held-out text, and the largest
held-out share):

* First at context 128 and 300 steps (the same tokens, the same time): the learning rate 1e-3,
  3e-3, 1e-2 gave ``dense_active`` 3.070, 3.011, 3.165 and ``experts`` 3.088, 3.107, 3.345; at
  3e-3 ``dense_total`` 2.895 (at 1e-2, 3.414). So 3e-3 for every model,
  chapter "Tokens"'s. There the mixture lost to the dense model of equal active parameters (3.107
  against 3.011), and the balancing terms cost loss: no balancing 3.000 (largest share 0.451: in
  the second layer one expert is in nine of ten tokens' two), the Switch loss at 0.01 3.107
  (0.211, and one expert of the first layer down to 0.029), at 0.1 3.094 (0.143), the bias update
  at 0.001, 0.01, 0.03 3.024 (0.141), 3.089 (0.150), 3.130 (0.269: the loads oscillate).
* Trained longer (1000 steps at context 128), ``experts`` caught up: 2.621 against
  ``dense_active``'s 2.623. The router needs steps more than tokens, so the record takes twice
  the steps at half the context (the same tokens and about the same time): at context 64 and 600
  steps ``dense_active`` 2.912, ``experts`` 2.912, ``experts_free`` 2.913 (0.461: the second
  layer sends 86 % of its assignments to two experts), ``dense_total`` 2.848; the Switch loss at
  0.1 2.890 (0.149); the bias update at 0.001 2.881 (0.138) and at 0.01 2.974 (0.144). The bias
  rate is DeepSeek-V3's 0.001: it balanced the loads as well as 0.01 and cost nothing.
* What the calibration says, before the seeds: at this size and length a mixture of experts is
  level with the dense model of its active parameters, not better, and well behind the dense
  model of its total parameters; without a balancing term a layer collapses onto two or three
  experts, and the loss does not notice. The record's three seeds say how much of the
  differences above is the seed.

The record (three seeds; bits per byte, median and range; the largest held-out share): the dense
model of equal total parameters is best, 2.848 (2.836-2.869): better than every mixture by 0.03
or more on seeds 0 and 1, level with them on seed 2 (2.869 against 2.867-2.874); the dense model
of equal active parameters is worst, 2.947 (2.912-2.958); the mixtures lie between: the Switch
loss 2.912 (2.874-2.929; 0.161-0.186), no balancing 2.884 (2.867-2.913; 0.442-0.461), the bias
update 2.881 (2.871-2.895; 0.138-0.153). Seed by seed the bias update beats ``dense_active`` by
0.03 to 0.08 bits; the Switch loss and no balancing tie it on seed 0 and beat it on the other
two. Without balancing the second layer collapses on every seed: two experts take 86 to 87 % of
its assignments (the first layer stays spread), and its bits per byte are no worse for it.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import transformer_lib as tl
from transformer_lib.experts import active_parameters, after_step, experts_layers
from transformer_lib.experts import training_loss as balancing_loss

from ..chapters import data_folder
from .gpt import weights_sha256
from .recorder import Experiment, Part, run_experiment
from .tokens import as_float32, run_settings, write_float32_state
from .tokens import char_corpus as corpus

__all__ = [
    "CHECKPOINT",
    "EXPERIMENT",
    "MODELS",
    "SETTINGS",
    "checkpoint_model",
    "config",
    "corpus",
    "evaluate",
    "probe_loss",
    "run",
    "train",
    "write_checkpoint",
]

SEEDS = [0, 1, 2]
LLAMA = tl.LLAMA_BLOCK.changes()
#: the experts of every mixture: eight of width 64, two per token
EXPERTS = {"n_experts": 8, "top_k": 2, "d_expert": 64}
#: each model's GPTConfig options besides the Llama block's: dense widths from the experts' sizes
MODELS = {
    "dense_active": {"d_ff": EXPERTS["top_k"] * EXPERTS["d_expert"]},
    "dense_total": {"d_ff": EXPERTS["n_experts"] * EXPERTS["d_expert"]},
    "experts": {"experts": {**EXPERTS, "aux_loss": 0.01}},
    "experts_free": {"experts": {**EXPERTS, "aux_loss": 0.0}},
    "experts_bias": {"experts": {**EXPERTS, "aux_loss": 0.0, "bias_rate": 0.001}},
}
#: the shape and training of every run (chapter "Tokens"'s ``token_run`` settings, for 600 steps), in float64
SETTINGS = {
    **run_settings(steps=600),
    "dtype": "float64",
    "load_every": 25,  # the training batch's loads are logged after step 1 and every this many steps
    "last": 50,  # the final training loss: the mean over the last this many steps
    "probe_windows": 8,  # probe_loss: the first this many held-out windows
}
DTYPE = torch.float64
NOTES = (
    "shares: each expert's share of the n k assignments of a layer; 'shares' are the training batch's "
    "(layer.loads after the training forward of each step in load_steps), 'held_out_shares' the whole "
    "held-out text's after training (eval mode). final_loss is the language model's loss without the "
    "balancing term. seconds_per_step is the median over the steps on the machine that made the record "
    "(one thread): compare it within the record only."
)
#: seed 0's ``experts`` model, float32 (a state dict :func:`checkpoint_model` loads)
CHECKPOINT = data_folder("experts") / "experts_seed0.pt"
#: the models the part trained in this process, by (name, seed) (the checkpoint is written from seed 0's experts)
TRAINED: dict[tuple[str, int], tl.GPT] = {}


def config(name: str, vocab_size: int = 65) -> tl.GPTConfig:
    """The GPT configuration of model ``name`` (a key of :data:`MODELS`)."""
    if name not in MODELS:
        raise ValueError(f"no model {name!r}: the models are {', '.join(MODELS)}")
    s = SETTINGS
    return tl.GPTConfig(
        vocab_size, s["context_len"], s["n_layers"], s["n_heads"], s["d_model"], **LLAMA, **MODELS[name]
    )


def shares(loads: torch.Tensor) -> list[float]:
    """An expert's share of the assignments, from the loads ``(n_experts,)`` of one forward."""
    return (loads.double() / loads.sum()).tolist()


def train(name: str, seed: int, steps: int | None = None, data=None) -> tuple[tl.GPT, dict]:
    """Train model ``name`` with seed ``seed`` for ``steps`` (default :data:`SETTINGS`'); returns the
    model (in eval mode) and what training logged: the language model's ``losses`` per step, the
    ``seconds`` of each step and, for an experts model, ``load_steps`` and each layer's ``shares``
    of the training batch at those steps (``[layer][logged step][expert]``)."""
    tokenizer, train_ids, _ = data or corpus()
    s = SETTINGS
    steps = s["steps"] if steps is None else steps
    T, B = s["context_len"], s["batch_size"]
    torch.manual_seed(seed)
    model = tl.GPT(config(name, tokenizer.vocab_size)).to(DTYPE)
    layers = list(experts_layers(model).values())
    optimiser = torch.optim.AdamW(model.parameters(), lr=s["lr"], weight_decay=0.0)
    generator = torch.Generator().manual_seed(seed)
    log = {"losses": [], "seconds": [], "load_steps": [], "shares": [[] for _ in layers]}
    model.train()
    for step in range(1, steps + 1):
        start = time.perf_counter()
        starts = torch.randint(len(train_ids) - T, (B,), generator=generator)
        window = train_ids[starts[:, None] + torch.arange(T + 1)]  # (B, T + 1)
        _, loss = model(window[:, :-1], window[:, 1:])
        balancing = balancing_loss(model)  # the balancing terms the loss holds, or None
        optimiser.zero_grad(set_to_none=True)
        loss.backward()
        optimiser.step()
        after_step(model)  # DeepSeek-V3's bias update (nothing without bias_rate)
        log["seconds"].append(time.perf_counter() - start)
        log["losses"].append(loss.item() - (0.0 if balancing is None else balancing.item()))
        if layers and (step == 1 or step % s["load_every"] == 0):
            log["load_steps"].append(step)
            for i, layer in enumerate(layers):
                log["shares"][i].append(shares(layer.loads))
    return model.eval(), log


@torch.no_grad()
def probe_loss(model: tl.GPT, val_ids: torch.Tensor) -> float:
    """The mean next-character loss of ``model`` (eval mode) on the first ``probe_windows`` held-out
    windows, in nats: what the float32 checkpoint is checked against."""
    T, n = model.config.context_len, SETTINGS["probe_windows"]
    x, y = val_ids[: n * T].view(n, T), val_ids[1 : n * T + 1].view(n, T)
    logits, _ = model(x)
    return F.cross_entropy(logits.double().flatten(0, 1), y.flatten()).item()


def evaluate(model: tl.GPT, tokenizer: tl.CharTokenizer, val_ids: torch.Tensor) -> dict:
    """Bits per byte on the held-out ids and, for an experts model, each layer's experts' shares
    of the assignments over the whole held-out text (``[layer][expert]``)."""
    layers = list(experts_layers(model).values())
    totals = [torch.zeros(layer.spec.n_experts, dtype=torch.long) for layer in layers]

    def add(i):
        def hook(layer, inputs, output):
            totals[i] += layer.loads

        return hook

    hooks = [layer.register_forward_hook(add(i)) for i, layer in enumerate(layers)]
    try:
        measured = tl.bits_per_byte(model, val_ids, tl.token_byte_lengths(tokenizer))
    finally:
        for h in hooks:
            h.remove()
    out = {"bits_per_byte": measured["bits_per_byte"]}
    if layers:
        out["held_out_shares"] = [shares(t) for t in totals]
    return out


def run(name: str, seed: int, steps: int | None = None, data=None) -> dict:
    """One run of the sweep: model ``name`` (:data:`MODELS`), seed ``seed``; the record's entry."""
    data = data or corpus()
    tokenizer, _, val_ids = data
    model, log = train(name, seed, steps, data)
    TRAINED[name, seed] = model
    last = log["losses"][-SETTINGS["last"] :]
    entry = {
        "name": name,
        "seed": seed,
        "params": sum(p.numel() for p in model.parameters()),
        "active_params": active_parameters(model),
        "final_loss": sum(last) / len(last),
        "probe_loss": probe_loss(model, val_ids),
        "seconds_per_step": statistics.median(log["seconds"]),
        **evaluate(model, tokenizer, val_ids),
    }
    if log["load_steps"]:
        entry |= {"load_steps": log["load_steps"], "shares": log["shares"]}
        entry["max_share"] = max(max(layer) for layer in entry["held_out_shares"])
    if (name, seed) == ("experts", 0):  # the shipped checkpoint's weights: float32
        entry["checkpoint_sha256"] = weights_sha256(as_float32(model))
    return entry


def sweep(seeds: list[int], steps: int | None = None) -> dict:
    """The ``sweep`` part: every model of :data:`MODELS` for each seed."""
    data = corpus()
    runs = []
    for name in MODELS:
        for seed in seeds:
            runs.append(run(name, seed, steps, data))
            r = runs[-1]
            loads = f", largest share {r['max_share']:.3f}" if "max_share" in r else ""
            print(f"{name:>12} seed {seed}: {r['bits_per_byte']:.4f} bits/byte{loads}", flush=True)
    return {"sweep": {"settings": {**SETTINGS, **LLAMA}, "models": MODELS, "notes": NOTES, "runs": runs}}


def checkpoint_model(path: str | Path = CHECKPOINT) -> tuple[tl.GPT, tl.CharTokenizer]:
    """Seed 0's ``experts`` model as the sweep trained it, loaded from its float32 state dict into
    :func:`config` ``("experts")``, in eval mode, and the tokenizer it reads."""
    tokenizer = corpus()[0]
    model = tl.GPT(config("experts", tokenizer.vocab_size))
    model.load_state_dict(torch.load(path, weights_only=True))
    return model.eval(), tokenizer


def write_checkpoint(model: tl.GPT, path: str | Path = CHECKPOINT) -> Path:
    """Write ``model``'s weights as a float32 state dict to ``path``, atomically."""
    return write_float32_state(model, path)


EXPERIMENT = Experiment("experts", {"sweep": Part(sweep, SEEDS)})


def main(argv: list[str] | None = None) -> int:
    """``python -m transformer_lib.experiments.experts [--dry-run]``: every run of the record and,
    unless a dry run, seed 0's experts model written to :data:`CHECKPOINT`."""
    import argparse

    parser = argparse.ArgumentParser(description="Record the experts sweep and write seed 0's experts model.")
    parser.add_argument("--dry-run", action="store_true", help="train and print, write nothing")
    args = parser.parse_args(argv)
    record = run_experiment(EXPERIMENT, dry_run=args.dry_run)
    model = TRAINED["experts", 0]
    seed0 = next(r for r in record["sweep"]["runs"] if (r["name"], r["seed"]) == ("experts", 0))
    if not args.dry_run:
        write_checkpoint(model)
        assert weights_sha256(checkpoint_model()[0]) == seed0["checkpoint_sha256"]
        print(f"wrote {CHECKPOINT} ({CHECKPOINT.stat().st_size / 1e6:.2f} MB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

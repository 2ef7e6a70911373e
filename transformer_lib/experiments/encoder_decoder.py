"""The experiments over seeds of chapter "Encoder-decoder and cross-attention": the encoder-decoders the chapter trains
three times. The chapter reads the record, ``transformer_lib/data/ch08/encoder_decoder.json``
(``recorded("encoder_decoder")``), and the trained dates model of seed 0, ``transformer_lib/data/ch08/dates_seed0.pt``;
it trains seed 0 of the two small models again, and the first 50 steps of the dates model's seed 0.

Every run is float32 on one thread, as the chapter trains them; the settings are the chapter's.
The checkpoint holds the float32 weights (under 0.6 MB): the chapter only reads and runs them, so
every CPU starts from the same numbers.

The command line (``--dry-run`` prints and writes nothing)::

    # three seeds of every part (about 90 seconds, 1 core)
    python -m transformer_lib.experiments encoder_decoder
    # the copy task's three seeds, printed, nothing written
    python -m transformer_lib.experiments encoder_decoder --parts copy --dry-run
    # the dates model of seed 0, written to dates_seed0.pt (about 20 seconds)
    python -m transformer_lib.experiments.encoder_decoder

The checkpoint has a command of its own because a part only returns what the record holds (a dry
run must write nothing); after re-running the ``dates`` part, run the last command too. The record
keeps each dates run's SHA-256 of its weights, and ``tests/test_recorded_encoder_decoder.py``
checks that the shipped checkpoint is the recorded seed 0.

Parts:

* ``reverse``: Bahdanau's RNN encoder-decoder (a bidirectional GRU encoder, additive attention,
  a GRU decoder: the chapter's ``BahdanauSeq2Seq``) trained to reverse sequences of 3 to 8 of 8
  symbols, 200 steps of 64 (Adam at 1e-2, gradients clipped at 1); the share of the held-out
  output symbols whose most-weighted source position is the mirrored one, and the last loss;
* ``copy``: a tiny ``tl.Transformer`` (width 32, 2 heads, one encoder and one decoder layer)
  trained to copy sequences of 1 to 8 of 10 symbols, 300 steps of 64; exact match on the 500
  held-out sequences;
* ``dates``: the dates ``tl.Transformer`` (width 64, 4 heads, one encoder and two decoder
  layers) trained for 400 steps of 64 dates; exact match on the 1,000 held-out dates, the loss
  of every step, and the SHA-256 of the trained weights.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import asdict
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

import transformer_lib as tl

from ..chapters import data_folder
from .recorder import Experiment, Part

__all__ = ["EXPERIMENT"]

SEEDS = [0, 1, 2]
#: the chapter's settings of each part
REVERSE = {
    "task": {"n_train": 5_000, "n_val": 500, "n_symbols": 8, "min_len": 3, "max_len": 8, "seed": 0},
    "d_emb": 16,
    "hidden": 32,
    "steps": 200,
    "batch_size": 64,
    "lr": 1e-2,
    "clip": 1.0,
}
COPY = {
    "task": {"n_train": 10_000, "n_val": 500, "n_symbols": 10, "max_len": 8, "seed": 0},
    "model": {"d_model": 32, "n_heads": 2, "n_encoder_layers": 1, "n_decoder_layers": 1, "d_ff": 64},
    "steps": 300,
    "batch_size": 64,
    "lr": 5e-3,
    "min_lr": 3e-4,
    "warmup_iters": 50,
}
DATES = {
    "task": {"n_train": 50_000, "n_val": 1_000, "seed": 0},
    "model": {"d_model": 64, "n_heads": 4, "n_encoder_layers": 1, "n_decoder_layers": 2, "d_ff": 128},
    "steps": 400,
    "batch_size": 64,
    "lr": 8e-3,
    "min_lr": 3e-4,
    "warmup_iters": 50,
}
#: the trained dates model of seed 0, which the chapter reads
CHECKPOINT = data_folder("encoder_decoder") / "dates_seed0.pt"


class BahdanauSeq2Seq(nn.Module):
    """Chapter "Encoder-decoder and cross-attention"'s RNN encoder-decoder with attention (the chapter writes the same
    class): a bidirectional GRU encoder, additive attention whose query is the decoder's state and whose
    keys and values are the encoder's states, and a GRU decoder, one step per output token.
    ``forward(src (B, T_src), tgt_in (B, T_tgt))`` returns the logits ``(B, T_tgt, vocab_size)``
    and the attention weights ``(B, T_tgt, T_src)``."""

    def __init__(self, vocab_size, d_emb=16, hidden=32):
        super().__init__()
        self.src_embed = nn.Embedding(vocab_size, d_emb)
        self.encoder = nn.GRU(d_emb, hidden, batch_first=True, bidirectional=True)
        self.tgt_embed = nn.Embedding(vocab_size, d_emb)
        self.attention = tl.AdditiveAttention(query_size=hidden, key_size=2 * hidden, hidden_size=hidden)
        self.init_state = nn.Linear(2 * hidden, hidden)
        self.cell = nn.GRUCell(d_emb + 2 * hidden, hidden)
        self.out = nn.Linear(hidden + 2 * hidden, vocab_size)

    def encode(self, src):
        keep = src != 0  # (B, T_src), True at real tokens (id 0 is padding)
        packed = nn.utils.rnn.pack_padded_sequence(
            self.src_embed(src),
            keep.sum(1),
            batch_first=True,
            # so padding never enters
            # a GRU
            enforce_sorted=False,
        )
        h, _ = self.encoder(packed)
        # (B, T_src, 2H)
        h, _ = nn.utils.rnn.pad_packed_sequence(h, batch_first=True, total_length=src.shape[1])
        # (B, H): start from position 0, read by both directions
        s = torch.tanh(self.init_state(h[:, 0]))
        return h, keep, s

    def forward(self, src, tgt_in):
        h, keep, s = self.encode(src)  # keys = values = h
        logits, weights = [], []
        # one decoder step per output token
        for t in range(tgt_in.shape[1]):
            # (B, 1, 2H), (B, 1, T_src)
            c, a = self.attention(s[:, None], h, h, mask=keep[:, None, :])
            # (B, H)
            s = self.cell(
                torch.cat([self.tgt_embed(tgt_in[:, t]), c[:, 0]], dim=-1),
                s,
            )
            # (B, vocab_size)
            logits.append(self.out(torch.cat([s, c[:, 0]], dim=-1)))
            weights.append(a[:, 0])
        # (B, T_tgt, vocab_size), (B, T_tgt, T_src)
        return torch.stack(logits, 1), torch.stack(weights, 1)


def reverse_task() -> tl.Seq2SeqData:
    """The reversal task of the chapter's Bahdanau model."""
    return tl.sequence_task("reverse", **REVERSE["task"])


def train_bahdanau(data, seed: int, steps: int | None = None) -> tuple[BahdanauSeq2Seq, list[float]]:
    """The chapter's training of the Bahdanau model: the model and the loss of every step."""
    tl.set_seed(seed)
    rnn = BahdanauSeq2Seq(data.src_tokenizer.vocab_size, REVERSE["d_emb"], REVERSE["hidden"])
    optimizer = torch.optim.Adam(rnn.parameters(), lr=REVERSE["lr"])
    batches = tl.Seq2SeqBatches(data, batch_size=REVERSE["batch_size"], seed=seed)
    losses = []
    for _ in range(REVERSE["steps"] if steps is None else steps):
        src, tgt_in, tgt_out = batches("train")
        logits, _ = rnn(src, tgt_in)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt_out.reshape(-1), ignore_index=0)
        optimizer.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(rnn.parameters(), REVERSE["clip"])
        optimizer.step()
        losses.append(loss.item())
    return rnn, losses


def on_mirror(rnn: BahdanauSeq2Seq, data) -> float:
    """The share of held-out output symbols (not ``<eos>``, not padding) whose most-weighted source
    position is the mirrored one, in one teacher-forced pass (the chapter's measure)."""
    lengths = (data.val_src != 0).sum(1)  # (N,)
    symbol = data.val_tgt[:, 1:] > 2  # (N, T_tgt - 1)
    t = torch.arange(data.val_tgt.shape[1] - 1)
    mirror = (lengths[:, None] - 1 - t).clamp(min=0)  # output t copies source position L - 1 - t
    with torch.no_grad():
        _, alpha = rnn(data.val_src, data.val_tgt[:, :-1])  # (N, T_tgt, T_src)
    return (alpha.argmax(-1) == mirror)[symbol].float().mean().item()


def transformer_config(data, sizes: dict) -> tl.TransformerConfig:
    """A pre-LN ``tl.Transformer`` of ``sizes`` for ``data``, without dropout."""
    return tl.TransformerConfig(
        src_vocab_size=data.src_tokenizer.vocab_size,
        tgt_vocab_size=data.tgt_tokenizer.vocab_size,
        dropout=0.0,
        context_len=data.context_len,
        norm_first=True,
        **sizes,
    )


def train_transformer(data, settings: dict, seed: int, steps: int | None = None):
    """The chapter's training of a ``tl.Transformer`` (``COPY`` or ``DATES``): the model, in eval
    mode, and its :class:`~transformer_lib.train.History`. ``steps`` stops early, the schedule kept."""
    tl.set_seed(seed)
    model = tl.Transformer(transformer_config(data, settings["model"]))
    history = tl.train(
        model,
        tl.Seq2SeqBatches(data, batch_size=settings["batch_size"], seed=seed),
        tl.TrainConfig(
            max_iters=settings["steps"],
            lr=settings["lr"],
            min_lr=settings["min_lr"],
            warmup_iters=settings["warmup_iters"],
            eval_interval=0,
            device="cpu",
            progress=False,
            verbose=False,
        ),
        until=steps,
    )
    return model.eval(), history


def weights_sha256(model: nn.Module) -> str:
    """The SHA-256 of a model's tensors, in the order of its state dict."""
    digest = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        digest.update(name.encode())
        digest.update(tensor.detach().contiguous().numpy().tobytes())
    return digest.hexdigest()


def reverse(seeds: list[int], steps: int | None = None) -> dict:
    data = reverse_task()
    runs = []
    for seed in seeds:
        start = time.perf_counter()
        rnn, losses = train_bahdanau(data, seed, steps)
        runs.append({"seed": seed, "on_mirror": on_mirror(rnn, data), "final_loss": losses[-1]})
        print(
            f"reverse seed {seed}: {runs[-1]['on_mirror']:.1%} on the mirrored position "
            f"({time.perf_counter() - start:.0f} s)",
            flush=True,
        )
    return {"settings": {"reverse": REVERSE}, "reverse": {"runs": runs}}


def copy(seeds: list[int], steps: int | None = None) -> dict:
    data = tl.sequence_task("copy", **COPY["task"])
    runs = []
    for seed in seeds:
        start = time.perf_counter()
        model, history = train_transformer(data, COPY, seed, steps)
        runs.append(
            {
                "seed": seed,
                "exact_match": tl.exact_match(model, data.val_src, data.val_tgt),
                "final_loss": history.step_loss[-1],
            }
        )
        print(
            f"copy seed {seed}: exact match {runs[-1]['exact_match']:.1%} ({time.perf_counter() - start:.0f} s)",
            flush=True,
        )
    return {"settings": {"copy": COPY}, "copy": {"runs": runs}}


def dates(seeds: list[int], steps: int | None = None) -> dict:
    data = tl.dates_task(**DATES["task"])
    runs = []
    for seed in seeds:
        start = time.perf_counter()
        model, history = train_transformer(data, DATES, seed, steps)
        runs.append(
            {
                "seed": seed,
                "params": sum(p.numel() for p in model.parameters()),
                "exact_match": tl.exact_match(model, data.val_src, data.val_tgt),
                "step_loss": [round(x, 6) for x in history.step_loss],
                "weights_sha256": weights_sha256(model),
            }
        )
        print(
            f"dates seed {seed}: exact match {runs[-1]['exact_match']:.1%} ({time.perf_counter() - start:.0f} s)",
            flush=True,
        )
    return {"settings": {"dates": DATES}, "dates": {"runs": runs}}


def write_checkpoint(path: str | Path = CHECKPOINT) -> Path:
    """Train the dates model of seed 0 as the ``dates`` part does and write it to ``path`` (a
    checkpoint that ``tl.load_checkpoint`` reads): the model the chapter reads after its training."""
    data = tl.dates_task(**DATES["task"])
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the record was made
    try:
        model, history = train_transformer(data, DATES, 0)
    finally:
        torch.set_num_threads(threads)
    state = {
        "model_class": "Transformer",
        "model_config": asdict(model.config),
        "model": model.state_dict(),
        "step": len(history.step_loss),
        "meta": {"seed": 0, "settings": DATES, "weights_sha256": weights_sha256(model)},
    }
    out = tl.save_checkpoint(state, path)
    print(f"wrote {out} (weights {state['meta']['weights_sha256'][:12]}...)")
    return out


EXPERIMENT = Experiment(
    "encoder_decoder", {"reverse": Part(reverse, SEEDS), "copy": Part(copy, SEEDS), "dates": Part(dates, SEEDS)}
)

if __name__ == "__main__":
    write_checkpoint()

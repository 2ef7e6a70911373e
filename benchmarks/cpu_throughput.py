"""CPU training throughput: ``tl.GPT`` against three peers of the same size that compute the same function.

- ``nano``: a plain PyTorch GPT written the way nanoGPT's ``model.py`` is (one ``c_attn`` linear
  layer for Q, K and V, ``F.scaled_dot_product_attention(is_causal=True)``, a GELU MLP, pre-LN
  blocks, a tied head, no checks): the code a reader would otherwise train.
- ``torch``: a GPT built from PyTorch's own layers: token and learned position embeddings, a stack
  of ``torch.nn.TransformerEncoderLayer(batch_first=True, norm_first=True, activation="gelu")``
  with a causal mask, a final LayerNorm and a head tied to the token embedding.
- ``hf``: Hugging Face ``transformers``' ``GPT2LMHeadModel`` with exact GELU and no dropout
  (skipped, and said so, when ``transformers`` is not installed, or when ``--no-bias``: GPT-2
  always has biases).

All train at the CPU preset's shape (the defaults of ``tl.GPTConfig`` and ``tl.TrainConfig``: 4
layers, 4 heads, d_model 128, context 64, batch 12, dropout 0) with the trainer's AdamW and
gradient clipping, on the same batches, from the same weights, with a fixed thread count. After a
warm-up they take turns, ``steps`` training steps each per round, in an order that rotates every
round; the table shows each round's tokens per second, the medians, and for each peer the median
of the per-round ratios with their spread (lowest to highest).

Target: ours / peer >= 1.10 against every peer.

    python -m benchmarks.cpu_throughput                # the real run; appends a row to RESULTS.md
    python -m benchmarks.cpu_throughput --threads 1 --rounds 7 --steps 100
    python -m benchmarks.cpu_throughput --no-bias --profile   # and where each model's step spends its time
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

import transformer_lib as tl

from .common import (
    add_record_flags,
    append_result,
    default_threads,
    format_op_profile,
    format_table,
    median,
    op_profile,
    set_threads,
)

PEERS = ("nano", "torch", "hf")
LABELS = {
    "ours": "tl.GPT",
    "nano": "nanoGPT-style peer",
    "torch": "torch.nn peer",
    "hf": "transformers GPT2LMHeadModel",
}
VOCAB_SIZE = 65  # Tiny Shakespeare's characters


class TorchPeerGPT(nn.Module):
    """A GPT made of PyTorch's own layers, the same sizes as :class:`tl.GPT` (pre-LN, GELU, tied head)."""

    def __init__(self, config: tl.GPTConfig):
        super().__init__()
        c = self.config = config
        self.tok_embed = nn.Embedding(c.vocab_size, c.d_model)
        self.pos_embed = nn.Embedding(c.context_len, c.d_model)
        layer = nn.TransformerEncoderLayer(
            c.d_model,
            c.n_heads,
            dim_feedforward=4 * c.d_model,
            dropout=c.dropout,
            activation="gelu",
            batch_first=True,
            norm_first=True,
            bias=c.bias,
        )
        final_norm = nn.LayerNorm(c.d_model, bias=c.bias)
        self.blocks = nn.TransformerEncoder(layer, c.n_layers, norm=final_norm, enable_nested_tensor=False)
        self.lm_head = nn.Linear(c.d_model, c.vocab_size, bias=False)
        self.lm_head.weight = self.tok_embed.weight  # weight tying
        causal = nn.Transformer.generate_square_subsequent_mask(c.context_len)  # (T, T), -inf above the diagonal
        self.register_buffer("causal", causal, persistent=False)

    def forward(self, idx: Tensor, targets: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        T = idx.shape[1]
        positions = torch.arange(T, device=idx.device)  # (T,)
        x = self.tok_embed(idx) + self.pos_embed(positions)  # (B, T, d_model)
        x = self.blocks(x, mask=self.causal[:T, :T], is_causal=True)  # (B, T, d_model)
        return _logits_and_loss(self.lm_head(x), targets)


class _NanoBlock(nn.Module):
    """One pre-LN block of :class:`NanoPeerGPT`."""

    def __init__(self, d_model: int, n_heads: int, bias: bool):
        super().__init__()
        self.n_heads = n_heads
        self.ln_1, self.ln_2 = nn.LayerNorm(d_model, bias=bias), nn.LayerNorm(d_model, bias=bias)
        self.c_attn = nn.Linear(d_model, 3 * d_model, bias=bias)  # rows: W_q, W_k, W_v
        self.attn_proj = nn.Linear(d_model, d_model, bias=bias)
        self.c_fc = nn.Linear(d_model, 4 * d_model, bias=bias)
        self.mlp_proj = nn.Linear(4 * d_model, d_model, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_heads, C // self.n_heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, h, T, d_k)
        x = x + self.attn_proj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x))))


class NanoPeerGPT(nn.Module):
    """A GPT in the plain style of nanoGPT's ``model.py`` (written for this benchmark, not copied):
    embeddings, pre-LN blocks with fused QKV and PyTorch's fused causal attention, a final
    LayerNorm and a tied head; nothing checked, nothing cached."""

    def __init__(self, config: tl.GPTConfig):
        super().__init__()
        c = self.config = config
        self.wte, self.wpe = nn.Embedding(c.vocab_size, c.d_model), nn.Embedding(c.context_len, c.d_model)
        self.h = nn.ModuleList(_NanoBlock(c.d_model, c.n_heads, c.bias) for _ in range(c.n_layers))
        self.ln_f = nn.LayerNorm(c.d_model, bias=c.bias)
        self.lm_head = nn.Linear(c.d_model, c.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # weight tying

    def forward(self, idx: Tensor, targets: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        positions = torch.arange(idx.shape[1], device=idx.device)  # (T,)
        x = self.wte(idx) + self.wpe(positions)  # (B, T, d_model)
        for block in self.h:
            x = block(x)
        return _logits_and_loss(self.lm_head(self.ln_f(x)), targets)


class HFPeerGPT(nn.Module):
    """``transformers``' ``GPT2LMHeadModel`` at the sizes of ``config``, with exact GELU and no
    dropout; ``forward(idx, targets)`` returns ``(logits, loss)`` as :class:`tl.GPT` does."""

    def __init__(self, config: tl.GPTConfig):
        super().__init__()
        from transformers import GPT2Config, GPT2LMHeadModel

        c = self.config = config
        hf_config = GPT2Config(
            vocab_size=c.vocab_size, n_positions=c.context_len, n_embd=c.d_model, n_layer=c.n_layers,
            n_head=c.n_heads, activation_function="gelu", resid_pdrop=c.dropout, embd_pdrop=c.dropout,
            attn_pdrop=c.dropout, bos_token_id=None, eos_token_id=None,
        )  # fmt: skip
        self.gpt2 = GPT2LMHeadModel(hf_config)

    def forward(self, idx: Tensor, targets: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        return _logits_and_loss(self.gpt2(input_ids=idx).logits, targets)  # (B, T, vocab_size)


def _logits_and_loss(logits: Tensor, targets: Tensor | None) -> tuple[Tensor, Tensor | None]:
    if targets is None:
        return logits, None
    return logits, F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def hf_available() -> bool:
    try:
        import transformers  # noqa: F401
    except ImportError:
        return False
    return True


@torch.no_grad()
def copy_weights(ours: tl.GPT, peer: nn.Module) -> None:
    """Give ``peer`` (a :class:`TorchPeerGPT` or :class:`HFPeerGPT`) the weights of ``ours``."""
    if isinstance(peer, HFPeerGPT):
        _copy_to_hf(ours, peer.gpt2.transformer)
        return
    if isinstance(peer, NanoPeerGPT):
        _copy_to_nano(ours, peer)
        return
    peer.tok_embed.weight.copy_(ours.tok_embed.weight)
    peer.pos_embed.weight.copy_(ours.pos_embed.embedding.weight)
    for mine, theirs in zip(ours.decoder.layers, peer.blocks.layers, strict=True):
        attn = mine.self_attn
        theirs.self_attn.in_proj_weight.copy_(attn.in_proj_weight)  # the same layout: rows of W_q, W_k, W_v
        if attn.in_proj_bias is not None:
            theirs.self_attn.in_proj_bias.copy_(attn.in_proj_bias)
        theirs.self_attn.out_proj.load_state_dict(attn.out_proj.state_dict())
        theirs.norm1.load_state_dict(mine.res_self.norm.state_dict())
        theirs.linear1.load_state_dict(mine.ff.net[0].state_dict())
        theirs.linear2.load_state_dict(mine.ff.net[2].state_dict())
        theirs.norm2.load_state_dict(mine.res_ff.norm.state_dict())
    peer.blocks.norm.load_state_dict(ours.decoder.norm.state_dict())


def _copy_to_nano(ours: tl.GPT, peer: NanoPeerGPT) -> None:
    peer.wte.weight.copy_(ours.tok_embed.weight)
    peer.wpe.weight.copy_(ours.pos_embed.embedding.weight)
    for mine, block in zip(ours.decoder.layers, peer.h, strict=True):
        block.c_attn.weight.copy_(mine.self_attn.in_proj_weight)  # the same layout: rows of W_q, W_k, W_v
        if mine.self_attn.in_proj_bias is not None:
            block.c_attn.bias.copy_(mine.self_attn.in_proj_bias)
        pairs = [
            (block.attn_proj, mine.self_attn.out_proj),
            (block.c_fc, mine.ff.net[0]),
            (block.mlp_proj, mine.ff.net[2]),
            (block.ln_1, mine.res_self.norm),
            (block.ln_2, mine.res_ff.norm),
        ]
        for theirs, module in pairs:
            theirs.load_state_dict(module.state_dict())
    peer.ln_f.load_state_dict(ours.decoder.norm.state_dict())


def _copy_to_hf(ours: tl.GPT, gpt2: nn.Module) -> None:
    """GPT-2's ``Conv1D`` layers store ``(in, out)`` weights: the transpose of ``nn.Linear``'s."""
    gpt2.wte.weight.copy_(ours.tok_embed.weight)
    gpt2.wpe.weight.copy_(ours.pos_embed.embedding.weight)
    for mine, block in zip(ours.decoder.layers, gpt2.h, strict=True):
        pairs = [
            (block.attn.c_attn, mine.self_attn.in_proj_weight, mine.self_attn.in_proj_bias),
            (block.attn.c_proj, mine.self_attn.out_proj.weight, mine.self_attn.out_proj.bias),
            (block.mlp.c_fc, mine.ff.net[0].weight, mine.ff.net[0].bias),
            (block.mlp.c_proj, mine.ff.net[2].weight, mine.ff.net[2].bias),
        ]
        for conv, weight, bias in pairs:
            conv.weight.copy_(weight.T)
            conv.bias.copy_(bias)
        block.ln_1.load_state_dict(mine.res_self.norm.state_dict())
        block.ln_2.load_state_dict(mine.res_ff.norm.state_dict())
    gpt2.ln_f.load_state_dict(ours.decoder.norm.state_dict())


def make_batches(
    n: int, batch_size: int, context_len: int, seed: int, data: str | Path | None = None
) -> tuple[list[tuple[Tensor, Tensor]], int, str]:
    """``n`` batches ``(x (B, T), y (B, T))`` drawn by ``tl.get_batch``: windows of a text file's
    characters, or of random tokens. Returns ``(batches, vocab_size, description)``."""
    g = torch.Generator().manual_seed(seed)
    if data is not None:
        text = Path(data).read_text(encoding="utf-8")
        tokenizer = tl.CharTokenizer.from_text(text)
        tokens = torch.tensor(tokenizer.encode(text), dtype=torch.long)
        vocab_size, source = tokenizer.vocab_size, f"text {Path(data).name}"
    else:
        vocab_size, source = VOCAB_SIZE, "synthetic"
        tokens = torch.randint(vocab_size, (100_000,), generator=g)
    return [tl.get_batch(tokens, context_len, batch_size, generator=g) for _ in range(n)], vocab_size, source


class Trainer:
    """One model, the trainer's AdamW (``tl.configure_optimizer``) and its place in the shared batches."""

    def __init__(self, model: nn.Module, batches: list, config: tl.TrainConfig):
        self.model, self.batches, self.grad_clip, self.position = model.train(), batches, config.grad_clip, 0
        self.optimizer = tl.configure_optimizer(model, config)

    def steps(self, n: int) -> float:
        """Train ``n`` steps; returns the last loss."""
        for _ in range(n):
            x, y = self.batches[self.position % len(self.batches)]
            self.position += 1
            _, loss = self.model(x, y)
            loss.backward()
            if self.grad_clip > 0:
                nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        return loss.item()


def build_models(config: tl.GPTConfig, seed: int, peers: tuple[str, ...]) -> dict[str, nn.Module]:
    """Ours and each peer, every peer given our initial weights; raises if a size differs."""
    torch.manual_seed(seed)
    models = {"ours": tl.GPT(config)}
    for name in peers:
        models[name] = {"nano": NanoPeerGPT, "torch": TorchPeerGPT, "hf": HFPeerGPT}[name](config)
        copy_weights(models["ours"], models[name])
    params = {name: sum(p.numel() for p in m.parameters()) for name, m in models.items()}
    if len(set(params.values())) != 1:
        raise RuntimeError(f"the models differ in size: {params}")
    return models


@torch.no_grad()
def logit_difference(models: dict[str, nn.Module], x: Tensor) -> float:
    """The largest ``|logit|`` difference of any peer from ours on ``x (B, T)`` (0 with no peer)."""
    logits = {name: m.eval()(x)[0] for name, m in models.items()}
    return max([(logits[p] - logits["ours"]).abs().max().item() for p in models if p != "ours"], default=0.0)


def timed_rounds(trainers: dict[str, Trainer], rounds: int, steps: int, tokens_per_step: int) -> tuple[dict, dict]:
    """``rounds`` turns of ``steps`` steps per model, the order rotating every round; returns
    ``(tokens/s per round of each model, last loss of each)``."""
    names = list(trainers)
    rates: dict[str, list[float]] = {name: [] for name in names}
    final_loss = {}
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            start = time.perf_counter()
            final_loss[name] = trainers[name].steps(steps)
            rates[name].append(tokens_per_step * steps / (time.perf_counter() - start))
    return rates, final_loss


def preset_shape(batch_size: int | None = None, **sizes: int | None) -> tuple[dict, int]:
    """The model's sizes and the batch size, each the CPU preset's (the defaults of ``tl.GPTConfig``
    and ``tl.TrainConfig``) unless given."""
    defaults = tl.GPTConfig(vocab_size=VOCAB_SIZE)
    shape = {k: getattr(defaults, k) if v is None else v for k, v in sizes.items()}
    return shape, tl.TrainConfig().batch_size if batch_size is None else batch_size


def run_throughput(
    n_layers: int | None = None,
    n_heads: int | None = None,
    d_model: int | None = None,
    context_len: int | None = None,
    batch_size: int | None = None,
    *,
    warmup: int = 10,
    steps: int = 50,
    rounds: int = 5,
    threads: int | None = None,
    seed: int = 1337,
    data: str | Path | None = None,
    peers: tuple[str, ...] | None = None,
    bias: bool = True,
    profile: bool = False,
) -> dict:
    """Train ``tl.GPT`` and the peers in turns; returns the settings and tokens/s of every round.

    Sizes left at None are the CPU preset's (:func:`preset_shape`). The result has, for ``ours`` and
    each peer, the tokens/s per round and their median (``<name>_median``); for each peer the
    per-round ratios ``ratio_<peer>`` (ours / peer), their median ``ratio_<peer>_median`` and
    spread; ``params``; ``max_logit_diff`` (the largest difference of a peer's logits from ours
    with equal weights, about 1e-6 when they compute the same function); and ``final_loss`` of
    each (close, as all see the same batches from the same weights). ``peers``: all by default,
    without ``hf`` when ``transformers`` is missing or ``bias`` is False (GPT-2 has biases).
    ``profile``: after the timing, ``steps`` more steps of each under PyTorch's profiler, in
    ``result["profile"]`` (:func:`benchmarks.common.op_profile`, per training step).
    """
    threads = set_threads(threads)
    shape, batch_size = preset_shape(n_layers=n_layers, n_heads=n_heads, d_model=d_model, context_len=context_len,
                                     batch_size=batch_size)  # fmt: skip
    context_len = shape["context_len"]
    if peers is None:
        peers = tuple(p for p in PEERS if p != "hf" or (hf_available() and bias))
    if "hf" in peers and not bias:
        raise ValueError("the hf peer (GPT-2) always has biases: leave it out, or keep bias=True")
    batches, vocab_size, source = make_batches(64, batch_size, context_len, seed, data)
    models = build_models(tl.GPTConfig(vocab_size=vocab_size, dropout=0.0, bias=bias, **shape), seed, peers)
    max_logit_diff = logit_difference(models, batches[0][0])

    train_config = tl.TrainConfig(batch_size=batch_size)
    trainers = {name: Trainer(m, batches, train_config) for name, m in models.items()}
    for trainer in trainers.values():
        if warmup:
            trainer.steps(warmup)
    rates, final_loss = timed_rounds(trainers, rounds, steps, batch_size * context_len)
    profiles = op_profile({name: (lambda t=t: t.steps(1)) for name, t in trainers.items()}, steps) if profile else None
    result = {
        "settings": dict(
            **shape,
            batch_size=batch_size,
            vocab_size=vocab_size,
            data=source,
            warmup=warmup,
            steps=steps,
            rounds=rounds,
            threads=threads,
            seed=seed,
            grad_clip=train_config.grad_clip,
            optimizer="AdamW",
            peers="+".join(peers),
            bias=bias,
        ),  # fmt: skip
        "peers": list(peers),
        "params": {name: sum(p.numel() for p in m.parameters()) for name, m in models.items()},
        "max_logit_diff": max_logit_diff,
        "final_loss": final_loss,
        "profile": profiles,
    }
    return {**result, **summarise(rates, peers)}


def summarise(rates: dict[str, list[float]], peers: tuple[str, ...]) -> dict:
    """Medians of the tokens/s per round, and per peer the per-round ratios ours / peer and their median."""
    out = {}
    for name, values in rates.items():
        out[name], out[f"{name}_median"] = values, median(values)
    for p in peers:
        ratios = [a / b for a, b in zip(rates["ours"], rates[p], strict=True)]
        out[f"ratio_{p}"], out[f"ratio_{p}_median"] = ratios, median(ratios)
    return out


def report(result: dict) -> str:
    """The printed table, then one line per peer: the median ratio and its spread."""
    s = result["settings"]
    tokens_per_step = s["batch_size"] * s["context_len"]
    rows = []
    for name in ["ours", *result["peers"]]:
        rate = result[f"{name}_median"]
        per_round = " ".join(f"{r:,.0f}" for r in result[name])
        ms_per_step, loss = 1000 * tokens_per_step / rate, result["final_loss"][name]
        rows.append(
            [
                LABELS[name],
                f"{result['params'][name]:,}",
                per_round,
                f"{rate:,.0f}",
                f"{ms_per_step:.1f}",
                f"{loss:.3f}",
            ]
        )
    table = format_table(["model", "params", "tokens/s per round", "median tokens/s", "ms/step", "loss"], rows)
    lines = [table, ""]
    for p in result["peers"]:
        ratios = result[f"ratio_{p}"]
        lines.append(
            f"ratio ours / {p}: median {result[f'ratio_{p}_median']:.3f} over {len(ratios)} rounds, "
            f"spread {min(ratios):.3f}..{max(ratios):.3f} (target >= 1.10)"
        )
    lines.append(f"same function: max |logit difference| {result['max_logit_diff']:.1e} with equal weights")
    if result.get("profile"):
        lines += ["", "where a training step's time goes (self CPU time per step, under the profiler):"]
        lines.append(format_op_profile(result["profile"], LABELS))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    defaults, train_defaults = tl.GPTConfig(vocab_size=VOCAB_SIZE), tl.TrainConfig()  # the CPU preset
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.cpu_throughput",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--threads", type=int, default=default_threads(), help="torch.set_num_threads")
    parser.add_argument("--warmup", type=int, default=10, help="untimed steps of each model first")
    parser.add_argument("--steps", type=int, default=50, help="timed steps of each model per round")
    parser.add_argument("--rounds", type=int, default=5, help="rounds; each model once per round")
    parser.add_argument("--seed", type=int, default=1337)
    parser.add_argument("--data", default=None, metavar="PATH", help="a text file (default: random tokens, 65 ids)")
    parser.add_argument("--peers", default=None, help=f"comma-separated peers from {', '.join(PEERS)} (default: all)")
    parser.add_argument("--no-bias", action="store_true", help="no biases in any layer (nanoGPT's default); no hf peer")
    for name in ("n_layers", "n_heads", "d_model", "context_len"):
        parser.add_argument("--" + name.replace("_", "-"), type=int, default=getattr(defaults, name))
    parser.add_argument("--batch-size", type=int, default=train_defaults.batch_size)
    parser.add_argument(
        "--profile", action="store_true", help="then profile --steps steps of each: operators side by side"
    )
    add_record_flags(parser)
    args = parser.parse_args(argv)

    if args.peers is None:
        args.peers = ",".join(p for p in PEERS if p != "hf" or (hf_available() and not args.no_bias))
    peers = tuple(p for p in args.peers.split(",") if p)
    unknown = set(peers) - set(PEERS)
    if unknown:
        parser.error(f"--peers: unknown peer(s) {sorted(unknown)}; choose from {list(PEERS)}")
    if "hf" in peers and not hf_available():
        parser.error("--peers hf needs Hugging Face transformers (pip install transformers)")
    if "hf" in peers and args.no_bias:
        parser.error("--peers hf cannot run with --no-bias: GPT-2 always has biases")
    result = run_throughput(
        args.n_layers, args.n_heads, args.d_model, args.context_len, args.batch_size, warmup=args.warmup,
        steps=args.steps, rounds=args.rounds, threads=args.threads, seed=args.seed, data=args.data, peers=peers,
        bias=not args.no_bias, profile=args.profile,
    )  # fmt: skip
    print(report(result))
    if not args.no_record:
        results = {"ours_tok_s": f"{result['ours_median']:.0f}"}
        for p in peers:
            ratios = result[f"ratio_{p}"]
            results[f"{p}_tok_s"] = f"{result[f'{p}_median']:.0f}"
            results[f"ratio_{p}"] = f"{result[f'ratio_{p}_median']:.3f} ({min(ratios):.3f}..{max(ratios):.3f})"
        results["target"] = ">=1.10"
        print(f"\nappended to {append_result('cpu_throughput', result['settings'], results, args.results)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""CPU training throughput: ``tl.GPT`` against a peer built from PyTorch's own layers.

The peer has the same sizes and computes the same function: token and learned position
embeddings, a stack of ``torch.nn.TransformerEncoderLayer(batch_first=True, norm_first=True,
activation="gelu")`` with a causal mask, a final LayerNorm and a head tied to the token
embedding. Both train at the CPU preset's shape (4 layers, 4 heads, d_model 128, context 64,
batch 12, dropout 0) with AdamW and gradient clipping, on the same batches, from the same seed,
with a fixed thread count. After a warm-up the two take turns (A B A B ...), ``steps`` training
steps each per round; the table shows each round's tokens per second, the medians and their ratio.

Target: ours / peer >= 1.00.

    python -m benchmarks.cpu_throughput                # the real run; appends a row to RESULTS.md
    python -m benchmarks.cpu_throughput --threads 1 --rounds 7 --steps 100
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

from .common import add_record_flags, append_result, default_threads, format_table, median, set_threads

# The CPU preset of the training command line (nanoGPT's "baby" GPT); vocabulary: Tiny Shakespeare's 65 characters.
CPU_SHAPE = dict(n_layers=4, n_heads=4, d_model=128, block_size=64, batch_size=12)
VOCAB_SIZE = 65


class TorchPeerGPT(nn.Module):
    """A GPT made of PyTorch's own layers, the same sizes as :class:`tl.GPT` (pre-LN, GELU, tied head)."""

    def __init__(self, config: tl.GPTConfig):
        super().__init__()
        c = self.config = config
        self.tok_embed = nn.Embedding(c.vocab_size, c.d_model)
        self.pos_embed = nn.Embedding(c.block_size, c.d_model)
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
        causal = nn.Transformer.generate_square_subsequent_mask(c.block_size)  # (T, T), -inf above the diagonal
        self.register_buffer("causal", causal, persistent=False)

    def forward(self, idx: Tensor, targets: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        T = idx.shape[1]
        positions = torch.arange(T, device=idx.device)  # (T,)
        x = self.tok_embed(idx) + self.pos_embed(positions)  # (B, T, d_model)
        x = self.blocks(x, mask=self.causal[:T, :T], is_causal=True)  # (B, T, d_model)
        logits = self.lm_head(x)  # (B, T, vocab_size)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        return logits, loss


@torch.no_grad()
def copy_weights(ours: tl.GPT, peer: TorchPeerGPT) -> None:
    """Give ``peer`` the weights of ``ours`` (to check that the two compute the same function)."""
    peer.tok_embed.weight.copy_(ours.tok_embed.weight)
    peer.pos_embed.weight.copy_(ours.pos_embed.embedding.weight)
    for mine, theirs in zip(ours.decoder.layers, peer.blocks.layers, strict=True):
        attn = mine.self_attn
        theirs.self_attn.in_proj_weight.copy_(torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]))
        theirs.self_attn.in_proj_bias.copy_(torch.cat([attn.q_proj.bias, attn.k_proj.bias, attn.v_proj.bias]))
        theirs.self_attn.out_proj.load_state_dict(attn.out_proj.state_dict())
        theirs.norm1.load_state_dict(mine.res_self.norm.state_dict())
        theirs.linear1.load_state_dict(mine.ff.net[0].state_dict())
        theirs.linear2.load_state_dict(mine.ff.net[2].state_dict())
        theirs.norm2.load_state_dict(mine.res_ff.norm.state_dict())
    peer.blocks.norm.load_state_dict(ours.decoder.norm.state_dict())


def make_batches(
    n: int, batch_size: int, block_size: int, seed: int, data: str | Path | None = None
) -> tuple[list[tuple[Tensor, Tensor]], int, str]:
    """``n`` batches ``(x (B, T), y (B, T))``: windows of a text file's characters, or random tokens.

    Returns ``(batches, vocab_size, description)``.
    """
    g = torch.Generator().manual_seed(seed)
    if data is not None:
        text = Path(data).read_text(encoding="utf-8")
        chars = sorted(set(text))
        stoi = {ch: i for i, ch in enumerate(chars)}
        tokens = torch.tensor([stoi[ch] for ch in text], dtype=torch.long)
        vocab_size, source = len(chars), f"text {Path(data).name}"
    else:
        vocab_size, source = VOCAB_SIZE, "synthetic"
        tokens = torch.randint(vocab_size, (100_000,), generator=g)
    if len(tokens) <= block_size + 1:
        raise ValueError(f"the data has {len(tokens)} tokens, need more than {block_size + 1}")
    batches = []
    for _ in range(n):
        starts = torch.randint(len(tokens) - block_size - 1, (batch_size,), generator=g)  # (B,)
        offsets = starts[:, None] + torch.arange(block_size)  # (B, T)
        batches.append((tokens[offsets], tokens[offsets + 1]))
    return batches, vocab_size, source


class Trainer:
    """One model, its AdamW and its place in the shared list of batches."""

    def __init__(self, model: nn.Module, batches: list, lr: float = 1e-3, grad_clip: float = 1.0):
        self.model, self.batches, self.grad_clip, self.position = model.train(), batches, grad_clip, 0
        decay = [p for p in model.parameters() if p.dim() >= 2]
        no_decay = [p for p in model.parameters() if p.dim() < 2]
        groups = [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]
        self.optimizer = torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.99))

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


def run_throughput(
    n_layers: int = 4,
    n_heads: int = 4,
    d_model: int = 128,
    block_size: int = 64,
    batch_size: int = 12,
    warmup: int = 10,
    steps: int = 50,
    rounds: int = 5,
    threads: int | None = None,
    seed: int = 1337,
    data: str | Path | None = None,
    grad_clip: float = 1.0,
) -> dict:
    """Train ``tl.GPT`` and the PyTorch peer in turns; returns the settings and tokens/s of every round.

    The result has ``ours`` and ``peer`` (tokens/s per round), their medians ``ours_median`` and
    ``peer_median``, ``ratio`` (ours / peer), ``params`` of each model, ``max_logit_diff`` (the
    largest difference of the two models' logits; the peer starts from our initial weights, so it
    is about 1e-6 when they compute the same function) and ``final_loss`` of each (close, as both
    see the same batches from the same weights).
    """
    threads = set_threads(threads)
    batches, vocab_size, source = make_batches(64, batch_size, block_size, seed, data)
    config = tl.GPTConfig(
        vocab_size=vocab_size, block_size=block_size, n_layers=n_layers, n_heads=n_heads, d_model=d_model, dropout=0.0
    )
    torch.manual_seed(seed)
    ours = tl.GPT(config)
    torch.manual_seed(seed)
    peer = TorchPeerGPT(config)
    params = {"ours": sum(p.numel() for p in ours.parameters()), "peer": sum(p.numel() for p in peer.parameters())}
    if params["ours"] != params["peer"]:
        raise RuntimeError(f"the two models differ in size: {params}")

    with torch.no_grad():  # the same function and the same start: the peer gets our initial weights
        copy_weights(ours, peer)
        x, _ = batches[0]
        max_logit_diff = (ours.eval()(x)[0] - peer.eval()(x)[0]).abs().max().item()

    trainers = {name: Trainer(m, batches, grad_clip=grad_clip) for name, m in (("ours", ours), ("peer", peer))}
    for trainer in trainers.values():
        trainer.steps(warmup)
    tokens_per_step = batch_size * block_size
    rates: dict[str, list[float]] = {"ours": [], "peer": []}
    final_loss = {}
    for _ in range(rounds):
        for name, trainer in trainers.items():  # A B A B ...
            start = time.perf_counter()
            final_loss[name] = trainer.steps(steps)
            rates[name].append(tokens_per_step * steps / (time.perf_counter() - start))
    ours_median, peer_median = median(rates["ours"]), median(rates["peer"])
    return {
        "settings": dict(
            n_layers=n_layers,
            n_heads=n_heads,
            d_model=d_model,
            block_size=block_size,
            batch_size=batch_size,
            vocab_size=vocab_size,
            data=source,
            warmup=warmup,
            steps=steps,
            rounds=rounds,
            threads=threads,
            seed=seed,
            grad_clip=grad_clip,
            optimizer="AdamW",
        ),
        "params": params,
        "max_logit_diff": max_logit_diff,
        "ours": rates["ours"],
        "peer": rates["peer"],
        "ours_median": ours_median,
        "peer_median": peer_median,
        "ratio": ours_median / peer_median,
        "final_loss": final_loss,
    }


def report(result: dict) -> str:
    """The printed table."""
    s = result["settings"]
    tokens_per_step = s["batch_size"] * s["block_size"]
    rows = []
    for name, label in (("ours", "tl.GPT"), ("peer", "torch.nn peer")):
        median_rate = result[f"{name}_median"]
        rows.append(
            [
                label,
                f"{result['params'][name]:,}",
                " ".join(f"{r:,.0f}" for r in result[name]),
                f"{median_rate:,.0f}",
                f"{1000 * tokens_per_step / median_rate:.1f}",
                f"{result['final_loss'][name]:.3f}",
            ]
        )
    table = format_table(["model", "params", "tokens/s per round", "median tokens/s", "ms/step", "loss"], rows)
    return (
        f"{table}\n\nratio ours / peer: {result['ratio']:.3f} (target >= 1.00); "
        f"same function: max |logit difference| {result['max_logit_diff']:.1e} with equal weights"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.cpu_throughput",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--threads", type=int, default=default_threads(), help="torch.set_num_threads")
    parser.add_argument("--warmup", type=int, default=10, help="untimed steps of each model first")
    parser.add_argument("--steps", type=int, default=50, help="timed steps of each model per round")
    parser.add_argument("--rounds", type=int, default=5, help="rounds of A B")
    parser.add_argument("--seed", type=int, default=1337)
    parser.add_argument("--grad-clip", type=float, default=1.0, help="clip the gradient norm (0: off), as the trainer")
    parser.add_argument("--data", default=None, metavar="PATH", help="a text file (default: random tokens, 65 ids)")
    for name, value in CPU_SHAPE.items():
        parser.add_argument("--" + name.replace("_", "-"), type=int, default=value)
    add_record_flags(parser)
    args = parser.parse_args(argv)

    result = run_throughput(
        args.n_layers, args.n_heads, args.d_model, args.block_size, args.batch_size, args.warmup, args.steps,
        args.rounds, args.threads, args.seed, args.data, args.grad_clip,
    )  # fmt: skip
    print(report(result))
    if not args.no_record:
        results = {
            "ours_tok_s": f"{result['ours_median']:.0f}",
            "peer_tok_s": f"{result['peer_median']:.0f}",
            "ratio": f"{result['ratio']:.3f}",
            "target": ">=1.00",
        }
        print(f"\nappended to {append_result('cpu_throughput', result['settings'], results, args.results)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

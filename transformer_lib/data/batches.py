"""Random training batches (chapters "Encoder-decoder and cross-attention" and "A GPT from scratch"), drawn from seeded
generators whose state a checkpoint saves, and split between the processes of a data-parallel run."""

from __future__ import annotations

import torch
from torch import Tensor

from .._checks import check_int
from .tasks import Seq2SeqData

__all__ = ["LMBatches", "Seq2SeqBatches", "get_batch", "split_tokens"]


def split_tokens(tokens: Tensor, val_fraction: float = 0.1) -> tuple[Tensor, Tensor]:
    """A token stream ``(N,)`` -> (first ``1 - val_fraction``, last ``val_fraction``): never overlapping (chapter "A GPT
    from scratch")."""
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
    n_train = int(len(tokens) * (1.0 - val_fraction))
    return tokens[:n_train], tokens[n_train:]


def _to_device(t: Tensor, device: torch.device | str) -> Tensor:
    device = torch.device(device)
    if device.type == "cuda":  # pinned memory lets the copy overlap with the GPU's work
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


def _windows(data: Tensor, starts: Tensor, context_len: int, device: torch.device | str) -> tuple[Tensor, Tensor]:
    offsets = starts[:, None] + torch.arange(context_len)  # (B, T)
    return _to_device(data[offsets], device), _to_device(data[offsets + 1], device)


def get_batch(
    data: Tensor,
    context_len: int,
    batch_size: int,
    generator: torch.Generator | None = None,
    device: torch.device | str = "cpu",
) -> tuple[Tensor, Tensor]:
    """``batch_size`` random windows of a token stream ``data (N,)`` (chapter "A GPT from scratch").

    Returns ``x (B, T)`` and ``y (B, T)`` on ``device`` with ``T = context_len``; ``y`` is ``x``
    shifted by one position in the stream, so ``y[:, t]`` is the token that follows ``x[:, t]``.
    """
    check_int(context_len, "context_len")
    check_int(batch_size, "batch_size")
    if len(data) <= context_len:
        raise ValueError(f"the data has {len(data)} tokens, need more than context_len={context_len}")
    starts = torch.randint(len(data) - context_len, (batch_size,), generator=generator)  # (B,)
    return _windows(data, starts, context_len, device)


class _Batches:
    """Shared part of the batch samplers: one seeded generator per split, and ranks.

    The samplers take these keyword arguments (``**sampling``): ``device`` where batches are put
    (once, when drawn), ``seed``, and ``rank`` / ``world_size`` for data-parallel training.

    With ``world_size`` processes (data-parallel training) every rank draws the same global batch
    of ``world_size * batch_size`` rows and keeps its own slice, so together the ranks see
    exactly the batch one process would see with ``world_size`` times the batch size.
    """

    def __init__(
        self, batch_size: int, *, device: torch.device | str = "cpu", seed: int = 0, rank: int = 0, world_size: int = 1
    ):
        check_int(batch_size, "batch_size")
        check_int(world_size, "world_size")
        check_int(rank, "rank", minimum=0)
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, world_size={world_size}), got {rank}")
        self.batch_size, self.device, self.rank, self.world_size = batch_size, torch.device(device), rank, world_size
        self.generators = {s: torch.Generator().manual_seed(seed + i) for i, s in enumerate(("train", "val"))}

    def _check_split(self, split: str) -> None:
        if split not in self.generators:
            raise ValueError(f"split must be 'train' or 'val', got {split!r}")

    def _rows(self, split: str, n: int) -> Tensor:
        """This rank's ``batch_size`` random row indices in ``[0, n)``."""
        rows = torch.randint(n, (self.world_size * self.batch_size,), generator=self.generators[split])
        return rows[self.rank * self.batch_size : (self.rank + 1) * self.batch_size]

    def state_dict(self) -> dict:
        """The generators' states (saved in checkpoints, so a resumed run draws the same batches)."""
        return {s: g.get_state() for s, g in self.generators.items()}

    def load_state_dict(self, state: dict) -> None:
        for s, g in self.generators.items():
            g.set_state(state[s])


class LMBatches(_Batches):
    """Language-model batches from a training and a validation token stream (chapter "A GPT from scratch").

    ``batches("train")`` or ``batches("val")`` returns ``(x (B, T), y (B, T))`` as
    :func:`get_batch` does, each split with its own seeded generator.
    """

    def __init__(self, train: Tensor, val: Tensor, context_len: int, batch_size: int, **sampling):
        super().__init__(batch_size, **sampling)
        check_int(context_len, "context_len")
        for name, data in (("train", train), ("val", val)):
            if len(data) <= context_len:
                raise ValueError(f"the {name} split has {len(data)} tokens, need more than context_len={context_len}")
        self.data, self.context_len = {"train": train, "val": val}, context_len

    def __call__(self, split: str = "train") -> tuple[Tensor, Tensor]:
        self._check_split(split)
        data = self.data[split]
        starts = self._rows(split, len(data) - self.context_len)  # (B,)
        return _windows(data, starts, self.context_len, self.device)


class Seq2SeqBatches(_Batches):
    """Random batches of a :class:`Seq2SeqData` for teacher forcing (chapter "Encoder-decoder and cross-attention").

    ``batches("train")`` returns ``(src (B, T_src), tgt_in (B, T_tgt - 1), tgt_out (B, T_tgt - 1))``,
    the arguments of ``Transformer.forward(src, tgt, targets)``.
    """

    def __init__(self, data: Seq2SeqData, batch_size: int, **sampling):
        super().__init__(batch_size, **sampling)
        self.splits = {"train": (data.train_src, data.train_tgt), "val": (data.val_src, data.val_tgt)}

    def __call__(self, split: str = "train") -> tuple[Tensor, Tensor, Tensor]:
        self._check_split(split)
        src, tgt = self.splits[split]
        rows = self._rows(split, len(src))  # (B,)
        src, tgt = _to_device(src[rows], self.device), _to_device(tgt[rows], self.device)
        return src, tgt[:, :-1], tgt[:, 1:]

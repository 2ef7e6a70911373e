"""Checkpoints (chapter 9, "A GPT from scratch"): written atomically, read once, loaded with
``weights_only=True`` and checked against the SHA-256 of their tensors; the model registry that
rebuilds a model from its saved config; and every random state a training step reads, so a
resumed run equals one that never stopped.
"""

from __future__ import annotations

import hashlib
import os
import random
from pathlib import Path

import numpy as np
import torch
from torch import nn

from .data import CharTokenizer
from .encoder_decoder import Transformer, TransformerConfig
from .models import GPT, GPTConfig
from .utils import atomic_write, check_writable

__all__ = [
    "CHECKPOINT_NAME",
    "MODELS",
    "capture_rng",
    "checkpoint_file",
    "load_checkpoint",
    "read_checkpoint",
    "restore_rng",
    "save_checkpoint",
]

CHECKPOINT_NAME = "ckpt.pt"

# The model classes a checkpoint can hold, by name, with their config classes.
MODELS: dict[str, tuple[type[nn.Module], type]] = {
    "GPT": (GPT, GPTConfig),
    "Transformer": (Transformer, TransformerConfig),
}


def _tensors(obj, name: str = ""):
    """``(name, tensor)`` for every tensor inside ``obj`` (dicts, lists, tuples), in a fixed order."""
    if isinstance(obj, torch.Tensor):
        yield name, obj
    elif isinstance(obj, dict):
        for key in sorted(obj, key=str):
            yield from _tensors(obj[key], f"{name}/{key}")
    elif isinstance(obj, (list, tuple)):
        for i, item in enumerate(obj):
            yield from _tensors(item, f"{name}/{i}")


def tensor_checksum(state) -> str:
    """SHA-256 over the name, dtype, shape and bytes of every tensor in ``state`` (chapter 9): a
    byte changed inside any tensor changes it."""
    digest = hashlib.sha256()
    for name, tensor in _tensors(state):
        digest.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)};".encode())
        digest.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def save_checkpoint(state: dict, path: str | os.PathLike) -> Path:
    """``torch.save(state)`` to ``path`` atomically, with the :func:`tensor_checksum` of its
    tensors under ``"checksum"`` (chapter 9): a reader, or a crash, never sees a half-written
    checkpoint, and :func:`read_checkpoint` finds a damaged one."""
    state = {**state, "checksum": tensor_checksum(state)}
    return atomic_write(path, lambda tmp: torch.save(state, tmp))


def prepare_folder(path: str | os.PathLike) -> list[Path]:
    """Check that the folder of the checkpoint ``path`` can be written (making it if needed) and
    delete the temporary files a killed writer left beside ``path`` (chapter 9); returns those."""
    path = Path(path)
    check_writable(path.parent)
    orphans = sorted(path.parent.glob(f"{path.name}.*.tmp"))
    for orphan in orphans:
        orphan.unlink(missing_ok=True)
    return orphans


def checkpoint_file(path: str | os.PathLike) -> Path:
    """``path`` itself, or ``path/ckpt.pt`` when ``path`` is a folder (chapter 9)."""
    path = Path(path)
    return path / CHECKPOINT_NAME if path.is_dir() else path


def read_checkpoint(path: str | os.PathLike) -> dict:
    """The dict saved in the checkpoint at ``path`` (a file or its folder), tensors on the CPU (chapter 9).

    An empty, truncated or garbage file, one holding more than tensors and plain data, or one
    whose tensors do not match their stored checksum, is a ``ValueError`` naming the file.
    """
    file = checkpoint_file(path)
    if not file.is_file():
        raise FileNotFoundError(f"no checkpoint at {file}")
    try:
        ckpt = torch.load(file, map_location="cpu", weights_only=True)
    except (PermissionError, IsADirectoryError):
        raise
    except Exception as e:
        if "GLOBAL" in str(e):  # a pickle that names a class or function: it could run code
            raise ValueError(
                f"{file} holds objects other than tensors and plain data: refused, as it may run code"
            ) from None
        size = file.stat().st_size
        raise ValueError(f"{file} is not a readable checkpoint ({size} bytes; empty, truncated or damaged)") from None
    if not isinstance(ckpt, dict) or "checksum" not in ckpt:
        raise ValueError(f"{file} is not a checkpoint written by this library (it has no tensor checksum)")
    if tensor_checksum({k: v for k, v in ckpt.items() if k != "checksum"}) != ckpt["checksum"]:
        raise ValueError(f"{file} is damaged: its tensors do not match the checksum stored with them")
    return ckpt


def load_checkpoint(
    path: str | os.PathLike | dict, device: torch.device | str = "cpu"
) -> tuple[nn.Module, CharTokenizer | None, dict]:
    """Rebuild the model saved by :func:`~transformer_lib.train.train` (chapter 9).

    ``path`` is a ``ckpt.pt``, its folder, or a checkpoint dict already read by
    :func:`read_checkpoint`. Returns ``(model, tokenizer or None, checkpoint dict)``; the model is
    on ``device`` in eval mode.
    """
    ckpt = path if isinstance(path, dict) else read_checkpoint(path)
    model_cls, config_cls = MODELS[ckpt["model_class"]]
    model = model_cls(config_cls(**ckpt["model_config"]))
    model.load_state_dict(ckpt["model"])
    tokenizer = CharTokenizer.from_dict(ckpt["tokenizer"]) if ckpt.get("tokenizer") else None
    return model.to(device).eval(), tokenizer, ckpt


def capture_rng(get_batch) -> dict:
    """Every random state a training step reads, in types ``weights_only`` loading accepts (chapter 9).

    Python's, NumPy's legacy global, PyTorch's CPU and CUDA generators, and the batch sampler's
    (``get_batch.state_dict()`` when it has one).
    """
    name, keys, pos, has_gauss, cached = np.random.get_state()  # noqa: NPY002 (the legacy global generator)
    return {
        "python": random.getstate(),
        "numpy": [name, keys.tolist(), pos, has_gauss, cached],
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else [],
        "batches": get_batch.state_dict() if hasattr(get_batch, "state_dict") else None,
    }


def restore_rng(rng: dict, get_batch) -> None:
    """Set every random state saved by :func:`capture_rng` (chapter 9)."""
    random.setstate(rng["python"])
    name, keys, pos, has_gauss, cached = rng["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))  # noqa: NPY002
    torch.set_rng_state(rng["torch"])
    if rng["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])
    if rng["batches"] is not None and hasattr(get_batch, "load_state_dict"):
        get_batch.load_state_dict(rng["batches"])

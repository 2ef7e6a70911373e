"""Helpers every chapter and tool shares: seeding, and the device, dtype and process rank, each
resolved in one place; an atomic file write."""

from __future__ import annotations

import errno
import math
import numbers
import os
import random
import signal
import tempfile
import threading
from collections.abc import Callable, Mapping
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from ._checks import is_int, is_real, plain_number

__all__ = [
    "DTYPES",
    "atomic_write",
    "autocast",
    "check_fields",
    "pick_device",
    "resolve_dtype",
    "set_seed",
    "world",
]

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def set_seed(seed: int = 0) -> None:
    """Seed Python's, NumPy's and PyTorch's random generators, CPU and every GPU (chapter "Why attention?").

    ``seed`` is an int in ``[0, 2**32 - 1]`` (NumPy's range); anything else is a clear error.
    """
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        hint = " (for a seed from the clock, int(time.time()))" if isinstance(seed, float) else ""
        raise TypeError(f"seed must be an int in [0, 2**32 - 1], got {seed!r} ({type(seed).__name__}){hint}")
    if not 0 <= seed < 2**32:
        raise ValueError(f"seed must be an int in [0, 2**32 - 1], got {seed}")
    random.seed(seed)
    np.random.seed(seed)  # noqa: NPY002 (seeds the legacy global generator that user code may use)
    torch.manual_seed(seed)


def pick_device(device: str | torch.device | None = None) -> torch.device:
    """``device`` if given, else CUDA if available, then Apple's MPS, then the CPU (chapter "A GPT from scratch").

    A device this machine lacks, one PyTorch does not know, or ``'meta'`` (shapes without
    values) is a ``ValueError`` naming it.
    """
    if isinstance(device, torch.device):
        return device
    if device not in (None, "auto"):
        try:
            chosen = torch.device(device)
        except (RuntimeError, TypeError, ValueError):
            raise ValueError(
                f"device {device!r} is not a device PyTorch knows: use 'auto', 'cpu', 'cuda', 'cuda:1', 'mps', ..."
            ) from None
        if chosen.type == "meta":
            raise ValueError(
                f"device {device!r} cannot run a model: a tensor on 'meta' has a shape but no values (use 'cpu', "
                f"'cuda' or 'auto')"
            )
        if chosen.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"device {device!r} is not available: this PyTorch sees no CUDA GPU (use 'cpu' or 'auto')")
        if chosen.type == "cuda" and (chosen.index or 0) >= torch.cuda.device_count():
            raise ValueError(f"device {device!r} is not available: there are {torch.cuda.device_count()} CUDA GPUs")
        mps = getattr(torch.backends, "mps", None)
        if chosen.type == "mps" and not (mps is not None and mps.is_available()):
            raise ValueError(f"device {device!r} is not available: this machine has no Apple MPS GPU (use 'cpu')")
        if chosen.type not in ("cpu", "cuda", "mps"):  # another backend (xpu, hpu, ...): try one small computation
            try:
                torch.ones(1, device=chosen).add(1).cpu()
            except Exception as e:  # noqa: BLE001 (each backend fails in its own way)
                reason = (str(e).strip().splitlines() or [type(e).__name__])[0].split(". ")[0][:160]
                raise ValueError(f"device {device!r} is not usable on this machine ({reason})") from None
        return chosen
    if torch.cuda.is_available():
        return torch.device("cuda")
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def resolve_dtype(name: str | torch.dtype, device: torch.device) -> torch.dtype:
    """The autocast dtype called ``name`` on ``device`` (chapter "A GPT from scratch").

    ``"auto"`` is bfloat16 on CUDA GPUs that have it, float16 on older ones and float32 elsewhere;
    otherwise one of :data:`DTYPES` (or a ``torch.dtype``, returned as it is).
    """
    if isinstance(name, torch.dtype):
        return name
    if name == "auto":
        if device.type != "cuda":
            return torch.float32
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if name not in DTYPES:
        raise ValueError(f"dtype must be 'auto' or one of {sorted(DTYPES)}, got {name!r}")
    return DTYPES[name]


def autocast(device: torch.device, dtype: torch.dtype):
    """``torch.autocast`` to ``dtype`` on ``device``, or nothing for float32 (chapter "A GPT from scratch")."""
    if dtype == torch.float32:
        return nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def batch_on(batch, device: torch.device):
    """The batch on ``device``, tensors already there not copied (chapter "A GPT from scratch"): a tuple of tensors,
    whose targets (the last) must have the shape of the inputs before them, else a ``ValueError``;
    or (chapter "Fine-tuning") a dict of tensors, the model's keyword arguments."""
    if isinstance(batch, Mapping):
        if not all(isinstance(t, torch.Tensor) for t in batch.values()):
            raise TypeError("get_batch must return tensors: a dict of them holds something else")
        return {k: t if t.device == device else t.to(device, non_blocking=True) for k, t in batch.items()}
    if isinstance(batch, torch.Tensor) or not all(isinstance(t, torch.Tensor) for t in batch):
        raise TypeError(f"get_batch must return a tuple of tensors, got {type(batch).__name__}")
    if len(batch) >= 2 and batch[-1].shape != batch[-2].shape:
        raise ValueError(
            f"the batch's targets have shape {tuple(batch[-1].shape)} but its inputs {tuple(batch[-2].shape)}: "
            f"get_batch must return targets of the inputs' shape"
        )
    return tuple(t if t.device == device else t.to(device, non_blocking=True) for t in batch)


def run_batch(model, batch):
    """``model(*batch)`` for a tuple, ``model(**batch)`` for a dict (chapter "Fine-tuning")."""
    return model(**batch) if isinstance(batch, Mapping) else model(*batch)


def world() -> tuple[int, int]:
    """``(rank, world_size)`` of this process; ``(0, 1)`` without ``torch.distributed`` (chapter "A GPT from
    scratch")."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def atomic_write(path: str | os.PathLike, write: Callable[[str], object]) -> Path:
    """Call ``write(tmp)`` on a temporary file beside ``path``, flush it to disk, then rename it
    to ``path`` (chapter "A GPT from scratch"): a reader, or a crash, never sees a half-written file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~current_umask())  # mkstemp makes it private: give it the usual mode
        os.replace(tmp, path)
    except OSError as e:
        Path(tmp).unlink(missing_ok=True)
        if e.errno not in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)):
            raise
        kept = f"the previous {path.name} is intact" if path.exists() else "nothing was written"
        full = OSError(f"no space left on the device to write {path}: {kept}")
        full.errno = e.errno
        raise full from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_folder(path.parent)
    return path


def current_umask() -> int:
    """The process's umask (the permission bits new files do not get)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def check_writable(folder: str | os.PathLike) -> Path:
    """Make ``folder`` if needed and write a probe file in it (chapter "A GPT from scratch"), so that a folder no
    file can be written to is an ``OSError`` naming it before any work is done, not after."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise OSError(f"cannot write to the folder {folder}: it is a file, not a folder")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".write-test.")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise OSError(f"cannot write to the folder {folder}: {e.strerror or e}") from None
    return folder


def _fsync_folder(folder: Path) -> None:
    """Flush a folder's entries (the rename) to disk where the system allows it."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return  # Windows cannot open a folder
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class InterruptFlag:
    """Inside ``with InterruptFlag() as flag:`` (in the main thread) the first Ctrl-C (SIGINT)
    only sets ``flag.requested``, for a loop to honour between two steps (chapter "A GPT from scratch"); a second
    Ctrl-C raises ``KeyboardInterrupt`` as usual. Elsewhere nothing changes."""

    def __init__(self) -> None:
        self.requested = False
        self._previous = None

    def __enter__(self) -> InterruptFlag:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
            self._previous = None

    def _handle(self, signum, frame) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True


def _number(value, kind: type) -> bool:
    """Python's or NumPy's whole number (``kind`` int) or finite real (float); never a bool, which
    Python counts as an int but is never a size or a rate here."""
    return is_int(value) if kind is int else is_real(value) and math.isfinite(value)


_RULES = {
    "positive": (lambda v: v > 0, "> 0"),
    "count": (lambda v: v >= 0, ">= 0"),
    "probability": (lambda v: 0 <= v < 1, "in [0, 1)"),
}


def check_fields(obj, rules: dict[str, tuple[type, str]]) -> None:
    """Raise a clear error for a dataclass field of the wrong type or out of range (chapter "A GPT from scratch").

    ``rules`` maps a field name to ``(int or float, "positive" | "count" | "probability")``; a
    field whose value is None is left alone (None means "the default" where a field allows it).
    A bool or a string where a number belongs is a ``TypeError``; a number out of range a
    ``ValueError``. Both name the class, the field and the value. A NumPy number is accepted and
    stored as Python's (a checkpoint's ``weights_only`` loading and JSON take no NumPy scalar).
    """
    for name, (kind, rule) in rules.items():
        value = getattr(obj, name)
        if value is None:
            continue
        where = f"{type(obj).__name__}.{name}"
        if not _number(value, kind):
            raise TypeError(f"{where} must be a finite {kind.__name__}, got {value!r} ({type(value).__name__})")
        test, text = _RULES[rule]
        if not test(value):
            raise ValueError(f"{where} must be {text}, got {value!r}")
        if plain_number(value) is not value:
            object.__setattr__(obj, name, plain_number(value))  # object's: a frozen dataclass too

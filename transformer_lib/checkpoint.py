"""Checkpoints (chapter "A GPT from scratch"): written atomically, read once, loaded with
``weights_only=True`` and checked against the SHA-256 of their tensors; the model registry that
rebuilds a model from its saved config; the lock by which one process owns a folder; and every
random state a training step reads, so a resumed run equals one that never stopped.

These are the mechanics of one file. The lock takes its file's name from its caller, and the
lookup of a checkpoint in a folder takes another name than ``ckpt.pt`` where its caller gives
one; the names of a run folder's other files (the lock's, the tokenizer's, a LoRA run's adapter
file's), what a training checkpoint records, and how a run is loaded back are
:mod:`transformer_lib.run`'s.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import hashlib
import json
import os
import random
import shutil
import socket
import time
from dataclasses import fields
from pathlib import Path

import numpy as np
import torch
from torch import nn

from .bpe import BPETokenizer
from .data import CharTokenizer, tokenizer_from_dict
from .encoder_decoder import Transformer, TransformerConfig
from .models import GPT, RECIPE_FIELDS, GPTConfig
from .utils import atomic_write, check_writable

__all__ = [
    "CHECKPOINT_NAME",
    "MODELS",
    "build_model",
    "capture_rng",
    "checkpoint_file",
    "read_checkpoint",
    "restore_rng",
    "save_checkpoint",
]

#: The checkpoint in a folder (a run folder's, :class:`transformer_lib.run.RunFolder`), unless the
#: caller of :func:`checkpoint_file` or :func:`read_checkpoint` names another.
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
    """SHA-256 over the name, dtype, shape and bytes of every tensor in ``state`` (chapter "A GPT from scratch"): a
    byte changed inside any tensor changes it."""
    digest = hashlib.sha256()
    for name, tensor in _tensors(state):
        digest.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)};".encode())
        digest.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


# What the stored checksum covers; a checkpoint without this key (from an earlier version) has
# a checksum of its tensors only.
_COVERS = "tensors and settings"


def _settings_digest(obj, digest, name: str = "") -> None:
    """Add every value that is not a tensor inside ``obj`` to ``digest``, in a fixed order."""
    if isinstance(obj, torch.Tensor):
        return
    if isinstance(obj, dict):
        for key in sorted(obj, key=str):
            _settings_digest(obj[key], digest, f"{name}/{key}")
    elif isinstance(obj, (list, tuple)):
        digest.update(f"{name}:{type(obj).__name__}{len(obj)};".encode())
        for i, item in enumerate(obj):
            _settings_digest(item, digest, f"{name}/{i}")
    else:
        digest.update(f"{name}={type(obj).__name__}:{obj!r};".encode())


def _full_checksum(state: dict) -> str:
    """SHA-256 over the tensors and over every setting (model config, tokenizer, step, ...)."""
    digest = hashlib.sha256(tensor_checksum(state).encode())
    _settings_digest(state, digest)
    return digest.hexdigest()


def save_checkpoint(state: dict, path: str | os.PathLike) -> Path:
    """``torch.save(state)`` to ``path`` atomically, with a SHA-256 of its tensors and of its
    settings (the model's config, the tokenizer, the step, ...) under ``"checksum"`` (chapter "A GPT from scratch"):
    a reader, or a crash, never sees a half-written checkpoint, and :func:`read_checkpoint` finds
    a damaged or edited one."""
    state = {**state, "checksum_covers": _COVERS}
    state["checksum"] = _full_checksum(state)
    return atomic_write(path, lambda tmp: _save(state, tmp))


def _save(state: dict, tmp: str) -> None:
    """``torch.save``, whose failed write on a full disk (a bare "unexpected pos" error) becomes
    the ``OSError`` it is (``ENOSPC``)."""
    try:
        torch.save(state, tmp)
    except RuntimeError:
        if shutil.disk_usage(Path(tmp).parent).free < 1 << 20:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), tmp) from None
        raise


def prepare_folder(*paths: str | os.PathLike) -> list[Path]:
    """Check that the folder of the files ``paths`` can be written (making it if needed) and
    delete the temporary files a killed writer left beside each of them (chapter "A GPT from scratch"); returns
    those."""
    paths = [Path(p) for p in paths]
    check_writable(paths[0].parent)
    orphans = sorted(o for path in paths for o in path.parent.glob(f"{path.name}.*.tmp"))
    for orphan in orphans:
        orphan.unlink(missing_ok=True)
    return orphans


_OWNED: dict[str, list] = {}  # folders this process owns: resolved path -> [file descriptor, depth]


def _lock(fd: int) -> None:
    """Take an exclusive lock on the open file ``fd`` at once, or raise ``OSError``; the
    operating system drops it when the process ends, however it ends."""
    try:
        import fcntl
    except ImportError:  # Windows: lock one byte far past the text, so the holder's line stays readable
        import msvcrt

        os.lseek(fd, 1 << 20, os.SEEK_SET)
        msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
        return
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)


def _holder(path: Path) -> str:
    """Who holds the lock file ``path``, as its holder wrote it (given a second to write it)."""
    for _ in range(20):
        try:
            info = json.loads(path.read_text(encoding="utf-8"))
            return f"pid {info['pid']} on {info['host']}, started {info['started']}"
        except (OSError, ValueError, KeyError, TypeError):
            time.sleep(0.05)  # locked a moment ago, not yet written
    return "a run that does not say which"


@contextlib.contextmanager
def own_folder(folder: str | os.PathLike, lock_name: str):
    """Inside ``with own_folder(folder, lock_name):`` this process alone writes checkpoints in
    ``folder`` (chapter "A GPT from scratch"), holding the lock file ``folder/lock_name`` (a run folder's is
    ``transformer_lib.run.LOCK_NAME``; :meth:`~transformer_lib.run.RunFolder.own` gives it): a
    second run, fresh or resumed, is refused with an ``OSError`` that says which run holds it (its
    pid, host and start time). The lock belongs to the process, so the operating system releases
    it when the run ends, even killed; the same process may enter it again (the command holds it,
    then :func:`~transformer_lib.train.train` inside)."""
    folder = check_writable(folder)
    key = str(folder.resolve())
    if key in _OWNED:
        _OWNED[key][1] += 1
        try:
            yield folder
        finally:
            _OWNED[key][1] -= 1
        return
    path = folder / lock_name
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            _lock(fd)
        except OSError:
            os.close(fd)
            raise BlockingIOError(
                f"{folder} is in use by another training run ({_holder(path)}): wait for it to finish, or "
                f"choose another folder"
            ) from None
        try:  # the file may have been removed by a holder that was just ending: lock the new one
            same = os.path.samestat(os.fstat(fd), os.stat(path))
        except OSError:
            same = False
        if same:
            break
        os.close(fd)
    started = time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime())
    line = json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "started": started}) + "\n"
    os.ftruncate(fd, 0)
    os.lseek(fd, 0, os.SEEK_SET)
    os.write(fd, line.encode())
    _OWNED[key] = [fd, 1]
    try:
        yield folder
    finally:
        del _OWNED[key]
        with contextlib.suppress(OSError):
            path.unlink()  # still locked: no other run can be holding this file
        os.close(fd)


def checkpoint_file(path: str | os.PathLike, name: str = CHECKPOINT_NAME) -> Path:
    """``path`` itself, or the checkpoint ``path/name`` when ``path`` is a folder (chapter "A GPT from scratch")."""
    path = Path(path)
    return path / name if path.is_dir() else path


def read_checkpoint(path: str | os.PathLike, name: str = CHECKPOINT_NAME) -> dict:
    """The dict saved in the checkpoint at ``path`` (a file, or the folder that holds it as
    ``name``), tensors on the CPU (chapter "A GPT from scratch").

    An empty, truncated or garbage file, one holding more than tensors and plain data, or one
    whose tensors do not match their stored checksum, is a ``ValueError`` naming the file.
    """
    file = checkpoint_file(path, name)
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
    rest = {k: v for k, v in ckpt.items() if k != "checksum"}
    if ckpt.get("checksum_covers") == _COVERS:
        if _full_checksum(rest) != ckpt["checksum"]:
            raise ValueError(
                f"{file} is damaged or was edited: its tensors or its settings do not match the checksum stored "
                f"with them"
            )
    elif tensor_checksum(rest) != ckpt["checksum"]:
        raise ValueError(f"{file} is damaged: its tensors do not match the checksum stored with them")
    return ckpt


def check_recorded(ckpt: dict, file, keys: tuple[str, ...] = ("model_class", "model_config", "model")) -> None:
    """Raise a ``ValueError`` naming ``file`` and the setting when ``ckpt`` lacks one of ``keys``
    or, for a known model class, one of its config's fields (a checkpoint from another version)."""
    missing = [k for k in keys if k not in ckpt]
    if not missing and "model_config" in keys:
        if ckpt["model_class"] not in MODELS:
            raise ValueError(f"{file} holds a model of class {ckpt['model_class']!r}, not one of {sorted(MODELS)}")
        config = ckpt["model_config"]
        if not isinstance(config, dict):
            raise ValueError(f"{file} does not record the model's settings (model_config is {config!r})")
        known = {f.name for f in fields(MODELS[ckpt["model_class"]][1])}
        # a GPT's recipe (chapter "Today's block") is absent in older checkpoints, which hold its choices flat, or none
        # (GPT-2's)
        optional = {"recipe", *RECIPE_FIELDS} if ckpt["model_class"] == "GPT" else set()
        missing = [f"model_config.{name}" for name in sorted(known - optional) if name not in config]
        unknown = sorted(set(config) - known - optional)
        if unknown and not missing:
            raise ValueError(f"{file} records the model setting {unknown[0]!r}, which this version does not know")
    if missing:
        raise ValueError(
            f"{file} does not record {missing[0]} (a checkpoint from another version?): it cannot be "
            f"loaded without guessing"
        )


def build_model(
    ckpt: dict, where: str | os.PathLike = "the checkpoint", device: torch.device | str = "cpu"
) -> tuple[nn.Module, CharTokenizer | BPETokenizer | None]:
    """The model and tokenizer (or None) that the checkpoint dict ``ckpt`` holds, rebuilt from its
    model class and config (chapter "A GPT from scratch"), in the dtype it was saved in, on ``device`` in eval mode.
    A missing or unknown setting, or weights that are not finite, is a ``ValueError`` naming ``where``.
    Loading a run's folder, a LoRA run's included, is :func:`~transformer_lib.run.load_checkpoint`'s."""
    check_recorded(ckpt, where)
    model_cls, config_cls = MODELS[ckpt["model_class"]]
    model = model_cls(config_cls(**ckpt["model_config"]))
    bad = next((k for k, t in ckpt["model"].items() if t.is_floating_point() and not bool(t.isfinite().all())), None)
    if bad is not None:
        raise ValueError(f"{where}: the model's {bad} holds values that are not finite (NaN or inf): a diverged model")
    floats = [t.dtype for t in ckpt["model"].values() if t.is_floating_point()]
    model.to(floats[0] if floats else torch.float32).load_state_dict(ckpt["model"])  # in the dtype it was saved in
    tokenizer = tokenizer_from_dict(ckpt["tokenizer"]) if ckpt.get("tokenizer") else None
    return model.to(device).eval(), tokenizer


def capture_rng(get_batch) -> dict:
    """Every random state a training step reads, in types ``weights_only`` loading accepts (chapter "A GPT from
    scratch").

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
    """Set every random state saved by :func:`capture_rng` (chapter "A GPT from scratch")."""
    random.setstate(rng["python"])
    name, keys, pos, has_gauss, cached = rng["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))  # noqa: NPY002
    torch.set_rng_state(rng["torch"])
    if rng["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])
    if rng["batches"] is not None and hasattr(get_batch, "load_state_dict"):
        get_batch.load_state_dict(rng["batches"])


def config_dict(model) -> dict | None:
    """The model's config as a checkpoint stores it: its own ``to_dict`` (a recipe's specs name their
    kinds), or the dataclass's fields; None for a model without one."""
    config = getattr(model, "config", None)
    if config is None:
        return None
    return config.to_dict() if hasattr(config, "to_dict") else dataclasses.asdict(config)

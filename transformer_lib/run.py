"""A training run as one thing (chapters "A GPT from scratch", "Tokens", "Fine-tuning" and "Preferences
and rewards"): the folder a run writes and what its checkpoint holds, a typed record of what the run
is, the rules for what ``--resume`` may change, :func:`start_model`, the model every command starts
from, and :func:`load_run`, which gives a run back.

A run folder holds (the checkpoint's name is checkpoint.py's; the others, its lock's too, are this module's)::

    ckpt.pt         the checkpoint, atomic and checksummed (checkpoint.py)
    ckpt.pt.lock    while a run writes in the folder (checkpoint.py's lock)
    tokenizer.json  a BPE run's tokenizer (chapter "Tokens"), or its base's
    adapter.pt      a LoRA run's adapters and token rows (chapter "Fine-tuning")

The bytes of one checkpoint file (writing, reading, checksums, the lock, rebuilding a model from
its config) are :mod:`transformer_lib.checkpoint`'s; what a training checkpoint holds is
:class:`TrainingFile`'s, which :func:`~transformer_lib.train.train` writes and resumes.

What the run is (its kind, tokenizer, base, data, LoRA rank, seed, split) is a frozen
:class:`RunRecord`; on disk it is the checkpoint's ``meta`` dict, with the keys that earlier
versions wrote, so every checkpoint, old or new, reads as a record and back::

    model, tokenizer, adapters = tl.load_run("out/finetune")
    record = tl.read_record("out/finetune")  # RunRecord(kind='finetune', ...)

A new kind of run is a new row of :data:`KINDS` and a short command, not a copy of one: the
preference (``"dpo"``) and reward (``"grpo"``) runs record what a fine-tuning run does, the adapter
file merged into the start (``adapter``) and their objective's settings (``objective``).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from .checkpoint import (
    CHECKPOINT_NAME,
    build_model,
    check_recorded,
    checkpoint_file,
    config_dict,
    own_folder,
    prepare_folder,
    read_checkpoint,
    save_checkpoint,
)
from .data import load_tokenizer, save_tokenizer, tokenizer_checksum
from .lora import ADAPTER_FORMAT, add_lora, load_adapter, lora_weights, save_adapter
from .token_rows import add_token_rows

__all__ = [
    "ADAPTER_NAME",
    "KINDS",
    "PROCESS_SETTINGS",
    "TOKENIZER_NAME",
    "RunFolder",
    "RunKind",
    "RunRecord",
    "load_checkpoint",
    "load_run",
    "read_record",
    "start_model",
]

LOCK_NAME = CHECKPOINT_NAME + ".lock"  # held while a run writes in its folder (RunFolder.own)
TOKENIZER_NAME = "tokenizer.json"  # a BPE run's tokenizer, beside its checkpoint (chapter "Tokens")
ADAPTER_NAME = "adapter.pt"  # a LoRA run's adapters, beside its checkpoint and rewritten with it (chapter
# "Fine-tuning")
DEFAULTS = {"seed": 1337, "val_fraction": 0.1, "tokenizer": "char"}  # of a new run, where no flag is given
#: TrainConfig fields that describe this process rather than the run: free to differ on resume (chapter "A GPT from
# scratch").
PROCESS_SETTINGS = frozenset({"device", "dtype", "compile", "out_dir", "progress", "verbose", "peak_tflops"})


@dataclass(frozen=True)
class RunKind:
    """How one kind of run is recorded (chapter "A GPT from scratch"): ``fields`` names the :class:`RunRecord` fields
    it writes to the checkpoint's meta (under the same key, or under ``renamed[field]``),
    ``fixed`` those that ``--resume`` may not change, and ``unset`` is how a fixed field recorded
    as None is said (None: an older checkpoint that did not record it, which a flag may then set)."""

    fields: tuple[str, ...]
    fixed: tuple[str, ...]
    unset: str | None = None
    renamed: dict[str, str] = field(default_factory=dict)

    def keys(self) -> dict[str, str]:
        """Each recorded field's key in the meta."""
        return {name: self.renamed.get(name, name) for name in self.fields}


_SHARED = ("data", "corpus", "data_sha256", "seed", "val_fraction", "tokenizer_sha256")
KINDS: dict[str, RunKind] = {
    "pretrain": RunKind(
        (*_SHARED, "data_from", "preset", "tokenizer", "vocab_size"),
        fixed=("preset", "seed", "val_fraction", "tokenizer", "vocab_size"),
        renamed={"data_sha256": "text_sha256"},
    ),
    "finetune": RunKind(
        (*_SHARED, "base", "base_sha256", "n_train", "n_val", "lora_rank", "lora_alpha", "token_rows"),
        fixed=("lora_rank", "lora_alpha", "seed", "val_fraction", "token_rows"),
        unset="none (full fine-tuning)",
    ),
}
_TUNING = (*_SHARED, "base", "base_sha256", "adapter", "adapter_sha256", "n_train", "n_val", "lora_rank", "lora_alpha")
for _kind in ("dpo", "grpo"):  # chapter "Preferences and rewards": their objective's settings are checked by their
    # commands
    KINDS[_kind] = RunKind(
        (*_TUNING, "objective"), fixed=("lora_rank", "lora_alpha", "seed", "val_fraction"), unset="none (full tuning)"
    )


@dataclass(frozen=True)
class RunRecord:
    """What a run is (chapter "A GPT from scratch"; chapter "Fine-tuning"'s fine-tuning runs): read from and written to
    its checkpoint's ``meta`` (:meth:`from_checkpoint`, :meth:`to_meta`); None where the run has no
    such thing or an older checkpoint did not record it.

    ``kind`` is a key of :data:`KINDS` (``"pretrain"``, ``"finetune"``, ``"dpo"``, ``"grpo"``); ``tokenizer`` is
    ``"char"`` or ``"bpe"`` and ``vocab_size`` the BPE's size asked for; ``data`` is the file
    trained on (``data_from`` a pipe it came from instead), ``data_sha256`` its checksum;
    ``base`` and ``base_sha256`` are a fine-tuning run's base checkpoint; ``lora_rank`` and
    ``lora_alpha`` its adapters (None: every weight is trained), ``token_rows`` the embedding rows
    trained beside them (:mod:`~transformer_lib.token_rows`); ``adapter`` and ``adapter_sha256``
    the adapter file merged into a chapter "Preferences and rewards" run's start, ``objective`` its DPO or GRPO
    settings; ``model_config`` is the checkpoint's, the block's recipe included, as it stores it.
    """

    kind: str = "pretrain"
    tokenizer: str | None = None
    vocab_size: int | None = None
    tokenizer_sha256: str | None = None
    base: str | None = None
    base_sha256: str | None = None
    data: str | None = None
    data_from: str | None = None
    corpus: str | None = None
    data_sha256: str | None = None
    lora_rank: int | None = None
    lora_alpha: float | None = None
    seed: int | None = None
    val_fraction: float | None = None
    preset: str | None = None
    n_train: int | None = None
    n_val: int | None = None
    token_rows: tuple[int, ...] | None = None
    adapter: str | None = None
    adapter_sha256: str | None = None
    objective: dict | None = None
    model_config: dict | None = field(default=None, compare=False)

    @property
    def method(self) -> str | None:
        """A run on a base's method, ``"lora"`` or ``"full"`` (None for pretraining)."""
        return None if self.kind == "pretrain" else "full" if self.lora_rank is None else "lora"

    @classmethod
    def from_meta(cls, meta: dict | None, model_config: dict | None = None) -> RunRecord:
        """The record a checkpoint's ``meta`` holds (an older checkpoint's too: what it lacks is None)."""
        meta = meta or {}
        kind = meta.get("kind") or ("finetune" if meta.get("finetune") else "pretrain")
        if kind not in KINDS:
            raise ValueError(f"a run of the kind {kind!r}, which this version does not know (it knows {sorted(KINDS)})")
        keys = KINDS[kind].keys()
        return cls(kind=kind, model_config=model_config, **{name: meta.get(key) for name, key in keys.items()})

    @classmethod
    def from_checkpoint(cls, ckpt: dict) -> RunRecord:
        """The record of the checkpoint dict ``ckpt`` (:func:`~transformer_lib.checkpoint.read_checkpoint`)."""
        return cls.from_meta(ckpt.get("meta"), ckpt.get("model_config"))

    def to_meta(self) -> dict:
        """The checkpoint's ``meta``, with the keys earlier versions wrote and read."""
        meta = {key: getattr(self, name) for name, key in KINDS[self.kind].keys().items()}
        if self.kind == "finetune":  # the method, as earlier versions wrote it (twice)
            meta |= {"finetune": self.method, "method": self.method}
        elif self.kind != "pretrain":
            meta["kind"] = self.kind
        return meta

    def adapter_meta(self) -> dict:
        """What a LoRA run's adapter file records of its run: the base, the data, rank and alpha."""
        keys = ("base", "base_sha256", "data", "data_sha256", "lora_rank", "lora_alpha", "token_rows")
        return {k: getattr(self, k) for k in keys}


@dataclass(frozen=True)
class RunFolder:
    """The folder of one run (chapter "A GPT from scratch"): its files' paths and their checks."""

    path: Path

    def __init__(self, path: str | os.PathLike):
        object.__setattr__(self, "path", Path(path))

    checkpoint = property(lambda self: self.path / CHECKPOINT_NAME)
    lock = property(lambda self: self.path / LOCK_NAME)
    tokenizer = property(lambda self: self.path / TOKENIZER_NAME)
    adapter = property(lambda self: self.path / ADAPTER_NAME)

    def own(self):
        """``with folder.own():`` this process alone writes here, holding the lock :data:`LOCK_NAME`
        (``checkpoint.own_folder``); a second run is refused, told which run holds the folder."""
        return own_folder(self.path, LOCK_NAME)

    def check_fresh(self, force: bool) -> None:
        """Refuse to start a run where another run's checkpoint is, unless ``force`` (it is replaced)."""
        if self.checkpoint.exists() and not force:
            raise ValueError(
                f"{self.checkpoint} holds another run's checkpoint: continue it with --resume, replace it with "
                f"--force, or choose another --out-dir"
            )

    def checked_tokenizer(self, tokenizer):
        """``tokenizer``, the one a checkpoint holds; if the folder also holds ``tokenizer.json``,
        that file must hold the same tokenizer (chapter "Tokens"), else a ``ValueError`` naming the file."""
        path = self.tokenizer
        if path.is_file():
            try:
                saved = load_tokenizer(path)
            except ValueError as e:
                raise ValueError(f"{e}; the checkpoint beside it holds its own copy of the tokenizer") from None
            if tokenizer_checksum(saved) != tokenizer_checksum(tokenizer):
                raise ValueError(
                    f"{path} holds a different tokenizer from the one the checkpoint was trained with (checksum "
                    f"{tokenizer_checksum(saved)[:12]}, not {tokenizer_checksum(tokenizer)[:12]}): restore that "
                    f"file, or remove it to use the checkpoint's own copy"
                )
        return tokenizer

    def write_tokenizer(self, tokenizer, force: bool) -> None:
        """A fresh run's ``tokenizer.json`` (None: no file). Another run's file there is refused,
        or with ``force`` replaced or removed (its run is replaced)."""
        saved = self.tokenizer
        if tokenizer is not None:
            save_tokenizer(tokenizer, saved, force=force)
        elif saved.exists() and not force:
            raise ValueError(f"{saved} holds another run's tokenizer: replace that run with --force")
        elif saved.exists():
            saved.unlink()

    def clear_adapter(self, force: bool) -> None:
        """Before a fresh fine-tuning run: another run's ``adapter.pt`` is refused, or with ``force`` removed."""
        if self.adapter.exists() and not force:
            raise ValueError(f"{self.adapter} holds another run's adapter: replace that run with --force")
        self.adapter.unlink(missing_ok=True)

    def adapter_writer(self, model: nn.Module, record: RunRecord):
        """What :func:`~transformer_lib.train.train` calls after each checkpoint (its ``on_save``):
        a LoRA run writes its adapters to ``adapter.pt``; another run, nothing."""
        if record.lora_rank is None:
            return None
        return lambda: save_adapter(model, self.adapter, meta=record.adapter_meta(), force=True)

    def resumed(self, kind: str, resume: bool, force: bool, start=None) -> tuple[dict | None, RunRecord | None]:
        """The one resume rule of the commands that start from a checkpoint ``start`` (chapters "Fine-tuning"
        and "Preferences and rewards"): with ``resume``, the run's checkpoint (read once) and its record, refused unless
        the run is of ``kind``; else ``(None, None)``, another run's checkpoint refused unless
        ``force``, and a ``start`` that is this folder's own checkpoint refused by name."""
        if not resume:
            if start is not None and checkpoint_file(start).resolve() == self.checkpoint.resolve():
                read_base(start, None, self.checkpoint)  # refuses an --out-dir that holds the start, by name
            self.check_fresh(force)
            return None, None
        ckpt = read_checkpoint(self.checkpoint)
        record = RunRecord.from_checkpoint(ckpt)
        if record.kind != kind:
            said, command = {"pretrain": "training", "finetune": "fine-tuning"}, {"pretrain": "train"}
            raise ValueError(
                f"{self.checkpoint} holds a {said.get(record.kind, record.kind)} run, not a {said.get(kind, kind)} "
                f"run: continue it with python -m transformer_lib {command.get(record.kind, record.kind)} --resume "
                f"--out-dir {self.path}"
            )
        return ckpt, record


class TrainingFile:
    """Where :func:`~transformer_lib.train.train` keeps its checkpoint (chapter "A GPT from scratch"):
    ``out_dir/ckpt.pt`` (``out_dir`` None: nowhere), written by one process (``writer``, rank 0), what it holds
    (:meth:`state`, :data:`PARTS`), the state it last wrote, and where the last good state is, in words."""

    #: The training objects whose ``state_dict`` a checkpoint holds under their names.
    PARTS = ("model", "optimizer", "scheduler", "scaler")
    #: What resuming reads: those, the step, whether it was evaluated, the history, every random state.
    RESUMED = (*PARTS, "step", "eval_pending", "history", "rng")

    def __init__(self, out_dir: str | os.PathLike | None, writer: bool = True):
        self.path = Path(out_dir) / CHECKPOINT_NAME if out_dir else None
        self.writer = writer and self.path is not None
        self.saved = None  # (step, eval_pending) of the last checkpoint written or resumed from

    @contextlib.contextmanager
    def own(self):
        """``with file.own():`` this process alone writes in the folder (:func:`own_folder`), whose
        temporary files left by a killed writer are removed first (:func:`prepare_folder`)."""
        if not self.writer:
            yield
            return
        with own_folder(self.path.parent, LOCK_NAME):
            prepare_folder(self.path, self.path.parent / ADAPTER_NAME)  # the adapter file is rewritten with it
            yield

    def read(self) -> dict:
        """The checkpoint to resume from."""
        if self.path is None or not self.path.is_file():
            raise FileNotFoundError(f"resume=True but there is no checkpoint at {self.path} (config.out_dir)")
        return read_checkpoint(self.path)

    def check(self, ckpt: dict) -> None:
        """Refuse, naming the file and the part, a checkpoint that lacks a part resuming reads (:data:`RESUMED`)."""
        check_recorded(ckpt, self.path or "the checkpoint", self.RESUMED)

    @staticmethod
    def state(parts: dict, model: nn.Module, step: int, eval_pending: bool, **rest) -> dict:
        """The checkpoint of a training run: each of :data:`PARTS` (``parts``, by name) as its
        ``state_dict``, the model's class, the step and whether it was evaluated, the model's
        config, and ``rest`` (train_config, rng, tokenizer, history, meta, changes) as given (chapter "A GPT from
        scratch")."""
        state = {key: parts[key].state_dict() for key in TrainingFile.PARTS}
        state |= {"model_class": type(model).__name__, "step": step, "eval_pending": eval_pending}
        return state | {"model_config": config_dict(model), **rest}

    def resumed(self, mark) -> None:
        """The run resumed the state ``mark`` (step, eval_pending): the one on disk, if there is one."""
        if self.path is not None and self.path.is_file():
            self.saved = mark

    def write(self, state: dict, mark) -> bool:
        """Write ``state``, whose mark (step, eval_pending) is ``mark``; False when there is nothing to write."""
        if not self.writer or self.saved == mark:
            return False
        save_checkpoint(state, self.path)
        self.saved = mark
        return True

    def last_good(self) -> str:
        """Where the last good state is, in words."""
        if not self.writer:
            return "no checkpoint is written (no out_dir)"
        if self.saved is not None:
            return f"the checkpoint in {self.path} holds step {self.saved[0]}, the last good state"
        if self.path.is_file():
            return f"the checkpoint in {self.path} is left as it was"
        return "no checkpoint was written"


def read_record(folder: str | os.PathLike) -> RunRecord:
    """The :class:`RunRecord` of the run in ``folder`` (or of the checkpoint file ``folder``) (chapter "A GPT from
    scratch")."""
    return RunRecord.from_checkpoint(read_checkpoint(folder))


def load_checkpoint(
    path: str | os.PathLike | dict, device: torch.device | str = "cpu"
) -> tuple[nn.Module, object, dict]:
    """Rebuild the model saved by :func:`~transformer_lib.train.train` (chapter "A GPT from scratch").

    ``path`` is a ``ckpt.pt``, its folder, or a checkpoint dict already read. Returns ``(model,
    tokenizer or None, checkpoint dict)``, the model on ``device`` in eval mode. A LoRA adapter file,
    and a LoRA run's checkpoint, are refused with what loads them (:func:`load_run`, ``--adapter``).
    """
    ckpt = path if isinstance(path, dict) else read_checkpoint(path)
    named = "the checkpoint" if isinstance(path, dict) else None
    model, tokenizer = _model(ckpt, named or path, named or checkpoint_file(path), device)
    return model, tokenizer, ckpt


def _model(ckpt: dict, given, where, device) -> tuple[nn.Module, object]:
    """:func:`load_checkpoint`'s model and tokenizer of ``ckpt``, given as ``given`` (its file ``where``)."""
    if str(ckpt.get("format", "")).startswith("transformer_lib.lora"):  # chapter "Fine-tuning": an adapter, not a model
        base = (ckpt.get("meta") or {}).get("base") or "its base"
        raise ValueError(
            f"{given} is a LoRA adapter file (adapters only, no model): load {base} and add the adapter with "
            f"load_adapter"
        )
    check_recorded(ckpt, where)
    if any(".parametrizations." in k for k in ckpt["model"]):  # chapter "Fine-tuning": a model with LoRA adapters
        base = (ckpt.get("meta") or {}).get("base") or "BASE"
        raise ValueError(
            f"{where} holds a model with LoRA adapters (a fine-tuning run's): load its base checkpoint and the "
            f"adapter file beside it (load_adapter), or on the command line: python -m transformer_lib sample "
            f"--ckpt {base} --adapter {Path(str(where)).parent / ADAPTER_NAME}"
        )
    return build_model(ckpt, where, device)


def start_model(ckpt: dict, file: Path, adapter=None, device="cpu", *, needs_end: bool = False):
    """The model every command starts from (chapters "A GPT from scratch", "Fine-tuning" and "Preferences and rewards"),
    and its tokenizer: the checkpoint ``ckpt`` read from ``file``, on ``device`` in eval mode; a LoRA run's comes back
    as its base model with its adapters and token rows loaded from its own checkpoint. A ``tokenizer.json``
    beside ``file`` must hold the checkpoint's tokenizer, which with ``needs_end`` must have the end
    token a tuning run ends every response with. The adapters (and token rows) of the adapter file
    ``adapter`` are added, refused on a LoRA run or when trained on another base (:func:`add_adapter`).
    """
    record = RunRecord.from_checkpoint(ckpt)
    state = ckpt.get("model") or {}
    names = [k.removesuffix(".0.A").replace(".parametrizations.", ".") for k in state if k.endswith(".0.A")]
    if names and record.lora_rank is not None:
        if adapter is not None:
            raise ValueError(f"{file} is a LoRA run, its adapters already in it: leave out --adapter, or give its base")
        base = {
            k.replace(".parametrizations.", ".").removesuffix(".original"): t
            for k, t in state.items()
            if not k.endswith((".0.A", ".0.B", ".0.delta", ".0.rows"))
        }
        model, tokenizer = _model({**ckpt, "model": base}, file, file, "cpu")
        add_lora(model, names, rank=record.lora_rank, alpha=record.lora_alpha)
        if record.token_rows:  # the embedding rows trained beside the adapters
            add_token_rows(model, record.token_rows)
        model.load_state_dict(state)
        model = model.to(device).eval()
    else:
        model, tokenizer = _model(ckpt, file, file, device)
    if tokenizer is not None:
        tokenizer = RunFolder(Path(file).parent).checked_tokenizer(tokenizer)
    if needs_end and getattr(tokenizer, "eos_id", None) is None:
        raise ValueError(
            f"{file}'s tokenizer has no end token (<|endoftext|>): fine-tuning ends every response "
            f"with it; fine-tune a base trained with --tokenizer bpe"
        )
    if adapter is not None:
        add_adapter(model, ckpt, Path(file), adapter)
    return model, tokenizer


def load_run(folder: str | os.PathLike, device: torch.device | str = "cpu") -> tuple[nn.Module, object, dict]:
    """The run in ``folder`` as ``(model, tokenizer, adapters)``, the model on ``device`` in eval mode (chapter "A GPT
    from scratch").

    A LoRA run (chapter "Fine-tuning") comes back as its base model with its adapters added and loaded
    from the run's own checkpoint; ``adapters`` maps each adapted weight's name to its
    :class:`~transformer_lib.lora.LoRA` (``{}`` for any other run), with the token rows trained
    beside them, if any. A ``tokenizer.json`` beside the checkpoint must hold the checkpoint's
    tokenizer. ``model(torch.tensor([tokenizer.encode("ROMEO:")]))`` then gives its logits.
    This is :func:`start_model` of the run's checkpoint.
    """
    model, tokenizer = start_model(read_checkpoint(folder), checkpoint_file(folder), device=device)
    return model, tokenizer, lora_weights(model)


def add_adapter(model: nn.Module, base: dict, base_file: Path, adapter: str | os.PathLike) -> list[str]:
    """Add the adapters in the file ``adapter`` to ``model``, loaded from the checkpoint ``base``
    (read from ``base_file``); refused when they were trained on another base (chapter "Fine-tuning")."""
    if not Path(adapter).is_file():
        raise FileNotFoundError(f"--adapter: no adapter file at {adapter}")
    meta = read_checkpoint(adapter).get("meta") or {}
    if meta.get("base_sha256") not in (None, base["checksum"]):
        raise ValueError(
            f"{adapter} was trained on the base {meta.get('base')} (checksum {meta['base_sha256'][:12]}), not "
            f"{base_file} (checksum {base['checksum'][:12]}): give that base with --ckpt"
        )
    return load_adapter(model, adapter)


def read_base(path: str | os.PathLike | None, record: RunRecord | None, file) -> tuple[dict, Path]:
    """A fine-tuning run's base checkpoint (read once) and its file: ``path``, or on resume the one the run
    records, which a different ``path`` may not replace; never the run's own ``file`` (chapter "Fine-tuning")."""
    if record is not None and path is None:
        path = record.base
        if not checkpoint_file(path).is_file():
            raise ValueError(f"the run in {file} fine-tunes {path}, which is no longer there: give it with --ckpt")
    base_file = checkpoint_file(path)
    if base_file.resolve() == Path(file).resolve():  # the run would write its checkpoint over its base
        raise ValueError(
            f"--out-dir {Path(file).parent} holds the base checkpoint {base_file}, which the run would "
            f"replace (even with --force): choose another --out-dir"
        )
    base = read_checkpoint(path)
    if record is not None and base["checksum"] != record.base_sha256:
        raise ValueError(
            f"--resume cannot change --ckpt: the run in {file} fine-tunes {record.base} (checksum "
            f"{record.base_sha256[:12]}), not {base_file} (checksum {base['checksum'][:12]})"
        )
    if base.get("format") == ADAPTER_FORMAT or RunRecord.from_checkpoint(base).method == "lora":
        what = "adapter file (adapters only)" if "format" in base else "run's checkpoint (base weights and adapters)"
        raise ValueError(
            f"{base_file} is a LoRA {what}: fine-tune its base, {(base.get('meta') or {}).get('base')}, "
            f"or a full fine-tuning run's checkpoint"
        )
    if base.get("model_class") != "GPT" or not base.get("tokenizer"):
        raise ValueError(
            f"{base_file} holds a {base.get('model_class')} without a tokenizer: fine-tune a GPT "
            f"checkpoint of python -m transformer_lib train --tokenizer bpe"
        )
    return base, base_file

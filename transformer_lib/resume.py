"""What ``--resume`` may change (chapters "A GPT from scratch", "Fine-tuning" and "Preferences and
rewards"): the one rule every command that continues a run follows. A flag given on resume either
equals what the run records or is refused by name (:func:`changed`); a training setting may change
and takes effect from the next step (:func:`resume_config`); the data and the start of a tuning run
are the ones it recorded (:func:`resumed_file`, :func:`resumed_data`). The run's folder, record and
start model are :mod:`transformer_lib.run`'s.
"""

from __future__ import annotations

from dataclasses import fields, replace
from pathlib import Path

from .checkpoint import check_recorded
from .data import sha256_of
from .run import DEFAULTS, KINDS, PROCESS_SETTINGS, RunRecord
from .train_config import TrainConfig
from .utils import pick_device

__all__ = [
    "changed",
    "flag",
    "recorded_process",
    "resumable_pretraining",
    "resume_config",
    "resume_record",
    "resumed_data",
    "resumed_file",
]


def flag(name: str) -> str:
    """The command-line flag of the setting ``name`` (chapter "A GPT from scratch"): ``lora_rank`` ->
    ``--lora-rank``."""
    return "--" + name.replace("_", "-")


def changed(name: str, recorded, value, file) -> ValueError:
    """The refusal of a flag that ``--resume`` was given with another value than the run in ``file``
    records (chapter "A GPT from scratch")."""
    return ValueError(f"--resume cannot change {flag(name)}: the run in {file} uses {recorded}, not {value}")


def resume_record(record: RunRecord, given: dict, file) -> RunRecord:
    """``record`` with the flags ``given`` (None: not given) checked against it: a different
    value of a field of its kind's ``fixed`` is refused by name; a field an older checkpoint
    does not record takes the flag's value, or the default (the split must then be given).
    Chapter "Fine-tuning"."""
    kind, out = KINDS[record.kind], {}
    for name in kind.fixed:
        recorded, value = getattr(record, name), given.get(name)
        if recorded is None and kind.unset is None:
            if value is None and name == "val_fraction":
                raise ValueError(
                    f"{file} does not record which fraction of the text was kept for validation: "
                    f"give the run's --val-fraction"
                )
            out[name] = DEFAULTS.get(name) if value is None else value
        elif value is not None and value != recorded:
            raise changed(name, kind.unset if recorded is None else recorded, value, file)
    return replace(record, **out)


def resume_config(config: TrainConfig, ckpt: dict | None, given: dict, file) -> TrainConfig:
    """The training settings: ``config`` (the defaults), then on resume the checkpoint's, then the
    flags ``given``. A setting that describes the process (:data:`PROCESS_SETTINGS`)
    is not taken from the checkpoint, except the device, dtype and compilation (see
    :func:`recorded_process`); another changed setting takes effect from the next step.
    Chapter "A GPT from scratch"."""
    if ckpt is not None:
        saved = {k: v for k, v in (ckpt.get("train_config") or {}).items() if k not in PROCESS_SETTINGS}
        names = {f.name for f in fields(TrainConfig)} - PROCESS_SETTINGS
        missing, unknown = sorted(names - set(saved)), sorted(set(saved) - names)
        if missing or unknown:
            what = (
                f"does not record the training setting {flag(missing[0])}"
                if missing
                else (f"records the training setting {unknown[0]!r}, which this version does not know")
            )
            raise ValueError(f"{file} {what} (a checkpoint from another version?)")
        config = replace(config, **saved, **recorded_process(ckpt, given, file))
    return replace(config, **{k: v for k, v in given.items() if v is not None})


def recorded_process(ckpt: dict, given: dict, file) -> dict:
    """On resume, the device, autocast dtype and compilation the run was started with, unless a
    flag gives another (a run can move to another machine that way): ``auto`` would otherwise
    pick a GPU for a run that trained on the CPU. A device this machine lacks is refused.
    Chapter "A GPT from scratch"."""
    saved = ckpt.get("train_config") or {}
    kept = {k: saved[k] for k in ("device", "dtype", "compile") if k in saved and given.get(k) is None}
    if "device" in kept:
        try:
            pick_device(str(kept["device"]))
        except (ValueError, RuntimeError):
            raise ValueError(
                f"the run in {file} trained on device {kept['device']!r}, which this machine does not have: "
                f"continue it here with --device cpu (or another device)"
            ) from None
    return kept


def resumed_data(given: str | None, record: RunRecord | None, file) -> str | None:
    """The data to train on: the flag's, or on resume the file the run records, refused when
    it came from a pipe or is no longer there.
    Chapter "A GPT from scratch"."""
    if given is not None or record is None:
        return given
    if record.data_from:
        raise ValueError(
            f"the run in {file} read its training text from {record.data_from}, which cannot be read "
            f"again: give the same text with --data FILE"
        )
    if record.data and not Path(record.data).is_file():
        raise ValueError(
            f"the run in {file} was trained on {record.data}, which is no longer there: give the same "
            f"text with --data FILE"
        )
    return record.data


def resumed_file(given: str | None, record: RunRecord | None, file) -> tuple[str, str]:
    """A tuning run's data file and its checksum: ``given``, or on resume the file the run records
    (:func:`resumed_data`), refused when it is not the data the run was tuned on.
    Chapter "Fine-tuning"."""
    data = resumed_data(given, record, file)
    digest = sha256_of(data)
    if record is not None and digest != record.data_sha256:
        tuned = "fine-tuned" if record.kind == "finetune" else "tuned"
        raise ValueError(
            f"{data} is not the data the run in {file} was {tuned} on ({record.data}): give it with --data"
        )
    return data, digest


def resumable_pretraining(ckpt: dict, file, data: str | None) -> dict:
    """``ckpt`` if the ``train`` command can continue it, else a ``ValueError`` that says why (chapter
    "A GPT from scratch")."""
    check_recorded(ckpt, file, ("model_class",))
    if ckpt.get("model_class") != "GPT" or not ckpt.get("model_config") or not ckpt.get("tokenizer"):
        raise ValueError(
            f"{file} holds a {ckpt.get('model_class')} "
            f"{'with' if ckpt.get('tokenizer') else 'without'} its tokenizer: --resume continues only a GPT saved "
            f"with its tokenizer (train(..., tokenizer=...) or this command)"
        )
    check_recorded(ckpt, file)
    if data is None and not (ckpt.get("meta") or {}).get("corpus"):
        raise ValueError(f"{file} does not say which text it was trained on: give it with --data")
    return ckpt

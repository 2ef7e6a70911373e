"""Training (chapter "A GPT from scratch"; used for the encoder-decoder of chapter "Encoder-decoder and cross-attention"
too).

:func:`train` runs AdamW (weight decay on matrices only) with a linear warm-up and a cosine
learning-rate decay, gradient clipping, periodic evaluation, a progress bar, mixed precision and
TF32 on GPUs, optional ``torch.compile``, and checkpoints that resume exactly. It trains any
model whose ``forward(*batch)`` returns ``(logits, loss)``: a :class:`~transformer_lib.models.GPT`
with ``(x, y)`` batches, a :class:`~transformer_lib.encoder_decoder.Transformer` with
``(src, tgt_in, tgt_out)`` batches. Inside a step nothing waits for the GPU: the loss stays a
tensor and is read (``.item()``) only every ``log_interval`` steps.

Data-parallel training: when ``torch.distributed`` is initialised (for example under
``torchrun``), :func:`train` wraps the model in ``DistributedDataParallel``, averages evaluation
losses over the ranks, and only rank 0 shows progress and writes checkpoints. What a run is and
its folder (the checkpoint's file and what it holds, tokenizer, adapters, what a resumed run may
change) are :mod:`transformer_lib.run`'s; the command line is in :mod:`transformer_lib.cli`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from .checkpoint import capture_rng, restore_rng
from .cost import estimate_mfu, gpu_peak_flops
from .data import tokenizer_from_dict
from .experts import after_step as experts_after_step
from .run import PROCESS_SETTINGS, TrainingFile
from .train_config import TrainConfig, configure_optimizer, lr_at, make_scheduler
from .utils import InterruptFlag, autocast, batch_on, pick_device, resolve_dtype, run_batch, world

__all__ = [
    "History",
    "batch_loss",
    "estimate_loss",
    "exact_match",
    "train",
]


@dataclass
class History:
    """What :func:`train` returns (chapter "A GPT from scratch"): the loss of every step and the evaluations.

    ``step_loss[i]`` and ``lr[i]`` belong to step ``i + 1``; ``train_loss[j]`` and ``val_loss[j]``
    are the mean losses on ``eval_iters`` batches after ``eval_step[j]`` steps. ``mfu`` is the last
    model-FLOPs-utilisation estimate (CUDA only).
    """

    step_loss: list[float] = field(default_factory=list)
    lr: list[float] = field(default_factory=list)
    eval_step: list[int] = field(default_factory=list)
    train_loss: list[float] = field(default_factory=list)
    val_loss: list[float] = field(default_factory=list)
    mfu: float | None = None


def batch_loss(model: nn.Module, get_batch, batch) -> Tensor:
    """One batch's loss: the model's own (``model(*batch)`` returns ``(logits, loss)``), or, from
    batches that score the model themselves (chapter "Preferences and rewards"'s preference and reward batches, whose
    loss is not the model's), ``get_batch.loss(model, batch)``."""
    scorer = getattr(get_batch, "loss", None)
    return scorer(model, batch) if callable(scorer) else run_batch(model, batch)[1]


@torch.no_grad()
def estimate_loss(
    model: nn.Module, get_batch: Callable[[str], Sequence[Tensor]], eval_iters: int = 20, dtype: str = "auto"
) -> dict[str, float]:
    """Mean loss over ``eval_iters`` batches of each split, ``{"train": ..., "val": ...}`` (chapter "A GPT from
    scratch").

    The model is put in eval mode (no dropout) and back in its previous mode afterwards. Under
    ``torch.distributed`` the means are averaged over the ranks.
    """
    device = next(model.parameters()).device
    autocast_dtype = resolve_dtype(dtype, device)
    world_size = world()[1]
    was_training = model.training
    model.eval()
    out = {}
    for split in ("train", "val"):
        losses = torch.zeros(eval_iters, device=device)
        for k in range(eval_iters):
            with autocast(device, autocast_dtype):
                loss = batch_loss(model, get_batch, batch_on(get_batch(split), device))
            losses[k] = loss.float()
        mean = losses.mean()
        if world_size > 1:
            dist.all_reduce(mean)
            mean /= world_size
        out[split] = mean.item()
    model.train(was_training)
    return out


@torch.no_grad()
def exact_match(model: nn.Module, src: Tensor, tgt: Tensor, batch_size: int = 500) -> float:
    """Fraction of rows that greedy decoding gets exactly right (chapter "Encoder-decoder and cross-attention").

    ``model`` is a :class:`~transformer_lib.encoder_decoder.Transformer`; ``src (N, T_src)`` and
    ``tgt (N, T_tgt)`` laid out as in :mod:`transformer_lib.data`: a row is right when the decoded
    tokens equal ``tgt[:, 1:]`` (the answer, ``eos``, then padding).
    """
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    correct = 0
    for i in range(0, len(src), batch_size):
        s, t = src[i : i + batch_size].to(device), tgt[i : i + batch_size, 1:].to(device)  # (b, T_src), (b, T)
        pred = model.greedy_decode(s, max_new_tokens=t.shape[1])  # (b, <= T)
        pred = F.pad(pred, (0, t.shape[1] - pred.shape[1]), value=model.config.pad_id)  # (b, T)
        correct += int((pred == t).all(dim=1).sum())
    model.train(was_training)
    return correct / max(1, len(src))


class _Run:
    """The state of one training run: what the loop reads and changes, and what a checkpoint holds."""

    def __init__(self, model, get_batch, config: TrainConfig, tokenizer, meta: dict | None, on_save=None):
        sampled = getattr(get_batch, "batch_size", None)  # the truth, whatever config.batch_size says
        if isinstance(sampled, int) and not isinstance(sampled, bool) and sampled > 0 and sampled != config.batch_size:
            config = replace(config, batch_size=sampled)
        self.model, self.get_batch, self.config, self.tokenizer, self.meta = model, get_batch, config, tokenizer, meta
        self.on_save = on_save or (lambda: None)  # after each checkpoint (the finetune command's adapter file)
        self.changes: list[dict] = []  # settings changed on resume: (step, setting, from, to)
        self.rank, self.world_size = world()
        self.device = pick_device(config.device)
        self.dtype = resolve_dtype(config.dtype, self.device)
        if self.device.type == "cuda":
            torch.set_float32_matmul_precision("high")  # TF32 matmuls for what autocast leaves in float32
        model.to(self.device)
        self.optimizer = configure_optimizer(model, config, self.device)
        self.scheduler = make_scheduler(self.optimizer, config)
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=self.dtype == torch.float16)
        self.file = TrainingFile(config.out_dir, writer=self.rank == 0)  # out_dir/ckpt.pt, or nowhere
        self.history, self.step, self.eval_pending = History(), 0, True  # eval_pending: `step` not evaluated yet
        self.pending: list[Tensor] = []  # losses still on the device
        self.busy = False  # inside a step or an evaluation: the state is not one a checkpoint may hold

    def point(self, name: str) -> None:
        """A named point of a step, where the tests interrupt a run: nothing happens here."""

    def resume(self, ckpt: dict | None) -> None:
        """Continue from ``ckpt`` (read from ``out_dir`` when None)."""
        ckpt = self.file.read() if ckpt is None else ckpt
        self.file.check(ckpt)
        for part in self.file.PARTS:
            getattr(self, part).load_state_dict(ckpt[part])
        self.step, self.eval_pending, self.history = ckpt["step"], ckpt["eval_pending"], History(**ckpt["history"])
        restore_rng(ckpt["rng"], self.get_batch)
        self.file.resumed((self.step, self.eval_pending))  # this state is the one on disk
        self.changes = list(ckpt.get("changes") or [])
        self.apply_changes(ckpt.get("train_config") or {})
        if self.tokenizer is None and ckpt.get("tokenizer"):  # a resume that names none keeps the run's
            self.tokenizer = tokenizer_from_dict(ckpt["tokenizer"])
        self.meta = ckpt.get("meta") if self.meta is None else self.meta

    def apply_changes(self, saved: dict) -> None:
        """Settings that differ from the checkpoint's take effect from the next step: the
        learning-rate schedule is recomputed from them and AdamW's hyperparameters set; every
        change is recorded (step, setting, from, to) in the checkpoints that follow."""
        now = asdict(self.config)
        kept = [k for k in now if k not in PROCESS_SETTINGS and k in saved]
        changed = {k: (saved[k], now[k]) for k in kept if saved[k] != now[k]}
        if not changed:
            return
        config, groups = self.config, self.optimizer.param_groups
        next_lr = config.lr * (lr_at(self.step, config) / config.lr)  # as the scheduler computes it
        for group in groups:
            group.update(betas=(config.beta1, config.beta2), initial_lr=config.lr, lr=next_lr)
        groups[0]["weight_decay"] = config.weight_decay  # the matrices' group (configure_optimizer)
        self.scheduler.base_lrs = [config.lr] * len(groups)
        self.scheduler._last_lr = [next_lr] * len(groups)
        for name, (old, new) in changed.items():
            self.changes.append({"step": self.step, "setting": name, "from": old, "to": new})
        if self.config.verbose and self.rank == 0:
            said = ", ".join(f"{name} {old} -> {new}" for name, (old, new) in changed.items())
            print(f"resuming at step {self.step} with changed settings, applied from step {self.step + 1}: {said}")

    def save(self, rng: dict) -> None:
        """Write the checkpoint (rank 0 only; nothing when this state is already saved)."""
        if not self.file.writer or self.file.saved == (self.step, self.eval_pending):
            return
        self.check_finite()
        state = self.file.state(
            {part: getattr(self, part) for part in self.file.PARTS},
            self.model,
            step=self.step,
            eval_pending=self.eval_pending,
            train_config={**asdict(self.config), "device": str(self.device)},
            rng=rng,
            tokenizer=self.tokenizer.to_dict() if self.tokenizer is not None else None,
            history=asdict(self.history),
            meta=self.meta or {},
            changes=self.changes,
        )
        self.file.write(state, (self.step, self.eval_pending))
        self.on_save()

    def check_finite(self) -> None:
        """Raise ``FloatingPointError`` when the model's weights or its last evaluation are not
        finite, so that a diverged model is never saved (read at checkpoint time only)."""
        h = self.history
        val = [x for x in (h.train_loss[-1:] + h.val_loss[-1:]) if not math.isfinite(x)] if h.eval_step else []
        weights = [name for name, p in self.model.named_parameters() if not bool(torch.isfinite(p).all())]
        if val or weights:
            what = f"the evaluation loss is {val[0]}" if val else f"the weights of {weights[0]} are not finite"
            raise FloatingPointError(
                f"the model diverged by step {self.step} ({what}); stopped without saving it: {self.file.last_good()}; "
                f"lower lr, or check the data"
            )

    def read_losses(self) -> None:
        """Move the pending losses to the history: the loop's only host-device synchronisation.

        A NaN or infinite loss stops the run (``FloatingPointError``) before anything is saved,
        so the last checkpoint written is the last good one.
        """
        if self.pending:
            losses = torch.stack(self.pending).float().tolist()
            self.pending.clear()
            bad = next((i for i, x in enumerate(losses) if not math.isfinite(x)), None)
            if bad is not None:
                step = self.step - len(losses) + bad + 1
                raise FloatingPointError(
                    f"the training loss became {losses[bad]} at step {step}; stopped: {self.file.last_good()}; "
                    f"lower lr, or check the data"
                )
            self.history.step_loss.extend(losses)

    def evaluate(self, write) -> None:
        """Score the model on both splits; ``write`` shows the line it prints (verbose runs)."""
        losses = estimate_loss(self.model, self.get_batch, self.config.eval_iters, self.dtype)
        h = self.history
        h.eval_step.append(self.step)
        h.train_loss.append(losses["train"])
        h.val_loss.append(losses["val"])
        self.eval_pending = False
        if self.config.verbose and self.rank == 0:
            line = getattr(self.get_batch, "eval_line", None)  # batches whose score is not a loss say it their way
            if callable(line):
                write(line(self.step, losses))
            else:
                write(f"step {self.step}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")

    def train_step(self, step_model: nn.Module) -> Tensor:
        """One optimizer step on one training batch; returns the batch's inputs."""
        batch = batch_on(self.get_batch("train"), self.device)
        with autocast(self.device, self.dtype):
            loss = batch_loss(step_model, self.get_batch, batch)
        self.point("forward")
        self.scaler.scale(loss).backward()
        self.point("backward")
        if self.config.grad_clip > 0:
            self.scaler.unscale_(self.optimizer)
            nn.utils.clip_grad_norm_(self.model.parameters(), self.config.grad_clip)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        experts_after_step(self.model)  # chapter "Experts": the choice biases move towards balance
        self.optimizer.zero_grad(set_to_none=True)
        self.point("optimizer")
        self.history.lr.append(self.scheduler.get_last_lr()[0])
        self.scheduler.step()
        self.pending.append(loss.detach())
        self.point("counter")
        self.step, self.eval_pending = self.step + 1, True
        return next(iter(batch.values())) if isinstance(batch, dict) else batch[0]

    def log(self, bar, inputs: Tensor, timer: tuple[float, int], peak: float | None) -> tuple[float, int]:
        """Read the losses, show them (and the MFU on a GPU); returns the new timer."""
        self.read_losses()
        now = time.perf_counter()
        h = self.history
        postfix = {"loss": f"{h.step_loss[-1]:.4f}", "lr": f"{h.lr[-1]:.2e}"}
        if peak and hasattr(self.model, "num_params") and self.step > timer[1]:
            tokens_per_second = inputs.numel() * (self.step - timer[1]) / (now - timer[0])
            h.mfu = estimate_mfu(self.model, tokens_per_second, inputs.shape[1], peak)
            postfix["mfu"] = f"{100 * h.mfu:.1f}%"
        bar.set_postfix(postfix, refresh=False)
        return now, self.step

    def step_model(self) -> nn.Module:
        """The module the steps call: compiled and wrapped for data parallelism as configured."""
        step_model = torch.compile(self.model) if self.config.compile else self.model
        if self.world_size > 1:
            device_ids = [self.device.index] if self.device.type == "cuda" else None
            step_model = nn.parallel.DistributedDataParallel(step_model, device_ids=device_ids)
        return step_model

    def peak_flops(self) -> float | None:
        if self.config.peak_tflops:
            return self.config.peak_tflops * 1e12
        return gpu_peak_flops() if self.device.type == "cuda" else None


def _loop(run: _Run, until: int, flag: InterruptFlag) -> None:
    """The steps; a Ctrl-C (``flag``) is honoured between two steps, so a checkpoint holds whole steps.

    The progress bar counts training steps only: an evaluation due before the first step (the
    starting model's, which can take as long as many steps) runs before the bar is made, under
    its own line, and the bar's clock is paused during every later evaluation, so its rate and
    time left are the steps'."""
    from tqdm import tqdm  # the progress bar, imported when a run starts, not with the package

    config, step_model, peak = run.config, run.step_model(), run.peak_flops()
    rng = capture_rng(run.get_batch)  # the random states as of the last completed step or evaluation
    shown = config.progress and run.rank == 0
    bar = None
    run.model.train()
    try:
        while not flag.requested:
            due = config.eval_interval > 0 and (run.step % config.eval_interval == 0 or run.step == config.max_iters)
            if run.eval_pending and due:
                if bar is None and shown:
                    rows = config.eval_iters * config.batch_size
                    print(f"evaluating the starting model on {rows} training and {rows} validation rows...", flush=True)
                run.busy = True
                run.evaluate(bar.write if bar is not None else print)
                rng, run.busy = capture_rng(run.get_batch), False
                if run.step > 0:
                    run.read_losses()
                    run.save(rng)
                if bar is not None:
                    bar.unpause()  # the evaluation's time counts in neither the rate nor the time left
                timer = (time.perf_counter(), run.step)
            if bar is None:
                bar = tqdm(total=config.max_iters, initial=run.step, desc="training", disable=not shown)
                timer = (time.perf_counter(), run.step)
            if run.step >= until:
                break
            if flag.requested:
                continue
            run.busy = True
            inputs = run.train_step(step_model)
            rng, run.busy = capture_rng(run.get_batch), False
            bar.update(1)
            if run.step % config.log_interval == 0 or run.step == until:
                timer = run.log(bar, inputs, timer, peak)
        else:
            raise KeyboardInterrupt
    except KeyboardInterrupt:
        if not run.busy:  # mid-step the state is torn: the last checkpoint written stays the one to resume
            run.read_losses()
            run.save(rng)
        if run.file.writer and run.file.saved is not None:
            (bar.write if bar is not None else print)(
                f"interrupted; the checkpoint in {run.file.path} holds step {run.file.saved[0]}"
            )
        raise
    finally:
        if bar is not None:
            bar.close()
    run.read_losses()
    run.save(rng)


def train(
    model: nn.Module,
    get_batch: Callable[[str], Sequence[Tensor]],
    config: TrainConfig | None = None,
    *,
    tokenizer=None,
    meta: dict | None = None,
    resume: bool | dict = False,
    until: int | None = None,
    on_save: Callable[[], None] | None = None,
) -> History:
    """Train ``model`` on batches from ``get_batch(split)`` (chapter "A GPT from scratch"); returns the
    :class:`History`.

    ``get_batch("train")`` / ``get_batch("val")`` return the arguments of ``model(*batch)``, which
    must return ``(logits, loss)``: :class:`~transformer_lib.data.LMBatches` (``x (B, T)``,
    ``y (B, T)``) for a GPT, :class:`~transformer_lib.data.Seq2SeqBatches` for a Transformer;
    batches with a ``loss(model, batch)`` method score the model themselves (:func:`batch_loss`).
    The model is moved to the chosen device. With ``config.out_dir`` a checkpoint (model,
    optimiser, scheduler, step, configs, ``tokenizer``, ``meta``, every random state and the batch
    sampler's state) is written after each evaluation, at the end, and on Ctrl-C, which lets the
    step under way finish before ``KeyboardInterrupt`` is raised. ``resume=True`` continues from
    that checkpoint exactly (the same steps, batches and random numbers as a run that never
    stopped); ``resume`` may also be the checkpoint dict itself, already read, so the file is read
    once. ``until`` stops early after that many steps (of ``config.max_iters``, whose schedule is
    kept), as if interrupted. ``on_save()`` is called after each checkpoint is written (chapter "Fine-tuning"'s
    ``finetune`` command writes its adapter file beside it then).
    """
    run = _Run(model, get_batch, config or TrainConfig(), tokenizer, meta, on_save)
    with run.file.own():  # no other run writes in out_dir while this one lives
        if resume is not False:
            run.resume(resume if isinstance(resume, dict) else None)
        with InterruptFlag() as flag:
            _loop(run, run.config.max_iters if until is None else min(until, run.config.max_iters), flag)
    return run.history


# python -m transformer_lib.train ...: the training command, as python -m transformer_lib train ...
if __name__ == "__main__":
    import runpy
    import sys

    sys.argv[1:] = sys.argv[1:] if sys.argv[1:2] == ["train"] else ["train", *sys.argv[1:]]
    runpy.run_module("transformer_lib", run_name="__main__", alter_sys=True)

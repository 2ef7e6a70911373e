"""Checks for chapter "Encoder-decoder and cross-attention": the teacher-forcing
shift and a greedy decoding loop written by the student.

Each check prints one verdict line and returns a :class:`~transformer_lib.exercises.CheckResult`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from ..encoder_decoder import Transformer, TransformerConfig, check_token_ids
from ..kv_cache import DecoderCache
from ._core import ExerciseFailure, call_student, check, fmt, require_dtype, require_pair, require_shape, require_tensor

__all__ = ["check_greedy_decode", "check_teacher_forcing_shift"]

PAD, BOS, EOS = 0, 1, 2  # the ids of transformer_lib.data and TransformerConfig's defaults


# ---------------------------------------------------------------- check_teacher_forcing_shift


def _shift_cases() -> list[tuple[str, Tensor]]:
    """(description, tgt) cases laid out as [bos] + answer + [eos] + pads."""
    g = torch.Generator().manual_seed(8)
    cases = [
        (
            "a batch of 3 targets of different lengths (the last has an empty answer)",
            torch.tensor([[BOS, 5, 6, 7, EOS], [BOS, 5, EOS, PAD, PAD], [BOS, EOS, PAD, PAD, PAD]]),
        ),
        ("one target with an empty answer, [bos, eos]", torch.tensor([[BOS, EOS]])),
    ]
    lengths = [7, 3, 5, 1]  # answer lengths
    T = max(lengths) + 2
    rows = []
    for n in lengths:
        answer = torch.randint(3, 13, (n,), generator=g).tolist()
        rows.append([BOS, *answer, EOS] + [PAD] * (T - n - 2))
    cases.append(("a batch of 4 random targets padded to T=9", torch.tensor(rows)))
    return cases


@check("check_teacher_forcing_shift")
def check_teacher_forcing_shift(fn: Callable[[Tensor], tuple[Tensor, Tensor]]) -> None:
    """Chapter "Encoder-decoder and cross-attention", exercise 1: check ``fn(tgt) -> (decoder_input, targets)``:
    ``tgt[:, :-1]`` and ``tgt[:, 1:]``.

    ``fn`` is given ``tgt (B, T)``, long token ids laid out as ``[bos] + answer + [eos] + pads``,
    and must return two ``(B, T - 1)`` long tensors without changing ``tgt``.
    """
    for desc, tgt in _shift_cases():
        where = f"for {desc}"
        result = call_student(
            fn,
            (tgt,),
            where,
            inputs="its argument tgt",
            in_place_hint="build new tensors instead (slicing makes views, which is fine, but do not write into them)",
        )
        inp, out = require_pair(result, where, ("decoder_input", "targets"))
        for name, t in (("decoder input", inp), ("targets", out)):
            require_dtype(
                t,
                tgt.dtype,
                where,
                what=f"your {name}",
                hint=": token ids stay integers (the embedding and the loss both need them)",
            )
        expected_inp, expected_out = tgt[:, :-1], tgt[:, 1:]
        if not (torch.equal(inp, expected_inp) and torch.equal(out, expected_out)):
            _diagnose_shift(desc, tgt, inp, out)


def _diagnose_shift(desc: str, tgt: Tensor, inp: Tensor, out: Tensor) -> None:
    """Raise ExerciseFailure naming the slip behind a wrong ``(decoder_input, targets)`` pair."""
    B, T = tgt.shape
    where = f"for {desc}"
    expected_inp, expected_out = tgt[:, :-1], tgt[:, 1:]
    if inp.shape == out.shape and torch.equal(inp, out):
        raise ExerciseFailure(
            f"for {desc}, your targets equal the decoder input: there is no shift, so the model would only "
            f"learn to copy the token it is given. The target at position t is the token that comes "
            f"next, tgt[:, t + 1]. Got decoder input {fmt(inp)}."
        )
    if torch.equal(inp, expected_out) and torch.equal(out, expected_inp):
        raise ExerciseFailure(
            f"for {desc}, the shift goes the wrong way: your decoder input starts with the first answer "
            f"token and your targets start with <bos>. The decoder is given <bos> and asked for the "
            f"answer, so decoder_input = tgt[:, :-1] and targets = tgt[:, 1:]."
        )
    for name, t in (("decoder input", inp), ("targets", out)):
        require_shape(
            t,
            (B, T - 1),
            f"{where} (tgt of shape {tuple(tgt.shape)})",
            what=f"your {name}",
            hint=": both drop one column of tgt, the input its last and the targets their first",
        )
    if not bool((inp[:, 0] == BOS).all()):
        r = int((inp[:, 0] != BOS).nonzero()[0])
        raise ExerciseFailure(
            f"for {desc}, row {r} of the decoder input starts with {int(inp[r, 0])}, not <bos> (id {BOS}): "
            f"the decoder's first input is always <bos>. Got {fmt(inp[r])}, expected {fmt(expected_inp[r])}."
        )
    if bool((out == BOS).any()):
        r = int((out == BOS).any(1).nonzero()[0])
        raise ExerciseFailure(
            f"for {desc}, row {r} of the targets contains <bos> (id {BOS}): the model is given <bos>, it never "
            f"has to predict it. Got {fmt(out[r])}, expected {fmt(expected_out[r])}."
        )
    no_eos = ~(out == EOS).any(1)
    if bool(no_eos.any()):
        r = int(no_eos.nonzero()[0])
        raise ExerciseFailure(
            f"for {desc}, row {r} of the targets has no <eos> (id {EOS}): the model must learn to predict "
            f"the end of the answer, or it cannot stop when it decodes. Got {fmt(out[r])}, expected "
            f"{fmt(expected_out[r])}."
        )
    for name, t, e in (("decoder input", inp, expected_inp), ("targets", out, expected_out)):
        if not torch.equal(t, e):
            r = int((t != e).any(1).nonzero()[0])
            raise ExerciseFailure(
                f"for {desc}, row {r} of the {name} is {fmt(t[r])}; expected {fmt(e[r])} (from tgt row {fmt(tgt[r])})."
            )


# ---------------------------------------------------------------- check_greedy_decode


class _ScriptedSeq2Seq(Transformer):
    """A stand-in for a trained :class:`Transformer` whose next token follows a fixed rule.

    It has the real model's interface (``config``, ``encode``, ``decode``, ``forward`` and the
    library's ``greedy_decode``), but its logits are one-hot: for a source row of length ``L``,
    output position ``t`` is ``<eos>`` when ``t == L`` and otherwise a symbol that depends on the
    source and on the sum of every decoder input so far (``<bos>`` included). So the answer changes
    when the decoder is not started with ``<bos>`` or is not fed its own predictions. Every decoder
    input is recorded in ``self.calls`` for the diagnosis.
    """

    n_symbols = 6

    def __init__(self):
        super().__init__(
            TransformerConfig(
                src_vocab_size=3 + self.n_symbols,
                tgt_vocab_size=3 + self.n_symbols,
                d_model=4,
                n_heads=1,
                n_encoder_layers=0,
                n_decoder_layers=0,
                dropout=0.0,
                context_len=16,
            )
        )
        self.calls: list[Tensor] = []
        self.eval()

    def encode(self, src: Tensor, need_weights: bool = False) -> tuple[Tensor, Tensor]:
        c = self.config
        check_token_ids(src, c.src_vocab_size, c.context_len, "src")
        return src.float()[..., None], src != c.pad_id  # memory (B, T_src, 1), src_keep (B, T_src)

    def decode(
        self,
        tgt: Tensor,
        memory: Tensor,
        src_keep: Tensor,
        need_weights: bool = False,
        cache: DecoderCache | None = None,
    ) -> Tensor:
        # every position is recomputed, so the cache is left unused; the last row, the one
        # greedy_decode reads, is the same with or without it
        c = self.config
        self.calls.append(tgt.detach().clone())
        check_token_ids(tgt, c.tgt_vocab_size, c.context_len, "tgt")
        src = memory[..., 0].round().long()  # (B, T_src)
        lengths = src_keep.sum(1).tolist()  # (B,)
        B, T = tgt.shape
        logits = torch.full((B, T, c.tgt_vocab_size), -4.0)
        for b in range(B):
            total = 0
            for t in range(T):
                total += int(tgt[b, t])
                L = lengths[b]
                token = EOS if t == L else 3 + (int(src[b, t % L]) - 3 + total) % self.n_symbols
                logits[b, t, token] = 4.0
        return logits


def _random_model() -> Transformer:
    """A small real Transformer with random weights whose logits are well separated (no near-ties)."""
    g = torch.Generator().manual_seed(11)
    model = Transformer(
        TransformerConfig(
            src_vocab_size=9,
            tgt_vocab_size=7,
            d_model=16,
            n_heads=2,
            n_encoder_layers=1,
            n_decoder_layers=1,
            dropout=0.0,
            context_len=16,
        )
    )
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (0.5 if p.dim() > 1 else 0.1))
    return model.eval()


def _greedy_cases() -> list[tuple[str, Callable[[], Transformer], Tensor, int]]:
    """(description, model factory, src, max_new_tokens) cases."""
    g = torch.Generator().manual_seed(12)

    def src_rows(lengths: list[int], n_symbols: int) -> Tensor:
        T = max(lengths)
        rows = [torch.randint(3, 3 + n_symbols, (n,), generator=g).tolist() + [PAD] * (T - n) for n in lengths]
        return torch.tensor(rows)

    s = _ScriptedSeq2Seq.n_symbols
    return [
        ("4 sources of lengths 3, 1, 5, 2 and max_new_tokens=8", _ScriptedSeq2Seq, src_rows([3, 1, 5, 2], s), 8),
        (
            "3 sources of lengths 6, 2, 4 and max_new_tokens=4 (row 0 cannot finish)",
            _ScriptedSeq2Seq,
            src_rows([6, 2, 4], s),
            4,
        ),
        ("a single source of length 1 and max_new_tokens=5", _ScriptedSeq2Seq, src_rows([1], s), 5),
        (
            "a real tl.Transformer with random weights, 5 sources, max_new_tokens=6",
            _random_model,
            src_rows([4, 2, 5, 1, 3], 6),
            6,
        ),
    ]


def _eos_position(row: Tensor) -> int | None:
    hits = (row == EOS).nonzero()
    return int(hits[0]) if len(hits) else None


def _diagnose_feeding(where: str, model: Transformer, src: Tensor, got: Tensor, expected: Tensor) -> None:
    """Raise ExerciseFailure when a step appended something other than the model's own greedy choice.

    Replays the decoder inputs the scripted model recorded: each must be the previous one plus the
    argmax of the logits at its last position (for rows that had not ended).
    """
    calls = getattr(model, "calls", [])
    with torch.no_grad():
        memory, src_keep = model.encode(src)
    for k in range(1, len(calls)):
        prev, now = calls[k - 1], calls[k]
        if now.shape[0] != prev.shape[0] or now.shape[1] != prev.shape[1] + 1:
            break  # not the growing-prefix protocol: fall through to the general message
        with torch.no_grad():
            logits = model.decode(prev, memory, src_keep)
        calls.pop()  # that call was ours
        last, first = logits[:, -1].argmax(-1), logits[:, 0].argmax(-1)
        alive = ~(prev == EOS).any(1)  # rows that had not ended before this step
        fed = now[:, -1]
        if bool((fed[alive] != last[alive]).any()):
            if bool((fed[alive] == first[alive]).all()) and prev.shape[1] > 1:
                raise ExerciseFailure(
                    f"{where}, at step {k} you appended the prediction of the first position (logits[:, 0]); "
                    f"the next token is predicted at the last position of the prefix, logits[:, -1]. "
                    f"Expected {fmt(expected)}, got {fmt(got)}."
                )
            raise ExerciseFailure(
                f"{where}, at step {k} the token you appended to the decoder input, {fmt(fed)}, is not the "
                f"model's most likely next token {fmt(last)} (the argmax over the vocabulary of "
                f"logits[:, -1]). Greedy decoding feeds the model its own prediction. Expected "
                f"{fmt(expected)}, got {fmt(got)}."
            )


def _diagnose_greedy(desc: str, model: Transformer, src: Tensor, n: int, got: Tensor, expected: Tensor) -> None:
    """Raise ExerciseFailure naming the likely slip behind a wrong greedy decoding."""
    B, E = expected.shape
    where = f"for {desc}"
    if got.shape[1] == E + 1 and bool((got[:, 0] == BOS).all()) and torch.equal(got[:, 1:], expected):
        raise ExerciseFailure(
            f"{where}, the first column of your output is <bos> (id {BOS}). Return only the generated tokens: "
            f"drop the <bos> you started the decoder with. Expected {fmt(expected)}, got {fmt(got)}."
        )
    calls = getattr(model, "calls", None)
    if calls:
        first = calls[0]
        if first.shape[1] == 0 or not bool((first[:, 0] == BOS).all()):
            raise ExerciseFailure(
                f"{where}, the first decoder input you passed was {fmt(first)}: decoding must start from a "
                f"column of <bos> (id {BOS}), shape (B, 1), which is what the model saw first in training. "
                f"Expected output {fmt(expected)}, got {fmt(got)}."
            )
    # a row that goes on after its <eos>, or one that lost its <eos> to a <pad>
    goes_on = [r for r in range(B) if (e := _eos_position(got[r])) is not None and bool((got[r, e + 1 :] != PAD).any())]
    if goes_on:
        r = goes_on[0]
        raise ExerciseFailure(
            f"{where}, row {r} goes on after its <eos> (id {EOS}): {fmt(got[r])}. Once a row has produced "
            f"<eos> it is finished; every later position of that row must be <pad> (id {PAD}). "
            f"Expected {fmt(expected[r])}."
        )
    ends = [(r, _eos_position(expected[r])) for r in range(B)]
    lost = [
        r
        for r, e in ends
        if e is not None and e < got.shape[1] and int(got[r, e]) == PAD and torch.equal(got[r, :e], expected[r, :e])
    ]
    if lost:
        r = lost[0]
        raise ExerciseFailure(
            f"{where}, row {r} has <pad> where it should have its <eos>: {fmt(got[r])}. Keep the <eos> itself "
            f"in the output; only the positions after it become <pad>. Expected {fmt(expected[r])}."
        )
    if got.shape[1] > E and torch.equal(got[:, :E], expected) and bool((got[:, E:] == PAD).all()):
        raise ExerciseFailure(
            f"{where}, every row had ended after {E} steps, but your output has {got.shape[1]} columns (the extra "
            f"ones are all <pad>): stop decoding as soon as every row has produced <eos>, or after "
            f"max_new_tokens={n} steps."
        )
    if got.shape[1] < E and torch.equal(got, expected[:, : got.shape[1]]):
        unfinished = [r for r in range(B) if _eos_position(got[r]) is None]
        raise ExerciseFailure(
            f"{where}, you stopped after {got.shape[1]} steps, but row {unfinished[0]} had not ended yet "
            f"(expected {fmt(expected[unfinished[0]])}). Stop when every row has produced <eos>, not the first "
            f"one, or after max_new_tokens={n} steps."
        )
    if calls and len(calls) > 1:
        _diagnose_feeding(where, model, src, got, expected)
    if got.shape != expected.shape:
        raise ExerciseFailure(f"{where}, your output has shape {tuple(got.shape)}; expected {tuple(expected.shape)}.")
    r = int((got != expected).any(1).nonzero()[0])
    raise ExerciseFailure(f"{where}, row {r} of your output is {fmt(got[r])}; expected {fmt(expected[r])}.")


def _decode_crash_hint(model: Transformer, src: Tensor) -> Callable[[Exception], str | None]:
    """What to tell a student whose greedy decoder crashed, judged from the calls the model saw."""

    def hint(exc: Exception) -> str | None:
        calls = getattr(model, "calls", [])
        if not isinstance(exc, RuntimeError | IndexError | ValueError) or not calls:
            return None
        if calls[0].shape[1] == 0:
            return (
                f"You called the decoder with an empty prefix of shape {tuple(calls[0].shape)}: decoding starts "
                f"from a column of <bos> (id {BOS}), shape (B, 1)."
            )
        return (
            f"It happened after calling the model. Check the shapes: logits[:, -1] is (B, vocab_size) = "
            f"{(src.shape[0], model.config.tgt_vocab_size)}, and the next token is its argmax over the vocabulary "
            "axis (dim=-1), one id per row, shape (B,)."
        )

    return hint


@check("check_greedy_decode")
def check_greedy_decode(fn: Callable[[Transformer, Tensor, int], Tensor]) -> None:
    """Chapter "Encoder-decoder and cross-attention", exercise 2: check ``fn(model, src, max_new_tokens) -> (B, n)``,
    greedy decoding's ids.

    ``fn`` is given a :class:`Transformer` (a scripted stand-in, then a small random one),
    ``src (B, T_src)`` long ids padded with ``<pad>``, and an int; it must return what
    ``Transformer.greedy_decode`` returns: no ``<bos>``, ``<pad>`` after ``<eos>``, stopping when
    every row has ended or after ``max_new_tokens`` steps.
    """
    for desc, make_model, src, n in _greedy_cases():
        model = make_model()
        with torch.no_grad():
            expected = model.greedy_decode(src, max_new_tokens=n)  # (B, <= n)
        if hasattr(model, "calls"):
            model.calls.clear()
        where = f"for {desc}"
        with torch.no_grad():
            got = call_student(
                fn,
                (model, src, n),
                where,
                crash_hint=_decode_crash_hint(model, src),
                inputs="src",
                in_place_hint="leave its argument unchanged",
            )
        require_tensor(got, where, dtype="integer", what="your output", dtype_hint=": return token ids (torch.long)")
        got = got.detach().cpu().long()
        if got.dim() != 2 or got.shape[0] != src.shape[0]:
            raise ExerciseFailure(
                f"for {desc}, your output has shape {tuple(got.shape)}; expected (B, n) with B={src.shape[0]} "
                f"rows, one per source, here {tuple(expected.shape)}."
            )
        if got.shape[1] > n + 1 or (got.shape[1] > n and not bool((got[:, 0] == BOS).all())):
            raise ExerciseFailure(
                f"for {desc}, your output has {got.shape[1]} columns but max_new_tokens={n}: generate at most "
                f"{n} tokens per row."
            )
        if torch.equal(got, expected):
            continue
        _diagnose_greedy(desc, model, src, n, got, expected)

"""Checks for chapter "Positional encoding".

Two coding exercises:

- ``my_sinusoidal(d_model, context_len)``: the paper's sinusoidal encoding, ``(context_len, d_model)``,
  in the argument order of :func:`transformer_lib.sinusoidal_encoding`, graded by
  :func:`check_sinusoidal` against :func:`transformer_lib.sinusoidal_encoding`;
- ``my_relative_rotation(k, d_model)``: the matrix ``M_k`` with ``PE(pos + k) = M_k @ PE(pos)``,
  graded by :func:`check_rotation` against :func:`transformer_lib.positional.relative_rotation`.

Both checks recognise the usual mistakes (sine and cosine swapped, a wrong exponent or base,
sines and cosines in two blocks, a rotation that runs backwards, ...) and name them.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from ..positional import relative_rotation, sinusoidal_encoding, sinusoidal_frequencies
from ._core import ExerciseFailure, call_student, check, fmt, require_tensor

__all__ = ["check_rotation", "check_sinusoidal"]


# --- check_sinusoidal -------------------------------------------------------------------------

# (context_len, d_model), roughly smallest first; odd widths come after the even ones so that a
# wrong formula is reported before a crash on odd widths.
_SINUSOIDAL_CASES = [(1, 2), (3, 2), (4, 4), (6, 6), (8, 8), (1, 1), (5, 3), (9, 7), (50, 16), (100, 64), (40, 33)]


def _variant(context_len: int, d_model: int, kind: str) -> Tensor:
    """A plausible wrong encoding, float64, used to name the student's mistake."""
    pos = torch.arange(context_len, dtype=torch.float64)[:, None]  # (context_len, 1)
    n_pairs = (d_model + 1) // 2
    pair = torch.arange(n_pairs, dtype=torch.float64)  # (n_pairs,)
    base, exponent = 10000.0, 2 * pair / d_model
    if kind == "base":
        base = 1000.0
    if kind == "half_exponent":
        exponent = pair / d_model
    angles = pos / base**exponent  # (context_len, n_pairs)
    pe = torch.empty(context_len, d_model, dtype=torch.float64)
    if kind == "dim_exponent":  # every dimension j uses j / d_model in the exponent
        dims = torch.arange(d_model, dtype=torch.float64)
        a = pos / 10000.0 ** (dims / d_model)  # (context_len, d_model)
        pe[:, 0::2], pe[:, 1::2] = torch.sin(a[:, 0::2]), torch.cos(a[:, 1::2])
    elif kind == "swapped":
        pe[:, 0::2], pe[:, 1::2] = torch.cos(angles), torch.sin(angles[:, : d_model // 2])
    elif kind == "blocked":
        pe[:, :n_pairs], pe[:, n_pairs:] = torch.sin(angles), torch.cos(angles[:, : d_model // 2])
    elif kind == "from_one":
        return _variant(context_len + 1, d_model, "correct")[1:]
    else:  # "correct", "base", "half_exponent"
        pe[:, 0::2], pe[:, 1::2] = torch.sin(angles), torch.cos(angles[:, : d_model // 2])
    return pe


_SINUSOIDAL_HINTS = {
    "swapped": (
        "sine and cosine are swapped: the even dimensions 2i hold sin(pos / 10000^(2i/d_model)) and the "
        "odd dimensions 2i+1 hold the cosine of the same angle (row 0 must start 0, 1, 0, 1, ...)."
    ),
    "blocked": (
        "you put all the sines first and then all the cosines. The paper's layout, and the library's, "
        "interleaves them: sin on dimension 2i, cos on dimension 2i+1. (The two layouts differ only by a "
        "fixed permutation of dimensions, but this exercise asks for the interleaved one.)"
    ),
    "half_exponent": (
        "the frequencies are too high: the exponent must be 2i/d_model where i counts pairs, so pair i "
        "divides pos by 10000^(2i/d_model); you used 10000^(i/d_model)."
    ),
    "dim_exponent": (
        "the sine and the cosine of one pair must share one angle: dimension 2i+1 uses the same "
        "10000^(2i/d_model) as dimension 2i; you used the dimension's own index (2i+1)/d_model."
    ),
    "base": "the wavelengths are off: the base of the geometric progression is 10000, not 1000.",
    "from_one": "positions start at 0: row 0 is PE(0) = (0, 1, 0, 1, ...), but your row 0 is PE(1).",
}


def _first_difference(actual: Tensor, expected: Tensor) -> str:
    diff = (actual.double() - expected).abs()
    pos, dim = (int(v) for v in torch.nonzero(diff > 1e-5)[0])
    return (
        f"first wrong entry PE[pos={pos}, dim={dim}]: expected {expected[pos, dim].item():.4f}, "
        f"got {actual[pos, dim].item():.4f}"
    )


def _odd_hint(d_model: int) -> str:
    """What goes wrong with an odd ``d_model``: the last sine has no cosine partner."""
    if d_model % 2 == 0:
        return ""
    return (
        f"With an odd d_model the last dimension {d_model - 1} is a sine whose cosine partner would "
        f"be dimension {d_model}, which does not exist: only d_model // 2 = {d_model // 2} of the "
        "angles get a cosine (for example angles[:, : d_model // 2])."
    )


def _matches(actual: object, expected: Tensor) -> bool:
    """True when ``actual`` is a floating tensor of ``expected``'s shape and values (to 1e-5)."""
    return (
        isinstance(actual, Tensor)
        and actual.is_floating_point()
        and actual.shape == expected.shape
        and torch.allclose(actual.double(), expected, atol=1e-5, rtol=0)
    )


def _layout_mistake(actual: object, d_model: int, context_len: int, expected: Tensor) -> str:
    """Name a table returned with its axes swapped or built from swapped arguments, else ``""``."""
    if not isinstance(actual, Tensor) or not actual.is_floating_point() or actual.dim() != 2:
        return ""
    if _matches(actual, expected.T):
        if d_model == context_len:
            return (
                "your table is transposed: row pos must hold PE(pos), so rows are positions and columns "
                "are dimensions; return it as (context_len, d_model)"
            )
        return (
            f"your table is transposed: it is (d_model, context_len) = {tuple(actual.shape)}, but rows "
            f"must be positions and columns dimensions, ({context_len}, {d_model})"
        )
    swapped_args = sinusoidal_encoding(context_len, d_model).double()  # a width of context_len
    if _matches(actual, swapped_args):
        return (
            "you read the arguments in the other order: the first is d_model and the second context_len, "
            "as in tl.sinusoidal_encoding(d_model, context_len)"
        )
    return ""


@check("sinusoidal")
def check_sinusoidal(fn: Callable[[int, int], Tensor]) -> None:
    """Chapter "Positional encoding", exercise 2: grade ``fn(d_model, context_len) -> (context_len, d_model)``, the
    encoding.

    The arguments come in the order of :func:`transformer_lib.sinusoidal_encoding`. ``fn`` is given
    ints, from ``d_model=2, context_len=1`` up to ``d_model=64, context_len=100``, odd widths last, and
    must return a floating-point tensor with one row per position. A transposed table, or one built
    from the two arguments in the other order, is named as such.
    """
    for context_len, d_model in _SINUSOIDAL_CASES:
        where = f"for d_model={d_model}, context_len={context_len}"
        actual = call_student(fn, (d_model, context_len), where, crash_hint=_odd_hint(d_model))
        expected = sinusoidal_encoding(d_model, context_len).double()
        if _matches(actual, expected):
            continue
        layout = _layout_mistake(actual, d_model, context_len, expected)
        if layout:
            raise ExerciseFailure(f"{where}, {layout}.")
        shape = (context_len, d_model)
        flipped = isinstance(actual, Tensor) and actual.shape == (d_model, context_len)
        hint = " (rows are positions, columns are dimensions: transpose it)" if flipped else ""
        require_tensor(
            actual, where, shape, "floating", what="the encoding", layout="(context_len, d_model)", shape_hint=hint
        )
        for kind, hint in _SINUSOIDAL_HINTS.items():
            if torch.allclose(actual.double(), _variant(context_len, d_model, kind), atol=1e-5, rtol=0):
                raise ExerciseFailure(f"{where}, {hint}")
        raise ExerciseFailure(f"{where}, wrong values: {_first_difference(actual, expected)}.")


# --- check_rotation ---------------------------------------------------------------------------

_ROTATION_CASES = [(1, 2), (0, 2), (1, 4), (3, 4), (-2, 4), (5, 8), (17, 16), (100, 32)]


def _pe_at(positions: Tensor, d_model: int) -> Tensor:
    """The sinusoidal encoding of any (even negative) ``positions (n,)``, float64 ``(n, d_model)``."""
    angles = positions.double()[:, None] * sinusoidal_frequencies(d_model)  # (n, d_model / 2)
    return torch.stack([torch.sin(angles), torch.cos(angles)], -1).flatten(1)  # interleaved


@check("relative rotation")
def check_rotation(fn: Callable[[int, int], Tensor]) -> None:
    """Chapter "Positional encoding", exercise 3: grade ``fn(k, d_model) -> M (d_model, d_model)`` with ``M @ PE(pos) ==
    PE(pos + k)``.

    ``fn`` is given ints: offsets ``k`` from -2 to 100 (0 included) and even widths from 2 to 32.
    ``M`` is tested on the encodings of 60 positions.
    """
    n_pos = 60
    for k, d_model in _ROTATION_CASES:
        where = f"for k={k}, d_model={d_model}"
        M = call_student(fn, (k, d_model), where)
        require_tensor(M, where, (d_model, d_model), "floating", what="the matrix", layout="(d_model, d_model)")
        M = M.double()
        pos = torch.arange(n_pos)
        moved = _pe_at(pos, d_model) @ M.T  # (n_pos, d_model): M @ PE(pos) for every pos
        target = _pe_at(pos + k, d_model)  # PE(pos + k)
        if torch.allclose(moved, target, atol=1e-5, rtol=0):
            continue
        if k != 0 and torch.allclose(moved, _pe_at(pos - k, d_model), atol=1e-5, rtol=0):
            raise ExerciseFailure(
                f"{where} your matrix moves the encoding backwards: M @ PE(pos) equals PE(pos - k), not "
                "PE(pos + k). You used the inverse (transposed) rotation; check the signs of the sine entries: "
                "sin(a + b) = sin(a) cos(b) + cos(a) sin(b) and cos(a + b) = cos(a) cos(b) - sin(a) sin(b)."
            )
        off_block = M.clone()
        for i in range(d_model // 2):
            off_block[2 * i : 2 * i + 2, 2 * i : 2 * i + 2] = 0
        if off_block.abs().max() > 1e-8:
            r, c = (int(v) for v in torch.nonzero(off_block.abs() > 1e-8)[0])
            raise ExerciseFailure(
                f"{where} your matrix mixes different frequency pairs: entry M[{r}, {c}] = {M[r, c].item():.4f} "
                "should be 0. M is block-diagonal: the 2x2 block of pair i acts on dimensions 2i and 2i+1 only."
            )
        bad = (moved - target).abs().amax(0)  # (d_model,)
        i = int(torch.nonzero(bad > 1e-5)[0]) // 2
        block = M[2 * i : 2 * i + 2, 2 * i : 2 * i + 2]
        expected = relative_rotation(k, d_model)[2 * i : 2 * i + 2, 2 * i : 2 * i + 2]
        omega = sinusoidal_frequencies(d_model)[i].item()
        raise ExerciseFailure(
            f"{where} the block of pair i={i} (dimensions {2 * i}, {2 * i + 1}) is wrong: it must rotate by the "
            f"angle k * omega_i = {k} * {omega:.4f} = {k * omega:.4f}; "
            f"expected {fmt(expected + 0.0)}, got {fmt(block)}."
        )

"""Reading a rotary model past the length it was trained at (chapter "Longer than trained"): the
rescalings of the rotary frequencies that today's models ship, each one function of the
frequencies, and the spec a recipe holds.

Rotary positions (chapter "Positional encoding") rotate pair ``i`` of a query or key at position ``m`` by the angle
``m * omega_i``, ``omega_i = base^(-2i/d)``. A model trained on ``L`` tokens has seen, for each pair,
the angles up to ``L * omega_i``; a longer input brings angles it never saw in the pairs whose
wavelength ``2 pi / omega_i`` is longer than ``L``. The rescalings change ``omega``:

- ``"linear"``: position interpolation (Chen et al., 2023), every ``omega_i / s``: the new length
  ``s L`` is squeezed into the angles of ``L``, and neighbouring positions come ``s`` times closer;
- ``"ntk"``: NTK-aware scaling, a larger base ``base * s^(d / (d - 2))``: the fastest pair is
  unchanged, the slowest divided by ``s``, the ones between in a geometric blend;
- ``"dynamic"``: the same with the factor grown with the sequence, ``s' = s T / L - (s - 1)`` for a
  sequence of ``T > L`` tokens (no change up to ``L``);
- ``"yarn"`` (Peng et al., 2023): pairs that turn more than ``beta_fast`` times over ``L`` are kept,
  pairs that turn less than ``beta_slow`` times are interpolated, and a linear ramp blends the ones
  between; ``cos`` and ``sin`` are multiplied by an attention factor ``0.1 ln s + 1``, so the
  scores are multiplied by its square;
- ``"llama3"``: Llama 3.1's rule, the same three bands by wavelength (``L / high_freq_factor`` and
  ``L / low_freq_factor``), a smooth blend between, no attention factor.

:meth:`RopeScaling.frequencies` returns ``(omega (d/2,), attention_factor)`` in float64; each
kind equals ``transformers``' ``ROPE_INIT_FUNCTIONS`` entry of the same name (``"ntk"`` of factor
``s`` is the ``"dynamic"`` entry read at ``(2 - 1/s) L`` tokens, where its grown factor reaches ``s``;
at ``s L`` tokens it has grown to ``s^2 - s + 1``). A recipe that holds a ``RopeScaling`` rotates its
multi-head attention's queries and keys with the scaled frequencies.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import torch
from torch import Tensor

from ._checks import check_bool, check_int, is_real
from ._specs import FlatSpec
from .positional import sinusoidal_frequencies

__all__ = ["ROPE_KINDS", "RopeScaling"]

#: the rescalings :class:`RopeScaling` knows (chapter "Longer than trained"); a recipe takes all but "dynamic"
ROPE_KINDS = ("linear", "ntk", "dynamic", "yarn", "llama3")


def _option(default, help_: str):
    return field(default=default, metadata={"help": help_})


@dataclass(frozen=True)
class RopeScaling:
    """A rescaling of the rotary frequencies (chapter "Longer than trained").

    ``RopeScaling("yarn", factor=4, original_context=64)`` reads a model trained on 64 tokens at
    up to 256. Each field is also a flag of the training command (``kind`` is ``--rope-scaling``,
    the others ``--rope-<field>``).
    """

    kind: str = _option("linear", f"the rescaling: one of {', '.join(ROPE_KINDS)}")
    factor: float = _option(2.0, "the new length over the trained one, s (at least 1)")
    original_context: int = _option(64, "the length the model was trained at, L")
    beta_fast: float = _option(32.0, "yarn: pairs turning more than this many times over L are kept")
    beta_slow: float = _option(1.0, "yarn: pairs turning fewer than this many times over L are interpolated")
    truncate: bool = _option(True, "yarn: round the ramp's ends to whole pairs (transformers' default)")
    attention_factor: float | None = _option(None, "yarn: cos and sin times this (default 0.1 ln s + 1)")
    low_freq_factor: float = _option(1.0, "llama3: wavelengths above L / this are interpolated")
    high_freq_factor: float = _option(4.0, "llama3: wavelengths below L / this are kept")

    def __post_init__(self):
        if self.kind not in ROPE_KINDS:
            raise ValueError(f"kind must be one of {list(ROPE_KINDS)}, got {self.kind!r}")
        for name in ("factor", "beta_fast", "beta_slow", "low_freq_factor", "high_freq_factor"):
            value = getattr(self, name)
            if isinstance(value, bool) or not is_real(value) or not math.isfinite(value) or not value > 0:
                raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
        if self.factor < 1:
            raise ValueError(f"factor must be at least 1 (the new length over the trained one), got {self.factor!r}")
        check_int(self.original_context, "original_context")
        check_bool(self.truncate, "truncate")
        if self.beta_slow >= self.beta_fast:
            raise ValueError(f"beta_slow={self.beta_slow!r} must be below beta_fast={self.beta_fast!r}")
        if self.low_freq_factor >= self.high_freq_factor:
            raise ValueError(
                f"low_freq_factor={self.low_freq_factor!r} must be below high_freq_factor={self.high_freq_factor!r}"
            )
        a = self.attention_factor
        if a is not None and (isinstance(a, bool) or not is_real(a) or not math.isfinite(a) or not a > 0):
            raise ValueError(f"attention_factor must be None or a finite number > 0, got {a!r}")

    def to_dict(self) -> dict:
        return asdict(self)

    def frequencies(self, d: int, base: float = 10000.0, seq_len: int | None = None) -> tuple[Tensor, float]:
        """``(omega (d/2,) float64, attention_factor)`` for a ``d``-wide head; ``seq_len`` (the
        longest position read, plus one) matters to ``"dynamic"`` alone."""
        check_int(d, "d")
        if d % 2:
            raise ValueError(f"a rotated width pairs its dimensions: d must be even, got {d}")
        omega = sinusoidal_frequencies(d, base=base)
        s, L = float(self.factor), self.original_context
        if self.kind == "linear":
            return omega / s, 1.0
        if self.kind in ("ntk", "dynamic"):
            if d < 4:
                raise ValueError(
                    f"{self.kind} scaling raises the base to s^(d / (d - 2)): d must be at least 4, got {d}"
                )
            if self.kind == "dynamic":
                s = s * max(seq_len or L, L) / L - (s - 1)
            return sinusoidal_frequencies(d, base=base * s ** (d / (d - 2))), 1.0
        if self.kind == "yarn":
            return self._yarn(omega, d, base), self.yarn_attention_factor()
        return self._llama3(omega), 1.0

    def yarn_attention_factor(self) -> float:
        """YaRN's factor on cos and sin: ``attention_factor``, or ``0.1 ln s + 1`` (1 for ``s <= 1``)."""
        if self.attention_factor is not None:
            return float(self.attention_factor)
        return 1.0 if self.factor <= 1 else 0.1 * math.log(self.factor) + 1.0

    def _yarn(self, omega: Tensor, d: int, base: float) -> Tensor:
        """Pair ``i`` turns ``L omega_i / (2 pi)`` times over the trained length; the ramp runs from
        the pair that turns ``beta_fast`` times (kept) to the one that turns ``beta_slow`` times
        (interpolated), computed from the *trained* length ``L``."""
        L = self.original_context

        def pair_turning(turns: float) -> float:  # the (fractional) pair index that turns `turns` times over L
            return d * math.log(L / (turns * 2 * math.pi)) / (2 * math.log(base))

        low, high = pair_turning(self.beta_fast), pair_turning(self.beta_slow)
        if self.truncate:
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, d - 1)
        if low == high:
            high += 0.001  # as transformers: no division by zero
        ramp = ((torch.arange(d // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)  # 0: kept, 1: scaled
        return omega * (1 - ramp) + omega / self.factor * ramp

    def _llama3(self, omega: Tensor) -> Tensor:
        """Wavelengths ``2 pi / omega`` below ``L / high_freq_factor`` kept, above ``L / low_freq_factor``
        divided by ``s``, and a smooth blend between."""
        L, s = self.original_context, float(self.factor)
        wavelength = 2 * math.pi / omega
        smooth = (L / wavelength - self.low_freq_factor) / (self.high_freq_factor - self.low_freq_factor)
        blended = (1 - smooth) * omega / s + smooth * omega
        out = torch.where(wavelength > L / self.low_freq_factor, omega / s, omega)
        medium = (wavelength >= L / self.high_freq_factor) & (wavelength <= L / self.low_freq_factor)
        return torch.where(medium, blended, out)


# The command line's flat settings: ``rope_scaling`` is the kind (none: no scaling), ``rope_<field>`` the others.
FLAT_SPEC = FlatSpec(RopeScaling, "rope_scaling", "kind", None, "rope_")

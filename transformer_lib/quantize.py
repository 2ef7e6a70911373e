"""Weight quantisation, measured (chapter "Measuring a model").

A weight matrix ``W (out, in)`` is stored as small integer codes and a few float32 scales, and
used as its dequantised value, each code's value times its scale. Two schemes, each equal bit
for bit to a production library on the CPU:

- **int8 per output channel** (:func:`quantize_int8`): one scale per row, ``s = max|W_row| / 127.5``
  (at least float32's eps), codes ``round(W * (1 / s))``, rounded half to even and clipped to
  ``[-128, 127]``; what ``torch.ao.quantization.PerChannelMinMaxObserver(ch_axis=0,
  dtype=torch.qint8, qscheme=torch.per_channel_symmetric)`` and ``torch.quantize_per_channel``
  compute. The denominator 127.5 halves the range ``[-128, 127]``, so a row's largest weight
  lands half a step inside the grid (on 127, or on -128 for some negative ones): quantising the
  dequantised weights again shrinks their scale by 127 / 127.5 (or grows it by 128 / 127.5), at
  every round trip. ``narrow_range=True`` uses ``[-127, 127]`` and ``s = max|W_row| / 127`` (the
  observer with ``quant_min=-127, quant_max=127``): the largest weight is a code, a second round
  trip keeps the codes (a scale may move by one float32 step, once) and the weights stay as they
  are from then on.
- **NF4**, the 4-bit NormalFloat of QLoRA (Dettmers et al., 2023; :func:`quantize_nf4`): 16
  values placed at quantiles of the standard normal (:func:`nf4_codebook`); the weight, flattened,
  is cut into blocks of 64 and each block divided by its largest magnitude (a float32 "absmax"),
  then every value is replaced by the index of the nearest code (a tie goes to the lower code).
  The codebook, codes and dequantised values are those of ``bitsandbytes.functional.quantize_4bit(W,
  blocksize=64, quant_type="nf4")`` (without its optional double quantisation of the absmax), which
  packs two codes per byte, the first in the high four bits. A last block shorter than the others
  holds what is left of the weight. Quantising the dequantised weights again changes nothing
  (unless a block's largest magnitude is below ``1e-38``, subnormal, where bitsandbytes' guard
  against a block of zeros takes over).

Everything is computed in float32, as the kernels of both libraries compute it (a float64 weight
is rounded to float32 first). :func:`quantize_weights` quantises the matrices of a model's parts
and returns a new model holding their dequantised values (what the quantised model computes),
with a report of the storage the codes and scales would take (:func:`weight_bytes`)::

    small, report = quantize_weights(model, "nf4")
    report["bits_per_weight"]  # 4.5
    report["bytes_before"], report["bytes_after"]
"""

from __future__ import annotations

import copy
import math

import torch
from torch import Tensor, nn

from ._checks import check_bool, check_int
from .parts import find_parts

__all__ = [
    "QUANT_METHODS",
    "dequantize_int8",
    "dequantize_nf4",
    "nf4_codebook",
    "quantize_int8",
    "quantize_nf4",
    "quantize_weights",
    "weight_bytes",
]

#: The schemes :func:`quantize_weights` knows.
QUANT_METHODS = ("int8", "nf4")
_ROLES = ("attention", "feed_forward", "embedding", "head")  # the roles whose matrices may be quantised
_EPS = torch.finfo(torch.float32).eps  # PyTorch's observer: the smallest scale (a row of zeros gets it)
_TINY = 1e-38  # bitsandbytes: the smallest absmax a block is divided by (a block of zeros)
# QLoRA's offset, the mean of 1 - 1/(2 * 15) and 1 - 1/(2 * 16), as bitsandbytes writes it (7 decimals)
_NF4_OFFSET = 0.9677083


def _float32_matrix(w, name: str) -> Tensor:
    """``w`` checked (a finite floating-point matrix), as a float32 tensor without autograd history."""
    if not isinstance(w, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(w).__name__}")
    if not w.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {w.dtype}")
    if w.dim() != 2:
        raise ValueError(f"{name} must be a matrix (out, in), got shape {tuple(w.shape)}")
    if w.numel() == 0:
        raise ValueError(f"{name} is empty (shape {tuple(w.shape)}): there is nothing to quantise")
    w32 = w.detach().float()
    bad = ~torch.isfinite(w32)
    if bad.any():
        i, j = (int(k) for k in bad.nonzero()[0])
        raise ValueError(
            f"{name} holds {int(bad.sum())} NaN or infinite value(s) in float32, the first {w32[i, j].item()} at "
            f"({i}, {j}): a weight to quantise must be finite"
        )
    return w32


def _int8(w32: Tensor, narrow_range: bool) -> tuple[Tensor, Tensor]:
    """The codes ``(out, in)`` and scales ``(out,)`` of a checked float32 matrix."""
    half_range = 127.0 if narrow_range else 127.5  # (quant_max - quant_min) / 2
    scales = torch.clamp(w32.abs().amax(dim=1) / half_range, min=_EPS)  # (out,)
    codes = torch.round(w32 * (1.0 / scales)[:, None])  # times the reciprocal, half to even: fbgemm's rounding
    return codes.clamp(-128, 127).to(torch.int8), scales


def quantize_int8(w: Tensor, *, narrow_range: bool = False) -> tuple[Tensor, Tensor]:
    """Quantise a weight ``w (out, in)`` to 8 bits, one scale per output row (chapter "Measuring a model").

    Returns ``(codes, scales)``: ``codes (out, in)`` int8 in ``[-128, 127]`` and ``scales (out,)``
    float32, ``max|w_row| / 127.5`` but at least float32's eps (``1.19e-7``, the scale of a row of
    zeros), bit for bit those of PyTorch's per-channel symmetric observer and
    ``torch.quantize_per_channel(w, scales, zero_points, 0, torch.qint8).int_repr()`` (the zero points
    are 0). ``narrow_range``:
    codes in ``[-127, 127]`` and ``max|w_row| / 127``, the observer with ``quant_min=-127``. Each
    weight is within half a step of its dequantised value, ``|w - codes * s| <= s / 2`` (but -128 steps
    of a row within 0.4 % of float32's largest value overflow to -inf, in PyTorch too).
    """
    check_bool(narrow_range, "narrow_range")
    return _int8(_float32_matrix(w, "w"), narrow_range)


def dequantize_int8(codes: Tensor, scales: Tensor) -> Tensor:
    """The weight ``codes * scales[:, None]``, float32 ``(out, in)``, from :func:`quantize_int8`'s
    ``codes (out, in)`` (int8) and ``scales (out,)`` (float32); PyTorch's ``.dequantize()`` bit for bit
    (chapter "Measuring a model")."""
    if not isinstance(codes, Tensor) or codes.dtype != torch.int8 or codes.dim() != 2:
        got = f"{codes.dtype} of shape {tuple(codes.shape)}" if isinstance(codes, Tensor) else type(codes).__name__
        raise TypeError(f"codes must be an int8 matrix (out, in) from quantize_int8, got {got}")
    if not isinstance(scales, Tensor) or scales.dtype != torch.float32 or tuple(scales.shape) != codes.shape[:1]:
        got = f"{scales.dtype} of shape {tuple(scales.shape)}" if isinstance(scales, Tensor) else type(scales).__name__
        raise ValueError(f"scales must be float32 of shape ({codes.shape[0]},), one per row of the codes, got {got}")
    return codes.float() * scales[:, None]


def nf4_codebook() -> Tensor:
    """The 16 values of NF4 (chapter "Measuring a model"; QLoRA), sorted, from -1 to 1 with an exact 0: float32
    ``(16,)``.

    A 4-bit code has 16 values; an exact zero leaves 15 others. The positive side takes 8 quantiles of
    the standard normal (``ndtri``) at probabilities evenly spaced from the offset ``0.9677083`` down to
    (not including) ``0.5``, the negative side 7; then everything is divided by the largest. The grid
    is float32, the quantiles float64, the division float32: the steps of bitsandbytes'
    ``create_normal_map``, whose printed table this equals bit for bit (computed in float64 throughout
    it would differ by up to ``1.8e-7``, a few float32 steps).
    """
    positive = torch.linspace(_NF4_OFFSET, 0.5, 9, dtype=torch.float32)[:-1]  # 8 probabilities above 1/2
    negative = torch.linspace(_NF4_OFFSET, 0.5, 8, dtype=torch.float32)[:-1]  # 7
    zero = torch.zeros(1, dtype=torch.float64)
    quantiles = torch.cat([torch.special.ndtri(positive.double()), zero, -torch.special.ndtri(negative.double())])
    values = quantiles.float().sort().values
    return values / values.max()


def _nf4(w32: Tensor, block_size: int) -> tuple[Tensor, Tensor]:
    """The codes (``w32``'s shape, uint8) and absmax ``(n_blocks,)`` of a checked float32 tensor."""
    flat = w32.reshape(-1)
    full = flat.numel() - flat.numel() % block_size
    blocks = flat[:full].view(-1, block_size)  # (n_full, block_size)
    absmax = blocks.abs().amax(dim=1)  # (n_full,)
    scaled = [(blocks * (1.0 / absmax.clamp(min=_TINY))[:, None]).reshape(-1)]  # times the reciprocal ...
    if full < flat.numel():  # ... and the shorter last block divided, as bitsandbytes does
        last = flat[full:].abs().amax()
        absmax = torch.cat([absmax, last[None]])
        scaled.append(flat[full:] / last.clamp(min=_TINY))
    code = nf4_codebook().to(w32.device)
    midpoints = (code[:-1] + code[1:]) / 2  # (15,): a value on a midpoint goes to the lower code
    codes = torch.bucketize(torch.cat(scaled).clamp(-1, 1), midpoints)
    return codes.to(torch.uint8).view(w32.shape), absmax


def quantize_nf4(w: Tensor, block_size: int = 64) -> tuple[Tensor, Tensor]:
    """Quantise a weight ``w (out, in)`` to NF4 (chapter "Measuring a model"; QLoRA): returns ``(codes, absmax)``.

    ``codes (out, in)``, uint8 in ``0 .. 15``, index :func:`nf4_codebook`; ``absmax (n_blocks,)``
    float32 holds the largest magnitude of each block of ``block_size`` consecutive weights of the
    flattened ``w`` (``n_blocks = ceil(out * in / block_size)``: a last, shorter block holds the
    rest). Each weight divided by its block's absmax is replaced by the nearest code, a tie by the
    lower one: bitsandbytes' ``quantize_4bit(w, blocksize=block_size, quant_type="nf4")`` on the CPU,
    bit for bit, unpacked (it stores two codes a byte, the first in the high four bits).
    """
    check_int(block_size, "block_size")
    return _nf4(_float32_matrix(w, "w"), block_size)


def dequantize_nf4(codes: Tensor, absmax: Tensor, shape, block_size: int = 64) -> Tensor:
    """The weight from :func:`quantize_nf4`'s ``codes`` (uint8, ``0 .. 15``, any layout of
    ``prod(shape)`` values) and ``absmax (n_blocks,)``: each code's value times its block's absmax,
    float32 of ``shape`` (chapter "Measuring a model"): bitsandbytes' table times its absmax, bit for bit (its CPU
    ``dequantize_4bit`` agrees where each row holds whole blocks)."""
    check_int(block_size, "block_size")
    shape = tuple(shape)
    if not all(isinstance(s, int) and s >= 0 for s in shape):
        raise TypeError(f"shape must be a tuple of sizes such as (out, in), got {shape!r}")
    n = math.prod(shape)
    if not isinstance(codes, Tensor) or codes.dtype != torch.uint8:
        got = f"dtype {codes.dtype}" if isinstance(codes, Tensor) else type(codes).__name__
        raise TypeError(f"codes must be a uint8 tensor from quantize_nf4, got {got}")
    if codes.numel() != n:
        raise ValueError(f"codes hold {codes.numel()} values, but shape {shape} has {n}")
    if n and int(codes.max()) > 15:
        raise ValueError(f"codes must lie in 0 .. 15 (one of NF4's 16 values), got {int(codes.max())}")
    n_blocks = -(-n // block_size)
    if not isinstance(absmax, Tensor) or absmax.dtype != torch.float32 or tuple(absmax.shape) != (n_blocks,):
        got = f"{absmax.dtype} of shape {tuple(absmax.shape)}" if isinstance(absmax, Tensor) else type(absmax).__name__
        raise ValueError(
            f"absmax must be float32 of shape ({n_blocks},), one per block of {block_size} of {n} weights, got {got}"
        )
    values = nf4_codebook().to(codes.device)[codes.reshape(-1).long()]  # (n,)
    return (values * absmax.repeat_interleave(block_size)[:n]).view(shape)


def _check_method(method) -> None:
    if method not in QUANT_METHODS:
        raise ValueError(f"method must be one of {list(QUANT_METHODS)}, got {method!r}")


def _roles(include) -> tuple[str, ...]:
    roles = (include,) if isinstance(include, str) else include
    if not isinstance(roles, (tuple, list)) or not roles or not all(isinstance(r, str) for r in roles):
        raise TypeError(f"include must be a tuple of part roles such as ('attention', 'feed_forward'), got {include!r}")
    for role in roles:
        if role not in _ROLES:
            raise ValueError(f"include: {role!r} is not a role whose matrices are quantised, one of {list(_ROLES)}")
    return tuple(roles)


def _selected(model: nn.Module, include) -> dict[str, nn.Parameter]:
    """The matrices (2-D parameters) of the parts of ``model`` with the roles ``include``, by their
    name in ``model.named_parameters()``, in the model's order, each shared matrix once."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    wanted: set[str] = set()
    for role in _roles(include):
        for part_name, part in find_parts(model, role).items():
            for name, p in part.named_parameters(remove_duplicate=False):
                full = f"{part_name}.{name}".lstrip(".")
                if "parametrizations." in full and p.dim() == 2:  # "....parametrizations.weight.original"
                    prefix, _, rest = full.partition("parametrizations.")
                    raise ValueError(
                        f"{prefix}{rest.split('.')[0]} carries a parametrization (a LoRA adapter?): merge it into the "
                        "weight first (tl.remove_lora(model) writes W + (alpha / r) B A into it), then quantise"
                    )
                if p.dim() == 2:
                    wanted.add(full)
    names: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(name)
    found = {}
    for name, p in model.named_parameters():  # each shared parameter once, by its first name
        inside = [n for n in names[id(p)] if n in wanted]
        outside = [n for n in names[id(p)] if n not in wanted]
        if inside and outside:
            raise ValueError(
                f"{inside[0]} is shared with {outside[0]} (tied weights), whose part's role is not in include="
                f"{_roles(include)}: include both roles, such as 'embedding' and 'head', or neither"
            )
        if inside:
            found[name] = p
    return found


def _storage_bits(shape: torch.Size, method: str, block_size: int) -> int:
    """The bits that the codes and float32 scales of a matrix of ``shape`` take."""
    n = math.prod(shape)
    if method == "int8":
        return 8 * n + 32 * shape[0]
    return 4 * n + 32 * -(-n // block_size)


def weight_bytes(
    model: nn.Module, method: str | None = None, *, include=("attention", "feed_forward"), block_size: int = 64
) -> int:
    """The bytes of ``model``'s parameters, each shared one once (chapter "Measuring a model"): at their own dtype's
    size (``method=None``), or with the matrices :func:`quantize_weights` would quantise stored as
    ``method`` does, codes and float32 scales (int8: ``out * in + 4 * out``; nf4, two codes a byte:
    ``ceil(out * in / 2) + 4 * n_blocks``)."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if method is None:
        return sum(p.numel() * p.element_size() for p in model.parameters())
    _check_method(method)
    check_int(block_size, "block_size")
    selected = _selected(model, include)
    ids = {id(p) for p in selected.values()}
    rest = sum(p.numel() * p.element_size() for p in model.parameters() if id(p) not in ids)
    return rest + sum(-(-_storage_bits(p.shape, method, block_size) // 8) for p in selected.values())


def quantize_weights(
    model: nn.Module,
    method: str,
    *,
    include=("attention", "feed_forward"),
    block_size: int = 64,
    narrow_range: bool = False,
) -> tuple[nn.Module, dict]:
    """A copy of ``model`` whose matrices are quantised with ``method`` (``"int8"``: :func:`quantize_int8`
    per output row; ``"nf4"``: :func:`quantize_nf4` in blocks of ``block_size``) and replaced by their
    dequantised values, and a report (chapter "Measuring a model"). ``model`` itself is left as it is.

    ``include`` names the roles of the parts whose matrices (2-D parameters) are quantised
    (:mod:`~transformer_lib.parts`): by default the attention layers' and the feed-forward networks',
    as Hugging Face's loading of bitsandbytes' 4-bit and 8-bit models keeps the output head in full
    precision (and embeddings are no linear layers). Add ``"embedding"`` and ``"head"`` to quantise
    those too; a tied output head (the token embedding's matrix, GPT-2's) needs both. Learned
    positions, vectors (biases, norms, sink logits) and chapter "Attention as a recurrence"'s short convolution (3-D)
    are never quantised. A weight with a LoRA adapter (chapter "Fine-tuning") is refused: merge the adapters first
    (``tl.remove_lora(model)``). QLoRA's order is the other way round: the base is quantised first,
    then the adapters are added to the copy. The copy's weights keep their dtype (float32 and float64
    hold the dequantised values exactly). ``narrow_range`` (int8): :func:`quantize_int8`'s, for
    weights that stay put when quantised again.

    The report: ``{"method", "weights_quantised"`` (the names), ``"bits_per_weight"`` (over those
    matrices, with the scales' share: int8 ``8 + 32 / in``, nf4 ``4 + 32 / block_size``),
    ``"bytes_before"`` and ``"bytes_after"`` (:func:`weight_bytes` of the whole model)``}``.
    """
    _check_method(method)
    check_int(block_size, "block_size")
    check_bool(narrow_range, "narrow_range")
    selected = _selected(model, include)
    if not selected:
        raise ValueError(f"the model has no matrix in a part with the roles {_roles(include)}: nothing to quantise")
    checked = {name: _float32_matrix(p, name) for name, p in selected.items()}  # every weight, before any copy
    quantised = copy.deepcopy(model)
    bits = 0
    with torch.no_grad():
        for name, w32 in checked.items():
            if method == "int8":
                value = dequantize_int8(*_int8(w32, narrow_range))
            else:
                value = dequantize_nf4(*_nf4(w32, block_size), w32.shape, block_size)
            quantised.get_parameter(name).copy_(value)
            bits += _storage_bits(w32.shape, method, block_size)
    report = {
        "method": method,
        "weights_quantised": list(selected),
        "bits_per_weight": bits / sum(p.numel() for p in selected.values()),
        "bytes_before": weight_bytes(model),
        "bytes_after": weight_bytes(model, method, include=include, block_size=block_size),
    }
    return quantised, report

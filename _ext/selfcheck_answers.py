"""Self-check answers (:mod:`selfcheck`): the normalisation of what a reader types, the same
rules as ``normalise`` in ``static/selfcheck.js``, and the salted hashes and encoded solutions
that the page holds instead of the answers.
"""

from __future__ import annotations

import base64
import hashlib
import re
from decimal import ROUND_HALF_UP, Decimal

from sphinx.errors import SphinxError

KINDS = ("number", "shape", "choice")


class SelfCheckError(SphinxError, ValueError):
    """A self-check question that cannot be built (a missing glue key, a bad answer, a bad label)."""

    category = "Self-check error"


_NUMBER = re.compile(r"^([+-]?)(\d*)(?:\.(\d*))?(?:e([+-]?\d+))?$")


def _decimal(text: str) -> Decimal:
    """Parse a number as a reader writes it: spaces, ``_``, thin spaces and thousands commas allowed."""
    s = re.sub(r"[\s_,\u2009\u202f]", "", str(text)).lower().replace("\u2212", "-")
    s = s.replace("\u00d710^", "e").replace("x10^", "e").replace("*10^", "e")
    m = _NUMBER.match(s)
    if not m or not (m.group(2) or m.group(3)):
        raise SelfCheckError(f"not a number: {text!r}")
    return Decimal(s)


def _canonical(d: Decimal) -> str:
    """One spelling per value: plain digits, no exponent, no trailing zeros, no ``-0``."""
    if d.is_zero():
        return "0"
    sign, digits, exp = d.as_tuple()
    digits = "".join(map(str, digits)).lstrip("0") or "0"
    # strip trailing zeros into the exponent
    stripped = digits.rstrip("0")
    exp += len(digits) - len(stripped)
    digits = stripped
    if exp >= 0:
        body = digits + "0" * exp
    elif -exp >= len(digits):
        body = "0." + "0" * (-exp - len(digits)) + digits
    else:
        body = digits[:exp] + "." + digits[exp:]
    return ("-" if sign else "") + body


def round_number(value, *, sig: int | None = None, decimals: int | None = None) -> str:
    """Round half up to ``sig`` significant digits or ``decimals`` places (or keep exact); canonical text."""
    d = value if isinstance(value, Decimal) else _decimal(repr(value) if isinstance(value, float) else value)
    if sig is not None and not d.is_zero():
        exponent = d.adjusted() - sig + 1
        d = d.quantize(Decimal(1).scaleb(exponent), rounding=ROUND_HALF_UP)
    elif decimals is not None:
        d = d.quantize(Decimal(1).scaleb(-decimals), rounding=ROUND_HALF_UP)
    return _canonical(d)


def _symbol(name: str) -> str:
    return re.sub(r"[_{}\s\\]", "", name).lower()


def parse_symbols(text: str | None) -> dict[str, int]:
    """``"B=2, h=4, T_q=5"`` -> ``{"b": 2, "h": 4, "tq": 5}`` (names normalised as in answers)."""
    out: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in (text or "").split(","))):
        name, sep, size = part.partition("=")
        if not sep or not name.strip() or not size.strip().isdigit():
            raise SelfCheckError(f"bad symbol {part!r} in :symbols: (write NAME=SIZE, e.g. T_q=5)")
        key = _symbol(name)
        if key in out:
            raise SelfCheckError(f"symbol {name.strip()!r} in :symbols: clashes with another (case and _ ignored)")
        out[key] = int(size)
    return out


def normalise_shape(text, symbols: dict[str, int] | None = None) -> str:
    """``"torch.Size([2, 4, 5,5])"``, ``"(B, h, T, T)"`` (with B=2, h=4, T=5) -> ``"(2,4,5,5)"``."""
    if isinstance(text, (tuple, list)):
        text = "(" + ",".join(str(int(n)) for n in text) + ")"
    s = str(text).strip()
    s = re.sub(r"^torch\.size", "", s, flags=re.I).strip()
    s = s.strip("()[] ")
    dims = [d.strip() for d in re.split(r"[,\u00d7]|\s+x\s+", s)]
    if dims and dims[-1] == "":
        dims = dims[:-1]
    out = []
    for d in dims:
        d = d.strip("()[] ")
        if re.fullmatch(r"\d+", d):
            out.append(str(int(d)))
        else:
            key = _symbol(d)
            out.append(str(symbols[key]) if symbols and key in symbols else key)
    return "(" + ",".join(out) + ")"


def normalise_choice(text) -> str:
    return re.sub(r"\s+", " ", str(text)).strip().lower()


def normalise(kind: str, value, *, sig=None, decimals=None, symbols=None) -> str:
    if kind == "number":
        return round_number(value, sig=sig, decimals=decimals)
    if kind == "shape":
        return normalise_shape(value, symbols)
    if kind == "choice":
        return normalise_choice(value)
    raise SelfCheckError(f"unknown kind {kind!r} (one of {', '.join(KINDS)})")


def digest(salt: str, normalised: str) -> str:
    return hashlib.sha256(f"{salt}:{normalised}".encode()).hexdigest()


def make_salt(docname: str, qid: str) -> str:
    return hashlib.sha256(f"selfcheck:{docname}:{qid}".encode()).hexdigest()[:16]


def _keystream(salt: str, n: int) -> bytes:
    stream = bytearray()
    counter = 0
    while len(stream) < n:
        stream += hashlib.sha256(f"{salt}:{counter}".encode()).digest()
        counter += 1
    return bytes(stream[:n])


def encode_solution(salt: str, html: str) -> str:
    """XOR the solution with a SHA-256 key stream of the salt, base64: no spoiler in the page source."""
    data = html.encode()
    return base64.b64encode(bytes(a ^ b for a, b in zip(data, _keystream(salt, len(data)), strict=True))).decode()


def decode_solution(salt: str, encoded: str) -> str:
    data = base64.b64decode(encoded)
    return bytes(a ^ b for a, b in zip(data, _keystream(salt, len(data)), strict=True)).decode()

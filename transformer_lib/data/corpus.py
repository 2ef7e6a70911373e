"""The language model's text (chapter "A GPT from scratch"): Tiny Shakespeare, shipped with the
package (public domain, 1,115,394 characters) and verified by its SHA-256. A user's own file or
``TINY_SHAKESPEARE`` comes first; without the shipped copy (a trimmed install), a verified copy in
a cache folder, one download, and, with a warning, text that every Python installation has: the
standard library's own source.
"""

from __future__ import annotations

import hashlib
import os
import sysconfig
import urllib.request
import warnings
from dataclasses import dataclass
from pathlib import Path

from ..utils import atomic_write

__all__ = [
    "CACHE_ENV",
    "OFFLINE_ENV",
    "PATH_ENV",
    "SHIPPED_PATH",
    "TINY_SHAKESPEARE_SHA256",
    "TINY_SHAKESPEARE_URL",
    "ChecksumError",
    "Corpus",
    "load_corpus",
    "python_stdlib_corpus",
    "sha256_of",
]

TINY_SHAKESPEARE_URL = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
TINY_SHAKESPEARE_SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"
PATH_ENV = "TINY_SHAKESPEARE"  # a local copy of the corpus
OFFLINE_ENV = "ATTENTION_EXECUTED_OFFLINE"  # "1": never download
CACHE_ENV = "ATTENTION_EXECUTED_CACHE"  # the cache folder, if not the default
SHIPPED_PATH = Path(__file__).with_name("tinyshakespeare.txt")  # the copy that comes with the package


class ChecksumError(ValueError):
    """A downloaded file does not have the expected SHA-256; it was not kept (chapter "A GPT from scratch")."""


@dataclass
class Corpus:
    """A text and where it came from (chapter "A GPT from scratch").

    ``name`` is ``"tiny_shakespeare"``, ``"python_stdlib"`` or a file's name.
    """

    text: str
    name: str
    source: str


def _cache_dir() -> Path:
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "attention-executed"


def _offline() -> bool:
    return os.environ.get(OFFLINE_ENV, "").strip().lower() not in ("", "0", "false", "no")


def sha256_of(data: bytes | str | os.PathLike) -> str:
    """The SHA-256 hex digest of ``data``, or of the file at ``data`` when given a path (chapter "A GPT from
    scratch")."""
    if not isinstance(data, bytes):
        data = Path(data).read_bytes()
    return hashlib.sha256(data).hexdigest()


def _fetch(url: str, timeout: float) -> bytes:
    """The bytes at ``url`` (a separate function so tests can replace it)."""
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read()


def _download(url: str, dest: Path, sha256: str, timeout: float) -> Path:
    """Download ``url`` to ``dest`` atomically; a checksum mismatch raises and keeps nothing."""
    data = _fetch(url, timeout)
    if sha256_of(data) != sha256:
        raise ChecksumError(
            f"the file downloaded from {url} has SHA-256 {sha256_of(data)}, expected {sha256}; it was not kept. "
            f"Download it yourself and pass its path (or set {PATH_ENV}=/path/to/input.txt)."
        )
    return atomic_write(dest, lambda tmp: Path(tmp).write_bytes(data))


def python_stdlib_corpus(n_chars: int = 1_000_000) -> str:
    """About ``n_chars`` of Python source (chapter "A GPT from scratch"): the standard library's top-level ``.py`` files
    that are pure ASCII, in sorted order. Every Python installation has it, so it is the offline fallback."""
    text, total = [], 0
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        try:
            part = path.read_bytes().decode("ascii")
        except (OSError, UnicodeDecodeError):
            continue
        text.append(part)
        total += len(part)
        if total >= n_chars:
            break
    corpus = "".join(text)[:n_chars]
    if len(corpus) < 10_000:
        raise RuntimeError("this Python installation has too little standard-library source for a fallback corpus")
    return corpus


def _text_of(data: bytes, path: Path) -> str:
    """The UTF-8 text of the file ``path`` holding ``data``; a ``ValueError`` naming the file when
    it is empty, binary or in another encoding. A byte-order mark at its start (which some editors
    write) is not part of the text: it would become a character of the vocabulary."""
    try:
        text = data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as e:
        raise ValueError(
            f"{path} is not UTF-8 text (byte {e.start} is {data[e.start : e.start + 1]!r}): convert it to UTF-8, "
            f"or give a text file"
        ) from None
    if "\x00" in text:
        raise ValueError(f"{path} looks binary (it holds NUL bytes), not like text")
    if not text:
        raise ValueError(f"{path} is empty")
    return text


def load_corpus(
    path: str | os.PathLike | None = None,
    *,
    offline: bool | None = None,
    cache_dir: str | os.PathLike | None = None,
    timeout: float = 5.0,
) -> Corpus:
    """The language model's text (chapter "A GPT from scratch"): Tiny Shakespeare if it can be had, else a fallback.

    In order: the file ``path`` (any text); the file named by the environment variable
    ``TINY_SHAKESPEARE``; the copy shipped with the package (:data:`SHIPPED_PATH`), when its
    checksum is right (a warning otherwise); a verified copy in the cache folder (``$ATTENTION_EXECUTED_CACHE``, else
    ``$XDG_CACHE_HOME/attention-executed`` or ``~/.cache/attention-executed``); a download (at
    most ``timeout`` seconds; skipped when ``offline`` or ``ATTENTION_EXECUTED_OFFLINE=1``),
    checked against :data:`TINY_SHAKESPEARE_SHA256`. When none works, a warning and
    :func:`python_stdlib_corpus`. A download with the wrong checksum raises :class:`ChecksumError`.
    """
    if path is not None:
        path = Path(path)
        return Corpus(_text_of(path.read_bytes(), path), path.stem, str(path))
    if os.environ.get(PATH_ENV):
        path = Path(os.environ[PATH_ENV])
        if not path.is_file():
            raise FileNotFoundError(f"{PATH_ENV}={path} does not name a file")
        data = path.read_bytes()
        if sha256_of(data) != TINY_SHAKESPEARE_SHA256:
            warnings.warn(f"{PATH_ENV}={path} is not the expected Tiny Shakespeare (checksum differs)", stacklevel=2)
        return Corpus(_text_of(data, path), "tiny_shakespeare", str(path))
    if SHIPPED_PATH.is_file():
        data = SHIPPED_PATH.read_bytes()
        if sha256_of(data) == TINY_SHAKESPEARE_SHA256:
            return Corpus(data.decode("utf-8"), "tiny_shakespeare", str(SHIPPED_PATH))
        warnings.warn(f"{SHIPPED_PATH} has been changed (its checksum is wrong): not using it", stacklevel=2)
    cached = Path(cache_dir or _cache_dir()) / "tinyshakespeare.txt"
    if cached.is_file():
        data = cached.read_bytes()
        if sha256_of(data) == TINY_SHAKESPEARE_SHA256:
            return Corpus(data.decode("utf-8"), "tiny_shakespeare", str(cached))
        warnings.warn(f"removing {cached}: its checksum is wrong", stacklevel=2)
        cached.unlink()
    offline = _offline() if offline is None else offline
    reason = f"downloads are disabled ({OFFLINE_ENV}=1 or offline=True)"
    if not offline:
        try:
            _download(TINY_SHAKESPEARE_URL, cached, TINY_SHAKESPEARE_SHA256, timeout)
            return Corpus(cached.read_text(encoding="utf-8"), "tiny_shakespeare", str(cached))
        except ChecksumError:
            raise
        except OSError as e:  # no network, a timeout, an HTTP error, a read-only cache...
            reason = f"the download failed ({e})"
    text = python_stdlib_corpus()
    warnings.warn(
        f"Tiny Shakespeare is not available: {reason}. Using the offline fallback corpus instead: "
        f"{len(text):,} characters of the Python standard library's source. To use Tiny Shakespeare, set "
        f"{PATH_ENV}=/path/to/input.txt or allow one download from {TINY_SHAKESPEARE_URL}.",
        stacklevel=2,
    )
    return Corpus(text, "python_stdlib", sysconfig.get_paths()["stdlib"])

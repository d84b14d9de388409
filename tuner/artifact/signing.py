"""Optional signatures of an artifact (``tuner compile --sign KEY``, ``tuner run --verify KEY``, ``tuner-run
--verify KEY``, ``tnr_verify_signature``): an HMAC-SHA256 of ``manifest.json`` under a shared key, in the file
``signature`` beside it (one line, ``hmac-sha256:<64 hex digits>``). The manifest holds every listed file's
SHA-256, so a valid signature vouches for them all: whoever holds the key made this artifact, and nobody
without it swapped a kernel, rescaled a weight or resealed the manifest. It is not a public-key signature: every
holder of the key can sign as well as verify. ``binaries/`` (outside the manifest) is not covered."""
from __future__ import annotations

import hashlib
import hmac
import os
from pathlib import Path

from tuner.errors import TunerError

SIGNATURE = "signature"
SCHEME = "hmac-sha256"
MIN_KEY_BYTES = 16


def read_key(path, flag: str) -> bytes:
    """The key file's bytes: at least ``MIN_KEY_BYTES`` of them (``head -c 32 /dev/urandom > KEY`` makes one)."""
    try:
        key = Path(path).read_bytes()
    except OSError as e:
        raise TunerError(f"{flag} {path}: cannot read the key file ({e.strerror or e})") from None
    if len(key) < MIN_KEY_BYTES:
        raise TunerError(f"{flag} {path}: the key holds under {MIN_KEY_BYTES} bytes ({len(key)}); use at least "
                         f"{MIN_KEY_BYTES} random bytes (head -c 32 /dev/urandom > KEY makes one)")
    return key


def _digest(artifact, key: bytes) -> str:
    manifest = Path(artifact) / "manifest.json"
    try:
        data = manifest.read_bytes()
    except OSError as e:
        raise TunerError(f"{artifact}: no manifest.json to sign or verify ({e.strerror or e})") from None
    return hmac.new(key, data, hashlib.sha256).hexdigest()


def sign(artifact, key: bytes) -> Path:
    """Write ``<artifact>/signature`` for the manifest as it is now; returns its path."""
    path = Path(artifact) / SIGNATURE
    tmp = path.with_name(f".{SIGNATURE}.{os.getpid()}.tmp")
    tmp.write_text(f"{SCHEME}:{_digest(artifact, key)}\n")
    os.replace(tmp, path)
    return path


def verify(artifact, key: bytes) -> None:
    """Raise a TunerError unless ``<artifact>/signature`` is the key's HMAC of its manifest.json."""
    path = Path(artifact) / SIGNATURE
    try:
        text = path.read_text(errors="replace").strip()
    except OSError:
        raise TunerError(f"{artifact} is not signed (no {SIGNATURE} file): sign it with `tuner compile --sign KEY`, "
                         f"or run it without --verify") from None
    scheme, _, hexd = text.partition(":")
    if scheme != SCHEME or len(hexd) != 64:
        raise TunerError(f"{path}: not a '{SCHEME}:<64 hex digits>' line")
    if not hmac.compare_digest(hexd, _digest(artifact, key)):
        raise TunerError(f"{artifact}: the signature does not match manifest.json under this key: the artifact was "
                         f"changed after it was signed, or signed with another key")

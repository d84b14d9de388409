"""Optional signatures of an artifact (``tuner compile --sign KEY``, ``tuner run --verify KEY``, ``tuner-run
--verify KEY``, ``tnr_open_verified``): an HMAC-SHA256 of ``manifest.json`` under a shared key, in the file
``signature`` beside it (one line, ``hmac-sha256:<64 hex digits>``). The manifest holds every listed file's
SHA-256, so a valid signature vouches for them all: whoever holds the key made this artifact, and nobody
without it swapped a kernel, rescaled a weight or resealed the manifest. It is not a public-key signature: every
holder of the key can sign as well as verify.

What runs is what was verified: ``read_artifact(path, key)`` checks the signature against the bytes of
manifest.json it then reads the artifact by (one reading, never the path twice), and a verified module takes
program binaries only from this user's own cache, keyed by the verified source's hash, never from the
artifact's ``binaries/`` (which the signature does not cover)."""
from __future__ import annotations

import hashlib
import hmac
import os
from pathlib import Path

from tuner.errors import TunerError

SIGNATURE = "signature"
SCHEME = "hmac-sha256"
MIN_KEY_BYTES = 16
MAX_KEY_BYTES = 1 << 20  # a key file larger than this is not a key (and /dev/zero never ends)
MAX_SIGNATURE_BYTES = 4096
MAX_MANIFEST_BYTES = 1 << 20  # store.MAX_MANIFEST


def read_key(path, flag: str) -> bytes:
    """The key file's bytes: a regular file (a FIFO, a device or a folder is refused before it is read) of
    ``MIN_KEY_BYTES`` to ``MAX_KEY_BYTES`` bytes (``head -c 32 /dev/urandom > KEY`` makes one)."""
    from tuner.files import FileProblem, read_capped
    try:
        key = read_capped(path, MAX_KEY_BYTES)
    except FileProblem as e:
        raise TunerError(f"{flag} {path}: cannot read the key file ({e.problem}); give a file of random bytes "
                         f"(head -c 32 /dev/urandom > KEY makes one)") from None
    if len(key) < MIN_KEY_BYTES:
        raise TunerError(f"{flag} {path}: the key holds under {MIN_KEY_BYTES} bytes ({len(key)}); use at least "
                         f"{MIN_KEY_BYTES} random bytes (head -c 32 /dev/urandom > KEY makes one)")
    return key


def _digest(manifest: bytes, key: bytes) -> str:
    return hmac.new(key, manifest, hashlib.sha256).hexdigest()


def check(artifact, manifest: bytes, signature: bytes | None, key: bytes) -> None:
    """Raise a TunerError unless ``signature`` (the bytes of the artifact's signature file; None: there is
    none) is the key's HMAC of ``manifest`` -- the very bytes the caller goes on to read the artifact by."""
    if signature is None:
        raise TunerError(f"{artifact} is not signed (no {SIGNATURE} file): sign it with `tuner compile --sign KEY`, "
                         f"or run it without --verify")
    scheme, _, hexd = signature.decode("utf-8", errors="replace").strip().partition(":")
    if scheme != SCHEME or len(hexd) != 64:
        raise TunerError(f"{Path(artifact) / SIGNATURE}: not a '{SCHEME}:<64 hex digits>' line")
    if not hmac.compare_digest(hexd, _digest(manifest, key)):
        raise TunerError(f"{artifact}: the signature does not match manifest.json under this key: the artifact was "
                         f"changed after it was signed, or signed with another key")


def _read(artifact, name: str, cap: int, missing_ok: bool = False) -> bytes | None:
    from tuner.files import FileProblem, read_capped
    try:
        return read_capped(Path(artifact) / name, cap, follow=False)
    except FileProblem as e:
        if missing_ok and e.missing:
            return None
        raise TunerError(f"{Path(artifact) / name}: cannot read it ({e.problem}); recompile the model "
                         f"(`tuner compile MODEL -o {artifact}`)") from None


def sign(artifact, key: bytes) -> Path:
    """Write ``<artifact>/signature`` for the manifest as it is now; returns its path."""
    path = Path(artifact) / SIGNATURE
    tmp = path.with_name(f".{SIGNATURE}.{os.getpid()}.tmp")
    tmp.write_text(f"{SCHEME}:{_digest(_read(artifact, 'manifest.json', MAX_MANIFEST_BYTES), key)}\n")
    os.replace(tmp, path)
    return path


def verify(artifact, key: bytes) -> None:
    """Raise a TunerError unless ``<artifact>/signature`` is the key's HMAC of its manifest.json. A check only:
    to run what was verified, read the artifact with the key (``read_artifact(path, key)``,
    ``load_module(path, key=key)``), which checks the signature against the manifest it reads."""
    manifest = _read(artifact, "manifest.json", MAX_MANIFEST_BYTES, missing_ok=True)
    if manifest is None:
        raise TunerError(f"{artifact}: no manifest.json to sign or verify")
    check(artifact, manifest, _read(artifact, SIGNATURE, MAX_SIGNATURE_BYTES, missing_ok=True), key)

"""Ed25519 keys through pynacl, as securesystemslib signers that python-tuf's Metadata API uses.

:class:`NaclSigner` is a :class:`securesystemslib.signer.Signer` backed by a pynacl
``SigningKey``: ``Metadata.sign(signer)`` signs the canonical JSON of the ``signed`` part with
it, and any TUF client verifies the signature with the public half (an ``ed25519``
:class:`~securesystemslib.signer.SSlibKey`, key id = SHA-256 of its canonical JSON, as the
specification computes it).

A :class:`KeyRing` holds the signers of the four TUF roles (``root``, ``targets``,
``snapshot``, ``timestamp``); several keys per role give thresholds. On disk a key is one JSON
file, mode 0600::

    {"keytype": "ed25519", "scheme": "ed25519", "keyid": "...", "public": "<hex>", "private": "<hex seed>"}

named ``<role>.key.json`` (``<role>-2.key.json``, ... for further keys of a role).

    >>> ring = KeyRing.generate()
    >>> signer = ring.signers("timestamp")[0]
    >>> sig = signer.sign(b"payload")
    >>> signer.public_key.verify_signature(sig, b"payload")  # raises if invalid
    >>> sorted(ring.roles())
    ['root', 'snapshot', 'targets', 'timestamp']
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

import nacl.exceptions
import nacl.signing
from securesystemslib.signer import SIGNER_FOR_URI_SCHEME, SecretsHandler, Signature, Signer, SSlibKey
from securesystemslib.signer._utils import compute_default_keyid

from publisher.errors import KeyFileError

__all__ = ["ROLES", "KeyRing", "NaclSigner", "public_key_of"]

#: The top-level TUF roles, in the order the client workflow loads them after root.
ROLES = ("root", "timestamp", "snapshot", "targets")

_KEY_FILE = re.compile(r"^(?P<role>[a-z]+)(?:-(?P<n>\d+))?\.key\.json$")


def public_key_of(verify_key: nacl.signing.VerifyKey) -> SSlibKey:
    """The TUF public key of an Ed25519 verify key, with the specification's default key id."""
    keyval = {"public": verify_key.encode().hex()}
    return SSlibKey(compute_default_keyid("ed25519", "ed25519", keyval), "ed25519", "ed25519", keyval)


class NaclSigner(Signer):
    """A securesystemslib ``Signer`` whose private key is a pynacl Ed25519 ``SigningKey``.

    Private key URIs of the form ``nacl:<path to key file>`` load through
    ``Signer.from_priv_key_uri`` once :data:`SCHEME` is registered (the module does it).
    """

    SCHEME = "nacl"

    def __init__(self, signing_key: nacl.signing.SigningKey) -> None:
        self._signing_key = signing_key
        self._public_key = public_key_of(signing_key.verify_key)

    @classmethod
    def generate(cls) -> NaclSigner:
        """A fresh key from the operating system's CSPRNG."""
        return cls(nacl.signing.SigningKey.generate())

    @classmethod
    def from_seed(cls, seed: bytes) -> NaclSigner:
        if len(seed) != 32:
            raise KeyFileError(f"an Ed25519 seed is 32 bytes, got {len(seed)}")
        return cls(nacl.signing.SigningKey(seed))

    @classmethod
    def from_priv_key_uri(
        cls, priv_key_uri: str, public_key: SSlibKey, secrets_handler: SecretsHandler | None = None
    ) -> NaclSigner:
        scheme, _, path = priv_key_uri.partition(":")
        if scheme != cls.SCHEME:
            raise ValueError(f"NaclSigner loads {cls.SCHEME}:<path> URIs, got {priv_key_uri!r}")
        signer = cls.load(path)
        if signer.public_key.keyval != public_key.keyval:
            raise ValueError(f"the key in {path} is not the private half of key {public_key.keyid}")
        return signer

    @property
    def public_key(self) -> SSlibKey:
        return self._public_key

    @property
    def keyid(self) -> str:
        return self._public_key.keyid

    def sign(self, payload: bytes) -> Signature:
        signature = self._signing_key.sign(payload).signature
        return Signature(self._public_key.keyid, signature.hex())

    # --- files -----------------------------------------------------------------------------------

    def to_json(self) -> dict[str, str]:
        return {
            "keytype": "ed25519",
            "scheme": "ed25519",
            "keyid": self.keyid,
            "public": self._public_key.keyval["public"],
            "private": bytes(self._signing_key).hex(),
        }

    def save(self, path: str | os.PathLike[str], *, overwrite: bool = False) -> Path:
        """Write the key file with mode 0600 (never world-readable, not even briefly)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if overwrite else os.O_EXCL)
        try:
            fd = os.open(path, flags, 0o600)
        except FileExistsError:
            raise KeyFileError(f"{path} exists; refusing to overwrite a signing key", subject=str(path)) from None
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(self.to_json(), handle, indent=2)
            handle.write("\n")
        return path

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> NaclSigner:
        path = Path(path)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            if data.get("keytype") != "ed25519" or data.get("scheme") != "ed25519":
                raise ValueError(f"keytype/scheme {data.get('keytype')!r}/{data.get('scheme')!r}, expected ed25519")
            signer = cls.from_seed(bytes.fromhex(data["private"]))
        except (OSError, ValueError, KeyError, TypeError, nacl.exceptions.CryptoError) as exc:
            raise KeyFileError(f"{path} is not a banditstream Ed25519 key file: {exc}", subject=str(path)) from None
        if data.get("public") not in (None, signer.public_key.keyval["public"]):
            raise KeyFileError(f"{path}: the public key does not belong to the private key", subject=str(path))
        return signer


# securesystemslib resolves private key URIs through this registry: "nacl:<path>" loads here.
SIGNER_FOR_URI_SCHEME.setdefault(NaclSigner.SCHEME, NaclSigner)


class KeyRing:
    """The signers of each TUF role a process holds (a publisher needs all but root, usually)."""

    def __init__(self, signers: Mapping[str, Iterable[NaclSigner]]) -> None:
        unknown = set(signers) - set(ROLES)
        if unknown:
            raise KeyFileError(f"unknown role(s) {sorted(unknown)}; roles are {', '.join(ROLES)}")
        self._signers = {role: tuple(keys) for role, keys in signers.items() if tuple(keys)}

    @classmethod
    def generate(cls, keys_per_role: int | Mapping[str, int] = 1, roles: Iterable[str] = ROLES) -> KeyRing:
        """Fresh keys: ``keys_per_role`` for every role, or per role name."""
        counts = {role: keys_per_role if isinstance(keys_per_role, int) else keys_per_role.get(role, 1) for role in roles}
        return cls({role: [NaclSigner.generate() for _ in range(n)] for role, n in counts.items()})

    def roles(self) -> list[str]:
        return [role for role in ROLES if role in self._signers]

    def signers(self, role: str) -> tuple[NaclSigner, ...]:
        """The signers of ``role``; :class:`KeyFileError` if this ring holds none."""
        try:
            return self._signers[role]
        except KeyError:
            raise KeyFileError(f"no private key for the {role} role in this key ring", subject=role) from None

    def public_keys(self, role: str) -> list[SSlibKey]:
        return [s.public_key for s in self.signers(role)]

    def without(self, *roles: str) -> KeyRing:
        """This ring minus some roles (e.g. a publisher's ring without the offline root key)."""
        return KeyRing({r: s for r, s in self._signers.items() if r not in roles})

    def save(self, directory: str | os.PathLike[str], *, overwrite: bool = False) -> list[Path]:
        """One key file per key (see the module docstring for names); returns the paths."""
        directory = Path(directory)
        paths = []
        for role in self.roles():
            for i, signer in enumerate(self._signers[role], start=1):
                name = f"{role}.key.json" if i == 1 else f"{role}-{i}.key.json"
                paths.append(signer.save(directory / name, overwrite=overwrite))
        return paths

    @classmethod
    def load(cls, directory: str | os.PathLike[str], roles: Iterable[str] = ROLES) -> KeyRing:
        """Every ``<role>[-n].key.json`` in ``directory`` for the given roles (absent roles are skipped)."""
        directory = Path(directory)
        if not directory.is_dir():
            raise KeyFileError(f"key directory {directory} does not exist", subject=str(directory))
        wanted = set(roles)
        found: dict[str, list[tuple[int, NaclSigner]]] = {}
        for path in sorted(directory.iterdir()):
            match = _KEY_FILE.match(path.name)
            if match and match["role"] in wanted:
                found.setdefault(match["role"], []).append((int(match["n"] or 1), NaclSigner.load(path)))
        return cls({role: [s for _, s in sorted(keys, key=lambda t: t[0])] for role, keys in found.items()})

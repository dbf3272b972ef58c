"""SSH key handling without a connection: reading a private key, a host key's fingerprint."""

from __future__ import annotations

import base64
import hashlib
import io

import paramiko


class UnreadableKey(ValueError):
    pass


def fingerprint(key_type: str, key_base64: str) -> str:
    """OpenSSH's SHA256 fingerprint of a public key (``ssh-keygen -lf`` prints the same)."""
    digest = hashlib.sha256(base64.b64decode(key_base64)).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def load_private_key(text: str) -> paramiko.PKey:
    for cls in (paramiko.Ed25519Key, paramiko.ECDSAKey, paramiko.RSAKey):
        try:
            return cls.from_private_key(io.StringIO(text))
        except (paramiko.SSHException, ValueError, IndexError):
            continue
    raise UnreadableKey("the credential's private key cannot be read (ed25519, ECDSA or RSA, no passphrase)")

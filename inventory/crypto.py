"""Encryption at rest for credential secrets (Fernet keys from RACKBENCH_ENCRYPTION_KEYS)."""

from __future__ import annotations

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.conf import settings


class DecryptionError(Exception):
    """The stored secret cannot be read with the configured keys."""


def _fernet() -> MultiFernet:
    return MultiFernet([Fernet(key.encode()) for key in settings.RACKBENCH["ENCRYPTION_KEYS"]])


def encrypt(plaintext: str) -> str:
    return _fernet().encrypt(plaintext.encode()).decode()


def decrypt(token: str) -> str:
    try:
        return _fernet().decrypt(token.encode()).decode()
    except InvalidToken:
        raise DecryptionError(
            "a stored credential cannot be decrypted with RACKBENCH_ENCRYPTION_KEYS; was the key changed?"
        ) from None

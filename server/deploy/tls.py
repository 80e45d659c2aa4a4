"""HTTPS for ``serve``: the certificate and key from ``--tls-cert``/``--tls-key``.

Loaded before anything else starts, so a wrong path, a key that does not match the
certificate or an encrypted key fails at once with a sentence naming the flags, not a
traceback after the engines have loaded. Browsers give pages the microphone only on
``localhost`` or HTTPS, so any other address needs this (or a TLS-terminating proxy).
"""

from __future__ import annotations

import os
import ssl

from server.config import ENV_PREFIX, Settings, SettingsError

FLAGS = f"--tls-cert/--tls-key ({ENV_PREFIX}TLS_CERT/{ENV_PREFIX}TLS_KEY)"


def _no_passphrase() -> bytes:
    # Without a callback OpenSSL would prompt on the terminal and hang a service start.
    raise SettingsError(f"{FLAGS}: the key is encrypted; give an unencrypted PEM key")


def server_context(cert_path: str, key_path: str) -> ssl.SSLContext:
    """A server-side TLS context (TLS 1.2 or later) holding the certificate chain and key."""
    for flag, path in (("tls-cert", cert_path), ("tls-key", key_path)):
        if not os.path.isfile(path):
            variable = ENV_PREFIX + flag.replace("-", "_").upper()
            raise SettingsError(f"--{flag} ({variable}): {path} is not a file")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(cert_path, key_path, password=_no_passphrase)
    except OSError as exc:  # ssl.SSLError is an OSError: not PEM, or key and cert differ
        reason = getattr(exc, "reason", None) or exc.strerror or str(exc)
        raise SettingsError(
            f"{FLAGS}: cannot load them as a PEM certificate chain and its key ({reason})"
        ) from exc
    return context


def tls_context(settings: Settings) -> ssl.SSLContext | None:
    """The context to serve HTTPS with, or ``None`` for plain HTTP (no certificate given)."""
    if settings.tls_cert is None or settings.tls_key is None:
        return None
    return server_context(settings.tls_cert, settings.tls_key)

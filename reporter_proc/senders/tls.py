"""TLS settings shared by the network senders: what to trust, which certificate to show.

Every sender turns the same settings (``tls_ca_file``, ``tls_cert_file``, ``tls_key_file``,
``tls_server_name``, ``force_tls``) into its client's own form here or next to it. The rule
they share: a security setting is never ignored. A file that cannot be read, a key without
its certificate, or TLS options next to an explicit ``http://`` backend raise
:class:`SecurityConfigError` when the sender is built, so the reporter refuses to start
(exit status "configuration", no restart loop) instead of sending in the clear.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Sequence

from reporter_proc.settings import ReporterSettings, kafka_key

MASK = "****"
# SW_KAFKA_REPORTER_CONFIG_* values that are never logged, converted or shown.
KAFKA_SECRET_KEYS = frozenset({"sasl_plain_password", "ssl_password"})


class SecurityConfigError(ValueError):
    """A TLS or authentication setting the sender cannot honour; restarting will not help."""


def tls_requested(settings: ReporterSettings) -> bool:
    """TLS is on with SW_AGENT_FORCE_TLS or as soon as any TLS file or name is given.

    A CA file without FORCE_TLS would otherwise be silently unused: that is the downgrade
    this module exists to prevent.
    """
    return bool(
        settings.force_tls
        or settings.tls_ca_file
        or settings.tls_cert_file
        or settings.tls_key_file
        or settings.tls_server_name
    )


def check_no_plain_backend(backends: Sequence[str], what: str) -> None:
    """Refuse an explicit ``http://`` backend when TLS was asked for."""
    for backend in backends:
        if backend.strip().lower().startswith("http://"):
            raise SecurityConfigError(
                f"{what} backend {backend.strip()!r} says http:// but TLS is required "
                "(SW_AGENT_FORCE_TLS or a SW_AGENT_TLS_* setting): use https:// or host:port"
            )


def read_file(path: str, what: str) -> bytes:
    """The bytes of a certificate or key file, or a :class:`SecurityConfigError` saying why not."""
    try:
        with open(os.path.expanduser(path), "rb") as f:
            data = f.read()
    except OSError as exc:
        raise SecurityConfigError(f"cannot read the {what} {path!r}: {exc.strerror or exc}") from None
    if not data.strip():
        raise SecurityConfigError(f"the {what} {path!r} is empty")
    return data


def check_pair(cert_file: str, key_file: str, cert_setting: str, key_setting: str) -> None:
    """A client certificate needs its key and the other way round."""
    if bool(cert_file) != bool(key_file):
        missing, given = (key_setting, cert_setting) if cert_file else (cert_setting, key_setting)
        raise SecurityConfigError(f"{given} is set but {missing} is not: a client certificate needs both")


def client_context(
    *,
    ca_file: str = "",
    cert_file: str = "",
    key_file: str = "",
    key_password: str = "",
    crl_file: str = "",
    ciphers: str = "",
    check_hostname: bool = True,
    names: tuple[str, str, str] = ("SW_AGENT_TLS_CA_FILE", "SW_AGENT_TLS_CERT_FILE", "SW_AGENT_TLS_KEY_FILE"),
) -> ssl.SSLContext:
    """A verifying client context: the system's CAs, or only ``ca_file`` when given.

    ``names`` are the settings' names for the error messages (Kafka has its own).
    Certificates are always verified; ``check_hostname=False`` only skips the name match.
    """
    ca_name, cert_name, key_name = names
    check_pair(cert_file, key_file, cert_name, key_name)
    if not ca_file:
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    else:
        read_file(ca_file, f"CA file ({ca_name})")  # a clear message for a missing file
        # Only the given CA: a private CA must not widen to every public one.
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        try:
            context.load_verify_locations(cafile=os.path.expanduser(ca_file))
        except (ssl.SSLError, OSError) as exc:
            raise SecurityConfigError(
                f"{ca_name} {ca_file!r} holds no usable CA certificate: {exc}"
            ) from None
    if cert_file:
        read_file(cert_file, f"client certificate ({cert_name})")
        read_file(key_file, f"client key ({key_name})")
        try:
            context.load_cert_chain(
                os.path.expanduser(cert_file), os.path.expanduser(key_file), password=key_password or None
            )
        except (ssl.SSLError, OSError) as exc:
            raise SecurityConfigError(
                f"{cert_name} {cert_file!r} / {key_name} {key_file!r} do not load as a certificate and "
                f"its key: {exc}"
            ) from None
    if crl_file:
        read_file(crl_file, "CRL file")
        try:
            context.load_verify_locations(cafile=os.path.expanduser(crl_file))
        except (ssl.SSLError, OSError) as exc:
            raise SecurityConfigError(f"CRL file {crl_file!r} does not load: {exc}") from None
        context.verify_flags |= ssl.VERIFY_CRL_CHECK_LEAF
    if ciphers:
        try:
            context.set_ciphers(ciphers)
        except ssl.SSLError as exc:
            raise SecurityConfigError(f"cipher list {ciphers!r} selects no cipher: {exc}") from None
    context.check_hostname = check_hostname
    context.verify_mode = ssl.CERT_REQUIRED
    return context


def agent_context(settings: ReporterSettings) -> ssl.SSLContext:
    """The client context for HTTP from the SW_AGENT_TLS_* settings."""
    return client_context(
        ca_file=settings.tls_ca_file, cert_file=settings.tls_cert_file, key_file=settings.tls_key_file
    )


def has_secret(settings: ReporterSettings) -> bool:
    """True when the settings carry a credential (the token, a Kafka SASL or key password)."""
    return bool(settings.authentication) or any(
        value for key, value in settings.kafka_extra.items() if kafka_key(key) in KAFKA_SECRET_KEYS
    )

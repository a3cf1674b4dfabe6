"""aiokafka keyword arguments for a :class:`schemas.tls.KafkaSecurity`, and readable connection failures.

:func:`client_kwargs` gives ``security_protocol``, ``ssl_context`` (``aiokafka.helpers.create_ssl_context``: the
broker's certificate and host name are verified against ``ssl_cafile`` or the system's roots; ``ssl_certfile`` /
``ssl_keyfile`` add a client certificate) and ``sasl_mechanism`` / ``sasl_plain_username`` / ``sasl_plain_password``
(aiokafka's names, used for PLAIN and SCRAM alike). The password file is read when this is called.

aiokafka reports why a bootstrap connection failed (bad password, unknown CA, TLS to a plaintext port...) only in an
ERROR log line and then raises ``KafkaConnectionError("Unable to bootstrap ...")``. :func:`connect_failures`
collects those lines so a command-line tool can print the cause in its one-line error.

:func:`add_security_arguments` adds the command-line flags of the same names as the updater's keys (``embedgate
publish``, ``embedgate export --stream-cut auto``); :func:`security_from_args` builds the KafkaSecurity from them.
"""

from __future__ import annotations

import argparse
import logging
import os
import ssl
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from schemas.tls import KafkaSecurity, TLSFileError

__all__ = ["add_security_arguments", "client_kwargs", "connect_failures", "security_from_args"]


def client_kwargs(security: KafkaSecurity | None) -> dict[str, Any]:
    """Keyword arguments for ``AIOKafkaProducer`` / ``AIOKafkaConsumer`` / ``AIOKafkaAdminClient``; ``{}`` for
    None or PLAINTEXT. Raises ``TLSFileError`` naming a file that cannot be read or loaded."""
    if security is None or security.security_protocol == "PLAINTEXT":
        return {}
    from aiokafka.helpers import create_ssl_context

    out: dict[str, Any] = {"security_protocol": security.security_protocol}
    if security.uses_ssl:
        try:
            out["ssl_context"] = create_ssl_context(
                cafile=security.ssl_cafile, certfile=security.ssl_certfile, keyfile=security.ssl_keyfile
            )
        except (OSError, ssl.SSLError) as exc:
            files = [str(p) for p in (security.ssl_cafile, security.ssl_certfile, security.ssl_keyfile) if p]
            raise TLSFileError(f"ssl_cafile/ssl_certfile/ssl_keyfile {files}: cannot load: {exc}") from exc
    if security.uses_sasl:
        out |= {
            "sasl_mechanism": security.sasl_mechanism,
            "sasl_plain_username": security.sasl_username,
            "sasl_plain_password": security.password(),
        }
    return out


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith("Unable connect to"):
            self.messages.append(record.getMessage())


@contextmanager
def connect_failures() -> Iterator[list[str]]:
    """While inside, aiokafka's "Unable connect to <host:port>: <cause>" log lines are appended to the yielded list
    (they are still logged as usual)."""
    handler = _Collect()
    logger = logging.getLogger("aiokafka")  # aiokafka's client logs under this name
    logger.addHandler(handler)
    try:
        yield handler.messages
    finally:
        logger.removeHandler(handler)


def add_security_arguments(parser: argparse.ArgumentParser) -> None:
    """The Kafka security flags (``--security-protocol``, ``--sasl-*``, ``--ssl-*``) as one argument group."""
    sec = parser.add_argument_group("Kafka security (as the updater's keys of the same names)")
    sec.add_argument(
        "--security-protocol",
        choices=["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"],
        default="PLAINTEXT",
        help="Kafka security.protocol (default PLAINTEXT)",
    )
    sec.add_argument(
        "--sasl-mechanism",
        choices=["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"],
        default="PLAIN",
        help="SASL mechanism for SASL_* protocols (default PLAIN)",
    )
    sec.add_argument("--sasl-username", default=None, help="SASL user")
    sec.add_argument(
        "--sasl-password-file",
        type=Path,
        default=None,
        help="file holding the SASL password (else the EMBEDGATE_SASL_PASSWORD environment variable)",
    )
    sec.add_argument(
        "--ssl-cafile", type=Path, default=None, help="PEM CA bundle that signed the broker's cert"
    )
    sec.add_argument("--ssl-certfile", type=Path, default=None, help="PEM client certificate (mTLS brokers)")
    sec.add_argument("--ssl-keyfile", type=Path, default=None, help="PEM private key of --ssl-certfile")


def security_from_args(args: argparse.Namespace) -> KafkaSecurity:
    """A KafkaSecurity from the flags of :func:`add_security_arguments` (ValueError with the problems, one line)."""
    from pydantic import SecretStr, ValidationError

    sasl = args.security_protocol.startswith("SASL_")
    password = os.environ.get("EMBEDGATE_SASL_PASSWORD") if sasl and args.sasl_password_file is None else None
    try:
        return KafkaSecurity(
            security_protocol=args.security_protocol,
            sasl_mechanism=args.sasl_mechanism,
            sasl_username=args.sasl_username,
            sasl_password=None if password is None else SecretStr(password),
            sasl_password_file=args.sasl_password_file,
            ssl_cafile=args.ssl_cafile,
            ssl_certfile=args.ssl_certfile,
            ssl_keyfile=args.ssl_keyfile,
        )
    except ValidationError as exc:
        problems = [
            f"--{str(e['loc'][0]).replace('_', '-')}: {e['msg']}"
            if e["loc"]
            else str(e["msg"]).removeprefix("Value error, ")
            for e in exc.errors()
        ]
        raise ValueError("; ".join(problems)) from None

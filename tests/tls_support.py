"""A throw-away PKI for TLS tests, made with the ``openssl`` command at test time.

:func:`make_pki` writes into a directory (PEM files, plus a PKCS12 keystore for Java
servers such as the Kafka broker):

* ``ca.pem`` / ``ca.key``: the test CA; ``otherca.pem``: a CA that signed nothing we serve;
* ``server.pem`` / ``server.key``: for ``localhost`` and ``127.0.0.1`` (serverAuth);
* ``named.pem`` / ``named.key``: only for ``collector.test`` (server-name override tests);
* ``client.pem`` / ``client.key``: a client certificate (clientAuth) for mutual TLS;
* ``server.p12``: server key + chain, password :data:`KEYSTORE_PASSWORD`.

EC P-256 keys keep generation fast (a few hundred ms for the whole set).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from reporter_proc.settings import ReporterSettings

KEYSTORE_PASSWORD = "swmp-test-keystore"
SERVER_NAME = "collector.test"


@dataclass(frozen=True)
class Pki:
    dir: Path

    def __getattr__(self, name: str) -> Path:
        # pki.ca -> ca.pem, pki.server_key -> server.key, pki.server_p12 -> server.p12
        stem, _, ext = name.partition("_")
        return self.dir / f"{stem}.{ext or 'pem'}"


def _openssl(*args: str, cwd: Path) -> None:
    proc = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(args)} failed: {proc.stderr.strip()}")


def _new_key(name: str, cwd: Path) -> None:
    _openssl(
        "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", f"{name}.key", cwd=cwd
    )


def _ca(name: str, cwd: Path) -> None:
    _new_key(name, cwd)
    _openssl(
        "req",
        "-x509",
        "-new",
        "-key",
        f"{name}.key",
        "-out",
        f"{name}.pem",
        "-days",
        "3",
        "-subj",
        f"/CN=swmp {name}",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
        cwd=cwd,
    )


def _leaf(name: str, san: str, usage: str, cwd: Path) -> None:
    _new_key(name, cwd)
    _openssl(
        "req", "-new", "-key", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN=swmp {name}", cwd=cwd
    )
    ext = cwd / f"{name}.ext"
    lines = [f"extendedKeyUsage={usage}", "basicConstraints=CA:FALSE"]
    if san:
        lines.append(f"subjectAltName={san}")
    ext.write_text("\n".join(lines) + "\n")
    _openssl(
        "x509",
        "-req",
        "-in",
        f"{name}.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        f"{name}.pem",
        "-days",
        "3",
        "-extfile",
        ext.name,
        cwd=cwd,
    )


def make_pki(directory: Path) -> Pki:
    """Create the CA, certificates and keystore described above in ``directory``."""
    if shutil.which("openssl") is None:
        pytest.fail(
            "TLS tests need the `openssl` command (Debian: apt-get install -y openssl)", pytrace=False
        )
    directory.mkdir(parents=True, exist_ok=True)
    _ca("ca", directory)
    _ca("otherca", directory)
    _leaf("server", "DNS:localhost,IP:127.0.0.1", "serverAuth", directory)
    _leaf("named", f"DNS:{SERVER_NAME}", "serverAuth", directory)
    _leaf("client", "", "clientAuth", directory)
    _openssl(
        "pkcs12",
        "-export",
        "-in",
        "server.pem",
        "-inkey",
        "server.key",
        "-certfile",
        "ca.pem",
        "-name",
        "server",
        "-out",
        "server.p12",
        "-passout",
        f"pass:{KEYSTORE_PASSWORD}",
        cwd=directory,
    )
    for key in directory.glob("*.key"):
        key.chmod(0o600)
    return Pki(directory)


def start_reporter(
    arena_path: str, settings: ReporterSettings, directory: Path, name: str, owner_pid: int = 0
) -> tuple[subprocess.Popen[bytes], Path]:
    """The real reporter (``python -m reporter_proc``, no supervisor) draining ``arena_path``
    for ``owner_pid`` (the master whose end it waits for at a stop; default: this process).

    Its settings, secrets included, go through a 0600 file (never the command line); its
    output (INFO and up) goes to the returned file, for tests that check what it says.
    """
    from reporter_proc.process import settings_to_json
    from tests import test_cli_support as support

    settings_file = directory / f"{name}.settings.json"
    settings_file.touch(mode=0o600)
    settings_file.write_text(settings_to_json(settings))
    output = directory / f"{name}.stderr"
    with open(output, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "reporter_proc", "--arena", arena_path,
             "--owner-pid", str(owner_pid or os.getpid()), "--settings-file", str(settings_file),
             "--no-supervise", "--log-level", "INFO"],
            cwd=support.REPO, env=support.env(), stdin=subprocess.DEVNULL, stdout=out, stderr=out,
        )  # fmt: skip
    return proc, output

"""Kafka security against a real broker with a SASL_SSL listener (PEM key store, SASL PLAIN and SCRAM users), and the
whole write path secured: publish over SASL_SSL -> updater over SASL_SSL -> mTLS to serve-local (client_verify) ->
the gateway's https predict with client certificates.

Certificates are made at test time (tests/support/certs.py); the broker is this module's own (one start).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
import yaml
from pydantic import ValidationError

from schemas.manifest import ps_model_name
from schemas.partition import shard_for
from schemas.tls import KafkaSecurity, TLSFileError
from tests.support.certs import TlsFiles, client_context, make_certs, ssl_config_text
from tests.support.kafka import Broker, SecureListener, kafka_broker
from tests.updater.conftest import PsCluster
from tests.updater.harness import (
    demo_row,
    eventually,
    predict_one,
    running,
    tls_closes_settled,
    updater_settings,
)
from tests.updater.psmodel import lookup
from updater.kafka_security import client_kwargs
from updater.producer import DeltaPublisher

_REPO = Path(__file__).resolve().parents[2]
UPDATER, UPDATER_PW = "updater", "updater-pw-1"
TRAINER, TRAINER_PW = "trainer", "trainer-pw-2"


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    return make_certs(tmp_path_factory.mktemp("kafka-certs"), client_name="embedgate-updater")


@pytest.fixture(scope="module")
def sasl_kafka(certs: TlsFiles, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    listener = SecureListener(
        "SASL_SSL", certs.server_cert, certs.server_key, users={UPDATER: UPDATER_PW, TRAINER: TRAINER_PW}
    )
    with kafka_broker(tmp_path_factory.mktemp("kafka-sasl"), secure=listener) as broker:
        yield broker


def _security(
    certs: TlsFiles, mechanism: str, user: str = UPDATER, password: str = UPDATER_PW
) -> dict[str, Any]:
    return {
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": mechanism,
        "sasl_username": user,
        "sasl_password": password,
        "ssl_cafile": str(certs.ca_cert),
    }


def _publish_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    import os

    return subprocess.run(
        [sys.executable, "-m", "embedgate", "publish", *args],
        cwd=_REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, **(env or {})},
    )


def _sasl_flags(
    broker: Broker, certs: TlsFiles, password_file: Path, mechanism: str = "SCRAM-SHA-256"
) -> list[str]:
    return [
        "--bootstrap",
        broker.secure_bootstrap,
        "--security-protocol",
        "SASL_SSL",
        "--sasl-mechanism",
        mechanism,
        "--sasl-username",
        TRAINER,
        "--sasl-password-file",
        str(password_file),
        "--ssl-cafile",
        str(certs.ca_cert),
    ]


# -- settings and client options (no broker) ------------------------------------------------------------------------
def test_security_settings_are_checked(certs: TlsFiles, tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="SASL_SSL needs sasl_username"):
        KafkaSecurity(security_protocol="SASL_SSL")
    with pytest.raises(ValidationError, match="exactly one of sasl_password, sasl_password_file"):
        KafkaSecurity(security_protocol="SASL_PLAINTEXT", sasl_username="u")
    with pytest.raises(ValidationError, match="only used with SASL_PLAINTEXT or SASL_SSL, not SSL"):
        KafkaSecurity(security_protocol="SSL", sasl_username="u", sasl_password="p")  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="only used with SSL or SASL_SSL, not PLAINTEXT"):
        KafkaSecurity(ssl_cafile=certs.ca_cert)
    with pytest.raises(ValidationError, match="sasl_mechanism"):
        KafkaSecurity(
            security_protocol="SASL_SSL", sasl_mechanism="GSSAPI", sasl_username="u", sasl_password="p"
        )  # type: ignore[arg-type]
    secret = KafkaSecurity(security_protocol="SASL_SSL", sasl_username="u", sasl_password="hunter2")  # type: ignore[arg-type]
    assert "hunter2" not in repr(secret) and "hunter2" not in json.dumps(secret.model_dump(mode="json"))
    pw = tmp_path / "pw"
    pw.write_text("  s3cret \n")
    from_file = KafkaSecurity(security_protocol="SASL_PLAINTEXT", sasl_username="u", sasl_password_file=pw)
    assert from_file.password() == "s3cret"
    pw.write_text("\n")
    with pytest.raises(TLSFileError, match="sasl_password_file .*: empty"):
        from_file.password()


def test_client_kwargs(certs: TlsFiles) -> None:
    assert client_kwargs(None) == {}
    assert client_kwargs(KafkaSecurity()) == {}
    sasl = client_kwargs(
        KafkaSecurity(
            security_protocol="SASL_PLAINTEXT",
            sasl_mechanism="SCRAM-SHA-512",
            sasl_username="u",
            sasl_password="p",
        )  # type: ignore[arg-type]
    )
    assert sasl == {
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": "u",
        "sasl_plain_password": "p",
    }
    tls = client_kwargs(
        KafkaSecurity(
            security_protocol="SSL",
            ssl_cafile=certs.ca_cert,
            ssl_certfile=certs.client_cert,
            ssl_keyfile=certs.client_key,
        )
    )
    ctx = tls["ssl_context"]
    assert tls["security_protocol"] == "SSL"
    assert ctx.verify_mode == ssl.CERT_REQUIRED and ctx.check_hostname
    with pytest.raises(TLSFileError, match="cannot load"):
        client_kwargs(KafkaSecurity(security_protocol="SSL", ssl_cafile=certs.client_key))


@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        (["--security-protocol", "SASL_SSL"], "needs sasl_username"),
        (["--security-protocol", "SASL_SSL", "--sasl-username", "u"], "exactly one of sasl_password"),
        (
            ["--ssl-cafile", "{tmp}/absent.pem", "--security-protocol", "SSL"],
            "--ssl-cafile: Path does not point",
        ),
        (["--ssl-cafile", "{ca}"], "only used with SSL or SASL_SSL"),
        (["--security-protocol", "SSL", "--ssl-cafile", "{key}"], "client.key']: cannot load"),
    ],
)
def test_publish_flag_errors_exit_2(certs: TlsFiles, tmp_path: Path, flags: list[str], needle: str) -> None:
    model = tmp_path / "m"
    model.mkdir()
    from tests.updater.test_producer import MANIFEST

    (model / "manifest.json").write_text(MANIFEST.dumps())
    args = [f.format(tmp=tmp_path, ca=certs.ca_cert, key=certs.client_key) for f in flags]
    proc = _publish_cli("--manifest", str(model), "--table", "item", "--id", "1", "--fill", "1", *args)
    assert proc.returncode == 2, proc.stderr
    assert needle in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


# -- a real SASL_SSL broker --------------------------------------------------------------------------------------------
@pytest.mark.integration
async def test_publish_and_updater_over_sasl_ssl(
    sasl_kafka: Broker, ps_cluster: PsCluster, certs: TlsFiles, unique: str, tmp_path: Path
) -> None:
    """publish (CLI, SCRAM-SHA-256, password file) and the updater (SCRAM-SHA-512 consumer, DLQ producer, admin)
    over SASL_SSL only: the rows reach every PS replica."""
    ids = np.asarray([700_001, 700_002, 700_003], dtype=np.int64)
    pw = tmp_path / "trainer.pw"
    pw.write_text(TRAINER_PW + "\n")
    s = updater_settings(sasl_kafka, ps_cluster, unique, bootstrap_servers=sasl_kafka.secure_bootstrap)
    s.update(_security(certs, "SCRAM-SHA-512"))
    async with running(s):
        proc = await asyncio.to_thread(
            _publish_cli,
            *_sasl_flags(sasl_kafka, certs, pw),
            "--topic",
            s["topics"][0],
            "--manifest",
            str(ps_cluster.model_dir),
            "--table",
            "item",
            *[a for i in ids for a in ("--id", str(i))],
            "--fill",
            "7.5",
        )
        assert proc.returncode == 0, proc.stderr
        assert "published 3 rows of emb.item" in proc.stdout

        async def applied() -> bool:
            for i in ids:
                shard = int(shard_for(np.asarray([i]), 2)[0])
                for target in ps_cluster.replicas(shard):
                    row = await asyncio.to_thread(
                        lookup, target, ps_model_name("emb", shard), ps_cluster.manifest, "item", [i]
                    )
                    if not np.allclose(row, 7.5):
                        return False
            return True

        await eventually(applied, 30, "rows published over SASL_SSL applied on every replica")


@pytest.mark.integration
async def test_delta_publisher_api_over_sasl_ssl_plain(
    sasl_kafka: Broker, certs: TlsFiles, unique: str
) -> None:
    from tests.updater.test_producer import MANIFEST

    security = KafkaSecurity.model_validate(_security(certs, "PLAIN", TRAINER, TRAINER_PW))
    async with DeltaPublisher(
        sasl_kafka.secure_bootstrap, topic=f"{unique}.deltas", security=security
    ) as pub:
        result = await pub.publish(MANIFEST, "item", [1, 2], np.ones((2, 4), np.float32))
    await tls_closes_settled()
    assert result.rows == 2


@pytest.mark.integration
@pytest.mark.parametrize(
    "case", ["wrong-password", "unknown-user", "untrusted-broker-ca", "plaintext-client"]
)
def test_publish_connection_failures_are_one_clear_line(
    sasl_kafka: Broker, ps_cluster: PsCluster, certs: TlsFiles, tmp_path: Path, case: str
) -> None:
    pw = tmp_path / "pw"
    pw.write_text("not-the-password\n" if case == "wrong-password" else TRAINER_PW)
    flags = _sasl_flags(sasl_kafka, certs, pw, mechanism="PLAIN")
    needle = "Authentication failed"
    if case == "unknown-user":
        flags[flags.index(TRAINER)] = "mallory"
    elif case == "untrusted-broker-ca":
        flags[flags.index(str(certs.ca_cert))] = str(certs.rogue_ca_cert)
        needle = "CERTIFICATE_VERIFY_FAILED"
    elif case == "plaintext-client":
        flags = ["--bootstrap", sasl_kafka.secure_bootstrap]
        needle = "Unable to bootstrap"
    proc = _publish_cli(
        *flags, "--manifest", str(ps_cluster.model_dir), "--table", "item", "--id", "5", "--fill", "1"
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stderr.startswith(f"embedgate publish: Kafka at {sasl_kafka.secure_bootstrap}: "), proc.stderr
    assert needle in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr  # one line: no traceback, no warnings
    assert "not-the-password" not in proc.stderr and TRAINER_PW not in proc.stderr


@pytest.mark.integration
def test_updater_wrong_password_is_a_clear_error(
    sasl_kafka: Broker, ps_cluster: PsCluster, certs: TlsFiles, tmp_path: Path, unique: str
) -> None:
    s = updater_settings(sasl_kafka, ps_cluster, unique, bootstrap_servers=sasl_kafka.secure_bootstrap)
    s.update(_security(certs, "SCRAM-SHA-256", password="wrong-password"))
    cfg = tmp_path / "updater.yaml"
    cfg.write_text(yaml.safe_dump(s))
    proc = subprocess.run(
        [sys.executable, "-m", "embedgate", "updater", "--config", str(cfg)],
        cwd=_REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 1, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"embedgate updater: Kafka at {sasl_kafka.secure_bootstrap}: "), proc.stderr
    assert "Authentication failed" in last, proc.stderr
    assert "Traceback" not in proc.stderr and "wrong-password" not in proc.stderr


# -- everything secured, end to end ---------------------------------------------------------------------------------
@pytest.mark.integration
async def test_secured_write_path_end_to_end(
    sasl_kafka: Broker, demo_artifacts: Any, certs: TlsFiles, tmp_path: Path, unique: str
) -> None:
    """serve-local with client_verify (entry + PS), the gateway with https + client certificates on REST and mTLS to
    the backends, the updater over SASL_SSL with mTLS to the PS: a published row changes the prediction, and a gRPC
    client without a certificate cannot write to the PS."""
    from tests.support.gateway import run_gateway
    from tests.support.servers import serve_local
    from tests.support.stack import embedding_model, exported_backends

    row = demo_row(demo_artifacts)
    manifest, table, instance, the_id = row.manifest, row.table, row.instance, row.the_id
    name = manifest.model_name
    served = exported_backends(demo_artifacts.model_dir)
    ssl_file = tmp_path / "ssl.config"
    ssl_file.write_text(ssl_config_text(certs, client_verify=True), encoding="utf-8")
    creds = grpc.ssl_channel_credentials(
        certs.pem("ca_cert"), certs.pem("client_key"), certs.pem("client_cert")
    )
    backend_tls = {
        "ca_file": str(certs.ca_cert),
        "cert_file": str(certs.client_cert),
        "key_file": str(certs.client_key),
    }

    with contextlib.ExitStack() as stack:
        server = await asyncio.to_thread(
            stack.enter_context,
            serve_local(served, extra_args=[f"--ssl_config_file={ssl_file}"], credentials=creds),
        )
        model = embedding_model(
            demo_artifacts.model_dir, entry=server.target, shards=[[server.target]] * manifest.num_shards
        )
        cfg = tmp_path / "gateway.yaml"
        rest_tls = {
            "cert_file": str(certs.server_cert),
            "key_file": str(certs.server_key),
            "client_ca_file": str(certs.ca_cert),
        }
        cfg.write_text(yaml.safe_dump({"models": [model], "tls": rest_tls, "backend_tls": backend_tls}))
        gw = await asyncio.to_thread(
            stack.enter_context, run_gateway(cfg, https={"verify": client_context(certs)})
        )
        url = f"{gw.url}/v1/models/{name}:predict"

        # the PS write path refuses a client without a certificate
        shard = int(shard_for(np.asarray([the_id]), manifest.num_shards)[0])
        with pytest.raises(grpc.RpcError) as refused:
            await asyncio.to_thread(
                lookup, server.target, ps_model_name(name, shard), manifest, table.name, [the_id]
            )
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE

        s = updater_settings(
            sasl_kafka, None, unique, models=[model], bootstrap_servers=sasl_kafka.secure_bootstrap
        )
        s.update(_security(certs, "SCRAM-SHA-256"), backend_tls=backend_tls)
        security = KafkaSecurity.model_validate(_security(certs, "SCRAM-SHA-512", TRAINER, TRAINER_PW))
        async with httpx.AsyncClient(verify=client_context(certs), timeout=10) as client, running(s):
            before = await predict_one(client, url, instance)
            async with DeltaPublisher(
                sasl_kafka.secure_bootstrap, topic=s["topics"][0], security=security
            ) as pub:
                await pub.publish(manifest, table.name, [the_id], np.full((1, table.dim), 3.0, np.float32))
            after = before

            async def changed() -> bool:
                nonlocal after
                after = await predict_one(client, url, instance)
                return not np.allclose(after, before)

            await eventually(changed, 30, f"prediction change after publishing {table.name}[{the_id}]")


@pytest.mark.integration
async def test_export_stream_cut_over_sasl_ssl(sasl_kafka: Broker, certs: TlsFiles, unique: str) -> None:
    """``embedgate export --stream-cut auto`` reads end offsets with the same security settings as publish."""
    from embedgate.export.streamcut import read_stream_cut
    from tests.updater.test_producer import MANIFEST

    security = KafkaSecurity.model_validate(_security(certs, "PLAIN", TRAINER, TRAINER_PW))
    topic = f"{unique}.deltas"
    async with DeltaPublisher(sasl_kafka.secure_bootstrap, topic=topic, security=security) as pub:
        result = await pub.publish(MANIFEST, "item", np.arange(10), np.ones((10, 4), np.float32))
        partitions = await pub.partitions(topic)
    cut, missing = await read_stream_cut(
        sasl_kafka.secure_bootstrap, [topic, f"{unique}.absent"], security=security
    )
    await tls_closes_settled()
    assert missing == [f"{unique}.absent"]
    assert set(cut) == {f"{topic}:{p}" for p in range(partitions)}
    assert sum(cut.values()) == result.messages  # a new topic: its end offsets count the messages published

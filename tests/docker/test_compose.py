"""The production compose stack is consistent: every file it mounts parses as what its reader expects."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.deploy.tools import ROOT, parse_monitoring_config, run, tool

DOCKER = Path(__file__).resolve().parents[2] / "docker"


def _compose() -> dict:
    return yaml.safe_load((DOCKER / "compose.yaml").read_text())


def test_tf_serving_model_configs_parse_as_model_server_config() -> None:
    pytest.importorskip("tensorflow_serving")
    from google.protobuf import text_format
    from tensorflow_serving.config import model_server_config_pb2

    served: set[str] = set()
    for name in ("entry.config", "ps_even.config", "ps_odd.config"):
        config = text_format.Parse(
            (DOCKER / "config" / name).read_text(), model_server_config_pb2.ModelServerConfig()
        )
        for model in config.model_config_list.config:
            assert model.base_path.startswith("/models/demo/")
            assert model.model_version_policy.latest.num_versions == 2, name  # docs/export.md, full re-export
            served.add(model.name)
    assert served == {"demo_entry", "demo_ps_0", "demo_ps_1"}


def test_every_tf_serving_service_reads_a_config_that_exists() -> None:
    services = _compose()["services"]
    for name, service in services.items():
        if not name.startswith("serving-"):
            continue
        for opt in ("--model_config_file=", "--monitoring_config_file="):
            flag = next(part for part in service["command"].split() if part.startswith(opt))
            assert (DOCKER / "config" / Path(flag.split("=", 1)[1]).name).exists(), name


def test_ps_hosts_are_not_published_to_clients() -> None:
    services = _compose()["services"]
    for name, service in services.items():
        if name.startswith("serving-"):
            assert "ports" not in service, f"{name} must not be reachable by clients"
    assert _compose()["networks"]["backend"]["internal"] is True


def test_gateway_and_updater_configs_validate() -> None:
    from schemas.gateway_settings import GatewaySettings
    from schemas.updater_settings import UpdaterSettings

    gateway = GatewaySettings(**yaml.safe_load((DOCKER / "config" / "gateway.yaml").read_text()))
    updater = UpdaterSettings(**yaml.safe_load((DOCKER / "config" / "updater.yaml").read_text()))
    for settings in (gateway, updater):
        (model,) = settings.models
        assert model.served_entry_name == "demo_entry"
        assert [s.replicas for s in model.shards] == [["serving-ps-even:8500"], ["serving-ps-odd:8500"]]


def test_compose_file_loads_with_the_compose_spec_loader() -> None:
    proc = run([tool("deploycheck"), "compose", DOCKER / "compose.yaml"])
    assert proc.returncode == 0, proc.stderr
    assert "valid compose project with 6 services" in proc.stdout


def test_compose_loader_rejects_what_docker_compose_would() -> None:
    bad = (
        (DOCKER / "compose.yaml")
        .read_text()
        .replace("stop_grace_period: 60s", "stop_grace_period: 60s\n    stop_grace_periods: 60s", 1)
    )
    path = DOCKER / ".compose-invalid.yaml"  # beside the real one: relative paths resolve the same way
    path.write_text(bad)
    try:
        proc = run([tool("deploycheck"), "compose", path])
    finally:
        path.unlink()
    assert proc.returncode != 0 and "stop_grace_periods" in proc.stderr, proc.stderr


def test_images_are_pinned_and_every_service_has_a_healthcheck() -> None:
    compose = _compose()
    for name, service in compose["services"].items():
        image = service["image"].replace("${TF_SERVING_TAG:-", "").rstrip("}")
        assert ":" in image and not image.endswith(":latest"), (
            f"{name}: image {service['image']} is not pinned"
        )
        assert "healthcheck" in service, f"{name} has no healthcheck"
    for dockerfile in ("Dockerfile", "Dockerfile.export"):
        text = (DOCKER / dockerfile).read_text()
        base = next(line.split()[1] for line in text.splitlines() if line.startswith("FROM "))
        assert base.count(".") >= 2, f"{dockerfile}: base image {base} is not pinned to a patch release"
        users = [line.split()[1] for line in text.splitlines() if line.startswith("USER ")]
        assert users and users[-1] not in ("0", "root"), f"{dockerfile} runs as root"


def test_gateway_waits_for_healthy_backends_and_kafka_has_an_external_listener() -> None:
    services = _compose()["services"]
    for dependent in ("gateway", "updater"):
        for dep, cond in services[dependent]["depends_on"].items():
            assert cond == {"condition": "service_healthy"}, (dependent, dep)
    env = services["kafka"]["environment"]
    advertised = dict(item.split("://", 1) for item in env["KAFKA_ADVERTISED_LISTENERS"].split(","))
    assert advertised["INTERNAL"] == "kafka:9092"
    host_port = advertised["EXTERNAL"]
    assert f"{host_port}:{host_port.rsplit(':', 1)[1]}" in services["kafka"]["ports"]
    networks = _compose()["networks"]
    assert any(not networks[n].get("internal") for n in services["kafka"]["networks"]), (
        "host cannot reach kafka"
    )
    assert sorted(services["gateway"]["ports"]) == ["8500:8500", "8501:8501"]


def test_monitoring_config_parses_as_tf_serving_monitoring_config() -> None:
    config = parse_monitoring_config((DOCKER / "config" / "monitoring.config").read_text())
    assert config.prometheus_config.enable
    assert config.prometheus_config.path == "/monitoring/prometheus/metrics"


def test_docker_build_context_excludes_everything_but_the_sources() -> None:
    rules = [line for line in (ROOT / ".dockerignore").read_text().splitlines() if line and line[0] != "#"]
    assert rules[0] == "**", "the context must start from nothing (a .venv is gigabytes)"
    allowed = {r[1:].rstrip("/") for r in rules if r.startswith("!")}
    for dockerfile in ("Dockerfile", "Dockerfile.export"):
        for line in (DOCKER / dockerfile).read_text().splitlines():
            if line.startswith("COPY ") and not line.startswith("COPY --from="):  # --from: another stage's
                for src in line.split()[1:-1]:
                    assert src in allowed, f"{dockerfile} copies {src}, which .dockerignore excludes"


def test_gateway_config_serves_the_ports_compose_publishes() -> None:
    from schemas.gateway_settings import GatewaySettings

    gateway = GatewaySettings(**yaml.safe_load((DOCKER / "config" / "gateway.yaml").read_text()))
    published = {p.split(":")[-1] for p in _compose()["services"]["gateway"]["ports"]}
    assert published == {str(gateway.port), str(gateway.grpc_port)} == {"8500", "8501"}


def test_the_gateway_image_builds_and_installs_the_native_module() -> None:
    """docker/Dockerfile's first stage builds native/ into a wheel from Cargo.lock and the image installs it, so
    production runs the native path (the build itself needs a Docker engine; ``make install`` builds the same crate
    from the same lock file)."""
    stages: list[list[str]] = []
    for line in (DOCKER / "Dockerfile").read_text().splitlines():
        if line.startswith("FROM "):
            stages.append([])
        if stages:
            stages[-1].append(line)
    assert len(stages) == 2, "a build stage for native/, then the image"
    build, image = ("\n".join(stage) for stage in stages)
    assert build.splitlines()[0].endswith(" AS native")
    assert "COPY native ./native" in build
    assert "maturin build --release --locked --manifest-path native/Cargo.toml --out /wheels" in build
    assert (ROOT / "native" / "Cargo.lock").exists()
    assert "COPY --from=native /wheels /wheels" in image
    assert "pip install /wheels/*.whl ." in image
    assert "rust" not in image.splitlines()[0], "the toolchain stays in the build stage"

"""The production compose stack is consistent: every file it mounts parses as what its reader expects."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

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
            served.add(model.name)
    assert served == {"demo_entry", "demo_ps_0", "demo_ps_1"}


def test_every_tf_serving_service_reads_a_config_that_exists() -> None:
    services = _compose()["services"]
    for name, service in services.items():
        if not name.startswith("serving-"):
            continue
        flag = next(part for part in service["command"].split() if part.startswith("--model_config_file="))
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

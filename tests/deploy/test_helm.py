"""deploy/helm/embedgate: lints, renders, validates against the Kubernetes API types, and its configs are ours."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from schemas.gateway_settings import GatewaySettings
from schemas.updater_settings import UpdaterSettings
from tests.deploy.tools import (
    CHART,
    KUBE_VERSION,
    by_kind,
    helm_template,
    model_status_server,
    parse_monitoring_config,
    probe_passes,
    render,
    run,
    tool,
)

VARIANTS = {
    "defaults": [],
    "strimzi and service monitors": ["kafka.strimzi.enabled=true", "metrics.serviceMonitor.enabled=true"],
    "no autoscaling, no network policy, host path": [
        "gateway.autoscaling.enabled=false",
        "networkPolicy.enabled=false",
        "models.hostPath=/srv/models",
    ],
}


def test_chart_lints_strictly() -> None:
    proc = run([tool("helm"), "lint", CHART, "--strict", "--kube-version", KUBE_VERSION])
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_chart_renders_and_lints_as_shipped_with_no_flags() -> None:
    """The Helm `make deploy-tools` builds assumes Kubernetes v1.20.0 when not told otherwise (no version ldflags):
    the chart's kubeVersion admits it, `helm lint` reports nothing above INFO, and what renders is valid."""
    lint = run([tool("helm"), "lint", CHART, "--strict"])
    assert lint.returncode == 0, lint.stdout + lint.stderr
    assert "[WARNING]" not in lint.stdout and "[ERROR]" not in lint.stdout, lint.stdout
    proc = run([tool("helm"), "template", CHART])
    assert proc.returncode == 0, proc.stderr
    check = run([tool("deploycheck"), "k8s"], stdin=proc.stdout)
    assert check.returncode == 0, check.stdout + check.stderr
    hpa = next(d for d in yaml.safe_load_all(proc.stdout) if d and d["kind"] == "HorizontalPodAutoscaler")
    assert hpa["apiVersion"] == "autoscaling/v2"


@pytest.mark.parametrize("sets", VARIANTS.values(), ids=list(VARIANTS))
def test_rendered_objects_validate_against_the_kubernetes_api(sets: list[str]) -> None:
    proc = helm_template(*sets)
    assert proc.returncode == 0, proc.stderr
    check = run([tool("deploycheck"), "k8s"], stdin=proc.stdout)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "objects valid" in check.stdout


def test_deploycheck_rejects_an_unknown_field_and_a_wrong_type() -> None:
    proc = helm_template()
    bad_field = proc.stdout.replace(
        "podManagementPolicy: Parallel", "podManagementPolicy: Parallel\n  replica: 3", 1
    )
    assert bad_field != proc.stdout
    out = run([tool("deploycheck"), "k8s"], stdin=bad_field)
    assert out.returncode != 0 and 'unknown field "spec.replica"' in out.stderr, out.stderr
    bad_type = proc.stdout.replace("podManagementPolicy: Parallel", "podManagementPolicy: [Parallel]", 1)
    out = run([tool("deploycheck"), "k8s"], stdin=bad_type)
    assert out.returncode != 0 and "StatefulSet" in out.stderr, out.stderr


def test_gateway_and_updater_configs_are_valid_settings_and_name_every_ps_pod() -> None:
    docs = render("ps.replicas=3")
    maps = by_kind(docs, "ConfigMap")
    gateway = GatewaySettings(**yaml.safe_load(maps["r-embedgate-gateway"]["data"]["gateway.yaml"]))
    updater = UpdaterSettings(**yaml.safe_load(maps["r-embedgate-updater"]["data"]["updater.yaml"]))
    assert gateway.port == 8501 and gateway.host == "0.0.0.0"
    for settings in (gateway, updater):
        (model,) = settings.models
        assert model.entry == "r-embedgate-entry:8500"
        assert [len(s.replicas) for s in model.shards] == [3, 3]
        assert model.shards[1].replicas[2] == "r-embedgate-ps-odd-2.r-embedgate-ps-odd.default.svc:8500"
    sets = by_kind(docs, "StatefulSet")
    assert {n: s["spec"]["replicas"] for n, s in sets.items()} == {
        "r-embedgate-ps-even": 3,
        "r-embedgate-ps-odd": 3,
    }
    # the headless Service of each PS host gives every pod the DNS name the configs use
    services = by_kind(docs, "Service")
    for name, sts in sets.items():
        assert sts["spec"]["serviceName"] == name and services[name]["spec"]["clusterIP"] == "None"


def test_tf_serving_configs_parse_and_place_each_shard_where_ps_hosts_say() -> None:
    pytest.importorskip("tensorflow_serving")
    from google.protobuf import text_format
    from tensorflow_serving.config import model_server_config_pb2

    docs = render(
        "model.shards=4",
        "psHosts[0].name=a",
        "psHosts[0].shards={0,2,3}",
        "psHosts[1].name=b",
        "psHosts[1].shards={1,3}",
    )
    data = by_kind(docs, "ConfigMap")["r-embedgate-tfserving"]["data"]
    served = {}
    for key in ("entry.config", "ps-a.config", "ps-b.config"):
        config = text_format.Parse(data[key], model_server_config_pb2.ModelServerConfig())
        served[key] = [(c.name, c.base_path) for c in config.model_config_list.config]
        assert all(c.model_version_policy.latest.num_versions == 2 for c in config.model_config_list.config)
    assert served["entry.config"] == [("demo_entry", "/models/demo/entry")]
    assert [n for n, _ in served["ps-a.config"]] == ["demo_ps_0", "demo_ps_2", "demo_ps_3"]
    assert served["ps-b.config"] == [("demo_ps_1", "/models/demo/ps_1"), ("demo_ps_3", "/models/demo/ps_3")]
    monitoring = parse_monitoring_config(data["monitoring.config"])
    assert monitoring.prometheus_config.enable and monitoring.prometheus_config.path.startswith(
        "/monitoring/"
    )
    maps = by_kind(docs, "ConfigMap")
    gateway = GatewaySettings(**yaml.safe_load(maps["r-embedgate-gateway"]["data"]["gateway.yaml"]))
    (model,) = gateway.models
    assert [len(s.replicas) for s in model.shards] == [2, 2, 2, 4]  # shard 3 is on both hosts


def test_only_the_gateway_and_updater_reach_ps_ports() -> None:
    docs = render()
    policies = by_kind(docs, "NetworkPolicy")
    ps = policies["r-embedgate-ps"]["spec"]
    assert ps["podSelector"]["matchLabels"]["embedgate.io/role"] == "ps"
    grpc_rule = next(r for r in ps["ingress"] if r["ports"] == [{"protocol": "TCP", "port": 8500}])
    allowed = grpc_rule["from"][0]["podSelector"]["matchLabels"]
    clients = {
        name: d["spec"]["template"]["metadata"]["labels"]
        for name, d in by_kind(docs, "Deployment").items()
        if all(d["spec"]["template"]["metadata"]["labels"].get(k) == v for k, v in allowed.items())
    }
    assert set(clients) == {"r-embedgate-gateway", "r-embedgate-updater"}
    for sts in by_kind(docs, "StatefulSet").values():
        assert sts["spec"]["template"]["metadata"]["labels"]["embedgate.io/role"] == "ps"
    entry = policies["r-embedgate-entry"]["spec"]["ingress"][0]["from"][0]["podSelector"]["matchLabels"]
    assert entry["app.kubernetes.io/component"] == "gateway"
    # no Service exposes a PS or entry REST port, and only the gateway's Service is for clients
    for name, svc in by_kind(docs, "Service").items():
        if "gateway" not in name:
            assert [p["port"] for p in svc["spec"]["ports"]] == [8500], name


def test_gateway_serves_tf_serving_ports_with_probes_and_an_hpa() -> None:
    docs = render()
    svc = by_kind(docs, "Service")["r-embedgate-gateway"]["spec"]
    assert {p["name"]: p["port"] for p in svc["ports"]} == {"grpc": 8500, "http": 8501}
    (container,) = by_kind(docs, "Deployment")["r-embedgate-gateway"]["spec"]["template"]["spec"][
        "containers"
    ]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    hpa = by_kind(docs, "HorizontalPodAutoscaler")["r-embedgate-gateway"]["spec"]
    assert hpa["scaleTargetRef"]["name"] == "r-embedgate-gateway" and hpa["minReplicas"] == 2


@pytest.mark.parametrize(
    ("layout", "row_bytes", "mb_per_million"),
    [
        ("hash", 4, 180 + 6.4 * 128),  # the hash layout's figure (docs/deployment.md "Sizing")
        ("slab", 4, 32 + 1.1 * 4 * 128),  # the slab layout's, float32 rows
        ("slab", 2, 32 + 1.1 * 2 * 128),  # float16 / bfloat16 rows
    ],
)
def test_ps_memory_request_follows_the_sizing_figure(
    layout: str, row_bytes: int, mb_per_million: float
) -> None:
    # the server's baseline + MB per million rows of the layout (docs/deployment.md) per shard on the host, times
    # the 1.3 headroom: 10 M rows per shard at dim 128; host "one" serves one shard, host "three" three
    ps = yaml.safe_load((CHART / "values.yaml").read_text())["ps"]
    assert (
        ps["baselineMi"] >= 749
    )  # serve-local's measured RSS with an empty PS (docs/deployment.md "Sizing")
    assert ps["writeBuffersMi"] >= 112  # kept after write calls (docs/benchmarks.md "Scale ladder")
    baseline = ps["baselineMi"] + ps["writeBuffersMi"]
    docs = render(
        "model.rowsPerShard=10000000",
        "model.dim=128",
        f"model.psLayout={layout}",
        f"model.rowBytes={row_bytes}",
        "model.shards=4",
        "kafka.topicPartitions=4",
        "psHosts[0].name=one",
        "psHosts[0].shards={0}",
        "psHosts[1].name=three",
        "psHosts[1].shards={1,2,3}",
    )
    mb = round(10 * mb_per_million)  # MB per shard
    memory = {
        name: sts["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]["memory"]
        for name, sts in by_kind(docs, "StatefulSet").items()
    }
    assert memory == {
        "r-embedgate-ps-one": f"{math.ceil(baseline + mb * 1.3)}Mi",
        "r-embedgate-ps-three": f"{math.ceil(baseline + 3 * mb * 1.3)}Mi",
    }
    # a host of an empty model still asks for the baseline
    docs = render("model.rowsPerShard=0", "ps.baselineMi=300", "ps.writeBuffersMi=0")
    requests = {
        sts["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]["memory"]
        for sts in by_kind(docs, "StatefulSet").values()
    }
    assert requests == {"300Mi"}


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (["updater.replicas=5"], "updater.replicas (5) must be <= kafka.topicPartitions (4)"),
        (["model.shards=3"], "shard 2 is on no PS host"),
        (
            ["model.shards=8", "kafka.topicPartitions=4"],
            "kafka.topicPartitions (4) must be >= model.shards (8)",
        ),
        (
            [
                "psHosts[0].name=even",
                "psHosts[0].shards={0,5}",
                "psHosts[1].name=odd",
                "psHosts[1].shards={1}",
            ],
            "psHosts even lists shard 5 but model.shards is 2",
        ),
        (["models.persistentVolumeClaim="], "models.persistentVolumeClaim or models.hostPath is required"),
    ],
)
def test_inconsistent_values_are_refused_with_the_reason(sets: list[str], message: str) -> None:
    proc = helm_template(*sets)
    assert proc.returncode != 0
    assert message in proc.stderr, proc.stderr


def test_values_from_the_placement_generator_render(tmp_path: Path, demo_artifacts) -> None:  # type: ignore[no-untyped-def]
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "embedgate",
            "helm-values",
            "--model-dir",
            str(demo_artifacts.model_dir),
            "--host",
            "even=ps_{i}; i % 2 == 0",
            "--host",
            "odd=ps_{i}; i % 2 == 1",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    values = yaml.safe_load(proc.stdout)
    assert values["psHosts"] == [{"name": "even", "shards": [0]}, {"name": "odd", "shards": [1]}]
    manifest = demo_artifacts.manifest
    assert values["model"]["name"] == manifest.model_name
    # sized for every table of a shard: all rows spread over the shards, dims weighted by rows (both rounded up)
    rows = sum(t.rows for t in manifest.tables)
    assert values["model"]["rowsPerShard"] == math.ceil(rows / manifest.num_shards)
    assert values["model"]["dim"] == math.ceil(sum(t.rows * t.dim for t in manifest.tables) / rows)
    assert values["model"]["psLayout"] == manifest.ps_layout.value
    assert values["model"]["rowBytes"] == 4  # float32 rows
    assert len(manifest.tables) > 1
    path = tmp_path / "values.yaml"
    path.write_text(proc.stdout)
    docs = render(values=path)
    assert set(by_kind(docs, "StatefulSet")) == {"r-embedgate-ps-even", "r-embedgate-ps-odd"}


def test_placement_generator_refuses_a_shard_on_no_host(demo_artifacts) -> None:  # type: ignore[no-untyped-def]
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "embedgate",
            "helm-values",
            "--model-dir",
            str(demo_artifacts.model_dir),
            "--host",
            "even=ps_{i}; i % 2 == 0",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode != 0
    assert "shards [1] are on no host" in proc.stderr and "Traceback" not in proc.stderr


def test_kafka_sasl_ssl_values_become_updater_settings_and_a_mounted_secret() -> None:
    docs = render(
        "kafka.external.securityProtocol=SASL_SSL",
        "kafka.external.saslMechanism=SCRAM-SHA-512",
        "kafka.external.credentialsSecret=kafka-creds",
        "kafka.external.caInSecret=true",
    )
    config = yaml.safe_load(by_kind(docs, "ConfigMap")["r-embedgate-updater"]["data"]["updater.yaml"])
    assert set(config) <= set(UpdaterSettings.model_fields), set(config) - set(UpdaterSettings.model_fields)
    assert config["security_protocol"] == "SASL_SSL" and config["sasl_mechanism"] == "SCRAM-SHA-512"
    pod = by_kind(docs, "Deployment")["r-embedgate-updater"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    mount = next(m for m in container["volumeMounts"] if m["name"] == "kafka-credentials")
    assert config["sasl_password_file"].startswith(mount["mountPath"] + "/")
    assert config["ssl_cafile"].startswith(mount["mountPath"] + "/")
    secret = next(v for v in pod["volumes"] if v["name"] == "kafka-credentials")["secret"]["secretName"]
    assert secret == "kafka-creds"
    (env,) = container["env"]  # the user name by env (EMBEDGATE_ prefix), the password only as a file
    assert env["name"] == "EMBEDGATE_SASL_USERNAME" and "sasl_username" in UpdaterSettings.model_fields
    assert env["valueFrom"]["secretKeyRef"] == {"name": "kafka-creds", "key": "username"}
    proc = helm_template("kafka.external.securityProtocol=SASL_SSL", "kafka.external.saslMechanism=PLAIN")
    assert proc.returncode != 0 and "credentialsSecret is required" in proc.stderr


def test_placement_generator_weights_dims_by_rows(tmp_path: Path, demo_artifacts) -> None:  # type: ignore[no-untyped-def]
    """Tables of different widths: ``model.dim`` is their dims weighted by rows, so the chart's
    rowsPerShard x (180 + 6.4 x dim) is the sum over the tables."""
    from embedgate.export.placement import helm_values

    doc = json.loads((demo_artifacts.model_dir / "manifest.json").read_text())
    doc["tables"][0]["dim"], doc["tables"][0]["rows"] = 128, 30_000  # one wide table among dim-16 ones
    doc["tables"][0]["row_dtype"], doc["ps_layout"] = (
        "float16",
        "slab",
    )  # most of the floats in half precision
    (tmp_path / "manifest.json").write_text(json.dumps(doc))
    values = yaml.safe_load(helm_values(tmp_path, [("all", "ps_{i}; True")]))
    shards = demo_artifacts.manifest.num_shards
    tables = [(t["rows"], t["dim"]) for t in doc["tables"]]
    rows = sum(r for r, _ in tables)
    assert values["model"]["rowsPerShard"] == math.ceil(rows / shards)
    assert values["model"]["dim"] == math.ceil(sum(r * d for r, d in tables) / rows)
    assert 16 < values["model"]["dim"] < 128
    floats = sum(r * d for r, d in tables)
    assert values["model"]["rowBytes"] == math.ceil((2 * 30_000 * 128 + 4 * (floats - 30_000 * 128)) / floats)
    assert values["model"]["psLayout"] == "slab"
    assert values["psHosts"] == [{"name": "all", "shards": list(range(shards))}]


def test_tf_serving_pods_are_ready_once_every_servable_of_the_pod_is_available() -> None:
    docs = render(
        "model.shards=3",
        "psHosts[0].name=a",
        "psHosts[0].shards={0,2}",
        "psHosts[1].name=b",
        "psHosts[1].shards={1}",
    )
    pods = {
        n: d["spec"]["template"]["spec"]["containers"][0] for n, d in by_kind(docs, "StatefulSet").items()
    }
    pods["r-embedgate-entry"] = by_kind(docs, "Deployment")["r-embedgate-entry"]["spec"]["template"]["spec"][
        "containers"
    ][0]
    serves = {
        "r-embedgate-ps-a": ["demo_ps_0", "demo_ps_2"],
        "r-embedgate-ps-b": ["demo_ps_1"],
        "r-embedgate-entry": ["demo_entry"],
    }
    for name, container in pods.items():
        for probe in ("startupProbe", "readinessProbe"):
            command = container[probe]["exec"]["command"]
            everything = dict.fromkeys(serves[name], "AVAILABLE")
            with model_status_server(everything) as port:
                assert probe_passes(command, 8501, port), (name, probe)
            for missing in serves[name]:  # one servable still loading, or unknown: not ready
                with model_status_server({**everything, missing: "LOADING"}) as port:
                    assert not probe_passes(command, 8501, port), (name, probe, missing)
                with model_status_server({k: v for k, v in everything.items() if k != missing}) as port:
                    assert not probe_passes(command, 8501, port), (name, probe, missing)


def test_tf_serving_containers_get_the_malloc_settings() -> None:
    # docs/deployment.md "PS memory and glibc malloc": glibc reads these at tensorflow_model_server's start
    docs = render()
    workloads = {**by_kind(docs, "StatefulSet"), **by_kind(docs, "Deployment")}
    tfs = [
        c
        for w in workloads.values()
        for c in w["spec"]["template"]["spec"]["containers"]
        if c["name"] == "tfserving"
    ]
    assert len(tfs) == 3  # the entry and the two PS hosts of the default values
    for c in tfs:
        assert {e["name"]: e["value"] for e in c["env"]} == {
            "MALLOC_MMAP_THRESHOLD_": "1048576",
            "MALLOC_ARENA_MAX": "2",
        }

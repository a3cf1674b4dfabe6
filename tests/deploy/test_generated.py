"""``embedgate deploy compose | helm`` for the demo and for a differently shaped model (two-tower: lookup-layer tables,
3 shards): every generated file is checked by the loader that will read it (compose-spec loader, ``helm template``
of the shipped chart plus strict Kubernetes decoding, the gateway/updater settings loaders, TF Serving's
ModelServerConfig), the files agree with each other and with the manifests, and a second run writes the same bytes."""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from embedgate.deploy.plan import (
    DEFAULT_TF_SERVING_TAG,
    DeployError,
    load_models,
    parse_hosts,
    tf_serving_tag,
)
from schemas.gateway_settings import load_settings
from schemas.manifest import Manifest, entry_model_name, ps_model_name
from schemas.updater_settings import UpdaterSettings
from tests.deploy.tools import ROOT, by_kind, model_status_server, probe_passes, run, tool

# Placements of each model: the demo on an entry host and even/odd PS hosts; the two-tower model's 3 shards on two
# overlapping PS hosts (shard 1 on both: two replicas) and its entry on a host that also serves shard 2.
COMPOSE_FILTERS = {
    "demo": ["entry=entry; True", "ps-even=ps_{i}; i % 2 == 0", "ps-odd=ps_{i}; i % 2 == 1"],
    "twotower": ["front=entry; True", "front=ps_{i}; i == 2", "a=ps_{i}; i < 2", "b=ps_{i}; i >= 1"],
}
HELM_FILTERS = {
    "demo": ["even=ps_{i}; i % 2 == 0", "odd=ps_{i}; i % 2 == 1"],
    "twotower": ["a=ps_{i}; i < 2", "b=ps_{i}; i >= 1"],
}


def _embedgate(*args: str | Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "embedgate", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env=env,
        cwd=ROOT,
    )


def _deploy(target: str, out: Path, model_dirs: list[Path], filters: list[str], *extra: str) -> None:
    args: list[str | Path] = ["deploy", target, "--out", out]
    for d in model_dirs:
        args += ["--model-dir", d]
    for f in filters:
        args += ["--filter", f]
    proc = _embedgate(*args, *extra)
    assert proc.returncode == 0, proc.stderr


def _tree(out: Path) -> dict[str, bytes]:
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


@pytest.fixture(params=["demo", "twotower"])
def exported(request: pytest.FixtureRequest) -> Any:
    fixture = "demo_artifacts" if request.param == "demo" else "twotower_artifacts"
    return request.getfixturevalue(fixture)


def _served_by_config(text: str) -> list[tuple[str, str]]:
    pytest.importorskip("tensorflow_serving")
    from google.protobuf import text_format
    from tensorflow_serving.config import model_server_config_pb2

    config = text_format.Parse(text, model_server_config_pb2.ModelServerConfig())
    # every servable keeps its latest two versions loaded (a full re-export loses no request, docs/export.md)
    assert all(c.model_version_policy.latest.num_versions == 2 for c in config.model_config_list.config)
    return [(c.name, c.base_path) for c in config.model_config_list.config]


def _health_names(service: dict[str, Any]) -> list[str]:
    script = service["healthcheck"]["test"][-1]
    return [part.split(" HTTP/")[0] for part in script.split("GET /v1/models/")[1:]]


def test_compose_project_loads_and_every_file_agrees(tmp_path: Path, exported: Any) -> None:
    manifest: Manifest = exported.manifest
    name = manifest.model_name
    out = tmp_path / "out"
    _deploy("compose", out, [exported.model_dir], COMPOSE_FILTERS[name])

    proc = run([tool("deploycheck"), "compose", out / "compose.yaml"])
    assert proc.returncode == 0, proc.stderr
    hosts = sorted({f.split("=", 1)[0] for f in COMPOSE_FILTERS[name]})
    assert f"valid compose project with {len(hosts) + 3} services" in proc.stdout  # + kafka, gateway, updater

    compose = yaml.safe_load((out / "compose.yaml").read_text())
    services = compose["services"]
    config = out / "config"
    gateway = load_settings(config / "gateway.yaml")
    updater = UpdaterSettings.from_yaml(config / "updater.yaml")
    assert gateway.models == updater.models
    (model,) = updater.embedding_models
    assert model.name == name and str(model.manifest) == f"/models/{exported.model_dir.name}"
    assert len(model.shards) == manifest.num_shards
    # each host serves what its TF Serving config says; the healthcheck names exactly those servables; the
    # gateway/updater target a host for a servable exactly when the host serves it
    placed: dict[str, set[str]] = {}
    for host in hosts:
        service = services[f"serving-{host}"]
        assert f"--model_config_file=/config/{host}.config" in service["command"]
        served = _served_by_config((config / f"{host}.config").read_text())
        assert all(
            path == f"/models/{exported.model_dir.name}/{n.removeprefix(name + '_')}" for n, path in served
        )
        assert _health_names(service) == [n for n, _ in served]
        assert "ports" not in service and service["networks"] == ["backend"]
        placed[f"serving-{host}:8500"] = {n for n, _ in served}
    assert entry_model_name(name) in placed[model.entry]
    assert [n for t, ns in placed.items() for n in ns if n == entry_model_name(name)] == [
        entry_model_name(name)
    ]
    for i, shard in enumerate(model.shards):
        assert set(shard.replicas) == {t for t, ns in placed.items() if ps_model_name(name, i) in ns}, i
    # the healthcheck passes once every servable of the host is AVAILABLE, and not before
    for host in hosts:
        command = services[f"serving-{host}"]["healthcheck"]["test"]
        names = _health_names(services[f"serving-{host}"])
        with model_status_server(dict.fromkeys(names, "AVAILABLE")) as port:
            assert probe_passes(command, 8501, port), host
        with model_status_server({**dict.fromkeys(names, "AVAILABLE"), names[-1]: "LOADING"}) as port:
            assert not probe_passes(command, 8501, port), host
    # the image is the TF Serving release of the TensorFlow the export recorded (the exporter's own)
    assert manifest.tensorflow_version == importlib.metadata.version("tensorflow")
    tag = manifest.tensorflow_version
    assert {services[f"serving-{h}"]["image"] for h in hosts} == {
        f"tensorflow/serving:${{TF_SERVING_TAG:-{tag}}}"
    }
    # the model directory is mounted where the configs say, relative to the project
    mount = next(
        v for v in services["gateway"]["volumes"] if v.endswith(f":/models/{exported.model_dir.name}:ro")
    )
    assert (out / mount.split(":")[0]).resolve() == exported.model_dir.resolve()
    # safe defaults: published on loopback only, where the gateway may serve without tokens
    assert services["gateway"]["ports"] == ["127.0.0.1:8500:8500", "127.0.0.1:8501:8501"]
    assert gateway.auth.allow_unauthenticated and gateway.cache.max_bytes == 0
    assert compose["networks"]["backend"]["internal"] is True
    partitions = int(services["kafka"]["environment"]["KAFKA_NUM_PARTITIONS"])
    assert updater.topic_partitions == partitions >= manifest.num_shards


def test_helm_values_render_with_the_shipped_chart_and_validate(tmp_path: Path, exported: Any) -> None:
    manifest: Manifest = exported.manifest
    name = manifest.model_name
    out = tmp_path / "out"
    _deploy("helm", out, [exported.model_dir], HELM_FILTERS[name], "--ps-replicas", "3")
    values_file = out / f"{name}.values.yaml"
    values = yaml.safe_load(values_file.read_text())
    assert values["tfServing"]["tag"] == manifest.tensorflow_version
    assert values["model"]["name"] == name and values["model"]["shards"] == manifest.num_shards

    # no --kube-version: the chart renders as shipped with the Helm `make deploy-tools` builds
    proc = run(
        [tool("helm"), "template", "r", ROOT / "deploy" / "helm" / "embedgate", "--values", values_file]
    )
    assert proc.returncode == 0, proc.stderr
    check = run([tool("deploycheck"), "k8s"], stdin=proc.stdout)
    assert check.returncode == 0, check.stdout + check.stderr
    docs = [d for d in yaml.safe_load_all(proc.stdout) if d]
    maps = by_kind(docs, "ConfigMap")
    gw_path, up_path = tmp_path / "gateway.yaml", tmp_path / "updater.yaml"
    gw_path.write_text(maps["r-embedgate-gateway"]["data"]["gateway.yaml"])
    up_path.write_text(maps["r-embedgate-updater"]["data"]["updater.yaml"])
    gateway, updater = load_settings(gw_path), UpdaterSettings.from_yaml(up_path)
    assert gateway.models == updater.models
    (model,) = updater.embedding_models
    assert model.name == name and len(model.shards) == manifest.num_shards
    by_host = {h["name"]: h["shards"] for h in values["psHosts"]}
    for i, shard in enumerate(model.shards):
        hosts = [h for h, shards in by_host.items() if i in shards]
        assert len(shard.replicas) == 3 * len(hosts), i
    # TF Serving: the pinned image from the manifest, and the configs serve the model's own servables
    tfs = maps["r-embedgate-tfserving"]["data"]
    for host, shards in by_host.items():
        served = _served_by_config(tfs[f"ps-{host}.config"])
        assert [n for n, _ in served] == [ps_model_name(name, i) for i in shards]
    images = {
        c["image"]
        for kind in ("Deployment", "StatefulSet")
        for d in by_kind(docs, kind).values()
        for c in d["spec"]["template"]["spec"]["containers"]
        if c["name"] == "tfserving"
    }
    assert images == {f"tensorflow/serving:{manifest.tensorflow_version}"}


def test_two_models_in_one_compose_project(
    tmp_path: Path, demo_artifacts: Any, twotower_artifacts: Any
) -> None:
    out = tmp_path / "out"
    filters = ["entry=entry; True", "ps-even=ps_{i}; i % 2 == 0", "ps-odd=ps_{i}; i % 2 == 1"]
    _deploy(
        "compose",
        out,
        [demo_artifacts.model_dir, twotower_artifacts.model_dir],
        filters,
        "--updater-replicas",
        "2",
    )
    proc = run([tool("deploycheck"), "compose", out / "compose.yaml"])
    assert proc.returncode == 0, proc.stderr
    updater = UpdaterSettings.from_yaml(out / "config" / "updater.yaml")
    assert load_settings(out / "config" / "gateway.yaml").models == updater.models
    assert [(m.name, len(m.shards)) for m in updater.embedding_models] == [("demo", 2), ("twotower", 3)]
    odd = _served_by_config((out / "config" / "ps-odd.config").read_text())
    assert [n for n, _ in odd] == ["demo_ps_1", "twotower_ps_1"]
    services = yaml.safe_load((out / "compose.yaml").read_text())["services"]
    assert "kafka" not in services["gateway"]["depends_on"]  # no cache: the gateway does not read Kafka
    assert _health_names(services["serving-ps-even"]) == ["demo_ps_0", "twotower_ps_0", "twotower_ps_2"]
    assert services["updater"]["deploy"]["replicas"] == 2


def test_two_models_get_a_helm_values_file_each(
    tmp_path: Path, demo_artifacts: Any, twotower_artifacts: Any
) -> None:
    out = tmp_path / "out"
    _deploy("helm", out, [demo_artifacts.model_dir, twotower_artifacts.model_dir], ["ps=ps_{i}; True"])
    assert sorted(p.name for p in out.iterdir()) == [
        ".embedgate-deploy",
        "demo.values.yaml",
        "twotower.values.yaml",
    ]
    for name, shards in (("demo", 2), ("twotower", 3)):
        proc = run(
            [
                tool("helm"),
                "template",
                name,
                ROOT / "deploy" / "helm" / "embedgate",
                "-f",
                out / f"{name}.values.yaml",
            ]
        )
        assert proc.returncode == 0, proc.stderr
        assert run([tool("deploycheck"), "k8s"], stdin=proc.stdout).returncode == 0
        docs = [d for d in yaml.safe_load_all(proc.stdout) if d]
        tfs = by_kind(docs, "ConfigMap")[f"{name}-embedgate-tfserving"]["data"]
        assert [n for n, _ in _served_by_config(tfs["ps-ps.config"])] == [
            ps_model_name(name, i) for i in range(shards)
        ]


@pytest.mark.parametrize("target", ["compose", "helm"])
def test_a_second_run_writes_the_same_bytes(tmp_path: Path, twotower_artifacts: Any, target: str) -> None:
    out = tmp_path / "out"
    filters = COMPOSE_FILTERS["twotower"] if target == "compose" else HELM_FILTERS["twotower"]
    _deploy(target, out, [twotower_artifacts.model_dir], filters, "--cache-max-bytes", "1000000")
    first = _tree(out)
    # compose.yaml, 4 configs, gateway/updater.yaml (or the values file), and the list of what was written
    assert len(first) == (8 if target == "compose" else 2)
    _deploy(target, out, [twotower_artifacts.model_dir], filters, "--cache-max-bytes", "1000000")
    assert _tree(out) == first
    if target == "compose":  # the hot-row cache reads the deployment's Kafka
        gateway = load_settings(out / "config" / "gateway.yaml")
        assert gateway.cache.max_bytes == 1000000 and gateway.cache.bootstrap_servers == "kafka:9092"
        services = yaml.safe_load(first["compose.yaml"])["services"]
        assert services["gateway"]["depends_on"]["kafka"] == {"condition": "service_healthy"}
        assert run([tool("deploycheck"), "compose", out / "compose.yaml"]).returncode == 0


def test_a_rerun_removes_the_files_of_hosts_that_are_gone(tmp_path: Path, demo_artifacts: Any) -> None:
    out = tmp_path / "out"
    _deploy("compose", out, [demo_artifacts.model_dir], COMPOSE_FILTERS["demo"])
    (out / "config" / "mine.txt").write_text("a file of the user's")
    assert (out / "config" / "ps-odd.config").exists()
    _deploy("compose", out, [demo_artifacts.model_dir], ["entry=entry; True", "all=ps_{i}; True"])
    assert sorted(p.name for p in (out / "config").iterdir()) == [
        "all.config",
        "entry.config",
        "gateway.yaml",
        "mine.txt",
        "monitoring.config",
        "updater.yaml",
    ]
    assert run([tool("deploycheck"), "compose", out / "compose.yaml"]).returncode == 0


def test_tokens_become_a_compose_secret_and_a_public_address_needs_them(
    tmp_path: Path, demo_artifacts: Any
) -> None:
    tokens = tmp_path / "tokens.txt"
    tokens.write_text("s3cret demo\n")
    out = tmp_path / "out"
    proc = _embedgate(
        "deploy", "compose", "--model-dir", demo_artifacts.model_dir, "--out", out, "--publish", "0.0.0.0"
    )
    assert proc.returncode == 2 and "--tokens-file" in proc.stderr and "Traceback" not in proc.stderr
    assert not out.exists()
    _deploy(
        "compose", out, [demo_artifacts.model_dir], [], "--publish", "0.0.0.0", "--tokens-file", str(tokens)
    )
    assert run([tool("deploycheck"), "compose", out / "compose.yaml"]).returncode == 0
    compose = yaml.safe_load((out / "compose.yaml").read_text())
    assert (out / compose["secrets"]["embedgate-tokens"]["file"]).resolve() == tokens.resolve()
    assert compose["services"]["gateway"]["secrets"] == ["embedgate-tokens"]
    gateway = load_settings(out / "config" / "gateway.yaml")
    assert (
        str(gateway.auth.tokens_file) == "/run/secrets/embedgate-tokens"
        and not gateway.auth.allow_unauthenticated
    )


def test_helm_tokens_secret_is_mounted_as_the_tokens_file(tmp_path: Path, demo_artifacts: Any) -> None:
    out = tmp_path / "out"
    _deploy("helm", out, [demo_artifacts.model_dir], [], "--tokens-secret", "shop-tokens")
    proc = run(
        [
            tool("helm"),
            "template",
            "r",
            ROOT / "deploy" / "helm" / "embedgate",
            "-f",
            out / "demo.values.yaml",
        ]
    )
    assert proc.returncode == 0, proc.stderr
    assert run([tool("deploycheck"), "k8s"], stdin=proc.stdout).returncode == 0
    docs = [d for d in yaml.safe_load_all(proc.stdout) if d]
    config = yaml.safe_load(by_kind(docs, "ConfigMap")["r-embedgate-gateway"]["data"]["gateway.yaml"])
    pod = by_kind(docs, "Deployment")["r-embedgate-gateway"]["spec"]["template"]["spec"]
    mount = next(m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "auth")
    assert config["auth"] == {"tokens_file": mount["mountPath"] + "/tokens"}
    volume = next(v for v in pod["volumes"] if v["name"] == "auth")
    assert volume["secret"]["secretName"] == "shop-tokens"


# -- placement and version errors: the plan alone, on copies of the manifests (no TensorFlow) ------------------------


def _copy_model(src: Path, dest: Path, **changes: Any) -> Path:
    doc = json.loads((src / "manifest.json").read_text())
    doc.update(changes)
    dest.mkdir(parents=True)
    (dest / "manifest.json").write_text(json.dumps(doc))
    return dest


@pytest.mark.parametrize(
    ("filters", "message"),
    [
        (["entry=entry; True", "ps=ps_{i}; i == 0"], "model 'twotower': shards [1, 2] are on no host"),
        (["ps=ps_{i}; True"], "model 'twotower': its entry is on no host"),
        (["a=entry; True", "b=entry; True", "a=ps_{i}; True"], "its entry is on hosts ['a', 'b']"),
        (["Bad_Host=ps_{i}; True"], "host name 'Bad_Host'"),
        (["ps_{i}; True"], "expected HOST='PATTERN; EXPR'"),
        (["ps_{i}; i % 2 == 0"], "expected HOST='PATTERN; EXPR'"),
        (
            ["x=ps_{i}; i > 7", "y=entry; True", "z=ps_{i}; True"],
            "host 'x': its filters ['ps_{i}; i > 7'] select nothing",
        ),
        (["a=ps_{i}; open(i)"], "Call is not allowed"),
    ],
)
def test_placements_that_cannot_deploy_are_refused(
    tmp_path: Path, twotower_artifacts: Any, filters: list[str], message: str
) -> None:
    model = _copy_model(twotower_artifacts.model_dir, tmp_path / "twotower")
    with pytest.raises(DeployError, match=None) as err:
        parse_hosts(filters, load_models([model]))
    assert message in str(err.value)


def test_helm_filters_place_shards_only(tmp_path: Path, twotower_artifacts: Any) -> None:
    models = load_models([_copy_model(twotower_artifacts.model_dir, tmp_path / "twotower")])
    with pytest.raises(DeployError, match="the Helm chart runs the entry as its own Deployment"):
        parse_hosts(["a=entry; True", "a=ps_{i}; True"], models, entry_hosts=False)
    (host,) = parse_hosts(["a=ps_{i}; True"], models, entry_hosts=False)
    assert host.shards_of("twotower") == [0, 1, 2]


def test_the_tf_serving_tag_follows_the_manifests(tmp_path: Path, twotower_artifacts: Any) -> None:
    src = twotower_artifacts.model_dir
    old = load_models([_copy_model(src, tmp_path / "old", tensorflow_version=None)])
    assert (
        old[0].manifest.tensorflow_version is None
    )  # a manifest written before the field existed still loads
    assert tf_serving_tag(old, None) == DEFAULT_TF_SERVING_TAG
    doc = json.loads((src / "manifest.json").read_text())
    del doc["tensorflow_version"]
    assert Manifest.model_validate(doc).tensorflow_version is None
    a = _copy_model(src, tmp_path / "a" / "m1", tensorflow_version="2.20.0", model_name="m1")
    b = _copy_model(src, tmp_path / "b" / "m2", tensorflow_version="2.21.0", model_name="m2")
    assert tf_serving_tag(load_models([a]), None) == "2.20.0"
    with pytest.raises(DeployError, match="different TensorFlow releases"):
        tf_serving_tag(load_models([a, b]), None)
    assert tf_serving_tag(load_models([a, b]), "2.21.0") == "2.21.0"
    rc = _copy_model(src, tmp_path / "rc" / "m3", tensorflow_version="2.22.0rc1", model_name="m3")
    with pytest.raises(DeployError, match="pass --tf-serving-tag"):
        tf_serving_tag(load_models([rc]), None)
    with pytest.raises(DeployError, match="clashes"):
        load_models([a, _copy_model(src, tmp_path / "c" / "m1", model_name="m1")])


def test_pinned_tf_serving_releases_match_the_exporters_tensorflow() -> None:
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert f'"tensorflow=={DEFAULT_TF_SERVING_TAG}"' in pyproject
    values = yaml.safe_load((ROOT / "deploy" / "helm" / "embedgate" / "values.yaml").read_text())
    assert values["tfServing"]["tag"] == DEFAULT_TF_SERVING_TAG
    compose = yaml.safe_load((ROOT / "docker" / "compose.yaml").read_text())
    assert (
        compose["x-tfserving"]["image"] == f"tensorflow/serving:${{TF_SERVING_TAG:-{DEFAULT_TF_SERVING_TAG}}}"
    )


def test_public_names_of_the_deploy_modules() -> None:
    import importlib

    surface = {
        "embedgate.deploy": set(),
        "embedgate.deploy.cli": {"register"},
        "embedgate.deploy.compose": {"ComposeOptions", "compose_files"},
        "embedgate.deploy.files": {"RECORD", "check_config", "dump_yaml", "write_tree"},
        "embedgate.deploy.helm": {"HelmOptions", "helm_files"},
        "embedgate.deploy.plan": {
            "DEFAULT_TF_SERVING_TAG",
            "MODELS_ROOT",
            "TF_SERVING_IMAGE",
            "DeployError",
            "Host",
            "Model",
            "load_models",
            "parse_hosts",
            "tf_serving_tag",
        },
    }
    for name, names in surface.items():
        module = importlib.import_module(name)
        assert set(module.__all__) == names, name
        assert all(hasattr(module, n) for n in names), name

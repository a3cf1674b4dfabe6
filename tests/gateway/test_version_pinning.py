"""One model version per request, with real parts: serve-local serving exported demo versions, the gateway in front.

* A rollout while requests stream (a gateway process): every answer equals the all-v1 or the all-v2 predictions
  computed offline with Keras (never a mix of shards at different versions); after the switch the gateway parses
  with v2's manifest (v2 allows more tags); a manifest.json that does not parse is ignored and counted.
* A PS shard without the entry's latest version: "latest" requests fall back to the version every backend serves,
  marked degraded (REST header, gRPC trailing metadata, metric); with no such version: a retriable 503 naming the
  versions; an explicit version is pinned everywhere, as asked.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import yaml

from tests.gateway.conftest import app_client
from tests.support.gateway import run_gateway
from tests.support.ports import free_port
from tests.support.predict import Answer, PredictLoop
from tests.support.servers import serve_local

pytestmark = pytest.mark.integration

MODEL = "demo"
V2_TAGS_MAX_IDS = 12  # v1 (the demo declaration) allows 8 tags per example
_STREAM_MAX_REQUESTS = 3000
_STREAM_MAX_SECONDS = 300.0
_SWITCH_TIMEOUT = 180.0
_RTOL, _ATOL = 2e-5, 2e-6  # gateway (numpy pooling) vs Keras: float32 rounding only


@dataclass(frozen=True)
class Versions:
    """A demo model directory holding versions 1 and 2 (v2: a new user table and tags max_ids 12), and the offline
    predictions of both on the demo instances."""

    model_dir: Path
    v1: np.ndarray
    v2: np.ndarray
    v2_user_table: tuple[np.ndarray, np.ndarray] = field(repr=False)


def _keras_predictions(demo_artifacts: Any, user_table: np.ndarray | None = None) -> np.ndarray:
    import keras

    model = keras.models.load_model(demo_artifacts.keras_path)
    if user_table is not None:
        model.get_layer("user_emb").set_weights([user_table])
    out = model.predict(demo_artifacts.keras_inputs(demo_artifacts.instances), verbose=0)
    if isinstance(out, dict):
        out = next(iter(out.values()))
    return np.asarray(out, dtype=np.float32).reshape(-1)


def _v2_user_table(demo_artifacts: Any) -> tuple[np.ndarray, np.ndarray]:
    spec = demo_artifacts.manifest.table("user_emb")
    rng = np.random.default_rng(7)
    return np.arange(spec.rows, dtype=np.int64), rng.normal(0.0, 0.5, (spec.rows, spec.dim)).astype(
        np.float32
    )


def export_v2(demo_artifacts: Any, root: Path, table: tuple[np.ndarray, np.ndarray]) -> None:
    """Export version 2 of the demo into ``root/demo`` (the exporter: PS dirs first, entry, then manifest.json)."""
    from embedgate.export.declaration import Declaration
    from embedgate.export.exporter import export_model

    decl = demo_artifacts.declaration.model_dump()
    for f in decl["sparse"]:
        if f["name"] == "tags":
            f["max_ids"] = V2_TAGS_MAX_IDS
    result = export_model(
        demo_artifacts.keras_path,
        Declaration.model_validate(decl),
        root,
        num_shards=demo_artifacts.manifest.num_shards,
        version=2,
        tables={"user_emb": table},
    )
    assert result.version == 2 and result.manifest.sparse("tags").max_ids == V2_TAGS_MAX_IDS


def publish_version(src: Path, dest: Path, version: int) -> None:
    """Publish ``version`` of model dir ``src`` (exported by :func:`export_v2`) into model dir ``dest`` as the
    exporter does: its version dirs staged, renamed into place by the exporter's own ``_publish_into`` (PS first,
    the entry last), then the model files and manifest.json each replaced. What serve-local and the gateway see is
    an export's; the rollout test so skips a second export."""
    from embedgate.export.exporter import ENTRY_DIR, _publish_into
    from schemas.manifest import MANIFEST_FILE

    ver = str(version)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.publish-", dir=dest.parent))
    try:
        stage = tmp / "stage"
        shards = sorted(d.name for d in src.iterdir() if d.name.startswith("ps_") and (d / ver).is_dir())
        subdirs = [ENTRY_DIR, *shards]
        for s in subdirs:
            shutil.copytree(src / s / ver, stage / s)
        _publish_into(dest, stage, subdirs, ver, tmp)
        files = sorted(x for x in src.iterdir() if x.is_file() and x.name != MANIFEST_FILE)
        for f in [*files, src / MANIFEST_FILE]:  # manifest.json last, as the exporter writes it
            shutil.copy2(f, tmp / f.name)
            (tmp / f.name).replace(dest / f.name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def copy_v1(demo_artifacts: Any, root: Path) -> Path:
    dest = root / MODEL
    shutil.copytree(demo_artifacts.model_dir, dest)
    return dest


@pytest.fixture(scope="module")
def versions(demo_artifacts: Any, tmp_path_factory: pytest.TempPathFactory) -> Versions:
    from schemas.partition import shard_for

    assert demo_artifacts.manifest.version == 1 and demo_artifacts.manifest.model_name == MODEL
    root = tmp_path_factory.mktemp("two_versions")
    model_dir = copy_v1(demo_artifacts, root)
    table = _v2_user_table(demo_artifacts)
    export_v2(demo_artifacts, root, table)
    v1 = _keras_predictions(demo_artifacts)
    v2 = _keras_predictions(demo_artifacts, table[1])
    # _which can only catch a mix if v1 and v2 differ for every instance (well beyond the tolerance) and the users
    # sit on both shards.
    assert np.all(np.abs(v1 - v2) > 10 * (_ATOL + _RTOL * np.abs(v1))), (v1, v2)
    users = np.array([i["user_id"] for i in demo_artifacts.instances], dtype=np.int64)
    assert set(shard_for(users, 2).tolist()) == {0, 1}
    return Versions(model_dir, v1, v2, table)


def _which(preds: np.ndarray, v: Versions) -> str:
    """ "v1" / "v2" when ``preds`` equal one version's offline predictions (every instance), else "mix"."""
    for name, want in (("v1", v.v1), ("v2", v.v2)):
        if preds.shape == want.shape and np.allclose(preds, want, rtol=_RTOL, atol=_ATOL):
            return name
    return "mix"


def _preds(body: dict[str, Any]) -> np.ndarray:
    return np.asarray(body["predictions"], dtype=np.float32).reshape(-1)


def _metric(text: str, name: str, **labels: str) -> float:
    """The value of one sample of the Prometheus text ``text`` (0 when absent)."""
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        m = re.fullmatch(rf"{name}\{{(.*)\}} (\S+)", line)
        if m and ",".join(sorted(m.group(1).split(","))) == want:
            return float(m.group(2))
    return 0.0


def _with_tags(instance: dict[str, Any], n: int) -> dict[str, Any]:
    return {**instance, "tags": list(range(1, n + 1)), "tags_weights": [1.0] * n}


# ---- rollout while requests stream ------------------------------------------------------------------------------


def _label(a: Answer, v: Versions) -> str:
    """ "v1" / "v2" / "mix" (+ " degraded=<reason>") for a 200, "http <status>" for anything else."""
    if a.preds is None:
        return f"http {a.status}"
    which = _which(a.preds, v)
    return which if a.degraded is None else f"{which} degraded={a.degraded}"


_NO_COMMON_VERSION = re.compile(
    r"model demo: no version is AVAILABLE on the entry and every PS shard at once \(entry: \[[12, ]+\]; "
    r"PS shard 0: \[[12, ]*\]; PS shard 1: \[[12, ]*\]\); a new version is probably being loaded, retry later"
)


@pytest.fixture(params=["latest", "two_versions"])
def rollout(
    request: pytest.FixtureRequest, demo_artifacts: Any, tmp_path: Path
) -> Iterator[tuple[Path, str, str]]:
    """serve-local (0.2 s polls) serving a copy of the v1 demo with TF Serving's default policy (``latest``: each
    servable swaps to v2 on its own) or ``latest { num_versions: 2 }`` on every servable, and a gateway process in
    front of it re-reading manifest.json every 0.2 s: (the model dir to export into, the gateway URL, the policy)."""
    from schemas.manifest import entry_model_name, ps_dir_name, ps_model_name

    model_dir = copy_v1(demo_artifacts, tmp_path / "models")
    served = {entry_model_name(MODEL): model_dir / "entry"}
    n = demo_artifacts.manifest.num_shards
    served.update({ps_model_name(MODEL, i): model_dir / ps_dir_name(i) for i in range(n)})
    policy = (
        "    model_version_policy { latest { num_versions: 2 } }\n" if request.param == "two_versions" else ""
    )
    config = tmp_path / "models.config"
    config.write_text(
        "model_config_list {\n"
        + "".join(
            f'  config {{\n    name: "{name}"\n    base_path: "{base}"\n    model_platform: "tensorflow"\n'
            f"{policy}  }}\n"
            for name, base in served.items()
        )
        + "}\n",
        encoding="utf-8",
    )
    with serve_local(config, poll_seconds=0.2) as backend:
        cfg = tmp_path / "gateway.yaml"
        model = {
            "kind": "embedding",
            "name": MODEL,
            "manifest": str(model_dir),
            "entry": backend.target,
            "shards": [{"replicas": [backend.target]} for _ in range(n)],
        }
        cfg.write_text(yaml.safe_dump({"manifest_poll_s": 0.2, "log": {"format": "text"}, "models": [model]}))
        with run_gateway(cfg) as gw:
            yield model_dir, gw.url, request.param


def test_rollout_answers_are_all_v1_or_all_v2_and_v2_manifest_is_used(
    rollout: tuple[Path, str, str], demo_artifacts: Any, versions: Versions
) -> None:
    model_dir, url, policy = rollout
    instances = demo_artifacts.instances
    many_tags = json.dumps({"instances": [_with_tags(instances[0], 10)]})
    r = httpx.post(f"{url}/v1/models/{MODEL}:predict", content=many_tags, timeout=30)
    assert r.status_code == 400 and "more than max_ids 8" in r.text, r.text  # v1's manifest

    stream = PredictLoop(
        url, MODEL, json.dumps({"instances": instances}).encode(), _STREAM_MAX_REQUESTS, _STREAM_MAX_SECONDS
    )
    thread = threading.Thread(target=stream.run, name="predict-stream")
    thread.start()

    def labels() -> list[str]:
        return [_label(a, versions) for a in stream.since(0)]

    try:
        stream.wait_until("a v1 answer", lambda: "v1" in labels(), 60.0)
        publish_version(versions.model_dir, model_dir, 2)
        stream.wait_until("a v2 answer", lambda: "v2" in labels(), _SWITCH_TIMEOUT)
        settled = stream.count
        end = time.monotonic() + 60.0
        while stream.count < settled + 20 and time.monotonic() < end:  # some answers after the switch
            time.sleep(0.05)
    finally:
        stream.stop.set()
        thread.join(timeout=60)
    assert not thread.is_alive()
    seen = labels()
    errors = [a.error for a in stream.answers if a.status != 200]
    # Never a mix; v1 only until v2 is served everywhere, then v2 only (a request keeps one version).
    assert "mix" not in " ".join(seen), seen
    first_v2 = seen.index("v2")
    assert all(s.startswith(("v1", "http 503")) for s in seen[:first_v2]), seen[:first_v2]
    assert set(seen[first_v2:]) == {"v2"}, seen[first_v2:]
    if policy == "latest":
        # Each servable swaps on its own: while the entry serves only v2 and a shard only v1, no version is served
        # everywhere -> a retriable 503 naming the versions (never a mixed answer).
        assert all(_NO_COMMON_VERSION.fullmatch(e) for e in errors), errors[:3]
    else:
        # v1 stays served everywhere until v2 is: no errors; the answers in between are v1, marked degraded when
        # the entry already served v2.
        assert not errors, errors[:3]
        assert set(seen[:first_v2]) <= {"v1", "v1 degraded=version_fallback"}, seen[:first_v2]

    # After the switch the gateway parses with v2's manifest (10 tags allowed) and counts the reload.
    r = httpx.post(f"{url}/v1/models/{MODEL}:predict", content=many_tags, timeout=30)
    assert r.status_code == 200, r.text
    assert "X-Embedgate-Degraded" not in r.headers
    metrics = httpx.get(f"{url}/metrics", timeout=30).text
    assert _metric(metrics, "embedgate_manifest_reloads_total", model=MODEL, outcome="ok") >= 1

    # A manifest.json that does not parse is ignored (v2's keeps serving) and counted.
    (model_dir / "manifest.json").write_text('{"format_version": 1, "model_name": ', encoding="utf-8")
    end = time.monotonic() + 30.0
    while True:
        text = httpx.get(f"{url}/metrics", timeout=30).text
        if _metric(text, "embedgate_manifest_reloads_total", model=MODEL, outcome="error") >= 1:
            break
        assert time.monotonic() < end, "the bad manifest was not counted within 30 s"
        time.sleep(0.1)
    r = httpx.post(f"{url}/v1/models/{MODEL}:predict", content=many_tags, timeout=30)
    assert r.status_code == 200, r.text
    r = httpx.post(
        f"{url}/v1/models/{MODEL}:predict", content=json.dumps({"instances": instances}), timeout=30
    )
    assert r.status_code == 200 and _which(_preds(r.json()), versions) == "v2", r.text


# ---- a PS shard without the entry's latest version --------------------------------------------------------------


def _config(models: dict[str, tuple[Path, bool]]) -> str:
    """serve-local model config: served name -> (base path, serve all versions (else the latest))."""
    parts = []
    for name, (base, all_versions) in models.items():
        policy = "    model_version_policy { all {} }\n" if all_versions else ""
        parts.append(
            f'  config {{\n    name: "{name}"\n    base_path: "{base}"\n    model_platform: "tensorflow"\n'
            f"{policy}  }}\n"
        )
    return "model_config_list {\n" + "".join(parts) + "}\n"


@pytest.fixture(scope="module")
def lagging_backend(
    versions: Versions, demo_artifacts: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Any]:
    """One serve-local process; PS shard 1 has only version 1 on disk (the exporter's v2 not there yet):

    * ``fb_*``: entry and shard 0 serve versions 1 and 2 (policy all): v1 is still served everywhere;
    * ``nc_*``: entry and shard 0 serve only their latest (2): no version is served everywhere.
    """
    tmp = tmp_path_factory.mktemp("lagging")
    ps1_v1_only = tmp / "ps_1"
    shutil.copytree(demo_artifacts.model_dir / "ps_1", ps1_v1_only)
    md = versions.model_dir
    models = {
        "fb_entry": (md / "entry", True),
        "fb_ps_0": (md / "ps_0", True),
        "fb_ps_1": (ps1_v1_only, True),
        "nc_entry": (md / "entry", False),
        "nc_ps_0": (md / "ps_0", False),
        "nc_ps_1": (ps1_v1_only, False),
    }
    config = tmp / "models.config"
    config.write_text(_config(models), encoding="utf-8")
    with serve_local(config) as server:
        yield server


def _lagging_model(name: str, target: str, manifest: Path) -> dict[str, Any]:
    return {
        "kind": "embedding",
        "name": name,
        "manifest": str(manifest),
        "entry": target,
        "entry_name": f"{name}_entry",
        "ps_name_prefix": f"{name}_ps_",
        "shards": [{"replicas": [target]}, {"replicas": [target]}],
    }


async def test_lagging_shard_falls_back_to_a_consistent_version_marked_degraded(
    lagging_backend: Any, versions: Versions, demo_artifacts: Any, tmp_path: Path
) -> None:
    import grpc
    import tensorflow as tf
    from tensorflow_serving.apis import prediction_service_pb2_grpc

    from tests.gateway.test_grpc_front import _predict_request, _tensors

    # The gateway starts knowing v1's manifest; manifest.json then describes v2 (as after an export).
    manifest = tmp_path / "manifest.json"
    shutil.copy(demo_artifacts.model_dir / "manifest.json", manifest)
    grpc_port = free_port()
    models = [
        _lagging_model("fb", lagging_backend.target, manifest),
        _lagging_model("nc", lagging_backend.target, versions.model_dir),
    ]
    body = json.dumps({"instances": demo_artifacts.instances})
    async with app_client(models=models, manifest_poll_s=0, grpc_port=grpc_port) as gw:
        shutil.copy(
            versions.model_dir / "manifest.json", manifest
        )  # v2's, read when version 2 is first pinned
        for _ in range(3):  # the first finds shard 1 without v2; the next ones reuse the fallback pin
            r = await gw.post("/v1/models/fb:predict", content=body)
            assert r.status_code == 200, r.text
            assert r.headers["X-Embedgate-Degraded"] == "version_fallback"
            assert _which(_preds(r.json()), versions) == "v1"

        # An explicit version is pinned everywhere, as asked: never degraded, never another version.
        r = await gw.post("/v1/models/fb/versions/1:predict", content=body)
        assert r.status_code == 200 and _which(_preds(r.json()), versions) == "v1", r.text
        assert "X-Embedgate-Degraded" not in r.headers
        r = await gw.post("/v1/models/fb/versions/2:predict", content=body)
        assert r.status_code == 404, r.text  # shard 1 does not serve version 2

        # Each request is parsed with the manifest of the version it is served at: v1 allows 8 tags, v2 12.
        many_tags = json.dumps({"instances": [_with_tags(demo_artifacts.instances[0], 10)]})
        for path in ("fb", "fb/versions/1"):
            r = await gw.post(f"/v1/models/{path}:predict", content=many_tags)
            assert r.status_code == 400 and "more than max_ids 8" in r.text, r.text
        r = await gw.post("/v1/models/fb/versions/2:predict", content=many_tags)
        assert r.status_code == 404, r.text  # parsed with v2's manifest, then shard 1 lacks version 2

        # classify over REST carries the header too.
        examples = json.dumps({"examples": demo_artifacts.instances})
        r = await gw.post("/v1/models/fb:regress", content=examples)
        assert r.status_code == 200 and r.headers["X-Embedgate-Degraded"] == "version_fallback", r.text

        # No version served by every backend: a retriable 503 naming what each serves.
        r = await gw.post("/v1/models/nc:predict", content=body)
        assert r.status_code == 503, r.text
        assert "Retry-After" in r.headers
        assert r.json()["error"] == (
            "model nc: no version is AVAILABLE on the entry and every PS shard at once "
            "(entry: [2]; PS shard 0: [2]; PS shard 1: [1]); a new version is probably being loaded, retry later"
        )

        # gRPC: the same fallback, reported in the trailing metadata.
        async with grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
            stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
            call = stub.Predict(
                _predict_request("fb", _tensors(demo_artifacts.instances, demo_artifacts.manifest))
            )
            resp = await call
            trailing = dict(await call.trailing_metadata())
        assert trailing.get("x-embedgate-degraded") == "version_fallback"
        assert resp.model_spec.version.value == 1
        got = tf.make_ndarray(next(iter(resp.outputs.values()))).astype(np.float32).ravel()
        assert _which(got, versions) == "v1"

        metrics = (await gw.get("/metrics")).text
        degraded = _metric(
            metrics, "embedgate_degraded_responses_total", model="fb", reason="version_fallback"
        )
        assert degraded == 5  # 3 predicts + regress over REST, 1 predict over gRPC
        assert (
            _metric(metrics, "embedgate_degraded_responses_total", model="nc", reason="version_fallback") == 0
        )


# ---- units: the manifest store and the pinner, with fake status clients -------------------------------------------


def _manifest(version: int, *, tags_max_ids: int = 8, shards: int = 2, name: str = MODEL) -> Any:
    from schemas.manifest import Manifest

    return Manifest.model_validate(
        {
            "model_name": name,
            "version": version,
            "tables": [{"name": "tag_emb", "dim": 2}],
            "sparse_features": [
                {"name": "tags", "table": "tag_emb", "kind": "multi", "max_ids": tags_max_ids}
            ],
            "partition": {"num_shards": shards},
            "entry": {"outputs": [{"name": "y", "shape": [1]}]},
        }
    )


def test_manifest_store_keeps_one_manifest_per_version_and_ignores_bad_files(tmp_path: Path) -> None:
    from gateway.core.manifests import ManifestStore

    path = tmp_path / "manifest.json"
    v1 = _manifest(1)
    path.write_text(v1.dumps(), encoding="utf-8")
    reloads: list[str] = []
    store = ManifestStore(MODEL, v1, path, num_shards=2, on_reload=lambda m, outcome: reloads.append(outcome))
    assert store.poll() is False and reloads == []  # unchanged file: not read again

    v3 = _manifest(3, tags_max_ids=12)
    path.write_text(v3.dumps(), encoding="utf-8")
    assert store.for_version(3) == v3 and reloads == ["ok"]  # an unknown version re-reads the changed file
    assert store.for_version(1) == v1 and store.latest == v3 and store.versions == [1, 3]
    assert store.for_version(2) == v1  # unknown: the newest older one
    assert store.for_version(None) == v3

    for bad in ("{not json", _manifest(4, shards=3).dumps(), _manifest(4, name="other").dumps()):
        path.write_text(bad, encoding="utf-8")
        assert store.poll() is False
        assert store.poll() is False  # reported once per change, not on every poll
    assert reloads == ["ok", "error", "error", "error"] and store.versions == [1, 3]

    store.retain({3})
    assert store.versions == [3]
    store.retain(set())
    assert store.versions == [3]  # the latest known is always kept
    assert store.for_version(1) == v3  # nothing older known: the oldest known


class _StatusFake:
    """A backend answering GetModelStatus from ``versions`` (served name -> AVAILABLE versions) or raising."""

    target = "fake:1"

    def __init__(self, versions: dict[str, set[int]], error: Exception | None = None) -> None:
        self.versions = versions
        self.error = error
        self.calls = 0

    async def get_model_status(self, req: Any, deadline: float) -> Any:
        from schemas.proto import tfs_pb2

        self.calls += 1
        if self.error is not None:
            raise self.error
        resp = tfs_pb2.GetModelStatusResponse()
        for v in sorted(self.versions.get(req.model_spec.name, set())):
            resp.model_version_status.add(version=v, state=tfs_pb2.ModelVersionStatus.AVAILABLE)
        resp.model_version_status.add(version=99, state=tfs_pb2.ModelVersionStatus.LOADING)  # never pinned
        return resp


def _pinner(entry: _StatusFake, *replicas: list[_StatusFake]) -> Any:
    from gateway.core.versions import VersionPinner

    shards = [(f"ps_{i}", r) for i, r in enumerate(replicas)]
    return VersionPinner(MODEL, entry, "entry", shards, ttl_s=3600)


async def test_pinner_pins_the_entry_latest_and_falls_back_to_the_highest_common_version() -> None:
    from gateway.core.versions import Pin
    from gateway.errors import Unavailable

    deadline = time.monotonic() + 10
    entry = _StatusFake({"entry": {1, 2, 3}})
    ps0 = _StatusFake({"ps_0": {1, 2, 3}})
    ps1a, ps1b = _StatusFake({"ps_1": {1, 2, 3}}), _StatusFake({"ps_1": {1, 2}})
    pins = _pinner(entry, [ps0], [ps1a, ps1b])
    assert await pins.current(deadline) == Pin(3)
    assert await pins.current(deadline) == Pin(3) and entry.calls == 1  # cached

    # A replica of shard 1 lacks v3: the highest version on the entry and every replica of every shard.
    assert await pins.after_not_found(Pin(3), deadline) == Pin(2, "version_fallback")
    assert await pins.after_not_found(Pin(3), deadline) == Pin(2, "version_fallback")
    assert ps0.calls == 1  # the second caller used the first one's refresh

    # A replica that does not answer does not count; once v3 is everywhere the pin is not degraded.
    ps1b.error = Unavailable("down")
    assert await pins.after_not_found(Pin(2, "version_fallback"), deadline) == Pin(3)

    # No replica of a shard answers: its error.
    ps1a.error = Unavailable("all down")
    with pytest.raises(Unavailable, match="all down"):
        await pins.after_not_found(Pin(3), deadline)

    # No version served everywhere: a retriable UNAVAILABLE naming what each serves.
    nothing = _pinner(_StatusFake({"entry": {2}}), [_StatusFake({"ps_0": {1}})])
    with pytest.raises(Unavailable) as info:
        await nothing.after_not_found(Pin(2), deadline)
    assert info.value.retriable
    assert "(entry: [2]; PS shard 0: [1])" in info.value.message

    empty = _pinner(_StatusFake({}), [ps0])
    with pytest.raises(Unavailable, match="model demo: the entry has no AVAILABLE version"):
        await empty.current(deadline)


async def test_pinner_waits_for_another_refresh_no_longer_than_the_deadline() -> None:
    import asyncio

    from gateway.errors import DeadlineExceeded

    class _Slow(_StatusFake):
        def __init__(self) -> None:
            super().__init__({"entry": {1}})
            self.release = asyncio.Event()

        async def get_model_status(self, req: Any, deadline: float) -> Any:
            await self.release.wait()
            return await super().get_model_status(req, deadline)

    entry = _Slow()
    pins = _pinner(entry, [_StatusFake({"ps_0": {1}})])
    first = asyncio.create_task(pins.current(time.monotonic() + 60))
    await asyncio.sleep(0)  # the first request holds the refresh lock, waiting for the entry
    with pytest.raises(DeadlineExceeded, match="resolving the version of demo"):
        await pins.current(time.monotonic() + 0.05)
    entry.release.set()
    assert (await first).version == 1


class _Gated(_StatusFake):
    """A backend whose GetModelStatus answers only once ``release`` is set."""

    def __init__(self, versions: dict[str, set[int]]) -> None:
        import asyncio

        super().__init__(versions)
        self.release = asyncio.Event()
        self.asked = 0  # calls made, answered or still waiting

    async def get_model_status(self, req: Any, deadline: float) -> Any:
        self.asked += 1
        await self.release.wait()
        return await super().get_model_status(req, deadline)


async def test_an_expired_pin_answers_while_one_refresh_runs_and_waiters_share_it() -> None:
    import asyncio

    from gateway.core.versions import STALE_S, Pin

    entry = _Gated({"entry": {1}})
    pins = _pinner(entry, [_StatusFake({"ps_0": {1, 2}})])

    # No pin yet: every request waits, all for one refresh (one call to the entry), and all wake together.
    waiting = [asyncio.create_task(pins.current(time.monotonic() + 60)) for _ in range(50)]
    await asyncio.sleep(0.01)
    assert not any(t.done() for t in waiting)
    entry.release.set()
    assert await asyncio.gather(*waiting) == [Pin(1)] * 50
    assert entry.asked == 1

    # Expired: answered at once with the previous pin while one refresh asks the entry, which now serves v2.
    entry.release.clear()
    entry.versions["entry"] = {1, 2}
    pins._until = time.monotonic() - 0.5
    assert [await pins.current(time.monotonic() + 60) for _ in range(20)] == [Pin(1)] * 20
    await asyncio.sleep(0.01)
    assert entry.asked == 2  # one refresh in flight for the 20 requests
    entry.release.set()
    await asyncio.sleep(0.01)
    assert await pins.current(time.monotonic() + 60) == Pin(2) and entry.asked == 2

    # Expired longer than STALE_S ago: the request waits for the refresh.
    entry.release.clear()
    entry.versions["entry"] = {1, 2, 3}
    pins._until = time.monotonic() - STALE_S - 1
    late = asyncio.create_task(pins.current(time.monotonic() + 60))
    await asyncio.sleep(0.01)
    assert not late.done()
    entry.release.set()
    assert await late == Pin(3)


async def test_a_failed_refresh_keeps_the_previous_pin_and_fails_only_its_waiters() -> None:
    import asyncio

    from gateway.core.versions import STALE_S, Pin
    from gateway.errors import Unavailable

    entry = _StatusFake({"entry": {4}})
    pins = _pinner(entry, [_StatusFake({"ps_0": {4}})])
    assert await pins.current(time.monotonic() + 10) == Pin(4)
    entry.error = Unavailable("entry down")
    pins._until = time.monotonic() - 0.5
    assert await pins.current(time.monotonic() + 10) == Pin(
        4
    )  # answered; the refresh fails in the background
    await asyncio.sleep(0.01)
    assert entry.calls == 2 and pins._refresh is None  # done, its error taken
    pins._until = time.monotonic() - STALE_S - 1
    with pytest.raises(Unavailable, match="entry down"):
        await pins.current(time.monotonic() + 10)
    entry.error = None
    assert await pins.current(time.monotonic() + 10) == Pin(4)


async def test_after_not_found_never_takes_a_pin_only_the_entry_was_asked_about() -> None:
    import asyncio

    from gateway.core.versions import Pin

    entry = _StatusFake({"entry": {1}})
    ps0 = _StatusFake({"ps_0": {1}})
    pins = _pinner(entry, [ps0])
    assert await pins.current(time.monotonic() + 10) == Pin(1)
    entry.versions["entry"] = {1, 2}  # the entry loaded v2, the shard not yet
    pins._until = time.monotonic() - 0.5
    assert await pins.current(time.monotonic() + 10) == Pin(1)  # the previous pin; the refresh finds v2
    await asyncio.sleep(0.01)
    assert await pins.current(time.monotonic() + 10) == Pin(2)
    # The shard answered NOT_FOUND for v2: every backend is asked, whatever the fresh pin says.
    assert await pins.after_not_found(Pin(2), time.monotonic() + 10) == Pin(1, "version_fallback")
    assert ps0.calls == 1

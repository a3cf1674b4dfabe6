"""An entry + sharded-PS embedding model: features -> lookups on every PS shard at once -> pooling -> entry."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

import numpy as np

from gateway.backends.client import BackendClient, ReplicaSet
from gateway.cache import CachedRowSource, RowSource, ShardRows
from gateway.coalesce import Coalescer
from gateway.codec.numeric import numeric_ndarray
from gateway.codec.tensor import from_ndarray, to_ndarray
from gateway.core.manifests import ManifestStore
from gateway.core.metadata import MetadataCache
from gateway.core.modelspec import answered_version, model_spec, read_answer
from gateway.core.positions import mark_stale, stale_reads
from gateway.core.requests import (
    ClassifyResult,
    Inputs,
    MetadataResult,
    PredictResult,
    RegressResult,
    VersionSpec,
)
from gateway.core.servable import Servable, StatusClient, available
from gateway.core.versions import VersionPinner
from gateway.errors import GatewayError, Internal, InvalidArgument, NotFound, clip
from gateway.limits import offload
from schemas.deployment import EmbeddingModel
from schemas.manifest import (
    LOOKUP_SIGNATURE,
    Manifest,
    lookup_ids_input,
    lookup_values_output,
)
from schemas.proto import tfs_pb2
from schemas.wire import predict_request_for

if TYPE_CHECKING:
    from gateway.embedding import LookupPlan
    from gateway.features import FeatureBatch

__all__ = ["EmbeddingServable"]


class EntryAnswer(Mapping[str, np.ndarray]):
    """The entry's answer to one run, kept as the entry sent it: ``wire`` (its serialized PredictResponse) and
    ``protos`` (its output tensors, parsed once). Read as arrays (a ``Mapping`` of them) only by what needs arrays
    (a coalesced run split per request, classify and regress); a Predict of this run alone answers with the entry's
    own tensors (and a gRPC front relays ``wire``), never decoded into numpy and encoded again."""

    __slots__ = ("_arrays", "protos", "wire")

    def __init__(self, wire: bytes | None, resp: tfs_pb2.PredictResponse) -> None:
        self.wire = wire  # None: not to be relayed (:func:`~gateway.core.modelspec.read_answer`)
        self.protos: Mapping[str, tfs_pb2.TensorProto] = resp.outputs
        self._arrays: dict[str, np.ndarray] | None = None

    def _all(self) -> dict[str, np.ndarray]:
        if self._arrays is None:
            self._arrays = {k: _ndarray(t) for k, t in self.protos.items()}
        return self._arrays

    def __getitem__(self, key: str) -> np.ndarray:
        return self._all()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._all())

    def __len__(self) -> int:
        return len(self.protos)


@dataclass(frozen=True, eq=False)
class _Served:
    """One request's entry outputs, the version that answered ("" if unknown), the feature batch they were computed
    from, and why the answer is degraded (None: it is not)."""

    outputs: Mapping[str, np.ndarray]
    answered: str
    batch: FeatureBatch
    degraded: str | None


class EmbeddingServable(Servable):
    """``config.name``: features parsed by the front end's :class:`Inputs` against ``manifest``; ids deduplicated
    and routed by :func:`gateway.embedding.plan_lookups`; the ``lookup`` signature called on every PS shard at once
    (one healthy replica each); rows pooled; the entry's serving signature called with pooled + dense inputs.

    **One version per request.** The same backend :class:`VersionSpec` goes to the lookups and the entry: the
    client's version (or configured label, resolved) or passed-through label as asked; for a "latest" request the
    version pinned by :class:`~gateway.core.versions.VersionPinner` (the entry's latest AVAILABLE version, or, when
    a backend does not serve it yet, the highest version every backend serves: the answer is then marked degraded).
    Features are parsed, routed and pooled with the manifest of that version (``manifests``).
    """

    config: EmbeddingModel

    def __init__(
        self,
        config: EmbeddingModel,
        manifest: Manifest | ManifestStore,
        entry: BackendClient,
        shards: list[ReplicaSet],
        cache: MetadataCache,
    ) -> None:
        manifests = manifest if isinstance(manifest, ManifestStore) else ManifestStore(config.name, manifest)
        if len(shards) != manifests.num_shards:
            raise ValueError(
                f"model {config.name!r}: manifest has {manifests.num_shards} shards, config lists {len(shards)}"
            )
        self.config = config
        self.name = config.name
        self.manifests = manifests
        self.served = config.served_entry_name
        self.entry = entry
        self.shards = shards
        self.cache = cache
        self.signature = manifests.latest.entry.signature_name
        self.pins = VersionPinner(
            config.name,
            entry,
            self.served,
            [(config.served_ps_name(i), rs.clients) for i, rs in enumerate(shards)],
            on_served=manifests.retain,
            ps_of=manifests.ps_version_of,
        )
        # Where PS rows come from. Default: the ``lookup`` signature of every shard with ids, at once. The lifespan
        # may wrap it (gateway.cache.CachedRowSource); anything implementing gateway.cache.RowSource fits.
        # ``coalescer`` (gateway.coalesce.Coalescer over ``run_now``), when set, merges concurrent ``run`` calls
        # for the same VersionSpec (so one pinned version, one manifest).
        self.rows: RowSource = _ShardLookups(self)
        self.coalescer: Coalescer | None = None

    @property
    def manifest(self) -> Manifest:
        """The manifest of the newest version known."""
        return self.manifests.latest

    @property
    def front(self) -> StatusClient:
        return self.entry

    def served_names(self) -> list[str]:
        return [self.served, *(self.config.served_ps_name(i) for i in range(len(self.shards)))]

    def _check_signature(self, sig: str) -> None:
        if sig not in ("", self.signature):
            raise InvalidArgument(f'Serving signature name: "{clip(sig)}" not found in signature def')

    async def _lookup(
        self,
        shard: int,
        ids: Mapping[str, np.ndarray],
        spec: VersionSpec,
        deadline: float,
        manifest: Manifest,
    ) -> tuple[dict[str, np.ndarray], str]:
        # int64 tensor_content framed around the ids' bytes (schemas/wire.py), one input per table of the manifest
        req = predict_request_for(
            model_spec(self.config.served_ps_name(shard), spec, LOOKUP_SIGNATURE),
            [(lookup_ids_input(t.name), ids.get(t.name, _NO_IDS)) for t in manifest.tables],
        )
        resp = await self.shards[shard].predict(req, deadline)
        out: dict[str, np.ndarray] = {}
        for t in manifest.tables:
            key = lookup_values_output(t.name)
            if key not in resp.outputs:
                raise Internal(f"PS shard {shard} of {self.name} returned no {key}")
            out[t.name] = _ndarray(resp.outputs[key]).reshape(-1, t.dim).astype(np.float32, copy=False)
        return out, _version_text(answered_version(resp))

    async def run(
        self, batch: FeatureBatch, spec: VersionSpec, deadline: float, manifest: Manifest | None = None
    ) -> tuple[Mapping[str, np.ndarray], str]:
        """Entry outputs (+ the version that answered, "" if unknown) for ``batch``, every backend call at ``spec``:
        through the coalescer when one is set (concurrent requests share one lookup per shard and one entry call),
        else :meth:`run_now`. ``manifest``: the one ``batch`` was parsed with (default: ``spec``'s version's)."""
        if self.coalescer is not None:
            return await self.coalescer.submit(batch, spec, deadline)
        return await self.run_now(batch, spec, deadline, manifest)

    async def run_now(
        self, batch: FeatureBatch, spec: VersionSpec, deadline: float, manifest: Manifest | None = None
    ) -> tuple[EntryAnswer, str]:
        """Lookups (``rows``: every shard with ids, concurrently, or the cache), then the entry's Predict: with the
        rows pooled per feature (``pooled`` entry) or with each distinct row once plus indices (``unique_rows``
        entry, :func:`gateway.embedding.unique_inputs`; the entry pools)."""
        from gateway.embedding import plan_lookups

        if manifest is None:
            manifest = self.manifests.for_version(spec.version)
        spec_msg = model_spec(self.served, spec, manifest.entry.signature_name)
        wire = self._all_cached(spec_msg, batch, spec, manifest)
        if wire is not None:
            return await self._entry(wire, deadline)
        plan = await offload(plan_lookups, batch, manifest)
        shard_values = (await self.rows.lookup(plan.shard_ids, _ps_spec(spec, manifest), deadline)).values
        # framed around the arrays' bytes (one copy, off the event loop for a large request): schemas/wire.py
        req = await offload(_entry_request_for, spec_msg, plan, shard_values, batch, manifest)
        return await self._entry(req, deadline)

    def _all_cached(
        self, spec_msg: tfs_pb2.ModelSpec, batch: FeatureBatch, spec: VersionSpec, manifest: Manifest
    ) -> bytes | None:
        """The entry request written in one native call when the hot-row cache holds every row ``batch`` reads
        and the entry is one it writes (:meth:`gateway.cache.CachedRowSource.cached_entry_request`); else None and
        :meth:`run_now` takes the general path, which gives the same request."""
        rows = self.rows
        if not isinstance(rows, CachedRowSource):
            return None
        head = tfs_pb2.PredictRequest(model_spec=spec_msg).SerializeToString()
        return rows.cached_entry_request(head, batch, manifest, _ps_spec(spec, manifest))

    async def _entry(self, req: bytes, deadline: float) -> tuple[EntryAnswer, str]:
        """The entry's answer to the serialized request ``req``, and the version that answered."""
        resp, relay = read_answer(await self.entry.predict_bytes(req, deadline), f"entry of {self.name}")
        return EntryAnswer(relay, resp), _version_text(answered_version(resp))

    async def _serve(
        self, parse: Callable[[Manifest], FeatureBatch], spec: VersionSpec, deadline: float
    ) -> _Served:
        """Parse with the manifest of the version the request is served at and :meth:`run` at that one version.

        ``spec`` with a version or label: as asked. "Latest": at the pinned version; when a backend answers
        NOT_FOUND for it, re-pinned once (see :class:`~gateway.core.versions.VersionPinner`) and run again. Either
        is marked ``replica_catching_up`` too when a PS replica catching up answered a lookup meanwhile
        (:func:`~gateway.core.positions.mark_stale`).
        """
        stale = stale_reads(self.shards)
        if spec != VersionSpec():
            manifest = self.manifests.for_version(spec.version)
            batch = await offload(parse, manifest)
            outputs, answered = await self.run(batch, spec, deadline, manifest)
            return _Served(outputs, answered, batch, mark_stale(None, self.shards, stale))
        pin = await self.pins.current(deadline)
        batches: dict[
            int, FeatureBatch
        ] = {}  # by manifest version: parsed again only if the manifest differs
        for attempt in range(2):
            manifest = self.manifests.for_version(pin.version)
            if manifest.version not in batches:
                batches[manifest.version] = await offload(parse, manifest)
            batch = batches[manifest.version]
            try:
                outputs, answered = await self.run(batch, pin.spec, deadline, manifest)
            except NotFound:
                if attempt:
                    raise
                pin = await self.pins.after_not_found(pin, deadline)
                continue
            return _Served(outputs, answered, batch, mark_stale(pin.degraded, self.shards, stale))
        raise AssertionError("unreachable: the second attempt returns or raises")

    async def predict(
        self, inputs: Inputs, signature: str, spec: VersionSpec, deadline: float
    ) -> PredictResult:
        self._check_signature(signature)
        served = await self._serve(inputs.features, spec, deadline)
        outputs = served.outputs
        answered = _version_number(served.answered)
        # this request's own entry call: its tensors as the entry sent them
        if isinstance(outputs, EntryAnswer):
            return PredictResult(outputs.protos, answered, self.signature, served.degraded, wire=outputs.wire)
        tensors = {k: from_ndarray(v) for k, v in outputs.items()}
        return PredictResult(tensors, answered, self.signature, served.degraded)

    async def _scores(
        self, inp: tfs_pb2.Input, signature: str, spec: VersionSpec, deadline: float
    ) -> tuple[np.ndarray, int | None, str | None]:
        from gateway.features import batch_from_input

        self._check_signature(signature)
        served = await self._serve(lambda manifest: batch_from_input(inp, manifest), spec, deadline)
        batch, outputs = served.batch, served.outputs
        if len(outputs) != 1:
            raise InvalidArgument(
                f"Expected one output tensor for classify/regress, model {self.name} has {len(outputs)}: "
                f"{', '.join(sorted(outputs))}"
            )
        ((name, arr),) = outputs.items()
        if arr.ndim == 0 or arr.shape[0] != batch.size or arr.ndim > 2:
            raise InvalidArgument(
                f"Output tensor {name} has shape {list(arr.shape)}; expected [{batch.size}, ...]"
            )
        return (
            arr.reshape(batch.size, -1).astype(np.float32),
            _version_number(served.answered),
            served.degraded,
        )

    async def classify(
        self, inp: tfs_pb2.Input, signature: str, spec: VersionSpec, deadline: float
    ) -> ClassifyResult:
        scores, answered, degraded = await self._scores(inp, signature, spec, deadline)
        result = tfs_pb2.ClassificationResult()
        for row in scores.tolist():
            classes = result.classifications.add().classes
            for s in row:
                classes.add(label="", score=s)
        return ClassifyResult(result, answered, self.signature, degraded)

    async def regress(
        self, inp: tfs_pb2.Input, signature: str, spec: VersionSpec, deadline: float
    ) -> RegressResult:
        scores, answered, degraded = await self._scores(inp, signature, spec, deadline)
        if scores.shape[1] != 1:
            raise InvalidArgument(
                f"Expected output tensor of shape [batch_size] or [batch_size, 1] for regression, got "
                f"[{scores.shape[0]}, {scores.shape[1]}]"
            )
        result = tfs_pb2.RegressionResult()
        for v in scores[:, 0].tolist():
            result.regressions.add(value=v)
        return RegressResult(result, answered, self.signature, degraded)

    async def metadata(self, spec: VersionSpec, deadline: float) -> MetadataResult:
        from gateway.features import client_signature

        if spec == VersionSpec():  # the inputs of the version a "latest" predict is served at
            spec = (await self.pins.current(deadline)).spec
        used, sigmap = await self.cache.get(self.entry, self.served, spec, deadline, fresh=True)
        if self.signature not in sigmap.signature_def:
            raise Internal(f"entry of {self.name} has no signature {self.signature!r}")
        entry_sig = sigmap.signature_def[self.signature]
        visible = tfs_pb2.SignatureDefMap()
        manifest = self.manifests.for_version(used)
        visible.signature_def[self.signature].CopyFrom(client_signature(manifest, entry_sig.outputs))
        return MetadataResult(used, visible)

    async def ready(self, deadline: float) -> bool:
        checks: list[tuple[StatusClient, str]] = [(self.entry, self.served)]
        for i, rs in enumerate(self.shards):
            checks.extend((c, self.config.served_ps_name(i)) for c in rs.clients)
        for client, served in checks:
            if not await available(client, served, deadline):
                return False
        return True


_NO_IDS: Final = np.zeros(0, dtype=np.int64)


def _entry_request_for(
    spec: tfs_pb2.ModelSpec,
    plan: LookupPlan,
    shard_values: list[dict[str, np.ndarray]],
    batch: FeatureBatch,
    manifest: Manifest,
) -> bytes:
    """The serialized entry request for ``manifest.entry.input_mode`` (:func:`gateway.embedding.entry_request`)."""
    from gateway.embedding import entry_request

    return entry_request(spec, plan, shard_values, batch, manifest)


def _ndarray(t: tfs_pb2.TensorProto) -> np.ndarray:
    fast = numeric_ndarray(t)
    return fast if fast is not None else to_ndarray(t)


def _ps_spec(spec: VersionSpec, manifest: Manifest) -> VersionSpec:
    """The PS lookups' spec of a request at entry ``spec``: the PS version ``manifest`` (that entry version's) reads
    after an entry-only export, else ``spec`` itself."""
    if manifest.ps_version is not None and spec.version == manifest.version:
        return VersionSpec(version=manifest.ps_version)
    return spec


def _version_text(version: int | None) -> str:
    return "" if version is None else str(version)


def _version_number(text: str) -> int | None:
    return int(text) if text else None


class _ShardLookups:
    """The PS as a :class:`gateway.cache.RowSource`: the ``lookup`` signature on every shard that has ids, at once,
    with the manifest of ``spec``'s version; shards without ids are not called (their answer is empty arrays)."""

    def __init__(self, servable: EmbeddingServable) -> None:
        self._s = servable

    async def lookup(
        self, shard_ids: Sequence[Mapping[str, np.ndarray]], spec: VersionSpec, deadline: float
    ) -> ShardRows:
        s = self._s
        manifest = s.manifests.for_version(spec.version)
        dims = {t.name: t.dim for t in manifest.tables}
        asked = [i for i, ids in enumerate(shard_ids) if any(a.size for a in ids.values())]
        try:
            async with asyncio.TaskGroup() as tg:
                tasks = {
                    i: tg.create_task(s._lookup(i, shard_ids[i], spec, deadline, manifest)) for i in asked
                }
        except* GatewayError as eg:
            raise eg.exceptions[0] from None
        values: list[dict[str, np.ndarray]] = []
        versions: list[str] = []
        for i in range(len(shard_ids)):
            if i in tasks:
                got, answered = tasks[i].result()
            else:
                got = {t: np.empty((0, d), dtype=np.float32) for t, d in dims.items()}
                answered = ""
            values.append(got)
            versions.append(answered)
        return ShardRows(values, tuple(versions))

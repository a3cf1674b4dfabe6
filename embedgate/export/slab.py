"""The slab layout of a PS shard: every table's rows in one dense variable, a compact id -> slot index beside it.

Per table ``t`` (checkpoint names in brackets; all core TF, restored by the TF1 loader like any variable):

* ``slabs/<t>``: a resource variable ``[capacity, dim]`` of the table's ``row_dtype`` (float32, float16 or bfloat16)
  created with an unknown shape, so a write that needs more slots re-assigns it to a larger tensor (growth by a
  quarter of the capacity, at least :data:`MIN_GROWTH` rows: amortised O(1) per row, at most 25 % slack); an export
  has exactly its rows' capacity;
* ``keys/<t>``: int64, the exported ids, sorted, then padded with at least one :data:`EMPTY_KEY` to a multiple of
  :data:`FENCE_BLOCK`; the exported row of ``keys[i]`` is in slot ``i`` (8 bytes per exported row, no hash table);
* ``fence/<t>``: int64 ``[1, len(keys) / FENCE_BLOCK]``, the last key of every block of :data:`FENCE_BLOCK` keys
  (1/8 byte per row, small enough to stay in the CPU's cache). An id is found in two binary searches
  (``LowerBound``): the fence names the one block that can hold it, then a search within that block (a few adjacent
  cache lines), instead of one search over all keys (a cache miss per step once the keys outgrow the cache). Exports
  of earlier builds have no fence and unpadded keys, and keep their own graph (one search over all keys);
* ``overlay/<t>``: ``DenseHashTable`` int64 id -> int64 reference for what changed since the export: the slot of an
  id written later with its allocation's generation in the high 32 bits (``slot | generation << 32``), or -2 for a
  deleted exported id (open addressing, 16 bytes per bucket; only changed ids pay). Ids
  2**63 - 1 and 2**63 - 2 are its sentinels: they look up to the default row and writes of them are ignored (the
  largest int64, not the smallest: -2**63 is the OOV key of lookup-layer tables, gateway.lookup_mapping.OOV_KEY);
* ``owners/<t>``: int32 ``[capacity]``, parallel to the slab: the generation of the allocation that gave each slot
  its current id (exported slots: 0); ``generation/<t>``: int64, the allocations made so far (4 bytes a row);
* ``row_versions/<t>``: int64 ``[capacity, 2]``, parallel to the slab: the version (timestamp ms, seq) of each slot's
  row; exported rows have (-1, -1);
* ``tombstones/<t>``: ``DenseHashTable`` int64 id -> int64[2], the version of each id's latest delete (only ids
  deleted at least once pay), so an older write arriving later cannot resurrect the row. A tombstone stays when its
  id is written again (a live row's own version is the one compared) and is overwritten by the next delete: nothing
  is ever removed from a ``DenseHashTable``, whose ``remove`` in TF 2.21 can leave a stale duplicate of a key that
  a later lookup finds (tests/export/test_slab.py reproduces it);
* ``free/<t>`` + ``free_count/<t>``: a stack of slots freed by deletes (and expiry), reused before new slots;
  ``used/<t>``: the high-water mark of slots handed out; ``count/<t>``: the live rows;
* ``written/<t>`` (tables with ``ttl_s`` only): int64 ``[capacity]``, the timestamp (ms) of the write that set each
  slot's row (exported rows: the export time), read by the ``expire`` signature.

Every write signature runs under one mutex per shard (``MutexV2``/``MutexLock``, core ops): a write is a
read-modify-write over several variables. ``lookup`` takes no lock (a ``MutexLock`` is a hop to the mutex's own
thread, the largest cost of a lookup on a busy host): it resolves each id to a reference (slot, generation), gathers
the slot's row, *then* the slot's owner generation, and answers the default row unless the two generations agree.
A write that gives a slot to another id writes the slot's new generation first, then the row, then the overlay entry
(control dependencies; every variable op holds the variable's lock). So a row a lookup returns was written for its id:
a lookup that read the row after a reuse of the slot reads the new generation after it, and generations are unique
(a 31-bit counter: a lookup would have to overlap 2**31 allocations to be fooled). A lookup overlapping a delete of
its id answers the old row or the default row, and one overlapping an upsert the old or the new row, as under a lock.
``row_count`` and ``stream_position`` read one hash table or variable each, which locks itself.
Semantics and signatures are those of :mod:`embedgate.export.ps` (the module docstring there and
:mod:`schemas.manifest`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from schemas.manifest import (
    EXPIRE_SIGNATURE,
    LOOKUP_SIGNATURE,
    ROW_COUNT_SIGNATURE,
    STREAM_POSITION_SIGNATURE,
    TableSpec,
    delete_signature,
    expire_count_output,
    lookup_ids_input,
    lookup_values_output,
    row_count_output,
    stream_offsets_output,
    stream_partitions_output,
    upsert_signature,
)

__all__ = ["FENCE_BLOCK", "MIN_GROWTH", "read_slab_rows", "write_slab_shard"]

Rows = tuple[Any, Any]
MIN_GROWTH = 1024  # fewest slots a growing slab adds
FENCE_BLOCK = 64  # keys per block of the exported-id index (512 bytes: 8 cache lines)
EMPTY_KEY = int(np.iinfo(np.int64).max)  # the index's sentinels: these two ids never get a row
DELETED_KEY = EMPTY_KEY - 1
_LOCK_NAME = "embedgate_ps_lock"
_MAX_SEQ = int(np.iinfo(np.int64).max)
_FLOAT16_MAX = 65504.0
_HIDDEN = -2  # overlay value of a deleted exported id
_SLOT_BITS = 32  # a reference is slot | generation << 32
_SLOT_MASK = (1 << _SLOT_BITS) - 1
_GENERATIONS = (1 << 31) - 1  # generations cycle through 1 .. 2**31 - 1 (0: exported slots)


def write_slab_shard(
    path: str | Path,
    tables: Sequence[TableSpec],
    rows: Mapping[str, Rows],
    *,
    stream_cut: Mapping[str, int] | None = None,
    written_ms: int = 0,
) -> None:
    """Save one PS shard in the slab layout at ``path``; arguments as :func:`embedgate.export.ps.write_ps_shard`.

    ``written_ms``: the time exported rows count as written (tables with ``ttl_s``). ValueError if an id is one of
    the two reserved sentinels."""
    import tensorflow as tf

    module = _module(tables, rows, stream_cut=stream_cut, written_ms=written_ms)
    tf.saved_model.save(module, str(path), signatures=_signatures(module, tables))


def _module(
    tables: Sequence[TableSpec],
    rows: Mapping[str, Rows],
    *,
    stream_cut: Mapping[str, int] | None = None,
    written_ms: int = 0,
) -> Any:
    """The ``tf.Module`` of one shard (variables and hash tables, arguments as :func:`write_slab_shard`)."""
    import tensorflow as tf

    module = tf.Module()
    for attr in (
        "slabs",
        "keys",
        "fence",
        "overlay",
        "row_versions",
        "owners",
        "generation",
        "tombstones",
        "free",
        "free_count",
        "used",
        "count",
    ):
        setattr(module, attr, {})
    module.written, module.positions = {}, {}
    cut = dict(stream_cut or {})
    for spec in tables:
        t = spec.name
        ids, values = rows.get(t, (np.zeros(0, np.int64), np.zeros((0, spec.dim), np.float32)))
        ids = np.asarray(ids, np.int64)
        n = len(ids)
        if n > _SLOT_MASK:
            raise ValueError(
                f"table {t!r}: {n} rows in one shard; the slab layout holds at most {_SLOT_MASK}"
            )
        if n and int(np.max(ids)) >= DELETED_KEY:
            raise ValueError(
                f"table {t!r}: ids {EMPTY_KEY} and {DELETED_KEY} are reserved by the slab layout"
            )
        if spec.row_dtype == "float16" and n and float(np.max(np.abs(values))) > _FLOAT16_MAX:
            raise ValueError(
                f"table {t!r}: a row element of magnitude {float(np.max(np.abs(values))):.4g} does not fit "
                f"row_dtype float16 (largest {_FLOAT16_MAX}); use bfloat16 or float32"
            )
        ordered = bool(np.all(ids[:-1] <= ids[1:]))
        order = np.arange(n) if ordered else np.argsort(ids, kind="stable")
        if n:  # rows in id order (no copy when they already are), cast in numpy where it can be
            slab = np.asarray(values, np.float32) if ordered else np.asarray(values, np.float32)[order]
        else:
            slab = np.zeros((1, spec.dim), np.float32)  # never empty: a gather needs a row (masked out)
        cap = len(slab)
        if spec.row_dtype == "bfloat16":
            init = tf.cast(tf.constant(slab, tf.float32), tf.bfloat16)
        else:
            init = tf.constant(slab.astype(spec.row_dtype, copy=False))
        module.slabs[t] = tf.Variable(init, shape=tf.TensorShape(None), name=f"ps_slab_{t}")
        del slab, init
        keys = _padded_keys(ids[order])
        module.keys[t] = tf.Variable(keys, name=f"ps_keys_{t}")
        module.fence[t] = tf.Variable(keys[FENCE_BLOCK - 1 :: FENCE_BLOCK][None, :], name=f"ps_fence_{t}")
        del keys
        module.overlay[t] = _dense_table(tf.constant(-1, tf.int64), f"ps_overlay_{t}")
        module.row_versions[t] = tf.Variable(
            tf.fill([cap, 2], tf.constant(-1, tf.int64)), shape=tf.TensorShape(None), name=f"ps_versions_{t}"
        )
        module.owners[t] = tf.Variable(
            tf.zeros([cap], tf.int32), shape=tf.TensorShape(None), name=f"ps_owners_{t}"
        )
        module.generation[t] = tf.Variable(tf.constant(0, tf.int64), name=f"ps_generation_{t}")
        module.tombstones[t] = _dense_table(tf.constant([-1, -1], tf.int64), f"ps_tombstones_{t}")
        module.free[t] = tf.Variable(tf.zeros([0], tf.int64), shape=tf.TensorShape(None), name=f"ps_free_{t}")
        module.free_count[t] = tf.Variable(tf.constant(0, tf.int64), name=f"ps_free_count_{t}")
        module.used[t] = tf.Variable(tf.constant(n, tf.int64), name=f"ps_used_{t}")
        module.count[t] = tf.Variable(tf.constant(n, tf.int64), name=f"ps_count_{t}")
        if spec.ttl_s is not None:
            module.written[t] = tf.Variable(
                tf.fill([cap], tf.constant(written_ms, tf.int64)),
                shape=tf.TensorShape(None),
                name=f"ps_written_{t}",
            )
        positions = tf.lookup.experimental.MutableHashTable(
            key_dtype=tf.string, value_dtype=tf.int64, default_value=-1, name=f"ps_positions_{t}"
        )
        if cut:
            positions.insert(tf.constant(list(cut), tf.string), tf.constant(list(cut.values()), tf.int64))
        module.positions[t] = positions
    return module


def _padded_keys(keys: np.ndarray) -> np.ndarray:
    """Sorted ``keys`` followed by :data:`EMPTY_KEY` up to the next multiple of :data:`FENCE_BLOCK` (at least one:
    so the last block ends with a key above every id, and an empty table has one block, never matched)."""
    out = np.full((len(keys) // FENCE_BLOCK + 1) * FENCE_BLOCK, EMPTY_KEY, np.int64)
    out[: len(keys)] = keys
    return out


def _dense_table(default: Any, name: str) -> Any:
    """An empty int64-keyed ``DenseHashTable``: 8 buckets (a loaded one adopts its saved buckets, no second array)."""
    import tensorflow as tf

    return tf.lookup.experimental.DenseHashTable(
        key_dtype=tf.int64,
        value_dtype=tf.int64,
        default_value=default,
        empty_key=EMPTY_KEY,
        deleted_key=DELETED_KEY,
        initial_num_buckets=8,
        name=name,
    )


def read_slab_rows(reader: Any, spec: TableSpec, where: str) -> Rows:
    """(ids, float32 rows) of ``spec`` from a slab-layout checkpoint ``reader``; ValueError naming ``where``."""
    t = spec.name
    slab = reader.get_tensor(f"slabs/{t}/.ATTRIBUTES/VARIABLE_VALUE")
    if slab.ndim != 2 or slab.shape[1] != spec.dim:
        raise ValueError(f"{where}: table {t!r} has rows of shape {slab.shape[1:]}, expected ({spec.dim},)")
    keys = reader.get_tensor(f"keys/{t}/.ATTRIBUTES/VARIABLE_VALUE").astype(np.int64)
    ov_k = reader.get_tensor(f"overlay/{t}/.ATTRIBUTES/table-keys").astype(np.int64).reshape(-1)
    ov_v = reader.get_tensor(f"overlay/{t}/.ATTRIBUTES/table-values").astype(np.int64).reshape(-1)
    real = ov_k < DELETED_KEY  # the rest are the DenseHashTable's empty and deleted buckets
    ov_k, ov_v = ov_k[real], ov_v[real]
    base = (keys < DELETED_KEY) & ~np.isin(keys, ov_k)
    ids = np.concatenate([keys[base], ov_k[ov_v >= 0]])
    slots = np.concatenate([np.flatnonzero(base), ov_v[ov_v >= 0] & _SLOT_MASK])  # older exports: bare slots
    return ids, np.asarray(slab[slots], dtype=np.float32)


# -- graph pieces (run inside tf.function, under the shard's lock) --------------------------------------------------
class _Table:
    """The variables and hash tables of one table, and the graph operations on them (call inside tf.function)."""

    def __init__(self, module: Any, spec: TableSpec) -> None:
        t = spec.name
        self.spec = spec
        self.slab, self.keys, self.overlay = module.slabs[t], module.keys[t], module.overlay[t]
        self.fence = module.fence[t]
        self.versions, self.tombstones = module.row_versions[t], module.tombstones[t]
        self.owners, self.generation = module.owners[t], module.generation[t]
        self.free, self.free_count, self.used = module.free[t], module.free_count[t], module.used[t]
        self.count = module.count[t]
        self.written = module.written.get(t)
        self.position = module.positions[t]

    def refs(self, ids: Any) -> Any:
        """int64 [n]: each id's reference (``slot | generation << 32``; exported rows: generation 0), negative for
        an unknown, deleted or reserved id. Few ops: a lookup's cost is mostly per op."""
        import tensorflow as tf

        safe = tf.minimum(ids, DELETED_KEY - 1)  # the hash tables refuse the sentinels; masked below
        over = self.overlay.lookup(safe)  # [n]: the table's values are scalars
        keys = self.keys.read_value()  # never sparse-accessed: the read aliases the variable, no copy
        # the block that can hold each id: the first whose last key is >= it (the last block ends with EMPTY_KEY)
        block = tf.reshape(
            tf.raw_ops.LowerBound(
                sorted_inputs=self.fence.read_value(), values=tf.reshape(safe, [1, -1]), out_type=tf.int64
            ),
            [-1],
        )
        within = tf.raw_ops.LowerBound(
            sorted_inputs=tf.gather(tf.reshape(keys, [-1, FENCE_BLOCK]), block),
            values=tf.reshape(safe, [-1, 1]),
            out_type=tf.int64,
        )
        pos = block * FENCE_BLOCK + tf.reshape(within, [-1])
        # an exported id not changed since (overlay -1) whose key is found; ids (not safe): a reserved id misses
        hit = tf.logical_and(tf.equal(tf.gather(keys, pos), ids), over == -1)
        return tf.where(ids >= DELETED_KEY, tf.constant(-1, tf.int64), tf.where(hit, pos, over))

    def slots(self, ids: Any) -> Any:
        """int64 [n]: the slot of each id, -1 for an unknown, deleted or reserved id."""
        import tensorflow as tf

        ref = self.refs(ids)
        return tf.where(ref >= 0, tf.bitwise.bitwise_and(ref, _SLOT_MASK), tf.constant(-1, tf.int64))

    def gather(self, ids: Any) -> Any:
        """float32 [n, dim]: the rows of ``ids``, the default row for an unknown id. Runs without the shard's lock:
        a row counts only if its slot's owner generation, read after the row, is the one the id resolved to."""
        return self.read(self.refs(ids))

    def read(self, ref: Any) -> Any:
        """float32 [n, dim]: the row of each reference of :meth:`refs`, the default row for a negative one or one
        whose slot has been given to another id since (its owner generation differs)."""
        import tensorflow as tf

        slot = tf.bitwise.bitwise_and(tf.maximum(ref, 0), _SLOT_MASK)
        rows = tf.cast(tf.gather(self.slab, slot), tf.float32)  # no op for float32 rows
        with tf.control_dependencies([rows]):
            owner = tf.gather(self.owners, slot)
        # a negative reference shifts (arithmetically) to generation -1, which no slot has: no separate ref >= 0
        ok = tf.equal(owner, tf.cast(tf.bitwise.right_shift(ref, _SLOT_BITS), tf.int32))
        # Select with a vector condition copies whole rows; SelectV2 broadcasting a [1, dim] default is 4x slower
        default = tf.fill(tf.shape(rows), tf.constant(self.spec.default_value, tf.float32))
        return tf.raw_ops.Select(condition=ok, x=rows, y=default)

    def stored(self, ids: Any) -> tuple[Any, Any]:
        """(slot or -1, int64 [n, 2] stored version: the row's, else the tombstone's, else (-1, -1))."""
        import tensorflow as tf

        slot = self.slots(ids)
        live = tf.gather(self.versions, tf.maximum(slot, 0))
        tomb = tf.reshape(self.tombstones.lookup(_safe(ids)), [-1, 2])
        return slot, tf.where(tf.expand_dims(slot >= 0, 1), live, tomb)

    def live(self) -> tuple[Any, Any]:
        """(ids, slots) of every live row: exported ids not changed since, and the overlay's ids with a slot."""
        import tensorflow as tf

        keys = self.keys.read_value()
        over = tf.reshape(self.overlay.lookup(_safe(keys)), [-1])
        base = tf.logical_and(keys < DELETED_KEY, over == -1)
        ok, ov = self.overlay.export()
        ok, ov = tf.reshape(ok, [-1]), tf.reshape(ov, [-1])
        mine = tf.logical_and(ok < DELETED_KEY, ov >= 0)
        base, mine = _where(base), _where(mine)
        ids = tf.concat([tf.gather(keys, base), tf.gather(ok, mine)], 0)
        slots = tf.concat([base, tf.bitwise.bitwise_and(tf.gather(ov, mine), _SLOT_MASK)], 0)
        return ids, slots

    def allocate(self, n: Any) -> tuple[Any, list[Any]]:
        """``n`` free slots (popped from the free stack first, then fresh ones, growing the slab): (slots, ops)."""
        import tensorflow as tf

        count = tf.identity(self.free_count.read_value())
        k = tf.minimum(n, count)
        popped = tf.gather(self.free, tf.range(count - k, count))
        ops = [tf.raw_ops.AssignVariableOp(resource=self.free_count.handle, value=count - k)]
        used = tf.identity(self.used.read_value())
        need = used + (n - k)
        grown = self._grow(need)
        ops.append(tf.raw_ops.AssignVariableOp(resource=self.used.handle, value=need))
        with tf.control_dependencies([grown]):
            slots = tf.concat([popped, tf.range(used, need)], 0)
        return slots, ops

    def _grow(self, need: Any) -> Any:
        """Make the slab (and its parallel variables) hold at least ``need`` slots; a tensor to depend on."""
        import tensorflow as tf

        cap = _capacity(self.slab)
        dim, dtype = self.spec.dim, self.slab.dtype

        def grow() -> Any:
            new = tf.maximum(need, cap + tf.maximum(cap // 4, MIN_GROWTH))
            extra = new - cap
            ops = [
                _append(self.slab, tf.zeros(tf.stack([extra, dim]), dtype)),
                _append(self.versions, tf.fill(tf.stack([extra, 2]), tf.constant(-1, tf.int64))),
                _append(self.owners, tf.zeros(tf.reshape(extra, [1]), tf.int32)),
            ]
            if self.written is not None:
                ops.append(_append(self.written, tf.zeros(tf.reshape(extra, [1]), tf.int64)))
            with tf.control_dependencies(ops):
                return tf.constant(True)

        return tf.cond(need > cap, grow, lambda: tf.constant(False))

    def claim(self, slots: Any) -> tuple[Any, list[Any]]:
        """Give each of ``slots`` (just allocated) a new generation, written to ``owners``: (int64 generations, ops)."""
        import tensorflow as tf

        done = tf.identity(self.generation.read_value())
        k = tf.size(slots, out_type=tf.int64)
        gens = tf.math.floormod(done + tf.range(k), _GENERATIONS) + 1
        return gens, [
            self.scatter(self.owners, slots, tf.cast(gens, tf.int32)),
            tf.raw_ops.AssignVariableOp(resource=self.generation.handle, value=done + k),
        ]

    def release(self, slots: Any) -> list[Any]:
        """Push ``slots`` onto the free stack (grown like the slab when full)."""
        import tensorflow as tf

        count = tf.identity(self.free_count.read_value())
        m = tf.size(slots, out_type=tf.int64)
        cap = _capacity(self.free)

        def grow() -> Any:
            extra = tf.maximum(count + m, cap + tf.maximum(cap // 4, MIN_GROWTH)) - cap
            with tf.control_dependencies([_append(self.free, tf.zeros(tf.reshape(extra, [1]), tf.int64))]):
                return tf.constant(True)

        grown = tf.cond(count + m > cap, grow, lambda: tf.constant(False))
        with tf.control_dependencies([grown]):
            put = tf.raw_ops.ResourceScatterUpdate(
                resource=self.free.handle, indices=tf.range(count, count + m), updates=slots
            )
        return [put, tf.raw_ops.AssignVariableOp(resource=self.free_count.handle, value=count + m)]

    def forget(self, ids: Any, slots: Any, stamps: Any) -> list[Any]:
        """Delete ``ids`` (their live rows in ``slots``): free the slots, hide the ids, record tombstones."""
        import tensorflow as tf

        ops = self.release(slots)
        with tf.control_dependencies(ops):
            ops.append(self.overlay.insert(ids, tf.fill(tf.shape(ids), tf.constant(_HIDDEN, tf.int64))))
            ops.append(self.tombstones.insert(ids, stamps))
            ops.append(
                tf.raw_ops.AssignSubVariableOp(
                    resource=self.count.handle, value=tf.size(slots, out_type=tf.int64)
                )
            )
        return ops

    def scatter(self, var: Any, slots: Any, values: Any) -> Any:
        import tensorflow as tf

        return tf.raw_ops.ResourceScatterUpdate(resource=var.handle, indices=slots, updates=values)


def _where(mask: Any) -> Any:
    """int64 [k]: the positions where the 1-D bool ``mask`` is true; ``tf.gather(x, _where(m))`` is
    ``tf.boolean_mask(x, m)`` in two ops (``boolean_mask`` adds a dozen shape ops, each traced at export)."""
    import tensorflow as tf

    return tf.reshape(tf.where(mask), [-1])


def _safe(ids: Any) -> Any:
    """``ids`` with the reserved sentinels replaced by 0 (a hash table refuses to look them up)."""
    import tensorflow as tf

    return tf.where(ids >= DELETED_KEY, tf.zeros_like(ids), ids)


def _capacity(var: Any) -> Any:
    """Rows of ``var`` without reading it (``tf.shape`` of a variable reads it: a full copy in copy-on-read mode)."""
    import tensorflow as tf

    return tf.raw_ops.VariableShape(input=var.handle, out_type=tf.int64)[0]


def _append(var: Any, tail: Any) -> Any:
    """Re-assign ``var`` (unknown static shape) to itself with ``tail`` appended along axis 0."""
    import tensorflow as tf

    return tf.raw_ops.AssignVariableOp(resource=var.handle, value=tf.concat([var.read_value(), tail], 0))


def _locked(body: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Run ``body`` holding the shard's mutex; the lock is released only after every output (which the body makes
    depend on its writes) is computed."""
    import tensorflow as tf

    mutex = tf.raw_ops.MutexV2(shared_name=_LOCK_NAME)
    lock = tf.raw_ops.MutexLock(mutex=mutex)
    with tf.control_dependencies([lock]):
        out = body()
    with tf.control_dependencies(tf.nest.flatten(out)):
        done = tf.raw_ops.ConsumeMutexLock(mutex_lock=lock)
    with tf.control_dependencies([done]):
        return {k: tf.identity(v) for k, v in out.items()}


def _write_result(tab: _Table, applied_ids: Any, previous: Any, ops: list[Any]) -> dict[str, Any]:
    """The outputs of ``upsert_<t>`` / ``delete_<t>``, computed after every op of the write."""
    import tensorflow as tf

    with tf.control_dependencies(ops):
        return {
            "rows": tab.count.read_value(),
            "applied": tf.size(applied_ids, out_type=tf.int64),
            "stream_previous": tf.identity(previous),
        }


def _signatures(module: Any, specs: Sequence[TableSpec]) -> dict[str, Any]:
    import tensorflow as tf

    from embedgate.export.ps import advance_positions, newer_versions, winners

    tabs = {s.name: _Table(module, s) for s in specs}
    names = [s.name for s in specs]

    def lookup(*ids: Any) -> dict[str, Any]:  # no lock: see the module docstring
        return {lookup_values_output(t): tabs[t].gather(i) for t, i in zip(names, ids, strict=True)}

    def row_count() -> dict[str, Any]:
        return {row_count_output(t): tabs[t].count.read_value() for t in names}

    def stream_position() -> dict[str, Any]:
        out: dict[str, Any] = {}
        for t in names:
            keys, offsets = tabs[t].position.export()
            out[stream_partitions_output(t)] = keys
            out[stream_offsets_output(t)] = offsets
        return out

    def applicable(tab: _Table, ids: Any, timestamps: Any, seqs: Any) -> tuple[Any, Any, Any, Any]:
        """(ids, positions in the call, [n, 2] versions, slots or -1) of the writes of one call that take effect."""
        uniq, win = winners(ids, timestamps, seqs)
        ts, seq = tf.gather(timestamps, win), tf.gather(seqs, win)
        slot, stored = tab.stored(uniq)
        # the positions of the newer ones; reserved ids are ignored
        newer = _where(tf.logical_and(newer_versions(stored, ts, seq), uniq < DELETED_KEY))
        stamps = tf.gather(tf.stack([ts, seq], axis=1), newer)
        return tf.gather(uniq, newer), tf.gather(win, newer), stamps, tf.gather(slot, newer)

    def make_upsert(tab: _Table) -> Callable[..., dict[str, Any]]:
        def upsert(
            ids: Any,
            values: Any,
            timestamps_ms: Any,
            seqs: Any,
            stream_partitions: Any,
            stream_offsets: Any,
            stream_expected: Any,
        ) -> dict[str, Any]:
            def body() -> dict[str, Any]:
                keep, rows, stamps, slot = applicable(tab, ids, timestamps_ms, seqs)
                fresh = slot < 0
                new_ids = tf.gather(keep, _where(fresh))
                got, ops = tab.allocate(tf.size(new_ids, out_type=tf.int64))
                slots = tf.tensor_scatter_nd_update(slot, tf.where(fresh), got)
                with tf.control_dependencies(ops):
                    # lock-free lookups: a reused slot's new generation, then the rows, then the overlay entries
                    gens, claim = tab.claim(got)
                    with tf.control_dependencies(claim):
                        row_ops = [
                            tab.scatter(tab.slab, slots, tf.cast(tf.gather(values, rows), tab.slab.dtype))
                        ]
                    with tf.control_dependencies(row_ops):
                        refs = tf.bitwise.bitwise_or(got, tf.bitwise.left_shift(gens, _SLOT_BITS))
                        ops.append(tab.overlay.insert(new_ids, refs))
                    ops += claim + row_ops
                    if tab.written is not None:
                        ops.append(tab.scatter(tab.written, slots, stamps[:, 0]))
                    ops.append(tab.scatter(tab.versions, slots, stamps))
                    ops.append(
                        tf.raw_ops.AssignAddVariableOp(
                            resource=tab.count.handle, value=tf.size(got, out_type=tf.int64)
                        )
                    )
                previous = advance_positions(tab.position, stream_partitions, stream_offsets, stream_expected)
                return _write_result(tab, keep, previous, ops)

            return _locked(body)

        return upsert

    def make_delete(tab: _Table) -> Callable[..., dict[str, Any]]:
        def delete(
            ids: Any,
            timestamps_ms: Any,
            seqs: Any,
            stream_partitions: Any,
            stream_offsets: Any,
            stream_expected: Any,
        ) -> dict[str, Any]:
            def body() -> dict[str, Any]:
                gone, _, stamps, slot = applicable(tab, ids, timestamps_ms, seqs)
                ops = tab.forget(gone, tf.gather(slot, _where(slot >= 0)), stamps)
                previous = advance_positions(tab.position, stream_partitions, stream_offsets, stream_expected)
                return _write_result(tab, gone, previous, ops)

            return _locked(body)

        return delete

    def expire(now_ms: Any) -> dict[str, Any]:
        def body() -> dict[str, Any]:
            out: dict[str, Any] = {}
            for t in names:
                tab = tabs[t]
                if tab.written is None or tab.spec.ttl_s is None:
                    out[expire_count_output(t)] = tf.constant(0, tf.int64)
                    continue
                ids, slots = tab.live()
                cutoff = now_ms - int(tab.spec.ttl_s * 1000)
                old = tf.reshape(tf.gather(tab.written, slots), [-1]) < cutoff
                old = _where(old)
                gone, gone_slots = tf.gather(ids, old), tf.gather(slots, old)
                # the tombstone's version is the cutoff: a write no newer than it (which would have expired by now)
                # cannot resurrect the row; a newer one (a trainer touching the id again) brings it back
                stamps = tf.stack(
                    [
                        tf.fill(tf.shape(gone), cutoff),
                        tf.fill(tf.shape(gone), tf.constant(_MAX_SEQ, tf.int64)),
                    ],
                    1,
                )
                ops = tab.forget(gone, gone_slots, stamps)
                with tf.control_dependencies(ops):
                    out[expire_count_output(t)] = tf.size(gone, out_type=tf.int64)
            return out

        return _locked(body)

    sigs: dict[str, Any] = {
        LOOKUP_SIGNATURE: tf.function(
            autograph=False,
            func=lookup,
            input_signature=[tf.TensorSpec([None], tf.int64, name=lookup_ids_input(t)) for t in names],
        ),
        ROW_COUNT_SIGNATURE: tf.function(autograph=False, func=row_count, input_signature=[]),
        STREAM_POSITION_SIGNATURE: tf.function(autograph=False, func=stream_position, input_signature=[]),
    }
    if any(s.ttl_s is not None for s in specs):
        sigs[EXPIRE_SIGNATURE] = tf.function(
            autograph=False, func=expire, input_signature=[tf.TensorSpec([], tf.int64, name="now_ms")]
        )
    stream_specs = [
        tf.TensorSpec([None], tf.string, name="stream_partitions"),
        tf.TensorSpec([None], tf.int64, name="stream_offsets"),
        tf.TensorSpec([None], tf.int64, name="stream_expected"),
    ]
    version_specs = [
        tf.TensorSpec([None], tf.int64, name="timestamps_ms"),
        tf.TensorSpec([None], tf.int64, name="seqs"),
    ]
    for spec in specs:
        tab = tabs[spec.name]
        sigs[upsert_signature(spec.name)] = tf.function(
            autograph=False,
            func=make_upsert(tab),
            input_signature=[
                tf.TensorSpec([None], tf.int64, name="ids"),
                tf.TensorSpec([None, spec.dim], tf.float32, name="values"),
                *version_specs,
                *stream_specs,
            ],
        )
        sigs[delete_signature(spec.name)] = tf.function(
            autograph=False,
            func=make_delete(tab),
            input_signature=[tf.TensorSpec([None], tf.int64, name="ids"), *version_specs, *stream_specs],
        )
    return sigs

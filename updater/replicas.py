"""What the updater knows about each PS replica's stream position, and when a replica must be caught up. Pure.

Every PS table keeps, per ``"<topic>:<partition>"``, the next Kafka offset it has applied (its *position*). A write
carries the offset it completes (``stream_offsets``) and the position the writer believes the table has
(``stream_expected``); the PS moves its position forward only if it stores at least the expected one (so it never
skips a gap) and answers with what it stored before (``stream_previous``).

:class:`PositionBook` holds, per replica servable (:class:`Replica`), table and partition, the position last
acknowledged (the *belief*). Live writes send the belief as expected. An answer below the belief means the replica
lost writes since (it restarted, or loaded a new version): :meth:`PositionBook.acknowledged` reports it, the updater
replays that replica alone from the position it reports (:mod:`updater.catchup`) while live writes keep flowing to
every replica (rows are versioned, so the order of replayed and live writes does not matter), and
:meth:`PositionBook.caught_up` hands the replica back to the live bookkeeping. Not task-safe: one event loop.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["NEVER", "PositionBook", "Replica"]

NEVER = 2**63 - 1  # as ``stream_expected``: no stored position is that high, so the position does not move


@dataclass(frozen=True, order=True)
class Replica:
    """One PS servable on one server: ``target`` host:port serving shard ``shard`` of ``model``."""

    target: str
    model: str
    shard: int


class PositionBook:
    """Beliefs ``(replica, table, partition key) -> position`` plus the replicas being caught up."""

    def __init__(self) -> None:
        self._belief: dict[tuple[Replica, str, str], int] = {}
        self._start: dict[str, int] = {}  # partition key -> offset the live loop started writing from
        self._catching_up: set[tuple[Replica, str]] = set()

    def live_from(self, key: str, offset: int) -> None:
        """The live loop writes every record of partition ``key`` from ``offset`` on (its position after an
        assignment): a replica storing at least that lacks nothing. Forgets older beliefs for ``key``."""
        self._start[key] = offset
        for k in [k for k in self._belief if k[2] == key]:
            del self._belief[k]

    def expected(self, replica: Replica, table: str, key: str) -> int:
        """What a live write to ``replica`` should send as ``stream_expected`` for ``key``; :data:`NEVER` (the
        position must not move) while the live start of ``key`` is unknown."""
        return self._belief.get((replica, table, key), self._start.get(key, NEVER))

    def catching_up(self, replica: Replica, key: str) -> bool:
        return (replica, key) in self._catching_up

    def acknowledged(
        self,
        replica: Replica,
        table: str,
        sent: dict[str, int],
        previous: dict[str, int],
        expected: dict[str, int] | None = None,
    ) -> dict[str, int]:
        """Record a live write's answer; returns ``{key: position the replica reported}`` for every partition where
        it fell behind the belief (it must be caught up), after marking those as catching up.

        ``expected``: the ``stream_expected`` the write sent per key (what :meth:`expected` said then). An answer
        below the belief is judged only if the belief is still the one the write was sent with: after it moved
        meanwhile (a catch-up handed the replica back with a new position) the answer tells about a state the
        belief no longer describes, and the next write or position check judges the replica instead."""
        behind: dict[str, int] = {}
        for key, end in sent.items():
            if (replica, key) in self._catching_up:
                continue  # the catch-up moves this position; live answers are not comparable meanwhile
            want = self.expected(replica, table, key)
            if want == NEVER or key not in previous:
                continue
            had = previous[key]
            if had < want:
                if expected is not None and expected.get(key, want) != want:
                    continue  # sent with an older belief: not comparable (see above)
                behind[key] = had
                self._catching_up.add((replica, key))
            else:
                self._belief[(replica, table, key)] = max(had, end)
        return behind

    def beliefs(self) -> dict[Replica, dict[tuple[str, str], int]]:
        """A snapshot ``{replica: {(table, key): belief}}`` of the replicas not being caught up, to compare with
        positions read later (a replica never stores less than a belief taken before the read, unless it lost
        writes)."""
        out: dict[Replica, dict[tuple[str, str], int]] = {}
        for (replica, table, key), pos in self._belief.items():
            if (replica, key) not in self._catching_up:
                out.setdefault(replica, {})[(table, key)] = pos
        return out

    def check(
        self, replica: Replica, snapshot: dict[tuple[str, str], int], reported: dict[str, dict[str, int]]
    ) -> dict[str, int]:
        """Compare a :meth:`beliefs` snapshot of ``replica`` with the positions it reported since; returns (and
        marks as catching up) ``{key: lowest reported position}`` for partitions where it fell behind."""
        behind: dict[str, int] = {}
        for (table, key), pos in snapshot.items():
            had = reported.get(table, {}).get(key, -1)
            if had < pos and (replica, key) not in self._catching_up:
                behind[key] = min(had, behind.get(key, had))
        for key in behind:
            self._catching_up.add((replica, key))
        return behind

    def caught_up(self, replica: Replica, key: str, tables: list[str], position: int) -> None:
        """The catch-up brought every table of ``replica`` to ``position`` for ``key``; live bookkeeping resumes."""
        for t in tables:
            self._belief[(replica, t, key)] = position
        self._catching_up.discard((replica, key))

    def abandon(self, replica: Replica, key: str) -> None:
        """A catch-up gave up (e.g. the partition was revoked); the next answer is judged afresh."""
        self._catching_up.discard((replica, key))
        for k in [k for k in self._belief if k[0] == replica and k[2] == key]:
            del self._belief[k]

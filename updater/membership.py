"""Refuse to join a consumer group whose active members consume other topics (another deployment's model list).

Consumer groups are derived from the served models by default, but ``group_id`` can be set by hand; two updaters
with different model lists in one group would split each other's partitions and lose rows. Before joining,
:func:`check_group` describes the group (Kafka DescribeGroups) and raises :class:`updater.errors.ConfigError`
naming the group, our topics and theirs when an active member is subscribed to a different set of topics.

Kafka protocol facts used here: a DescribeGroups answer lists, per member of a group of protocol type
``consumer``, its ``member_metadata``: the ConsumerProtocolSubscription it joined with. In every version (0-3) it
starts with an int16 ``version`` and the ``topics`` array: an int32 count, then each topic as an int16 length and
that many UTF-8 bytes (the classic, non-compact encoding; later fields, user data, owned partitions, generation and
rack, follow and are not needed). :func:`subscribed_topics` decodes that prefix.

Topics that match our HPS pattern are left out of the comparison on both sides (which HPS topics exist changes over
time; a member subscribed by pattern lists the ones it has seen). A member that was SIGKILLed stays listed until its
session times out (``session_timeout_ms``): restarting with another model list under the same group is refused
until then.
"""

from __future__ import annotations

import asyncio
import re
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from updater.errors import ConfigError

__all__ = ["GroupMember", "check_group", "foreign_members", "subscribed_topics"]

_ACTIVE_STATES = frozenset({"Stable", "PreparingRebalance", "CompletingRebalance"})
_COORDINATOR_ATTEMPTS = 60  # x 0.5 s: how long a retriable DescribeGroups failure is retried


@dataclass(frozen=True)
class GroupMember:
    """One member of a consumer group as DescribeGroups reports it; ``topics`` None = undecodable metadata."""

    member_id: str
    client_id: str
    host: str
    topics: tuple[str, ...] | None


def subscribed_topics(metadata: bytes) -> tuple[str, ...]:
    """The ``topics`` of a ConsumerProtocolSubscription (any version); ValueError if ``metadata`` is truncated or
    not one."""
    try:
        version, count = struct.unpack_from(">hi", metadata, 0)
        if version < 0 or count < 0:
            raise ValueError(f"version {version}, {count} topics")
        pos = 6
        topics = []
        for _ in range(count):
            (n,) = struct.unpack_from(">h", metadata, pos)
            if n < 0 or pos + 2 + n > len(metadata):
                raise ValueError(f"topic name of {n} bytes at byte {pos}")
            topics.append(metadata[pos + 2 : pos + 2 + n].decode("utf-8"))
            pos += 2 + n
    except (struct.error, UnicodeDecodeError) as exc:
        raise ValueError(f"not a consumer subscription: {exc}") from None
    except ValueError as exc:
        raise ValueError(f"not a consumer subscription: {exc}") from None
    return tuple(topics)


def foreign_members(
    members: Sequence[GroupMember], ours: Sequence[str], hps_pattern: str | None = None
) -> list[GroupMember]:
    """The members whose topics differ from ``ours``, topics matching ``hps_pattern`` left out on both sides.
    Members with undecodable metadata are not counted (nothing is known about them). Pure."""
    hps = re.compile(f"^(?:{hps_pattern})$") if hps_pattern else None

    def fixed(topics: Sequence[str]) -> set[str]:
        return {t for t in topics if hps is None or not hps.match(t)}

    want = fixed(ours)
    return [m for m in members if m.topics is not None and fixed(m.topics) != want]


def _members(group: Mapping[str, Any]) -> list[GroupMember]:
    out = []
    for m in group.get("members") or []:
        try:
            topics: tuple[str, ...] | None = subscribed_topics(bytes(m["member_metadata"] or b""))
        except ValueError:
            topics = None
        out.append(GroupMember(m["member_id"], m["client_id"], m["client_host"], topics))
    return out


async def check_group(
    *,
    bootstrap_servers: str,
    group_id: str,
    client_id: str,
    topics: Sequence[str],
    hps_pattern: str | None,
    kafka_kwargs: Mapping[str, Any],
) -> None:
    """Raise ConfigError when ``group_id`` has active members subscribed to other topics than ``topics`` (module doc).
    Kafka errors (unreachable, not authorized to describe the group) propagate as ``KafkaError``."""
    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.errors import KafkaError

    admin = AIOKafkaAdminClient(
        bootstrap_servers=bootstrap_servers, client_id=f"{client_id}-admin", **kafka_kwargs
    )
    try:
        await admin.start()
        for attempt in range(_COORDINATOR_ATTEMPTS):
            try:
                responses = await admin.describe_consumer_groups([group_id])
                break
            except (
                KafkaError
            ) as exc:  # e.g. no coordinator yet on a fresh broker (__consumer_offsets is created)
                if not exc.retriable or attempt == _COORDINATOR_ATTEMPTS - 1:
                    raise
                await asyncio.sleep(0.5)
    finally:
        await admin.close()
    for resp in responses:
        for group in resp.to_object()["groups"]:
            if group["group"] != group_id or group["state"] not in _ACTIVE_STATES:
                continue
            members = _members(group)
            if group["protocol_type"] not in ("consumer", ""):
                raise ConfigError(
                    f"consumer group {group_id!r} is in use with protocol type {group['protocol_type']!r} by "
                    f"{len(members)} member(s), not by consumers: refusing to start (set another group_id)"
                )
            foreign = foreign_members(members, topics, hps_pattern)
            if foreign:
                theirs = sorted({t for m in foreign for t in m.topics or ()})
                who = ", ".join(sorted({f"{m.client_id}@{m.host.lstrip('/')}" for m in foreign}))
                raise ConfigError(
                    f"consumer group {group_id!r} already has {len(foreign)} active member(s) ({who}) "
                    f"subscribed to topics {theirs}; this updater's topics are {sorted(topics)}: refusing to "
                    "start (two model lists in one group split each other's partitions); set another group_id, "
                    "or leave group_id unset to derive it from the models"
                )

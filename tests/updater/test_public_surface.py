"""The public names of the updater's modules and of schemas.deltas are pinned here; changing them is deliberate."""

from __future__ import annotations

import importlib

import pytest

SURFACE = {
    "schemas.deltas": {
        "BINARY_MAGIC",
        "DEAD_LETTER_TOPIC",
        "DECODER_ERROR",
        "DELTA_TOPIC_PREFIX",
        "FORMAT_VERSION",
        "HPS_MAGIC",
        "HPS_TOPIC_PATTERN",
        "MAX_JSON_INT_CHARS",
        "DeltaError",
        "DeltaOp",
        "EmbeddingDelta",
        "check_against_manifest",
        "decode_delta",
        "delta_topic",
        "decode_hps",
        "encode_delta",
        "encode_delta_json",
        "encode_hps",
        "hps_topic",
        "shard_partition",
    },
    "schemas.tensors": {
        "NP_DTYPES",
        "MalformedTensor",
        "TensorError",
        "UnsupportedDtype",
        "dtype_for",
        "from_ndarray",
        "to_ndarray",
    },
    "tfs_grpc.channels": {
        "METHODS",
        "ChannelConfig",
        "channel_credentials",
        "channel_options",
        "open_channel",
        "stub",
    },
    "schemas.wire": {"Bfloat16Bits", "bfloat16_bits", "predict_request", "predict_request_for"},
    "schemas.updater_settings": {"BatchSettings", "RetrySettings", "UpdaterSettings", "parse_replay_since"},
    "updater.apply": {
        "GroupKey",
        "ShardWriter",
        "WriteGroup",
        "WriteGroupRows",
    },
    "updater.batch": {"Chunk", "GroupBuffer", "coalesce", "split_by_shard"},
    "updater.consumer": {"Updater", "load_models", "replay_timestamp_ms"},
    "updater.errors": {
        "ApplyError",
        "ApplyRejected",
        "ConfigError",
        "KafkaAction",
        "ShardUnavailable",
        "UpdaterError",
        "error_from_grpc",
        "kafka_action",
    },
    "updater.metrics": {"UpdaterMetrics"},
    "updater.expiry": {"Expirer", "expiring_tables"},
    "updater.ledger": {"OffsetLedger"},
    "updater.scheduler": {"ApplyScheduler", "Clock", "backoff_s"},
    "updater.loop": {"CatchUps", "ConsumerLoop", "Writer", "iso_ms"},
    "updater.ingest": {"RecordDecoder", "Route"},
    "updater.deadletter": {"DeadLetterer", "dead_letter_headers"},
    "updater.kafka_client": {"DeadLetterProducer", "KafkaClient", "Record"},
    "updater.replicas": {"NEVER", "PositionBook", "Replica"},
    "updater.catchup": {"CatchUpTasks", "catch_up"},
    "updater.producer": {
        "DeltaPublisher",
        "KeyedTableError",
        "PublishResult",
        "load_rows",
        "message_key",
        "model_keys",
        "table_mappings",
    },
    "updater.cli": {"register"},
    "updater.kafka_security": {
        "add_security_arguments",
        "client_kwargs",
        "connect_failures",
        "security_from_args",
    },
    "updater.membership": {"GroupMember", "check_group", "foreign_members", "subscribed_topics"},
    "updater.resume": {
        "concerned_replicas",
        "replica_start_offsets",
        "seed_committed_offsets",
        "topic_partitions",
    },
    "schemas.tls": {
        "BackendPem",
        "BackendTLS",
        "KafkaSecurity",
        "KafkaSecurityFields",
        "SaslMechanism",
        "SecurityProtocol",
        "ServerTLS",
        "TLSFileError",
    },
    "embedgate.devkafka": {
        "KAFKA_VERSION",
        "BrokerError",
        "BrokerState",
        "KafkaBroker",
        "SecureListener",
        "default_cache_dir",
        "fetch_jars",
        "register",
    },
}


@pytest.mark.parametrize("module", sorted(SURFACE))
def test_public_names(module: str) -> None:
    mod = importlib.import_module(module)
    assert set(mod.__all__) == SURFACE[module]
    for name in mod.__all__:
        assert hasattr(mod, name), f"{module}.{name} is exported but missing"


def test_updater_never_imports_tensorflow() -> None:
    import subprocess
    import sys

    code = (
        "import sys, updater.consumer, updater.producer, updater.cli, schemas.deltas, embedgate.devkafka;"
        "sys.exit(1 if 'tensorflow' in sys.modules else 0)"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False, timeout=60).returncode == 0

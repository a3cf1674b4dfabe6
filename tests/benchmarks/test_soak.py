"""The soak's pure parts (benchmarks/soak.py): the RSS growth criterion and the gRPC request it sends."""

from __future__ import annotations

import numpy as np

from benchmarks.soak import _grpc_request, memory_growth

MB = 2**20


def _samples(values_mb: list[float], start: float = 0.0, every: float = 2.0) -> list[tuple[float, int]]:
    return [(start + i * every, int(v * MB)) for i, v in enumerate(values_mb)]


def test_flat_memory_with_spikes_passes() -> None:
    values = [500.0 + (i % 3) for i in range(60)]
    values[10] = values[50] = 900.0  # one-off spikes (a GC cycle, a large batch) are not growth
    v = memory_growth("x", _samples(values), since=0.0, slack_mb=32, slack_ratio=0.05)
    assert v is not None and v.ok and abs(v.growth_mb) < 2 and v.max_mb == 900.0


def test_steady_leak_fails_and_warmup_is_not_judged() -> None:
    leak = [400.0 + 1.5 * i for i in range(60)]  # 1.5 MB per sample: ~60 MB between the thirds' medians
    v = memory_growth("x", _samples(leak), since=0.0, slack_mb=32, slack_ratio=0.05)
    assert v is not None and not v.ok and v.growth_mb > 32
    warm = [100.0 + 10 * i for i in range(20)] + [300.0] * 40  # grows only during warm-up (t < 40 s)
    assert not memory_growth("x", _samples(warm), since=0.0, slack_mb=32, slack_ratio=0.05).ok  # type: ignore[union-attr]
    judged = memory_growth("x", _samples(warm), since=40.0, slack_mb=32, slack_ratio=0.05)
    assert judged is not None and judged.ok and judged.samples == 40


def test_allowed_growth_is_the_larger_of_slack_and_ratio() -> None:
    big = memory_growth("x", _samples([2000.0] * 30), since=0, slack_mb=32, slack_ratio=0.05)
    small = memory_growth("x", _samples([100.0] * 30), since=0, slack_mb=32, slack_ratio=0.05)
    assert big is not None and big.allowed_mb == 100.0
    assert small is not None and small.allowed_mb == 32.0


def test_too_few_samples_are_not_judged() -> None:
    assert memory_growth("x", _samples([1.0] * 8), since=0, slack_mb=1, slack_ratio=0) is None
    assert memory_growth("x", _samples([1.0] * 30), since=1000, slack_mb=1, slack_ratio=0) is None


def test_grpc_request_pads_lists_with_minus_one_and_defaults_weights_to_one() -> None:
    from schemas.manifest import Manifest

    m = Manifest.model_validate(
        {
            "model_name": "m",
            "version": 1,
            "tables": [{"name": "t", "dim": 2}],
            "sparse_features": [
                {"name": "one", "table": "t"},
                {"name": "many", "table": "t", "kind": "multi", "weights": "many_w"},
            ],
            "dense_features": [{"name": "d", "dim": 2}],
            "partition": {"num_shards": 1},
            "entry": {"outputs": [{"name": "p", "shape": [1]}]},
        }
    )
    req = _grpc_request(m, [{"one": 3, "many": [1, 2], "d": [0.5, 1]}, {"one": 4, "many": [], "d": [2, 3]}])

    def arr(name: str, dtype: str) -> np.ndarray:
        t = req.inputs[name]
        return np.frombuffer(t.tensor_content, dtype).reshape([d.size for d in t.tensor_shape.dim])

    assert req.model_spec.name == "m"
    assert arr("one", "<i8").tolist() == [3, 4]
    assert arr("many", "<i8").tolist() == [[1, 2], [-1, -1]]
    assert arr("many_w", "<f4").tolist() == [[1, 1], [0, 0]]
    assert arr("d", "<f4").tolist() == [[0.5, 1], [2, 3]]

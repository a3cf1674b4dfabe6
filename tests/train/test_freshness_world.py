"""benchmarks.freshness_quality without servers or TensorFlow: the drifting world, the metrics, the windows, the
report tables (so the benchmark's logic cannot rot between ``make bench`` runs)."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest

from benchmarks import freshness_quality as fq


def _pairwise_auc(y: np.ndarray, s: np.ndarray) -> float:
    pos, neg = s[y > 0.5], s[y <= 0.5]
    wins = sum(1.0 if p > n else 0.5 if p == n else 0.0 for p, n in itertools.product(pos, neg))
    return wins / (len(pos) * len(neg))


@pytest.mark.parametrize("seed", range(4))
def test_auc_is_the_pairwise_probability_ties_counting_half(seed: int) -> None:
    rng = np.random.default_rng(seed)
    y = (rng.random(60) < 0.4).astype(np.float32)
    s = np.round(rng.random(60), 1)  # many ties
    assert fq.auc(y, s) == pytest.approx(_pairwise_auc(y, s), abs=1e-12)
    assert fq.auc([0, 1, 1, 0], [0.1, 0.9, 0.8, 0.2]) == 1.0
    assert fq.auc([0, 1], [0.7, 0.7]) == 0.5
    assert np.isnan(fq.auc([1, 1], [0.2, 0.3]))
    with pytest.raises(ValueError, match="3 labels but 2 scores"):
        fq.auc([0, 1, 1], [0.1, 0.2])


def test_log_loss_is_the_mean_cross_entropy_clipped() -> None:
    y = np.asarray([1, 0, 1, 0], np.float32)
    p = np.asarray([0.9, 0.2, 0.6, 0.5])
    want = -np.mean(np.log([0.9, 0.8, 0.6, 0.5]))
    assert fq.log_loss(y, p) == pytest.approx(want)
    assert fq.log_loss([1], [0.0]) == pytest.approx(-np.log(1e-7))  # clipped, not infinite
    with pytest.raises(ValueError, match="2 labels but 1 probabilities"):
        fq.log_loss([0, 1], [0.5])


def test_the_world_is_deterministic_and_its_clicks_follow_the_true_probability() -> None:
    a, b = fq.DriftingWorld(seed=5), fq.DriftingWorld(seed=5)
    for w in (a, b):
        w.advance(30.0)
    ea, eb = a.sample(4000), b.sample(4000)
    assert np.array_equal(ea.users, eb.users) and np.array_equal(ea.clicks, eb.clicks)
    assert ((ea.p_true > 0) & (ea.p_true < 1)).all()
    assert ea.users.max() < a.cfg.users and ea.items.max() < a.cfg.items
    assert abs(float(ea.clicks.mean()) - float(ea.p_true.mean())) < 0.03  # 4000 draws: sd about 0.007
    assert fq.auc(ea.clicks, ea.p_true) > 0.8  # the ground truth separates clicks well


def test_the_world_drifts_so_an_old_truth_predicts_worse() -> None:
    """Interests move, a fifth of the users moves home every shift, popularity walks, fashion changes: the true
    probabilities of an hour ago rank today's clicks clearly worse than today's."""
    cfg = fq.WorldConfig()
    w = fq.DriftingWorld(cfg, seed=2)
    old = fq.DriftingWorld(cfg, seed=2)  # the same world, kept at t = 0
    fashion0 = w.fashion()
    w.advance(3600.0)
    assert w.fashion() != fashion0  # 3600 // 420 = 8 fashion changes: group 3
    ev = w.sample(20_000)
    now, then = fq.auc(ev.clicks, ev.p_true), fq.auc(ev.clicks, old.probability(ev.users, ev.items))
    assert now - then > 0.05, (now, then)
    assert fq.log_loss(ev.clicks, ev.p_true) < fq.log_loss(ev.clicks, old.probability(ev.users, ev.items))


def test_windows_cut_by_stream_time_and_score_every_variant() -> None:
    rng = np.random.default_rng(0)
    t = np.repeat(np.arange(0, 700, 10.0), 50)  # 70 ticks of 50 events, stream seconds 0..690
    y = (rng.random(len(t)) < 0.5).astype(np.float32)
    good = np.where(y > 0.5, 0.8, 0.2) + rng.normal(0, 0.2, len(t))
    preds = {"ceiling": np.clip(good, 0.01, 0.99), "frozen": np.full(len(t), 0.5)}
    wins = fq.score_windows(t, y, preds, window_s=300.0, start_s=50.0)
    bounds = [round(x * 60) for w in wins for x in (w.start_min, w.end_min)]
    assert bounds == [50, 350, 350, 650, 650, 950]
    assert [w.events for w in wins] == [
        1500,
        1500,
        250,
    ]  # a last partial window; events before start left out
    for w in wins:
        assert w.auc["frozen"] == 0.5 and w.auc["ceiling"] > 0.85
        assert w.loss["frozen"] == pytest.approx(np.log(2))
    with pytest.raises(ValueError, match="variant 'frozen': 3 predictions for 3500 events"):
        fq.score_windows(t, y, {"frozen": [0.5, 0.5, 0.5]}, 300.0)


def test_due_fires_once_per_period_on_the_tick_that_crosses_it() -> None:
    ticks = np.arange(5.0, 1805.0, 5.0)
    fired = [t for t in ticks if fq._due(t, 2.0, 5.0)]
    assert fired == [120.0 * k for k in range(1, 16)]


def test_report_states_the_targets_and_the_tables(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    t = np.repeat(np.arange(0, 600, 5.0), 40)
    y = (rng.random(len(t)) < 0.3).astype(np.float32)
    base = np.clip(np.where(y > 0.5, 0.6, 0.3) + rng.normal(0, 0.25, len(t)), 0.01, 0.99)
    preds = dict.fromkeys((*fq.VARIANTS, "truth"), base) | {"frozen": np.full(len(t), 0.3)}
    wins = fq.score_windows(t, y, preds, 120.0)
    overall = fq.score_windows(t, y, preds, 1e9)[0]
    delays = fq.Delays(rows=[0.05, 0.08, 0.1], entry_export_s=[0.5, 0.4])
    delays.add("entry", 0.6)
    delays.add("entry", None)
    delays.add("periodic", None)
    res = fq.Result(wins, overall, delays, 60.0, (1.0, 1.0, 1.0), (2.0, 2.0, 2.0), 120, {"fq_periodic": 3})
    plan = fq.Plan(20, 10, 5, 40, 2, 5, 2, 1.0)
    text = fq.report(res, plan, "python -m benchmarks.freshness_quality --quick", "img/x.png")
    assert "streamed within 0.005 AUC of the ceiling: **met** (0.0000)" in text
    assert "| frozen | 0.5000 |" in text and "| **all** | 4800 |" in text
    assert "| periodic full re-export (written -> served) | 0 |" in text and "fq_periodic: 3" in text
    assert "load average 1.00 before, 2.00 after" in text
    assert "| entry refresh (refresh call -> served, export included) | 1 | 1100 ms |" in text
    assert (
        "p99 <= 2 s (rows; entry refreshes from the refresh call, export included): **NOT met** (" in text
        and "1 not served within 30 s" in text
    )
    fq.plot(wins, fq.VARIANTS, tmp_path / "p.png", "test")
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

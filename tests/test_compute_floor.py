"""The compute floor (dev/bench/compute_floor.py) and `bob bench --compute-floor`'s rows,
without a GPU: the SMs a fused kernel issues on, the floor's arithmetic, and a missing
ncu as a skipped row, never the end of the bench.

ncu's counts and the device's issue rate are replaced here (no count is real).
"""

from __future__ import annotations

import pytest

from bob.backends import BackendChoice
from bob.config import Hyper
from bob.plan.placement import SM90
from dev.bench import compute_floor as cf
from dev.bench import suite
from dev.bench.tables import Row

CUDA = BackendChoice("cuda", SM90, reason="a fake cuda")
H200 = cf.Issue(132, 1.98e9)


@pytest.mark.parametrize(("vocab", "mode", "used"), [
    (8192, "hard", 132),  # tall: a block per row, every SM
    (32768, "hard", 132),  # held: a block an SM, one per SM
    (50257, "hard", 120),  # clusters of 4: as many as the SMs hold, 30 of 4
    (21553, "hard", 132),  # held below CLUSTER_ODD_FROM_VOCAB
])
def test_a_kernel_that_takes_an_sm_s_shared_memory_issues_on_its_grid_s_sms(
        vocab: int, mode: str, used: int) -> None:
    assert cf.multiprocessors_used(vocab, mode, 132, CUDA) == used  # type: ignore[arg-type]


def test_the_floor_is_one_update_s_warp_instructions_over_the_issue_rate() -> None:
    short = cf.Count(2, warp=1.0e9, thread=3.2e10)
    long = cf.Count(4, warp=1.0e9 + 4 * 2.0e9, thread=3.2e10 + 4 * 6.4e10)
    per_update = cf.PerUpdate.of(short, long)
    assert (per_update.warp, per_update.thread) == (2.0e9, 6.4e10)
    assert per_update.floor(H200) == pytest.approx(2.0e9 / (132 * 4 * 1.98e9))
    assert per_update.floor(H200.on(120)) == pytest.approx(2.0e9 / (120 * 4 * 1.98e9))


def test_the_floor_words_name_every_sm_and_the_grid_s_sms() -> None:
    per_update = cf.PerUpdate(warp=8.83e9, thread=8.83e9 * 32)
    words = cf.floor_words(per_update, H200, 120, 13.5e-3, 50257 * 50257)
    assert words.startswith("compute floor 8.446 ms (1.60x), 9.291 ms on the 120 SMs its "
                            "grid holds (1.45x); 111.9 thread and 111.9 lane-slot")
    assert "on the" not in cf.floor_words(per_update, H200, 132, None, 50257 * 50257)


def test_bench_s_compute_floor_rows_give_each_floor_per_update(monkeypatch) -> None:
    counts = iter([cf.Count(2, 1.0e9, 3.2e10), cf.Count(4, 1.0e9 + 4 * 2.0e9, 0.0)])
    monkeypatch.setattr(cf.Issue, "of_device", staticmethod(lambda ordinal=0: H200))
    monkeypatch.setattr(cf, "ncu_count", lambda vocab, mode, updates: next(counts))
    monkeypatch.setattr(cf, "multiprocessors_used", lambda vocab, mode, sms: 120)
    rows = cf.compute_floor_rows(50257, "hard", 20)
    assert [row.contender for row in rows] == ["compute floor (132 SMs' issue)",
                                               "compute floor (the 120 SMs its grid holds)"]
    assert all(row.kind == "floor" and row.updates == 20 for row in rows)
    assert rows[0].seconds == pytest.approx(20 * 2.0e9 / (132 * 4 * 1.98e9))
    assert rows[1].seconds == pytest.approx(20 * 2.0e9 / (120 * 4 * 1.98e9))
    assert rows[0].note == "25.3 instructions per parameter-update (ncu) / issue rate"


def test_a_missing_ncu_is_a_skipped_row_saying_so(monkeypatch) -> None:
    monkeypatch.setattr(cf.Issue, "of_device", staticmethod(lambda ordinal=0: H200))
    monkeypatch.setattr(cf.shutil, "which", lambda name: None)
    (row,) = cf.compute_floor_rows(8192, "hard", 100)
    assert (row.contender, row.kind, row.seconds) == ("compute floor", "floor", None)
    assert row.error == "skipped: compute_floor: ncu is not on PATH (or pass --no-ncu)"


def test_bench_device_puts_the_compute_floor_after_the_memory_floor(monkeypatch) -> None:
    monkeypatch.setattr(suite, "measure_bob", lambda choice, config, hyper, repeats, label="",
                        record=None: [Row(f"bob{label} invocation", "bob", config.updates)])
    monkeypatch.setattr(suite, "choose_backend", lambda name, **kw: CUDA)
    monkeypatch.setattr(suite, "measure_peer",
                        lambda make, name, updates, repeats: Row(name, "peer", updates))
    asked = []
    monkeypatch.setattr(suite, "compute_floor_rows", lambda vocab, mode, updates: asked.append(
        (vocab, mode, updates)) or [Row("compute floor (132 SMs' issue)", "floor", updates)])
    table = suite.bench_device("cuda", 8192, 100, 1, Hyper(), CUDA, "a fake GPU",
                               lambda text: None, 4.2e12, compute_floor=True)
    kinds = [(row.kind, row.contender.split(" (")[0]) for row in table.rows]
    assert kinds[-3:] == [("floor", "memory floor"), ("floor", "memory floor"),
                          ("floor", "compute floor")]
    assert asked == [(8192, "hard", 100)]
    plain = suite.bench_device("cuda", 8192, 100, 1, Hyper(), CUDA, "a fake GPU",
                               lambda text: None, 4.2e12)
    assert [row.contender for row in plain.rows if "compute" in row.contender] == []
    assert len(asked) == 1

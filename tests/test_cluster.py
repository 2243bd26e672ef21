"""Rows held by a thread-block cluster: the program's choice, the slices, the certificate's
checks of a cluster launch and the plan JSON's cluster field, without a GPU."""
from __future__ import annotations

from dataclasses import replace

import pytest

from bob.kernels import signatures as sig
from bob.kernels.cuda.regions import catalogue
from bob.plan import certify
from bob.plan.jsonio import dumps, loads
from bob.plan.model import Address
from bob.plan.placement import SM86, SM90
from bob.program.bob import BobConfig, build_plan, cluster_ctas

HARD, CORPUS = sig.FUSED_CLUSTER_HARD, sig.FUSED_CLUSTER_CORPUS


def config_of(vocab: int, mode: str, updates: int = 3) -> BobConfig:
    return BobConfig(vocab=vocab, prompts=0, updates=updates, mode=mode,  # type: ignore[arg-type]
                     schedule="fused", pairs=1 if mode == "corpus" else 0)


@pytest.mark.parametrize(("vocab", "hard", "corpus"), [
    (8192, sig.FUSED_TALL_HARD, sig.FUSED_TALL_CORPUS),
    (8193, sig.FUSED_HELD_HARD, sig.FUSED_HELD_CORPUS),
    (21553, sig.FUSED_HELD_HARD, sig.FUSED_HELD_CORPUS),
    (32768, sig.FUSED_HELD_HARD, sig.FUSED_HELD_CORPUS),
    (50257, HARD, CORPUS),
    (65536, sig.FUSED_HELD_HARD, CORPUS),
])
def test_the_program_takes_a_cluster_where_it_was_measured_ahead(vocab, hard, corpus):
    assert config_of(vocab, "hard").fused_region(SM90) == hard
    assert config_of(vocab, "corpus").fused_region(SM90) == corpus
    for target in (SM86, SM90.without_clusters()):  # no clusters: never a cluster region
        for mode in ("hard", "corpus"):
            assert config_of(vocab, mode).fused_region(target) not in sig.CLUSTER_SLICES


@pytest.mark.parametrize(("vocab", "mode", "ctas"), [
    (21553, "hard", 2), (21553, "corpus", 2), (50257, "hard", 4), (50257, "corpus", 8),
    (65536, "hard", 8), (65536, "corpus", 8),
])
def test_the_cluster_is_the_fewest_ctas_whose_slices_fit(vocab, mode, ctas):
    assert cluster_ctas(mode, vocab, SM90) == ctas  # type: ignore[arg-type]
    assert cluster_ctas(mode, vocab, SM86) is None  # type: ignore[arg-type]


def test_a_cluster_launch_runs_many_updates_on_the_clusters_the_target_holds():
    plan = build_plan(config_of(50257, "corpus", updates=40), SM90)
    fused = [launch for launch in plan.launches if launch.region == CORPUS]
    assert [launch.label for launch in fused] == ["fused[0:32]", "fused[32:40]"]
    assert all((launch.grid.x, launch.cluster, launch.block.x) == (120, 8, 512)
               for launch in fused)
    assert certify(plan).holds


@pytest.mark.parametrize("vocab", [8193, 9001, 21553, 50257, 65535])
@pytest.mark.parametrize("ctas", [2, 4, 8])
def test_the_slices_split_every_row_into_its_columns_once(vocab, ctas):
    """CTA c's positions k = L n + l are columns 256 n + c L + l: over the cluster, every
    column once, each lane's chain in order, as the unsplit lane order folds it."""
    slices = sig.CLUSTER_SLICES[HARD]
    width = slices.lanes_per_cta(ctas)
    seen = []
    for rank in range(ctas):
        columns = [256 * n + rank * width + lane for n in range(-(-vocab // 256))
                   for lane in range(width) if 256 * n + rank * width + lane < vocab]
        assert max(columns, default=None) == slices.last_column(vocab, ctas, rank)
        seen += columns
        for lane in range(rank * width, (rank + 1) * width):  # a lane's chain, in order
            chain = [j for j in columns if j % 256 == lane]
            assert chain == list(range(lane, vocab, 256))
    assert sorted(seen) == list(range(vocab))


def test_a_row_slice_one_column_out_of_its_tensor_is_caught():
    plan = build_plan(config_of(50257, "hard"), SM90)
    index = next(i for i, launch in enumerate(plan.launches) if launch.region == HARD)
    launch = plan.launches[index]
    moved = replace(launch, args=(Address(launch.args[0].address + 4), *launch.args[1:]))
    launches = (*plan.launches[:index], moved, *plan.launches[index + 1:])
    hazards = certify(replace(plan, launches=launches)).hazards
    assert [h.kind for h in hazards] == ["footprint-overflow"]
    rank = (50256 % 256) // 64  # the CTA of 4 whose slice holds the row's last column
    assert f"the slice of CTA {rank} of 4 reaches column 50256" in hazards[0].message
    assert hazards[0].argument == "parameters"


@pytest.mark.parametrize(("cluster", "kind", "words"), [
    (1, "geometry", "in clusters of 1 CTAs; its 256 lanes split over a power of two"),
    (3, "geometry", "in clusters of 3 CTAs; its 256 lanes split over a power of two"),
    (16, "hardware-limit", "allows at most 8"),
])
def test_a_cluster_launch_in_clusters_its_region_or_target_refuses_is_caught(cluster, kind,
                                                                             words):
    plan = build_plan(config_of(50257, "hard"), SM90)
    index = next(i for i, launch in enumerate(plan.launches) if launch.region == HARD)
    launch = plan.launches[index]
    moved = replace(launch, cluster=cluster, grid=replace(launch.grid, x=48))
    launches = (*plan.launches[:index], moved, *plan.launches[index + 1:])
    hazards = certify(replace(plan, launches=launches)).hazards
    assert any(h.kind == kind and words in h.message for h in hazards), hazards


def test_a_cluster_too_small_for_the_row_is_caught():
    plan = build_plan(config_of(65536, "corpus"), SM90)
    index = next(i for i, launch in enumerate(plan.launches) if launch.region == CORPUS)
    moved = replace(plan.launches[index], cluster=4)
    launches = (*plan.launches[:index], moved, *plan.launches[index + 1:])
    hazards = certify(replace(plan, launches=launches)).hazards
    assert [h.kind for h in hazards] == ["hardware-limit"]
    assert "a CTA of a cluster of 4 holds 327680 bytes" in hazards[0].message


def test_the_plan_json_round_trips_a_cluster_launch():
    plan = build_plan(config_of(50257, "corpus"), SM90)
    again = loads(dumps(plan), regions=catalogue())
    assert again.launches == plan.launches
    assert {launch.cluster for launch in again.launches} == {1, 8}
    assert again.region(CORPUS).cluster_slices == sig.CLUSTER_SLICES[CORPUS]

"""Rows held by a thread-block cluster: the program's choice, the slices, the certificate's
checks of a cluster launch and the plan JSON's cluster field, without a GPU."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
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
    (21553, "hard", 2), (21553, "corpus", 2), (50257, "hard", 4), (50257, "corpus", 4),
    (65536, "hard", 8), (65536, "corpus", 8),
])
def test_the_cluster_is_the_fewest_ctas_whose_slices_fit(vocab, mode, ctas):
    assert cluster_ctas(mode, vocab, SM90) == ctas  # type: ignore[arg-type]
    assert cluster_ctas(mode, vocab, SM86) is None  # type: ignore[arg-type]


def test_a_cluster_launch_runs_many_updates_on_the_clusters_the_target_holds():
    plan = build_plan(config_of(50257, "corpus", updates=40), SM90)
    fused = [launch for launch in plan.launches if launch.region == CORPUS]
    assert [launch.label for launch in fused] == ["fused[0:32]", "fused[32:40]"]
    assert all((launch.grid.x, launch.cluster, launch.block.x) == (120, 4, 512)
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
    assert "a CTA of a cluster of 4 holds 262144 bytes" in hazards[0].message


def test_the_plan_json_round_trips_a_cluster_launch():
    plan = build_plan(config_of(50257, "corpus"), SM90)
    again = loads(dumps(plan), regions=catalogue())
    assert again.launches == plan.launches
    assert {launch.cluster for launch in again.launches} == {1, 4}
    assert again.region(CORPUS).cluster_slices == sig.CLUSTER_SLICES[CORPUS]


# -- the nv encoding of a cluster launch ---------------------------------------------------


def test_a_cluster_launch_s_qmd_is_a_grid_of_gpc_clusters_and_its_driver_area_says_so():
    from bob.backends.nv import decoder, encoder

    plan = build_plan(config_of(65536, "corpus"), SM90)
    index = next(i for i, launch in enumerate(plan.launches) if launch.region == CORPUS)
    qmd = decoder.decode_qmd(encoder.encode_qmd(plan, index).to_bytes(), 0xCBC0)
    assert qmd.qmd_type() == "GRID_GPC_CGA"
    assert qmd.dispatch().cluster == (8, 1, 1) and qmd.dispatch().grid == (120, 1, 1)
    assert qmd.get("GRID_WIDTH") == 15  # a grid of clusters counts clusters
    area = decoder.decode_driver_area(encoder.parameter_block(plan, index))
    assert (area.explicit_cluster, area.cluster, area.clusters, area.cluster_ctas) == (
        1, (8, 1, 1), (15, 1, 1), 8)
    assert area.cluster_reciprocals == (0.125, 1.0, 1.0)
    other = next(i for i, launch in enumerate(plan.launches) if launch.cluster == 1)
    plain = decoder.decode_qmd(encoder.encode_qmd(plan, other).to_bytes(), 0xCBC0)
    assert plain.qmd_type() == "GRID_CTA" and plain.dispatch().cluster is None
    assert decoder.decode_driver_area(encoder.parameter_block(plan, other)).explicit_cluster == 0


def test_a_qmd_without_clusters_or_a_gpu_wide_cluster_is_refused_in_one_line():
    from bob.backends.nv import decoder, qmd

    with pytest.raises(qmd.QmdFieldError, match="^QMD V03_00 has no thread-block clusters$"):
        qmd.QmdV03().set_cluster(2, 1, 1)
    with pytest.raises(qmd.QmdFieldError, match="cluster \\(0, 1, 1\\) has a zero dimension"):
        qmd.QmdV04().set_cluster(0, 1, 1)
    record = qmd.QmdV04()
    record.write_value("QMD_TYPE", "QMD_TYPE_GRID_GPU_CGA")
    with pytest.raises(decoder.DecodeError, match="^QMD type GRID_GPU_CGA: Bob's clusters"):
        decoder.decode_qmd(record.to_bytes(), 0xCBC0).dispatch()


def small_cluster_config(monkeypatch: pytest.MonkeyPatch, vocab: int, mode: str) -> BobConfig:
    """A V the program would give the tall or small kernels, in clusters instead."""
    import bob.program.bob as program

    monkeypatch.setattr(program, "CLUSTER_FROM_VOCAB", 2)
    monkeypatch.setattr(program, "CLUSTER_ODD_FROM_VOCAB", 2)
    config = BobConfig(vocab=vocab, prompts=2, updates=3, mode=mode,  # type: ignore[arg-type]
                       schedule="fused", pairs=vocab * vocab if mode == "corpus" else 0)
    assert config.fused_region(SM90) in sig.CLUSTER_SLICES
    return config


@pytest.mark.parametrize("mode", ["hard", "corpus"])
def test_the_simulated_command_stream_runs_a_cluster_plan_as_the_cpu_does(monkeypatch, mode):
    from bob.backends.cpu import CpuBackend
    from bob.backends.nv.sim import NvSimBackend
    from bob.config import Hyper
    from bob.host.check import random_record
    from bob.program.bob import adam_scalar_table
    from conftest import stand_in_regions

    config = small_cluster_config(monkeypatch, 37, mode)
    plan = build_plan(config, SM90, compiled=stand_in_regions(config, SM90,
                                                            dynamic_shared_bytes=8192))
    assert {launch.cluster for launch in plan.launches} == {1, 2}
    rng = np.random.default_rng(5)
    table = rng.standard_normal((37, 37), dtype=np.float32)
    record = random_record(config, 5)
    backends = [CpuBackend(plan), NvSimBackend(plan)]
    for backend in backends:
        backend.write_tensor("input", record.payload())
        backend.write_tensor("parameters", table.tobytes())
        backend.write_tensor("adam_scalars", adam_scalar_table(Hyper(), 1, 3).tobytes())
        backend.run(range(plan.submission_count))
    for tensor in plan.tensors:
        assert backends[0].read_tensor(tensor.name) == backends[1].read_tensor(tensor.name), (
            tensor.name)
    assert any(backends[1].read_tensor("training_loss"))


def test_nv_launches_clusters_and_plan_and_doctor_say_none_is_withheld(monkeypatch):
    from bob.backends import registry
    from bob.cli.plan_cmd import cluster_note
    from bob.host import doctor

    assert registry.spec("nv").clusters_withheld == ""
    assert cluster_note(build_plan(config_of(50257, "corpus"), SM90)) is None
    assert "clusters" not in next(row for row in doctor.diagnose()
                                  if row["backend"] == "nv")["details"]


def test_plan_and_doctor_say_in_one_line_why_a_backend_launches_no_clusters(monkeypatch):
    from dataclasses import replace

    from bob.backends import registry
    from bob.cli.plan_cmd import cluster_note
    from bob.host import doctor

    why = "its QMD encodes no clusters"
    withheld = replace(registry.spec("nv"), clusters_withheld=why)
    monkeypatch.setitem(registry._BY_NAME, "nv", withheld)
    monkeypatch.setattr(doctor, "SPECS", tuple(withheld if each.name == "nv" else each
                                               for each in registry.SPECS))
    note = cluster_note(build_plan(config_of(50257, "corpus"), SM90))
    assert note == (f"clusters: the nv backend launches none ({why}); the cuda backend "
                    "launches these")
    assert "\n" not in note
    assert cluster_note(build_plan(config_of(50257, "corpus"), SM86)) is None
    monkeypatch.setattr(doctor, "_kernel_module", lambda: "no module")
    row = next(row for row in doctor.diagnose() if row["backend"] == "nv")
    assert row["details"].endswith(f"; no thread-block clusters: {why}; no module")

"""The inspection commands: plan --arch/--disasm/--emit, check, doctor."""

from __future__ import annotations

import json

import pytest

from bob.cli.main import main
from bob.config import TARGET_NAMES
from bob.kernels.cuda.regions import catalogue
from bob.plan.jsonio import loads
from bob.program.bob import BobConfig, build_plan
from conftest import needs_nvrtc


@needs_nvrtc
@pytest.mark.parametrize("arch", TARGET_NAMES)
def test_plan_arch_shows_compiled_regions(arch, capsys):
    assert main(["plan", "--arch", arch, "-N", "1", "--json"]) == 0
    plan = loads(capsys.readouterr().out, regions=catalogue())
    assert plan.target.name == arch
    for region in plan.regions:
        assert region.code and 0 < region.registers <= 255, region.name
    assert plan.code_extent >= sum(len(r.code) for r in plan.regions)
    assert main(["plan", "--arch", arch, "-N", "1"]) == 0
    assert "code bytes" in capsys.readouterr().out


def test_plan_disasm_lists_every_gpfifo_entry_and_qmd(capsys):
    assert main(["plan", "-N", "2", "-P", "1", "--submission", "per-launch", "--disasm"]) == 0
    out = capsys.readouterr().out
    plan = build_plan(BobConfig(prompts=1, updates=2))
    assert plan.submission_policy == "per-launch"
    assert out.count("GPFIFO entry") == plan.submission_count + 1  # + the set-up entry
    assert out.count("QMD V03_00 at") == plan.launch_count  # each QMD listed once
    assert out.count("-> QMD of launch") == plan.submission_count  # each dispatch names its
    for name in ("SET_OBJECT", "SEND_PCAS_A", "CTA_RASTER_WIDTH", "SHARED_MEMORY_SIZE"):
        assert name in out


@needs_nvrtc
def test_plan_emit_writes_each_component(tmp_path, capsys):
    out_dir = tmp_path / "components"
    assert main(["plan", "-N", "3", "-P", "2", "--arch", "sm_90", "--emit", str(out_dir)]) == 0
    capsys.readouterr()
    index = json.loads((out_dir / "index.json").read_text())
    assert index  # describes the files
    main(["plan", "-N", "3", "-P", "2", "--arch", "sm_90", "--json"])
    plan = loads(capsys.readouterr().out, regions=catalogue())
    assert (out_dir / "program.bin").stat().st_size == plan.program_bytes
    assert (out_dir / "qmd-table.bin").stat().st_size == plan.qmd_table_bytes
    assert (out_dir / "gpfifo.bin").stat().st_size == 8 * (plan.submission_count + 1)


@pytest.mark.parametrize("args", [
    ["--backends", "cpu,nv-sim"],
    ["--backends", "nv-sim,cpu", "--mode", "corpus", "-V", "300", "--arch", "sm_86"],
    ["--backends", "cpu,nv-sim", "--schedule", "fused", "--steps", "12", "-N", "5"],
])
def test_check_reports_agreement(args, capsys):
    assert main(["check", *args, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["identical"] is True and report["difference"] is None
    assert report["bytes_compared"] > 0


def test_check_refuses_a_bad_pair(capsys):
    assert main(["check", "--backends", "cpu"]) == 2
    assert "expected two of" in capsys.readouterr().err


def test_doctor_says_what_can_run(capsys):
    assert main(["doctor", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    rows = {row["backend"]: row for row in listed["backends"]}
    assert isinstance(listed["gpus"], list) and listed["gpus_note"]
    assert rows["cpu"]["usable"] is True and rows["nv-sim"]["usable"] is True
    assert set(rows) == {"cpu", "cuda", "nv-sim", "nv", "auto"}
    for name in ("cuda", "nv"):
        assert rows[name]["details"]  # why it can or cannot run here
    assert rows["auto"]["details"] in ("picks cuda", "picks cpu")

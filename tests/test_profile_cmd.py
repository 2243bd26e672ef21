"""`bob profile` on the CPU: the table from a fake timestamp source, and its refusals."""

from __future__ import annotations

import json

import pytest

from bob.backends import BackendChoice
from bob.backends.cpu import CpuBackend
from bob.cli import profile_cmd
from bob.cli.main import main
from bob.errors import BackendUnavailable, RunFailure
from bob.host import profiling
from bob.plan.placement import SM86
from bob.program.bob import BobConfig, build_plan


class TimedCpu(CpuBackend):
    """The CPU backend with a fake device clock: launch i takes 100 ns * (i + 1) + 7."""

    can_profile = True

    def _timed_run(self, submissions: range) -> list[tuple[int, int]]:
        self._run(submissions)
        return [(launch, 100 * (launch + 1) + 7) for index in submissions
                for launch in self.plan.submissions[index].launches]


def _fake_backend(monkeypatch, backend_class=TimedCpu):
    chosen = []

    def choose(name: str, kernels: str = "nvrtc"):
        chosen.append(name if kernels == "nvrtc" else f"{name} ({kernels})")
        return BackendChoice(name, SM86, None, backend_class, "a fake timed backend")

    monkeypatch.setattr(profiling, "choose_backend", choose)
    return chosen


def _expected(config: BobConfig) -> dict[str, list[int]]:
    plan = build_plan(config, SM86)
    times: dict[str, list[int]] = {}
    for submission in plan.submissions:
        for launch in submission.launches:
            times.setdefault(plan.launches[launch].region, []).append(100 * (launch + 1) + 7)
    return times


@pytest.mark.parametrize("schedule", ["seed", "fused"])
def test_the_json_profile_sums_each_regions_launches(monkeypatch, capsys, schedule):
    chosen = _fake_backend(monkeypatch)
    status = main(["profile", "--backend", "cuda", "-V", "256", "-N", "3", "--schedule",
                   schedule, "--json"])
    out = capsys.readouterr().out
    assert status == 0, out
    assert chosen == ["cuda"]
    result = json.loads(out)
    config = BobConfig(vocab=256, prompts=0, updates=3, schedule=schedule)  # type: ignore[arg-type]
    expected = _expected(config)
    plan = build_plan(config, SM86)
    assert result["plan_launches"] == plan.launch_count
    assert result["timed_launches"] == sum(len(t) for t in expected.values())
    assert result["method"].startswith("cuEventRecord before and after every launch")
    assert [r["region"] for r in result["regions"]] == list(expected)
    for row in result["regions"]:
        times = expected[row["region"]]
        assert row["launches"] == len(times)
        assert row["total_us"] == pytest.approx(sum(times) / 1000)
        assert row["mean_us"] == pytest.approx(sum(times) / len(times) / 1000)
        assert row["max_us"] == pytest.approx(max(times) / 1000)


def test_the_table_shows_every_region_and_the_whole(monkeypatch, capsys):
    _fake_backend(monkeypatch)
    assert main(["profile", "--backend", "nv", "-V", "256", "-N", "2"]) == 0
    out = capsys.readouterr().out
    expected = _expected(BobConfig(vocab=256, prompts=0, updates=2))
    for region, times in expected.items():
        line = next(line for line in out.splitlines() if f" {region} " in line)
        assert f"{sum(times) / 1000:,.2f}" in line and f" {len(times)} " in line
    total = sum(sum(times) for times in expected.values())
    assert f"{total / 1000:,.2f}" in next(line for line in out.splitlines() if " all " in line)
    assert "timestamped semaphore releases" in out  # the nv method, said in the output


def test_region_times_refuse_what_the_plan_does_not_have():
    plan = build_plan(BobConfig(vocab=256, prompts=0, updates=1), SM86)
    with pytest.raises(RunFailure, match=f"a timed launch {plan.launch_count} is not in"):
        profile_cmd.region_times(plan, [(plan.launch_count, 5)])
    with pytest.raises(RunFailure, match="launch 0 took -1 ns: a negative device time"):
        profile_cmd.region_times(plan, [(0, -1)])


@pytest.mark.parametrize(("argv", "message"), [
    (["--backend", "nv", "--submission", "chained"],
     "bob: profiling on nv times one launch per submission: use --submission per-launch "
     "(chained submissions cannot be bracketed launch by launch)"),
    (["-N", "0"], "bob profile: Invalid value for '--updates' / '-N': 0 is not in the range"),
    (["--backend", "cpu"], "bob profile: Invalid value for '--backend': 'cpu' is not one of"),
    (["-V", "1"], "bob: --vocab 1 is outside [2, 1048576]"),
    (["--kernels", "own"], "bob: --kernels own runs on nv-sim and nv (Bob's command stream); "
                           "the cuda backend loads NVRTC's cubin and stays on NVRTC's kernels"),
    (["--backend", "nv", "--kernels", "own", "--schedule", "fused", "-V", "4096"],
     "bob: --kernels own: Bob has no own machine code for bob-fused-train-wide (V = 4096); "
     "use --kernels nvrtc or --schedule seed"),
    (["-V", "1048577"], "bob: --vocab 1048577 is outside [2, 1048576]: V=1048576 is the "
                        "largest table Bob trains"),
])
def test_bad_input_is_one_line_and_exit_2(monkeypatch, capsys, tmp_path, argv, message):
    chosen = _fake_backend(monkeypatch)
    monkeypatch.chdir(tmp_path)
    assert main(["profile", *argv]) == 2
    captured = capsys.readouterr()
    assert captured.err.strip().splitlines()[-1].startswith(message)
    assert "Traceback" not in captured.err and captured.out == ""
    assert chosen == []  # nothing was opened
    assert list(tmp_path.iterdir()) == []  # nothing was written


def test_own_kernels_are_asked_of_the_nv_backend(monkeypatch, capsys):
    chosen = _fake_backend(monkeypatch)
    assert main(["profile", "--backend", "nv", "-N", "1", "--kernels", "own", "--json"]) == 0
    assert chosen == ["nv (own)"]
    assert json.loads(capsys.readouterr().out)["kernels"] == "own"


def test_an_unavailable_backend_is_one_line_and_exit_1(monkeypatch, capsys):
    def unavailable(name: str, kernels: str = "nvrtc"):
        raise BackendUnavailable(f"the {name} backend cannot run here: no GPU")

    monkeypatch.setattr(profiling, "choose_backend", unavailable)
    assert main(["profile", "--backend", "nv"]) == 1
    err = capsys.readouterr().err
    assert err == "bob: the nv backend cannot run here: no GPU\n"


def test_a_backend_that_cannot_time_is_refused(monkeypatch, capsys):
    _fake_backend(monkeypatch, CpuBackend)
    assert main(["profile", "--backend", "cuda", "-N", "1"]) == 1
    assert capsys.readouterr().err == "bob: the cuda backend cannot time its launches\n"

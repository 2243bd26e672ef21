"""What `bob train` says while it runs: the plan before the backend starts, a line at
each eval point, and without a terminal (no progress bar) a line at least every
HEARTBEAT_SECONDS of wall time saying what the run is doing.

    plan: updates 1-1000 on the cpu backend (V=256, corpus mode, seed schedule), 10 invocations of 100 updates; the first estimated at 0.07 s
    step 100: train 2.4747  (148 ms/update, ETA 2:13)
    ... 0:20: 100 of 1000 updates done
"""  # noqa: E501

from __future__ import annotations

import threading
import time

from rich.console import Console

from bob.host import api

# Without a terminal, the longest the run stays silent (a log or a CI job shows it is
# alive and what it does).
HEARTBEAT_SECONDS = 10.0
HEARTBEAT_PREFIX = "... "  # a heartbeat line starts so: timed, never the same twice


class Heartbeat:
    """Lines on the console, one at a time, and while `enabled` (no terminal: no bar
    moves) a line whenever HEARTBEAT_SECONDS pass without one, naming the phase the run
    is in and the time since the command began."""

    def __init__(self, console: Console, enabled: bool) -> None:
        self.console = console
        self.enabled = enabled
        self.begun = self.last = time.monotonic()
        # Until the run announces its plan: the backend chosen, the data read or counted
        # (row shards: their workers started too).
        self.phase = "starting: the backend, the data"
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> Heartbeat:
        if self.enabled:
            self._thread = threading.Thread(target=self._beat, name="bob-heartbeat",
                                            daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def say(self, text: str) -> None:
        """A line now (markup off: file names and figures print as they are)."""
        with self._lock:
            self.console.print(text, markup=False, highlight=False, soft_wrap=True)
            self.last = time.monotonic()

    def doing(self, phase: str) -> None:
        """What the run does from now on, for the next heartbeat line."""
        self.phase = phase

    def _beat(self) -> None:
        while not self._stop.wait(min(1.0, HEARTBEAT_SECONDS / 4)):
            now = time.monotonic()
            if now - self.last >= HEARTBEAT_SECONDS:
                self.say(f"{HEARTBEAT_PREFIX}{clock(now - self.begun)}: {self.phase}")


def plan_line(plan: api.TrainPlan) -> str:
    """The run's plan in one line, with the first invocation's estimate."""
    sizes = plan.sizes
    first, last = plan.first_step + 1, plan.first_step + plan.steps
    shape = (f"{len(sizes)} invocation{'s' if len(sizes) != 1 else ''} of "
             f"{'' if len(sizes) == 1 or sizes[-1] == sizes[0] else 'up to '}{sizes[0]} "
             f"update{'s' if sizes[0] != 1 else ''}")
    estimate = plan.estimate_seconds
    guess = "" if estimate is None else f"; the first estimated at {seconds_text(estimate)}"
    return (f"plan: updates {first}-{last} on the {plan.backend} backend (V={plan.vocab}, "
            f"{plan.mode} mode, {plan.schedule} schedule), {shape}{guess}")


def invocation_phase(plan: api.TrainPlan, done: int) -> str:
    """The phase once `done` of the run's updates are made. Invocations overlap (the next
    is queued before the last is read back), so after the first only the count is sure."""
    if done >= plan.steps:
        return "saving the checkpoint"
    if done == 0:
        first = plan.first_step + 1
        return f"the first invocation running (updates {first}-{first + plan.sizes[0] - 1})"
    return f"{done} of {plan.steps} updates done"


class ProgressLog:
    """A line at each eval point, as nanoGPT prints them:
    `step 1200: train 2.4712, val 2.4981  (12.6 ms/update, ETA 0:42)`. The rate is the wall
    time from the line before's invocation to this one's (`Invocation.finished`; the first:
    from the first invocation's start) over the updates made in it, so the lines add up to
    the run, saves and all; the ETA is that rate times the updates left."""

    def __init__(self, heartbeat: Heartbeat, request: api.TrainRequest) -> None:
        self.heartbeat = heartbeat
        self.request = request
        self.plan: api.TrainPlan | None = None
        self.done = 0  # updates made at the last line
        self.at: float | None = None  # perf_counter of the last line (or the first start)

    def announce(self, plan: api.TrainPlan) -> None:
        """The plan, before the backend starts (and compiles, where it does)."""
        self.plan = plan
        self.heartbeat.say(plan_line(plan))
        self.heartbeat.doing(invocation_phase(plan, 0))

    def line(self, invocation, done: int) -> None:
        if self.plan is not None:
            self.heartbeat.doing(invocation_phase(self.plan, done))
        if self.at is None:
            self.at = invocation.began or time.perf_counter()
        if not self.request.eval_point(done):
            return
        now = invocation.finished or time.perf_counter()
        per_update = (now - self.at) / max(done - self.done, 1)
        self.done, self.at = done, now
        val = "" if invocation.validation is None else f", val {invocation.validation[1]:.4f}"
        left = max(self.request.steps - done, 0) * per_update
        self.heartbeat.say(f"step {invocation.state.step}: train {invocation.loss:.4f}{val}  "
                           f"({milliseconds(per_update)} ms/update, ETA {clock(left)})")


def milliseconds(seconds: float) -> str:
    """Three significant digits: 261, 12.6, 0.481."""
    milliseconds = 1000 * seconds
    return f"{milliseconds:.0f}" if milliseconds >= 1000 else f"{milliseconds:.3g}"


def seconds_text(seconds: float) -> str:
    """An estimate as a reader takes it in: 0.07 s, 3 s, 2:13."""
    if seconds < 10:
        return f"{seconds:.2g} s"
    return clock(seconds)


def clock(seconds: float) -> str:
    """0:42, 12:05, 1:02:03."""
    hours, rest = divmod(round(seconds), 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"

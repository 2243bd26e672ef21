"""Run `bob` as on a machine with the kernel driver and none of NVIDIA's wheels.

    PYTHONPATH=src:. python3 -m dev.bringup.no_wheels train --backend nv --steps 20 ...

Every import of ``cuda`` (cuda-bindings) and ``nvidia`` (NVRTC and the other wheels) is
refused before Bob loads, so the nv backend takes Bob's own machine code alone, as it would
where only the kernel driver is installed. The command's arguments are bob's. It prints
which of those modules were loaded (none, if the claim holds) on stderr at the end.
"""

from __future__ import annotations

import importlib.abc
import os
import runpy
import sys

REFUSED = ("cuda", "nvidia")


class NoCudaWheels(importlib.abc.MetaPathFinder):
    """A finder that refuses the CUDA wheels' top-level packages."""

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in REFUSED:
            raise ImportError(f"No module named {name!r} (refused: a machine without the "
                              "CUDA wheels)")
        return None


def report() -> None:
    loaded = sorted(name for name in sys.modules if name.split(".")[0] in REFUSED)
    print(f"no_wheels: CUDA wheel modules loaded: {', '.join(loaded) or 'none'}",
          file=sys.stderr, flush=True)


def main() -> int:
    """Run `python -m bob` with this process's arguments, the wheels refused: the command
    as a program (runpy), as a shell would start it. `bob` ends with os._exit, so the
    report goes out just before it."""
    sys.meta_path.insert(0, NoCudaWheels())
    sys.argv = ["bob", *sys.argv[1:]]
    exit_now = os._exit

    def reporting_exit(code: int) -> None:
        report()
        exit_now(code)

    os._exit = reporting_exit
    try:
        runpy.run_module("bob", run_name="__main__", alter_sys=True)
    except SystemExit as stop:
        report()
        return stop.code if isinstance(stop.code, int) else 1
    report()
    return 0


if __name__ == "__main__":
    sys.exit(main())

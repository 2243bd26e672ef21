"""Run `bob` as on a machine with the kernel driver and none of NVIDIA's wheels.

    PYTHONPATH=src:. python3 -m dev.bringup.no_wheels train --backend nv --steps 20 ...

Every import of ``cuda`` (cuda-bindings) and ``nvidia`` (NVRTC and the other wheels) is
refused before Bob loads, so the nv backend takes Bob's own machine code alone, as it would
where only the kernel driver is installed. The command's arguments are bob's. It prints
which of those modules were loaded (none, if the claim holds) on stderr at the end.
"""

from __future__ import annotations

import importlib.abc
import sys

REFUSED = ("cuda", "nvidia")


class NoCudaWheels(importlib.abc.MetaPathFinder):
    """A finder that refuses the CUDA wheels' top-level packages."""

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in REFUSED:
            raise ImportError(f"No module named {name!r} (refused: a machine without the "
                              "CUDA wheels)")
        return None


def main() -> int:
    sys.meta_path.insert(0, NoCudaWheels())
    from bob.cli.main import main as bob_main

    try:
        status = bob_main(sys.argv[1:])
    finally:
        loaded = sorted(name for name in sys.modules if name.split(".")[0] in REFUSED)
        print(f"no_wheels: CUDA wheel modules loaded: {', '.join(loaded) or 'none'}",
              file=sys.stderr)
    return int(status or 0)


if __name__ == "__main__":
    sys.exit(main())

"""The shipped CUDA source compiles with the oldest NVRTC the [cuda] extra allows.

NVRTC 13.0 is what PyTorch's CUDA 13.0 wheels bring, so a user's environment often holds
it rather than the newest; it refused a generic lambda in a kernel that 13.5 took. `make
test` installs its wheel beside the environment (.venv/nvrtc-13.0); a child process loads
that library before cuda-bindings looks for one, compiles, and reads every region.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FLOOR = (13, 0)
LIBRARY = ROOT / ".venv" / "nvrtc-13.0" / "nvidia" / "cu13" / "lib"

CHILD = """
import ctypes, json, sys
library = sys.argv[1]
ctypes.CDLL(library + "/libnvrtc-builtins.so.13.0", mode=ctypes.RTLD_GLOBAL)
ctypes.CDLL(library + "/libnvrtc.so.13", mode=ctypes.RTLD_GLOBAL)
from bob.kernels.cuda.compile import compile_kernels, nvrtc_version
from bob.kernels.cuda.regions import image_regions
from bob.plan.placement import TARGETS
compiled = compile_kernels("sm_90", use_cache=False)
regions = image_regions(compiled.image, TARGETS["sm_90"])
print(json.dumps({"version": list(nvrtc_version()), "regions": sorted(regions)}))
"""


def test_the_kernels_compile_with_the_oldest_nvrtc_allowed() -> None:
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert f'"nvidia-cuda-nvrtc>={FLOOR[0]}.{FLOOR[1]}"' in pyproject
    if not (LIBRARY / "libnvrtc.so.13").is_file():
        pytest.fail(f"{LIBRARY} holds no NVRTC {FLOOR[0]}.{FLOOR[1]}: `make test` installs it "
                    "(pip install --target .venv/nvrtc-13.0 nvidia-cuda-nvrtc==13.0.88)")
    child = subprocess.run([sys.executable, "-c", CHILD, str(LIBRARY)], capture_output=True,
                           text=True, cwd=ROOT, timeout=600,
                           env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    assert child.returncode == 0, child.stderr[-3000:]
    found = json.loads(child.stdout.strip().splitlines()[-1])
    assert tuple(found["version"]) == FLOOR  # the floor's library, not the newest
    from bob.kernels import signatures as sig

    assert set(found["regions"]) == set(sig.SIGNATURES)

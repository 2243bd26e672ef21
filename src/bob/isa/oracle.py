"""NVIDIA's disassembler and assembler from their PyPI wheels, as black-box oracles.

The wheels ``nvidia-cuda-nvdisasm`` and ``nvidia-cuda-nvcc`` (the test extra
pins them) put their programs under ``site-packages/nvidia/cu13/bin`` (CUDA
12's wheels used ``nvidia/cuda_nvcc/bin``). They run on a machine without a
GPU, so CI checks Bob's encoder against them. Nothing in the product needs
them: Bob only reads their output in tests.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

# Where the wheels put their binaries, under each directory of the `nvidia` namespace.
_LAYOUTS = ("cu13/bin", "cuda_nvcc/bin", "cuda_nvdisasm/bin")


class OracleMissing(RuntimeError):
    """The tool is not installed or does not run here; the message says which and why."""


def tool_path(name: str) -> Path:
    """The path of `name` (nvdisasm, ptxas) from the installed wheels; OracleMissing if none."""
    try:
        import nvidia
    except ImportError:
        raise OracleMissing(f"{name}: no 'nvidia' package is installed "
                            "(pip install 'bob-bigram[test]' brings the pinned wheels)") from None
    searched = []
    for root in getattr(nvidia, "__path__", []):
        for layout in _LAYOUTS:
            path = Path(root) / layout / name
            searched.append(str(path))
            if path.is_file() and os.access(path, os.X_OK):
                return path
    raise OracleMissing(f"{name}: not found in the installed nvidia wheels "
                        f"(looked at {', '.join(searched) or 'no nvidia directory'})")


def run_tool(name: str, *args: str, timeout: float = 300) -> str:
    """Run the tool; its stdout, or OracleMissing/RuntimeError with its stderr."""
    path = tool_path(name)
    try:
        done = subprocess.run([str(path), *args], capture_output=True, text=True,
                              timeout=timeout, check=False)
    except OSError as error:
        raise OracleMissing(f"{name} at {path} does not run here: {error}") from None
    if done.returncode:
        raise RuntimeError(f"{name} {' '.join(args)} exited {done.returncode}:\n"
                           f"{done.stderr.strip()}")
    return done.stdout


def nvdisasm_raw(code: bytes, arch: str) -> list[str]:
    """nvdisasm's text of each instruction of raw `code` for `arch` ("sm_90"), in order.

    The text is as printed less the address and the final ';', with nvdisasm's
    padding before commas and semicolons (``+INF ,``) removed.
    """
    sm = "SM" + arch.removeprefix("sm_")
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "code.bin"
        path.write_bytes(code)
        out = run_tool("nvdisasm", "-b", sm, str(path))
    lines = []
    for line in out.splitlines():
        stripped = line.strip()
        if not stripped.startswith("/*") or "*/" not in stripped:
            continue
        text = stripped.split("*/", 1)[1].strip()
        lines.append(normalise(text))
    return lines


def normalise(text: str) -> str:
    text = text.rstrip()
    if text.endswith(";"):
        text = text[:-1]
    return " ".join(text.replace(" ,", ",").split())

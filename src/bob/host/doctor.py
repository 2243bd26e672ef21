"""`bob doctor`: which backends are usable here, and why not."""

from __future__ import annotations

import platform

import numpy as np


def _kernel_module() -> str:
    from bob.backends.cuda import kernel_module

    kind, line = kernel_module()
    if kind is None:
        return "no NVIDIA kernel module loaded (/proc/driver/nvidia/version absent)"
    return f"{kind} kernel module: {line}"


def _nvrtc() -> tuple[bool, str]:
    try:
        from cuda.bindings import nvrtc
    except ImportError as error:
        return False, f"NVRTC bindings missing ({error}); pip install 'bob[cuda]'"
    try:
        result, major, minor = nvrtc.nvrtcVersion()
    except Exception as error:  # noqa: BLE001 - a broken install reports anything
        return False, f"NVRTC not loadable: {error}"
    return int(result) == 0, f"NVRTC {major}.{minor}"


def diagnose() -> list[dict]:
    rows = [{
        "backend": "cpu", "usable": True,
        "details": f"NumPy {np.__version__} on {platform.machine()}, Python "
                   f"{platform.python_version()}",
    }]
    nvrtc_ok, nvrtc_text = _nvrtc()
    module = _kernel_module()
    cuda_row = {"backend": "cuda", "usable": False, "details": ""}
    try:
        from bob.backends.cuda import cuda_available, device_info
    except ImportError as error:
        cuda_row["details"] = f"cuda-bindings missing ({error}); pip install 'bob[cuda]'"
    else:
        usable, why = cuda_available()
        if usable:
            info = device_info()
            details = (f"{info['name']}, compute capability {info['compute_capability']}, "
                       f"driver {info['driver_version']}; {module}; {nvrtc_text}")
            match = _image_matches(info.get("arch", ""))
            cuda_row.update(usable=usable and nvrtc_ok and match[0],
                            details=f"{details}; {match[1]}")
        else:
            cuda_row["details"] = f"{why}; {module}; {nvrtc_text}"
    rows.append(cuda_row)
    rows.append({"backend": "nv-sim", "usable": True,
                 "details": "encodes QMDs/pushbuffer/GPFIFO and simulates them on the CPU"})
    try:
        from bob.backends.nv.rm.backend import nv_available
    except ImportError as error:
        rows.append({"backend": "nv", "usable": False, "details": f"not built: {error}"})
    else:
        usable, why = nv_available()
        rows.append({"backend": "nv", "usable": usable, "details": f"{why}; {module}"})
    auto = "cuda" if cuda_row["usable"] else "cpu"
    rows.append({"backend": "auto", "usable": True, "details": f"picks {auto}"})
    return rows


def _image_matches(arch: str) -> tuple[bool, str]:
    """Compile (or fetch from the cache) the kernels for the device and read them back."""
    from bob.plan.placement import TARGETS

    if arch not in TARGETS:
        return False, f"no Bob target for {arch or 'this GPU'} (have {', '.join(TARGETS)})"
    try:
        from bob.kernels.cuda.compile import compiled_regions

        regions = compiled_regions(arch)
    except Exception as error:  # noqa: BLE001 - report whatever stops compilation
        return False, f"kernels do not compile for {arch}: {error}"
    return True, f"compiled image for {arch} matches ({len(regions)} kernels)"

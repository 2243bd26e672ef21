"""`bob doctor`: which backends are usable here, and why not (from the backend registry)."""

from __future__ import annotations

from bob.backends import BACKEND_NAMES, SPECS, availability


def _kernel_module() -> str:
    from bob.backends.cuda import kernel_module

    kind, line = kernel_module()
    if kind is None:
        return "no NVIDIA kernel module loaded (/proc/driver/nvidia/version absent)"
    return f"{kind} kernel module: {line}"


def diagnose() -> list[dict]:
    """One row per backend name: {backend, usable, details}; a GPU backend's details name
    the kernel module it sits on."""
    rows = [availability(name).to_json() for name in BACKEND_NAMES]
    module = _kernel_module()
    on_gpu = {each.name for each in SPECS if each.on_gpu}
    withheld = {each.name: each.clusters_withheld for each in SPECS if each.clusters_withheld}
    for row in rows:
        if row["backend"] in withheld:
            row["details"] = f"{row['details']}; no thread-block clusters: " \
                             f"{withheld[row['backend']]}"
        if row["backend"] in on_gpu:
            row["details"] = f"{row['details']}; {module}"
    return rows

"""`bob doctor`: which backends are usable here, and why not (from the backend registry),
and the GPUs the CUDA driver sees (what `bob train --gpus` can name)."""

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


def _error_text(error: Exception) -> str:
    """An error's message: a KeyError's own (its str() is the repr, in quotes), any other's
    str(); a quote that belongs to the text (pip install 'bob-bigram[cuda]') stays."""
    if isinstance(error, KeyError) and error.args:
        return str(error.args[0])
    return str(error)


def list_gpus() -> tuple[list[dict], str]:
    """The GPUs the CUDA driver sees, numbered as --gpus and CUDA_VISIBLE_DEVICES number
    them ({gpu, name, arch, memory_bytes, multiprocessors}), and a line saying how many or
    why none can be listed."""
    try:
        from bob.backends.cuda import driver

        driver.initialize()
        count = int(driver.call("cuDeviceGetCount"))
        found = []
        for ordinal in range(count):
            info = driver.describe_device(ordinal)
            device = driver.call("cuDeviceGet", ordinal)
            found.append({"gpu": ordinal, "name": info.name,
                          "arch": "sm_{}{}".format(*info.compute_capability),
                          "memory_bytes": int(driver.call("cuDeviceTotalMem", device)),
                          "multiprocessors": info.multiprocessors})
    except Exception as error:  # no bindings, no driver, no device: say which, list none
        lines = _error_text(error).splitlines()
        return [], f"no GPU listed: {lines[0] if lines else type(error).__name__}"
    return found, f"{count} GPU{'s' if count != 1 else ''} seen by the CUDA driver"

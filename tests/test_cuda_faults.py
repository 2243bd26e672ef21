"""The cuda backend after a kernel fault, on the CPU: which errors poison the context, and
how the next open gets a usable one (driver calls recorded, no GPU): the primary context
reset, or, where the driver keeps it poisoned, a context of the backend's own. The same on
a device: tests/test_nv_stream_gpu.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from bob.backends import cuda
from bob.backends.cuda import backend as cuda_backend
from bob.backends.cuda import driver as cuda_driver


class _Opened(Exception):
    """Stops `_open` once it has its context (the rest needs a GPU)."""


STICKY = "CUDA_ERROR_LAUNCH_FAILED"


def _bare_backend(monkeypatch, ordinal: int = 0, failing: tuple[str, ...] = (),
                  create: str = "ok") -> tuple[cuda.CudaBackend, list[str]]:
    """A backend whose driver records calls; `failing` calls fail with a sticky status,
    cuCtxCreate answers `create`, and cuCtxSetCurrent (the first use of the context)
    stops the open."""
    calls: list[str] = []

    def call(name: str, *args):
        calls.append(name)
        if name in failing:
            raise cuda.CudaError(name, STICKY, "unspecified launch failure")
        if name == "cuCtxSetCurrent":
            raise _Opened
        return f"context from {name}"

    def ctx_create(params, flags, device):
        calls.append("cuCtxCreate")
        if create != "ok":
            return (create, None)
        return ("ok", "own context")

    monkeypatch.setattr(cuda_driver, "call", call)
    monkeypatch.setattr(cuda_driver, "bindings", lambda: SimpleNamespace(cuCtxCreate=ctx_create))
    monkeypatch.setattr(cuda_driver, "check", lambda name, result: _checked(name, result))
    monkeypatch.setattr(cuda_backend, "_POISONED", set())
    backend = object.__new__(cuda.CudaBackend)  # no device: only the fault bookkeeping
    backend._ordinal = ordinal
    backend._device = f"device {ordinal}"
    backend._closed = False
    backend._own_context = False
    backend.close = lambda: setattr(backend, "_closed", True)  # type: ignore[method-assign]
    return backend, calls


def _checked(name: str, result: tuple):
    status, value = result
    if status != "ok":
        raise cuda.CudaError(name, status, "refused")
    return value


def _poison(backend: cuda.CudaBackend, status: str = STICKY) -> None:
    backend._after_fault(cuda.CudaError("cuStreamSynchronize", status, "a kernel fault"))


@pytest.mark.parametrize("status", sorted(cuda.STICKY_ERRORS))
def test_a_sticky_error_closes_and_the_next_open_resets_the_primary_context(monkeypatch,
                                                                           status):
    backend, calls = _bare_backend(monkeypatch)
    _poison(backend, status)
    assert backend._closed and cuda_backend._POISONED == {0}
    with pytest.raises(_Opened):
        backend._open()
    assert calls == ["cuDevicePrimaryCtxReset", "cuDevicePrimaryCtxRetain", "cuCtxSetCurrent"]
    assert cuda_backend._POISONED == set() and backend._context == "context from " \
        "cuDevicePrimaryCtxRetain" and not backend._own_context
    calls.clear()
    with pytest.raises(_Opened):
        backend._open()
    assert calls == ["cuDevicePrimaryCtxRetain", "cuCtxSetCurrent"]


def test_a_primary_context_still_poisoned_after_the_reset_gives_way_to_an_own_one(
        monkeypatch):
    backend, calls = _bare_backend(monkeypatch, failing=("cuDevicePrimaryCtxRetain",))
    _poison(backend)
    with pytest.raises(_Opened):
        backend._open()
    assert calls == ["cuDevicePrimaryCtxReset", "cuDevicePrimaryCtxRetain", "cuCtxCreate",
                     "cuCtxSetCurrent"]
    assert backend._context == "own context" and backend._own_context
    assert cuda_backend._POISONED == {0}  # every later open makes its own context too


def test_no_context_at_all_is_one_line_that_says_to_restart(monkeypatch):
    backend, calls = _bare_backend(monkeypatch, failing=("cuDevicePrimaryCtxReset",),
                                   create=STICKY)
    _poison(backend)
    with pytest.raises(cuda.CudaError) as raised:
        backend._open()
    message = str(raised.value)
    assert "\n" not in message and message.startswith("cuCtxCreate failed: " + STICKY)
    assert message.endswith("restart the process)")
    assert calls == ["cuDevicePrimaryCtxReset", "cuCtxCreate"]


def test_an_ordinary_error_leaves_the_context_alone(monkeypatch):
    backend, calls = _bare_backend(monkeypatch)
    _poison(backend, "CUDA_ERROR_OUT_OF_MEMORY")
    assert not backend._closed and cuda_backend._POISONED == set()
    with pytest.raises(_Opened):
        backend._open()
    assert calls == ["cuDevicePrimaryCtxRetain", "cuCtxSetCurrent"]


def test_only_the_faulting_device_is_reset(monkeypatch):
    backend, calls = _bare_backend(monkeypatch, ordinal=1)
    _poison(backend, "CUDA_ERROR_ILLEGAL_ADDRESS")
    assert cuda_backend._POISONED == {1}
    backend._ordinal, backend._device = 0, "device 0"  # the same bookkeeping, device 0
    with pytest.raises(_Opened):
        backend._open()
    assert calls == ["cuDevicePrimaryCtxRetain", "cuCtxSetCurrent"]
    assert cuda_backend._POISONED == {1}

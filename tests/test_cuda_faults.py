"""The cuda backend after a kernel fault, on the CPU: which errors poison the context,
and that the next open resets the primary context before retaining it (driver calls
recorded, no GPU). The same on a device: tests/test_nv_stream_gpu.py."""

from __future__ import annotations

import pytest

from bob.backends import cuda


class _Retained(Exception):
    """Stops `_open` once it has asked for the context (the rest needs a GPU)."""


def _bare_backend(monkeypatch, ordinal: int = 0) -> tuple[cuda.CudaBackend, list[str]]:
    calls: list[str] = []

    def call(name: str, *args):
        calls.append(name)
        if name == "cuDevicePrimaryCtxRetain":
            raise _Retained
        return None

    monkeypatch.setattr(cuda, "_call", call)
    monkeypatch.setattr(cuda, "_driver", lambda: None)
    monkeypatch.setattr(cuda, "_POISONED", set())
    backend = object.__new__(cuda.CudaBackend)  # no device: only the fault bookkeeping
    backend._ordinal = ordinal
    backend._device = f"device {ordinal}"
    backend._closed = False
    backend.close = lambda: setattr(backend, "_closed", True)  # type: ignore[method-assign]
    return backend, calls


@pytest.mark.parametrize("status", sorted(cuda.STICKY_ERRORS))
def test_a_sticky_error_closes_and_the_next_open_resets_the_context(monkeypatch, status):
    backend, calls = _bare_backend(monkeypatch)
    backend._after_fault(cuda.CudaError("cuStreamSynchronize", status, "a kernel fault"))
    assert backend._closed and cuda._POISONED == {0}
    with pytest.raises(_Retained):
        backend._open()
    assert calls == ["cuDevicePrimaryCtxReset", "cuDevicePrimaryCtxRetain"]
    assert cuda._POISONED == set()  # reset once
    calls.clear()
    with pytest.raises(_Retained):
        backend._open()
    assert calls == ["cuDevicePrimaryCtxRetain"]


def test_an_ordinary_error_leaves_the_context_alone(monkeypatch):
    backend, calls = _bare_backend(monkeypatch)
    backend._after_fault(cuda.CudaError("cuMemAlloc", "CUDA_ERROR_OUT_OF_MEMORY", "full"))
    assert not backend._closed and cuda._POISONED == set()
    with pytest.raises(_Retained):
        backend._open()
    assert calls == ["cuDevicePrimaryCtxRetain"]


def test_only_the_faulting_device_is_reset(monkeypatch):
    backend, calls = _bare_backend(monkeypatch, ordinal=1)
    backend._after_fault(cuda.CudaError("cuStreamSynchronize", "CUDA_ERROR_ILLEGAL_ADDRESS",
                                        "bad address"))
    assert cuda._POISONED == {1}
    backend._ordinal, backend._device = 0, "device 0"  # the same bookkeeping, device 0
    with pytest.raises(_Retained):
        backend._open()
    assert calls == ["cuDevicePrimaryCtxRetain"] and cuda._POISONED == {1}

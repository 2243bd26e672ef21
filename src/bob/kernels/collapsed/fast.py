"""The collapsed tables' kernels compiled with Numba (placeholder until written)."""

from bob.kernels.collapsed.reference import KERNELS  # noqa: F401

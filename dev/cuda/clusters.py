"""Backends that launch thread-block clusters where the registry's would not, and the
program made to take its cluster kernels wherever a cluster holds a row: for the GPU
tests and the benches that try clusters before a backend ships them.

    choice = nv_with_clusters()            # the nv backend on the sm_90 target with clusters
    with clusters_wherever_they_fit():     # the cluster kernels at any V a cluster holds
        config.fused_region(choice.target)
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import replace

from bob.backends import BackendChoice, choose_backend
from bob.plan.model import Target
from bob.program.bob import BobConfig, cluster_ctas

NV_DEADLINE_S = 10.0  # a cluster launch that hangs fails in seconds, not the default 30


def nv_with_clusters(deadline_s: float = NV_DEADLINE_S) -> BackendChoice:
    """The nv backend on its submitted target with that target's clusters (BackendUnavailable
    where nv cannot run here)."""
    from bob.backends.nv.rm.backend import SUBMITTED_TARGET, NvBackend
    from bob.plan.placement import TARGETS

    choice = choose_backend("nv")
    return replace(choice, target=TARGETS[SUBMITTED_TARGET],
                   opener=lambda plan: NvBackend(plan, deadline_s=deadline_s))


def _takes_any_cluster(config: BobConfig, target: Target) -> bool:
    return cluster_ctas(config.mode, config.vocab, target) is not None


@contextlib.contextmanager
def clusters_wherever_they_fit() -> Iterator[None]:
    """The program takes the cluster kernels at every V a cluster of the target holds."""
    chosen = BobConfig.takes_cluster
    BobConfig.takes_cluster = _takes_any_cluster  # type: ignore[method-assign]
    try:
        yield
    finally:
        BobConfig.takes_cluster = chosen  # type: ignore[method-assign]

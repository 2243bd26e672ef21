"""The cluster prototype in dev/cuda (bob_cluster.cuh, bench_cluster): its slice sizing and
its kernels' compiled resources, without a GPU."""
from __future__ import annotations

import pytest

from conftest import needs_nvrtc
from dev.cuda.bench_cluster import cluster_ctas, cluster_source, rows_chunk

OPT_IN = 232448  # the H200's opt-in shared memory per block


@pytest.mark.parametrize(("vocab", "mode", "ctas", "bytes_"), [
    (12000, "hard", 2, 4 * 4 * 47 * 128),
    (50257, "hard", 4, 4 * 4 * 197 * 64),
    (50257, "corpus", 4, 4 * 4 * 197 * 64),
    (65536, "hard", 8, 4 * 4 * 256 * 32),
    (65536, "corpus", 8, 4 * 4 * 256 * 32),
])
def test_the_cluster_is_the_fewest_ctas_whose_slices_fit(vocab: int, mode: str, ctas: int,
                                                          bytes_: int) -> None:
    assert cluster_ctas(vocab, mode, OPT_IN) == (ctas, bytes_)


def test_a_row_no_cluster_holds_is_refused_by_name() -> None:
    with pytest.raises(SystemExit, match=r"V=65536 corpus: a slice of 16 CTAs needs more"):
        cluster_ctas(65536, "corpus", 32768)


def test_the_check_rows_differ_and_row_0_is_zeros() -> None:
    first, second = rows_chunk(600, "corpus", 0, 11), rows_chunk(600, "corpus", 1, 11)
    assert not first["parameters"][0].any() and first["parameters"][1].any()
    assert first["parameters"].shape == (256, 600)
    assert not (first["parameters"][1:] == second["parameters"][1:]).all()
    assert rows_chunk(600, "corpus", 2, 11)["parameters"].shape == (88, 600)


@needs_nvrtc
def test_the_cluster_kernels_compile_without_a_stack_frame() -> None:
    from bob.kernels.cuda import cubin
    from bob.kernels.cuda.compile import compile_source

    image = cubin.Cubin(compile_source(cluster_source(), "sm_90").image)
    for mode in ("hard", "corpus"):
        kernel = image.kernel(f"bob_fused_train_cluster_{mode}")
        assert kernel.frame_bytes == 0
        assert kernel.max_threads == (512, 1, 1)

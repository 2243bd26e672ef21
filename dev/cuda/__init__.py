"""The CUDA kernels' tuning variants, in the manner of llm.c's ``dev/cuda``.

``bob_kernels.cu`` and its headers here are the knob source: Bob's kernels with every
tuning macro (``SMALL_THREADS``, ``TALL_*``, ``HELD_*``, ``STREAM_*``, ``SEED_*``, ...) still
in place, their defaults the shipped choices, so that the knob source with no macros
compiles to the shipped image byte for byte (tests/test_cuda_compile.py holds it there).
The shipped source (``src/bob/kernels/cuda``) has those choices written in. ``variants``
compiles the knob source with a variant's ``#define`` lines in front; the benches
(``bench_small``, ``bench_tall``, ``bench_stream``, ``bench_fused``) check each variant's
state against the shipped kernels' and time it. ``bob_cluster.cuh`` is the knob copy of the
shipped cluster kernels (rows held by a thread-block cluster), ``bench_cluster`` their check and
timing outside the plan.
"""

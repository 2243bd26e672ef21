"""Bob's kernels in CUDA C: NVRTC compilation (``compile``) and the compiled image (``cubin``).

The source, ``bob_kernels.cu``, ships in this package; nothing here needs a GPU.
"""

"""Bob's kernels in CUDA C: NVRTC compilation (``compile``), the ELF reader (``cubin``) and
the regions composed from a compiled image (``regions``).

The source, ``bob_kernels.cu``, ships in this package; nothing here needs a GPU.
"""

"""Bob's command stream on an NVIDIA GPU through the kernel driver alone.

No CUDA runtime and no libcuda: ioctl and mmap on /dev/nvidiactl and
/dev/nvidia0 (the RM interface of the open kernel module, 580 release).

- ``ioctl``: transport (device files, ioctl, mmap) and the one checker that
  turns every result into a typed error;
- ``structs``: the driver's parameter blocks as ctypes structures;
- ``device``: client, device, subdevice, class list, VA space, doorbell;
- ``memory``: allocations at chosen GPU addresses with CPU mappings;
- ``addresses``: where the runtime's own memory sits, one table below every plan;
- ``channel``: channel group, GPFIFO channel, compute object, submission;
- ``stream``: the runtime stream, a queue of copies, runs, clears and timestamps;
- ``snapshot``: Bob's copy kernels, a detached read's snapshot in video memory;
- ``backend``: ``NvBackend``, the ``nv`` backend.

The staged bring-up probe is tooling beside the product, in the repository's ``dev.bringup``.
"""

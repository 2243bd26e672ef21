"""Bob's command stream on an NVIDIA GPU through the kernel driver alone.

No CUDA runtime and no libcuda: ioctl and mmap on /dev/nvidiactl and
/dev/nvidia0 (the RM interface of the open kernel module, 580 release).

- ``ioctl``: transport (device files, ioctl, mmap) and the one checker that
  turns every result into a typed error;
- ``structs``: the driver's parameter blocks as ctypes structures;
- ``device``: client, device, subdevice, class list, VA space, doorbell;
- ``memory``: allocations at chosen GPU addresses with CPU mappings;
- ``channel``: channel group, GPFIFO channel, compute object, submission;
- ``backend``: ``NvBackend``, the ``nv`` backend.

The staged bring-up probe is tooling, in ``bob.bringup``.
"""

"""Bring-up tooling beside the product: the staged nv probe
(``PYTHONPATH=src python3 -m dev.bringup.probe``) and its stage 4, Bob's plan on the GPU
against the CPU (``plan_check``).

The product never imports this package; it imports the backends, the program and
the host, as any tool on top of them would.
"""

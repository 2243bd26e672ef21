"""Bob's tooling beside the product, in the source repository only (the wheel ships none):

- ``dev.bench``: ``bob bench``'s suite (Bob beside its peers) and the host, command and
  counting benches;
- ``dev.bringup``: the staged nv probe;
- ``dev.cuda``: the kernels' tuning variants, each compiled from the knob source here,
  checked against the shipped kernels and timed.

The repository root on ``sys.path`` makes this the package ``dev``: ``python -m`` from the
root, pytest (its ``pythonpath``), or ``bob bench``, which adds the checkout it runs from.
Not ``dev/`` itself: a package ``cuda`` there would hide NVIDIA's ``cuda.bindings``.
"""

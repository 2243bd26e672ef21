"""The GPU's one-launch check of each own region (tests/own_launch.py), run without a GPU:
every own image on the emulator and the reference on nv-sim, from the same inputs with
edges planted, give the same bytes. So the GPU test's plans and inputs are sound for every
region Bob has own code for, and a difference there is the GPU's."""

from __future__ import annotations

import numpy as np
import pytest

from bob.backends.nv.sim import NvSimBackend
from bob.kernels import own
from bob.kernels import signatures as sig
from bob.kernels.own_regions import OWN_REGIONS, own_regions
from bob.plan.model import PointerParam
from bob.plan.placement import SM90
from own_launch import first_difference, grid_of, inputs, one_launch_plan, run_alone
from own_support import run_region

VOCAB = 37


@pytest.mark.parametrize("name", [name for name in OWN_REGIONS if own.covers(name, VOCAB)])
def test_each_own_region_alone_gives_the_reference_s_bytes_on_the_emulator(name: str) -> None:
    region = own_regions(SM90)[name]
    arrays = inputs(name, VOCAB)
    plan = one_launch_plan(region, VOCAB)
    want = run_alone(NvSimBackend(plan), arrays)
    args: dict = {key: value.copy() for key, value in arrays.items()}
    for param, value in zip(sig.SIGNATURES[name], plan.launches[0].args, strict=True):
        if not isinstance(param, PointerParam):
            args[param.name] = (np.uint32(value.bits).view(np.float32) if param.dtype == "f32"
                                else value.bits)
    got = run_region(own.image(name, SM90.name), name, grid_of(name, VOCAB), args)
    differences = [d for d in (first_difference(tensor, want[tensor], got[tensor].tobytes())
                               for tensor in want) if d]
    assert not differences, "; ".join(differences)

"""The plan layer: a device program as data, its placement and its certificate.

Nothing in this package knows what the kernels compute.
"""

from bob.plan.certificate import (
    HAZARD_KINDS,
    Certificate,
    CertificateError,
    CertifiedPlan,
    Hazard,
    certify,
    require_certified,
)
from bob.plan.model import Plan, ProgramSpec, Target
from bob.plan.placement import SM86, SM90, TARGETS, place

__all__ = [
    "HAZARD_KINDS", "SM86", "SM90", "TARGETS", "Certificate", "CertificateError", "CertifiedPlan",
    "Hazard",
    "Plan", "ProgramSpec", "Target", "certify", "place", "require_certified",
]

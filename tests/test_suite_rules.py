"""The suite's own rules (tests/conftest.py), run by pytest on a small suite of their own: a test
of the fast tier over its CPU budget fails, one marked slow may use more, and a second run hands
the tests out longest first."""

from __future__ import annotations

import shutil

import pytest

from helpers import REPO

pytest_plugins = ["pytester"]
pytestmark = pytest.mark.slow  # each runs pytest in fresh interpreters

SUITE = """
import time

import pytest


def burn(seconds):
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def test_a_quick_one():
    pass


def test_a_busy_one():
    burn(0.3)


@pytest.mark.slow
def test_a_busy_one_marked_slow():
    burn(0.3)


def test_a_busy_child():
    import subprocess, sys
    subprocess.run([sys.executable, "-c", "import time\\nend = time.process_time() + 0.3\\n"
                    "while time.process_time() < end: pass"], check=True)
"""


@pytest.fixture
def suite(pytester, monkeypatch):
    pytester.makeconftest((REPO / "tests" / "conftest.py").read_text())
    shutil.copytree(REPO / "tests" / "helpers", pytester.path / "helpers")  # what conftest imports
    pytester.makepyfile(test_suite=SUITE)
    monkeypatch.setenv("MMM_ORCH_TEST_CPU_BUDGET", "0.2")
    return pytester


def test_a_fast_test_over_its_cpu_budget_fails_and_a_slow_one_may_use_more(suite):
    result = suite.runpytest_subprocess("-p", "no:xdist", "-p", "no:randomly")
    result.assert_outcomes(passed=4, errors=2)  # the errors: the two busy ones, at teardown
    result.stdout.fnmatch_lines(["*test_a_busy_one used 0.* CPU-seconds, over the budget of 0.2*",
                                 "*test_a_busy_child used 0.* CPU-seconds, over the budget of 0.2*",
                                 "slow: 1 tests,*"])


def test_the_next_run_starts_the_longest_tests_first(suite):
    suite.runpytest_subprocess("-p", "no:xdist")
    second = suite.runpytest_subprocess("-p", "no:xdist", "--collect-only", "-q")
    order = [line.split("::")[1] for line in second.outlines if "::" in line]
    assert order[-1] == "test_a_quick_one" and set(order[:3]) == {
        "test_a_busy_one", "test_a_busy_one_marked_slow", "test_a_busy_child"}, order

"""The suite's own scheduling: the tests that share a module's runs go to one pytest-xdist worker."""

import subprocess
import sys

GROUPED = """
import pytest

@pytest.mark.xdist_group("shared")
@pytest.mark.parametrize("case", range(4))
def test_case(case):
    pass
"""


def test_pytest_xdist_sends_a_group_of_tests_to_one_worker(tmp_path):
    (tmp_path / "test_grouped.py").write_text(GROUPED)
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-o", "addopts=", "-v"]
    done = subprocess.run(
        [*command, "-n", "2", "--dist", "loadgroup", str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout[-2000:]
    passed = [line for line in done.stdout.splitlines() if " PASSED " in line]
    workers = {line.split()[0] for line in passed}  # "[gw0]"
    assert len(passed) == 4 and len(workers) == 1, "\n".join(passed)

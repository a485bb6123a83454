"""The end-of-run summary groups skipped tests by reason, with counts (conftest.pytest_terminal_summary)."""

import inspect
import sys

pytest_plugins = ["pytester"]


def test_skips_are_grouped_by_reason(pytester):
    hook = sys.modules["conftest"].pytest_terminal_summary
    pytester.makeconftest(inspect.getsource(hook))
    pytester.makepyfile("""
        import pytest

        @pytest.mark.parametrize("i", range(3))
        def test_gpu(i):
            pytest.skip("CuPy is not installed")

        @pytest.mark.skipif(True, reason="PyTorch is not installed")
        def test_torch():
            pass

        def test_runs():
            pass
    """)
    result = pytester.runpytest("-q", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, skipped=4)
    result.stdout.fnmatch_lines(["*4 skipped, by reason*", "    3  CuPy is not installed",
                                 "    1  PyTorch is not installed"])

# run_tests.py - what meson test runs: pytest on one test file, or exit 77
# (meson's "skipped") when what the tests need is not installed.
import os
import sys


def main():
    skip = os.environ.get("WEFT_PYTHON_TESTS_SKIP")
    if skip:
        print("skipped: " + skip)
        return 77
    try:
        import cffi  # noqa: F401
        import numpy  # noqa: F401
        import pytest
    except ImportError as e:
        print("skipped: %s (install python3-numpy python3-cffi python3-pytest)" % e)
        return 77
    # no cache folder in the source tree; -rs lists why anything was skipped
    return pytest.main(["-q", "-rs", "-p", "no:cacheprovider"] + sys.argv[1:])


# guarded: ranks started with multiprocessing's spawn import this module again
if __name__ == "__main__":
    sys.exit(main())

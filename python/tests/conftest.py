# conftest.py - lets the tests run from a checkout without PYTHONPATH (meson
# test sets PYTHONPATH and WEFT_LIBRARY itself).
import os
import sys

_here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, _here)
try:
    import weft  # noqa: F401
except ImportError:
    sys.path.insert(0, os.path.dirname(_here))

"""python -m weft run|bench|info: weft's tools from the Python package."""
import sys

from ._tools import main

sys.exit(main())

"""`python -m engine.what_if`: the command's entry point; its code lives in `engine/tools/what_if.py`."""

import sys

from engine.tools.what_if import main

if __name__ == "__main__":
    sys.exit(main())

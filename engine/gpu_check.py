"""`python -m engine.gpu_check`: the command's entry point; its code lives in `engine/tools/gpu_check.py`."""

import sys

from engine.tools.gpu_check import main

if __name__ == "__main__":
    sys.exit(main())

"""`python -m engine.bench`: the command's entry point; its code lives in `engine/tools/bench.py`."""

import sys

from engine.tools.bench import main

if __name__ == "__main__":
    sys.exit(main())

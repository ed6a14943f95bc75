"""`python -m engine.precision_table`: the command's entry point; its code is `engine/tools/precision_table.py`."""

import sys

from engine.tools.precision_table import main

if __name__ == "__main__":
    sys.exit(main())

"""`python -m engine.first_reply`: the command's entry point; its code lives in `engine/tools/first_reply.py`."""

import sys

from engine.tools.first_reply import main

if __name__ == "__main__":
    sys.exit(main())

"""`python -m tests.soak`: the full soak of a public-mode playground (the harness is `tests/soak/harness.py`)."""

import sys

from tests.soak.harness import main

sys.exit(main())

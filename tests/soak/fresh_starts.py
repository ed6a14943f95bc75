"""`python -m tests.soak.fresh_starts`: start the app afresh N times and send each an Apply the moment it answers.

Why: the first Apply after a start raced the default engine's warm-up load (both importing transformers on their own
threads) and failed in 1 of 3 starts with "cannot import name 'AutoConfig' from 'transformers'". Every start here must
load without error; `tests/architecture/test_startup_imports.py` is the deterministic check of the same fix.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
import urllib.request

from tests.support.paths import PROJECT_ROOT
from tests.support.ui_helpers import api_client, free_port

START_TIMEOUT_S = 180


def apply_at_once(quantization: str) -> str:
    """Start `python app.py`, wait until it answers, send /apply at once; the status line, or the error."""
    from engine import EngineConfig, list_models
    from playground.engine_panel.form import FORM_FIELDS, config_to_form

    port = free_port()
    env = {**os.environ, "GRADIO_SERVER_NAME": "127.0.0.1", "GRADIO_SERVER_PORT": str(port),
           "GRADIO_ANALYTICS_ENABLED": "False"}
    app = subprocess.Popen([sys.executable, "app.py"], cwd=PROJECT_ROOT, env=env, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=5).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    return "the app did not answer"
                time.sleep(0.05)
        values = {**config_to_form(EngineConfig(model="demo").to_dict(), list(list_models())),
                  "quantization": quantization}
        try:
            return api_client(f"http://127.0.0.1:{port}/").predict(*[values[n] for n in FORM_FIELDS],
                                                                   api_name="/apply")[0]
        except Exception as error:  # what the Apply answered is the finding
            return f"failed: {error}"
    finally:
        app.terminate()
        app.wait(timeout=60)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--starts", type=int, default=10)
    parser.add_argument("--quantization", default="int8")
    args = parser.parse_args(argv)
    failed = 0
    for number in range(1, args.starts + 1):
        status = apply_at_once(args.quantization)
        failed += not status.startswith("loaded")
        print(f"start {number}: {status}", flush=True)
    print(f"{args.starts - failed} of {args.starts} starts loaded without error")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

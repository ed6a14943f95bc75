"""What a request needs is imported at start-up, once, on the main thread: no request imports a module.

Why: transformers' lazy module is not safe to import from two threads at once. With the default engine's warm-up
load still importing transformers, an Apply sent the moment a fresh app answered failed ("cannot import name
'AutoConfig' from 'transformers'"). The app imports every module a load or a request can need before it serves
(`engine.import_serving_modules`); this starts it in a fresh interpreter with an import hook that notes the thread of
every first import, sends an Apply with int8 weights (a quantization library the default engine does not use), a
chat and an OpenAI call, and finds no module first imported on any thread but the main one while it served.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from engine import EngineConfig, list_models
from playground.engine_panel.form import FORM_FIELDS, config_to_form
from tests.support.paths import PROJECT_ROOT
from tests.support.ui_helpers import api_client, free_port

pytestmark = pytest.mark.slow

SERVER = """
import json, sys, threading
first_imports = []

class FirstImports:  # a finder that finds nothing: it only sees each module the first time it is imported
    def find_spec(self, name, path=None, target=None):
        first_imports.append((name, threading.current_thread().name))

from engine import list_models
from playground.app import create_playground, launch, warm_up
from playground.shared.settings import Settings

context = create_playground(Settings.from_env(list(list_models()), env={"PLAYGROUND_PUBLIC": "1"}))
sys.meta_path.insert(0, FirstImports())  # from here on, anything imported off the main thread is a failure
warm_up(context).join()
startup = len(first_imports)
launch(context, server_name="127.0.0.1", server_port=int(sys.argv[1]), prevent_thread_lock=True, quiet=True)
serving = len(first_imports)
print("READY", flush=True)
sys.stdin.readline()
loaded = set(sys.modules)
print(json.dumps({"warm-up": [i for i in first_imports[:startup] if i[0] in loaded],
                  "serving": [i for i in first_imports[serving:] if i[0] in loaded]}), flush=True)
"""


def test_no_request_imports_a_module():
    port = free_port()
    server = subprocess.Popen([sys.executable, "-c", SERVER, str(port)], cwd=PROJECT_ROOT, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "GRADIO_ANALYTICS_ENABLED": "False"})
    try:
        assert server.stdout.readline().strip() == "READY"
        client = api_client(f"http://127.0.0.1:{port}/")
        values = {**config_to_form(EngineConfig(model="demo").to_dict(), list(list_models())), "quantization": "int8"}
        status, config, _ = client.predict(*[values[name] for name in FORM_FIELDS], api_name="/apply")
        assert config["quantization"] == "int8", status
        text, figures = client.predict("What is os.path?", api_name="/chat")
        assert figures["finish_reason"] in ("stop", "length")
        import openai

        reply = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused").chat.completions.create(
            model="demo", messages=[{"role": "user", "content": "hi"}], max_tokens=3)
        assert reply.choices[0].finish_reason in ("stop", "length")
        client.close()
        server.stdin.write("\n")
        server.stdin.flush()
        imports = json.loads(server.stdout.readline())
    finally:
        server.kill()
        server.wait()
    off_main = {phase: [(name, thread) for name, thread in found if thread != "MainThread"]
                for phase, found in imports.items()}
    assert off_main == {"warm-up": [], "serving": []}, off_main

"""No input gets a 5xx: every field of `/v1/chat/completions`, `/v1/completions` and of every named Gradio endpoint,
given hostile values one at a time (NaN, infinities, integers beyond any float, lone surrogates, wrong types, nesting),
is either served or refused with a clear error; the OpenAI routes' refusals name the field (`param`).

The Gradio calls speak Gradio's queue protocol over raw HTTP, as any client may, so values no well-behaved client
sends (NaN) reach the server too; an unexpected exception there reaches a client only as Gradio's generic "has raised
an exception" (no message), which counts as the server's failure. The named endpoints take raw values
(`preprocess=False`) and parse them themselves; only a file argument is Gradio's own to check.
"""

from __future__ import annotations

import http.client
import json
import math
import uuid

import gradio as gr
import pytest

from engine import EngineConfig, list_models
from playground.api.fields import POLICY
from playground.engine_panel.form import FORM_FIELDS, config_to_form
from tests.soak.harness import start_public_app
from tests.support.ui_helpers import api_client

pytestmark = pytest.mark.slow

HOSTILE = [None, True, -1, 1.5, 10**400, -(10**400), math.nan, math.inf, "x" * 400, "\udc00", "1e400", [], [[[1]]],
           {"a": 1}]
ASK = [{"role": "user", "content": "hi"}]
BASES = {"/v1/chat/completions": ("chat", {"model": "demo", "messages": ASK, "max_tokens": 2}),
         "/v1/completions": ("text", {"model": "demo", "prompt": "def add(a, b):", "max_tokens": 2})}


@pytest.fixture(scope="module")
def served():
    app, demo, url = start_public_app()
    yield app, demo, url
    demo.close()
    app.pool.close()


def post(url: str, path: str, body: bytes) -> tuple[int, bytes]:
    host, port = url.split("//")[1].rstrip("/").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=300)
    try:
        connection.request("POST", path, body=body, headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


@pytest.mark.parametrize("route", sorted(BASES))
def test_no_openai_field_gets_a_server_error(served, route):
    _, _, url = served
    kind, base = BASES[route]
    failures = []
    for field in sorted({f.name for f in POLICY if kind in f.routes}):
        for value in HOSTILE:
            status, raw = post(url, route, json.dumps({**base, field: value}).encode())
            if status == 200:
                continue
            error = json.loads(raw).get("error", {}) if raw.startswith(b"{") else {}
            if status >= 500 or not error.get("message") or (status == 400 and error.get("param") != field):
                failures.append(f"{field}={value!r:.30}: HTTP {status} {raw[:200]!r}")
    for body in (b"[" * 5000 + b"]" * 5000, b'{"model": "demo", "messages": ' + b"[" * 1000 + b"]" * 1000 + b"}",
                 json.dumps({**base, "max_tokens": 10**400}).encode(), b"\xff\xfe", b"null", b"1e400"):
        status, raw = post(url, route, body)
        if not 400 <= status < 500 or b"message" not in raw:
            failures.append(f"body {body[:40]!r}: HTTP {status} {raw[:200]!r}")
    assert not failures, "\n".join(failures[:40])


def gradio_call(url: str, fn_index: int, data: list) -> tuple[bool, str | None]:
    """One event through Gradio's queue, as raw HTTP: (success, error message)."""
    session = uuid.uuid4().hex
    body = json.dumps({"data": data, "fn_index": fn_index, "session_hash": session, "event_data": None,
                       "trigger_id": None}).encode()
    status, raw = post(url, "/gradio_api/queue/join", body)
    if status != 200:
        return False, f"HTTP {status} {raw[:200]!r}"
    host, port = url.split("//")[1].rstrip("/").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=300)
    try:
        connection.request("GET", f"/gradio_api/queue/data?session_hash={session}")
        for line in connection.getresponse():
            if line.startswith(b"data: "):
                message = json.loads(line[len(b"data: "):])
                if message.get("msg") == "process_completed":
                    return message.get("success", False), (message.get("output") or {}).get("error")
    finally:
        connection.close()
    return False, "the event never completed"


def gradio_bases(app) -> dict[str, list]:
    """Valid arguments of every named endpoint (cheap ones: one token, one request), states as None."""
    form = config_to_form(EngineConfig(model=app.default_config.model).to_dict(), list(list_models()))
    return {
        "apply": [form[name] for name in FORM_FIELDS] + [None, None],
        "apply_preset": ["no-prefix-cache", None],
        "chat": ["What is os.path?", "", 2, 0.0, 1.0, 0, "", [], None],
        "clear": [None], "export": [None], "cancel_benchmark": [None],
        "compare": ["engine panel", "", "engine panel", "", "What is os.path?", 1, 0.0, 1.0, 0, 0, 1, False, False,
                    "off", "", "B", "", None],
        "benchmark": ["random", None, 1, 1, 0, "4", "1", 0, True, 0, 0, 0, "", None],
        "roofline": [False, None],
    }


def test_no_gradio_endpoint_raises_on_any_value(served):
    app, demo, url = served
    endpoints = {fn.api_name: fn for fn in demo.fns.values() if fn.api_name and fn.api_visibility != "private"}
    bases = gradio_bases(app)
    assert set(endpoints) == set(bases), "a named endpoint without a fuzzed base (or a base without an endpoint)"
    failures = []
    for name, base in sorted(bases.items()):
        fn = endpoints[name]
        assert len(base) == len(fn.inputs), name
        # A file argument is a record Gradio itself validates (and moves into its upload cache) before any handler
        # runs; what it refuses there gets its generic error, so only the other arguments are ours to check.
        ours = [index for index, block in enumerate(fn.inputs) if not block.stateful and not isinstance(block, gr.File)]
        for index in ours:
            for value in HOSTILE:
                data = [*base[:index], value, *base[index + 1:]]
                success, error = gradio_call(url, fn._id, data)
                if not success and (not error or "has raised an exception" in error):
                    failures.append(f"/{name} argument {index} = {value!r:.30}: {error!r:.200}")
    assert not failures, "\n".join(failures[:40])


def test_the_apply_endpoint_takes_the_choices_its_description_lists(served):
    """`view_api()` lists block_size and tensor_parallel_size as string choices ('16', '1'); Gradio's own choice
    check refused them, as the integers they name. Both are taken now."""
    app, _, url = served
    client = api_client(url)
    described = {p["label"]: p["python_type"]["type"]
                 for p in client.view_api(return_format="dict", print_info=False)["named_endpoints"]["/apply"][
                     "parameters"]}
    assert "'16'" in described["block_size"] and "'1'" in described["tensor_parallel_size"]
    form = gradio_bases(app)["apply"][:len(FORM_FIELDS)]
    for block_size, ranks in (("16", "1"), (16, 1)):
        values = dict(zip(FORM_FIELDS, form, strict=True)) | {"block_size": block_size, "tensor_parallel_size": ranks}
        status, config, _ = client.predict(*[values[name] for name in FORM_FIELDS], api_name="/apply")
        assert (config["block_size"], config["tensor_parallel_size"]) == (16, 1), status
    client.close()

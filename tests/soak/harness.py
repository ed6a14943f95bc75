"""Soak: many clients at once against the running playground, with hang-ups, poison and a configuration change.

Why: a public Space is used by many people at once, by odd input and by people probing it, and one
caller must never cost another anything (issues 11 and 39). This drives the app only through its
public APIs, as its users do: the OpenAI-compatible routes over raw HTTP (so that a client can hang
up in the middle of a stream, and a body can carry what no well-behaved client sends, such as NaN)
and `gradio_client` for the page's own `/apply_preset` and `/chat`; each client is its own loopback
address. Half-way through a round, the traffic moves to another engine configuration while the
first one is still streaming, with more configurations in use than the pool may keep (public mode
keeps two), so engines load and are evicted under load.

Three rounds of the same shape: a warm-up, a calm round, and a round during which an attacker tries
everything in `attacks.py` at once (huge conversations and bodies, an abandoned slow benchmark
holding the measurement slot, non-streaming hang-ups, typed special tokens). Afterwards it checks,
from inside the server's process: every well-formed request finished with a correct reason and
token count, every poisoned one got exactly one clear 4xx error naming its field (no traceback, no
server path), no request got a 5xx, every attack got its answer, the visitors' p99 latency during
the attack stayed within ATTACKED_P99_RATIO of the calm round's, every engine is idle with all its
KV blocks free, the measurement slot is free, no request thread, engine thread or worker process is
left over, and RSS grew by no more than the engines the pool loaded meanwhile (plus a bound).

`python -m tests.soak` runs the full load (200 requests from 16 clients) and prints the report;
`tests/soak/test_soak.py` runs a short one in `make test`.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import http.client
import json
import random
import re
import socket
import sys
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psutil

from engine.testing import EngineProbe
from tests.soak.attacks import Attacks, run_attacks
from tests.soak.outcome import NO_FIELD, Outcome, refusal_problem
from tests.support.paths import PROJECT_ROOT

MIB = 2**20
ROOT = PROJECT_ROOT
# Half-way through a round the traffic and the Gradio sessions move from one preset to the next (None: the
# default configuration): the warm-up round, the calm round and the attacked round each make one move.
SWITCHES = ((None, "no-prefix-cache"), ("no-prefix-cache", "prefix-cache"), ("prefix-cache", "no-prefix-cache"))
ATTACKED_P99_RATIO = 3.0        # the visitors' p99 latency under attack, at most this times the calm round's
EVERY_ATTACK = Attacks()
ATTACKER_ADDRESS = "127.0.1.1"  # the visitors are 127.0.0.10, .11, ...
ALSO_USED = "static"            # another configuration in use throughout (the pool keeps two in public mode)
RSS_SLACK_MIB = 256             # RSS beside the KV pools may grow by the engines loaded meanwhile plus this
# A client that hangs up must cost little more than what it read: the tokens generated for hang-ups may be at most
# this share of what they asked for (each reads 1-12 text events of max_new_tokens, or waits 0.3 s for a
# non-streaming reply, then the server cancels).
HANG_UP_SHARE = 0.25
ANYIO_THREADS = 40              # AnyIO's default worker-thread limit: that pool grows and shrinks within it
QUESTIONS = ["What does the json module do?", "How do I sort a list?", "What is os.path?",
             "Explain the KV cache.", "How do I read a file line by line?"]
# Unusual but valid text: every one of these must be served like any other prompt.
ODD_TEXT = ["🦄 what does json do? 🐍🐍", "ما هو os.path؟", "e\u0301te\u0301 combining marks",
            "zero\u200bwidth\u200djoiner", "日本語のテキスト", "\u202eright-to-left override",
            "tab\tand\r\nnewlines", "x" * 500]


# ----- the plan ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Job:
    """One request of the soak: what to send, and what a correct answer looks like."""

    index: int
    kind: str              # chat | chat-stream | completion | hang-up | gradio-chat | poison
    route: str = ""
    body: bytes = b""
    max_tokens: int = 0
    exact_length: bool = False   # ignore_eos without stop strings: exactly max_tokens tokens, finish "length"
    stop: tuple[str, ...] = ()
    prompts: int = 1
    expect: str = ""       # poison: a word the one error message must contain
    field: str = NO_FIELD  # poison: the field the error names (its `param`)
    hang_up_after: int = 0


def _body(payload: dict) -> bytes:
    return json.dumps(payload).encode()


def poison_jobs(settings, model: str) -> list[tuple[str, bytes, str, str]]:
    """(route, body, word the error must contain, the field it must name) for requests that must each get one clear
    4xx error."""
    chat, text = "/v1/chat/completions", "/v1/completions"
    ask = [{"role": "user", "content": "hi"}]

    def raw(payload: dict, field_name: str, literal: str) -> bytes:  # a JSON number no encoder writes
        return _body({**payload, field_name: 0.25}).replace(b"0.25", literal.encode())

    base = {"model": model, "messages": ask, "max_tokens": 4}
    return [
        (chat, raw(base, "temperature", "NaN"), "temperature", "temperature"),
        (chat, raw(base, "temperature", "Infinity"), "temperature", "temperature"),
        (chat, raw(base, "top_p", "NaN"), "top_p", "top_p"),
        (chat, _body({**base, "temperature": 1e308}), "temperature", "temperature"),
        (chat, _body({**base, "temperature": -0.5}), "temperature", "temperature"),
        (chat, _body({**base, "top_p": -1}), "top_p", "top_p"),
        (chat, _body({**base, "top_k": -5}), "top_k", "top_k"),
        (chat, _body({**base, "top_k": 10**400}), "top_k", "top_k"),
        (chat, _body({**base, "max_tokens": -1}), "max_tokens", "max_tokens"),
        (chat, _body({**base, "max_tokens": 10**12}), "max_tokens", "max_tokens"),
        (chat, _body({**base, "seed": 2**70}), "seed", "seed"),
        (chat, _body({**base, "stop": [f"s{i}" for i in range(50)]}), "stop", "stop"),
        (chat, _body({**base, "stop": "\udc00"}), "stop", "stop"),
        (chat, _body({**base, "frequency_penalty": 0.5}), "not supported", "frequency_penalty"),
        (chat, _body({**base, "repetition_penalty": 1.3}), "not supported", "repetition_penalty"),
        (chat, _body({**base, "min_tokens": 8}), "not supported", "min_tokens"),
        (chat, _body({**base, "best_of_luck": 1}), "unknown field", "best_of_luck"),
        (chat, _body({**base, "stream": "yes"}), "stream", "stream"),
        (chat, _body({**base, "messages": [{"role": "user", "content": "x" * (settings.max_message_chars + 1)}]}),
         "characters", "messages"),
        (chat, _body({**base, "messages": [{"role": "user", "content": "bad \ud800 half"}]}), "surrogate",
         "messages"),
        (chat, _body({**base, "messages": [{"role": "wizard", "content": "hi"}]}), "role", "messages"),
        (chat, _body({**base, "messages": [{"role": "user", "content": 5}]}), "content", "messages"),
        (chat, _body({**base, "model": "no-such-model"}), "not allowed", "model"),
        (chat, _body({**base, "model": f"{model}@no-such-preset"}), "preset", "model"),
        (chat, _body({**base, "model": "../../../etc/passwd"}), "not allowed", "model"),
        (chat, _body({**base, "model": 42}), "model", "model"),
        (chat, b"{not json", "JSON", NO_FIELD),
        (chat, b"[]", "JSON object", NO_FIELD),
        (chat, b'{"model": "demo", "messages": ' + b"[" * 1000 + b"]" * 1000 + b"}", "JSON", NO_FIELD),
        (text, _body({"model": model, "prompt": [5] * (settings.max_prompt_tokens + 1), "max_tokens": 4}), "tokens",
         "prompt"),
        (text, _body({"model": model, "prompt": [5] * 1000, "max_tokens": 100}), "context length", "prompt"),
        (text, _body({"model": model, "prompt": [-1, 10**9], "max_tokens": 4}), "token ids", "prompt"),
        (text, _body({"model": model, "prompt": "hi", "max_tokens": 4, "echo": True}), "not supported", "echo"),
    ]


def model_id(model: str, preset: str | None) -> str:
    return f"{model}@{preset}" if preset else model


def plan_jobs(count: int, settings, model: str, max_tokens: int, rng: random.Random,
              switch: tuple[str | None, str | None] = (None, None)) -> list[Job]:
    """`count` jobs in a seeded order: about a third hang up mid-stream, a few are poison, the rest well-formed;
    the main configuration is preset `switch[0]` for the first half, `switch[1]` for the second. The poison
    catalogue is shuffled, and each of its entries is used once before any repeats."""
    poisons = poison_jobs(settings, model)
    rng.shuffle(poisons)
    poison_every = max(4, count // len(poisons)) if count >= 3 * len(poisons) else 6
    jobs = []
    for index in range(count):
        main = model_id(model, switch[0] if index < count // 2 else switch[1])
        target = model_id(model, ALSO_USED) if rng.random() < 0.1 else main
        roll = rng.random()
        if index % poison_every == poison_every - 1:
            route, body, expect, field = poisons[(index // poison_every) % len(poisons)]
            jobs.append(Job(index, "poison", route, body, expect=expect, field=field))
        elif roll < 0.33:
            jobs.append(Job(index, "hang-up", "/v1/completions", _body({
                "model": target, "prompt": rng.choice(QUESTIONS + ODD_TEXT), "max_tokens": settings.max_new_tokens,
                "ignore_eos": True, "stream": True, "temperature": 0.8}), max_tokens=settings.max_new_tokens,
                hang_up_after=rng.randint(1, 12)))
        elif roll < 0.42:
            jobs.append(Job(index, "gradio-chat", max_tokens=rng.randint(1, max_tokens)))
        else:
            jobs.append(well_formed(index, target, max_tokens, rng))
    return jobs


def well_formed(index: int, model: str, max_tokens: int, rng: random.Random) -> Job:
    tokens = rng.randint(1, max_tokens)
    ignore_eos = rng.random() < 0.5
    stop = tuple(rng.sample([".", "\n", "the", "`"], rng.randint(1, 2))) if rng.random() < 0.25 else ()
    sampling = {"max_tokens": tokens, "ignore_eos": ignore_eos, "stop": list(stop) or None,
                "temperature": rng.choice([0.0, 0.0, 0.7, 1.3]), "top_p": rng.choice([1.0, 0.9]),
                "top_k": rng.choice([0, 0, 20]), "seed": rng.choice([None, rng.randrange(2**63)])}
    text = rng.choice(QUESTIONS + ODD_TEXT)
    kind = rng.choice(["chat", "chat-stream", "completion"])
    if kind == "completion":
        prompts = rng.randint(1, 3)
        prompt = text if prompts == 1 else [rng.choice(QUESTIONS + ODD_TEXT) for _ in range(prompts)]
        body = {"model": model, "prompt": prompt, **sampling}
        route = "/v1/completions"
    else:
        prompts = 1
        body = {"model": model, "messages": [{"role": "user", "content": text}], **sampling,
                "stream": kind == "chat-stream", "stream_options": {"include_usage": True}}
        route = "/v1/chat/completions"
    return Job(index, kind, route, _body(body), max_tokens=tokens, exact_length=ignore_eos and not stop, stop=stop,
               prompts=prompts)


# ----- running one job -----------------------------------------------------------------------------


def _finished_right(job: Job, finish: str, output_tokens: int, text: str) -> str | None:
    """Why a reply's finish reason and length are wrong for what was asked, or None."""
    if finish not in ("stop", "length"):
        return f"finish reason {finish!r}"
    if output_tokens > job.max_tokens:
        return f"{output_tokens} tokens for max_tokens={job.max_tokens}"
    if finish == "length" and output_tokens != job.max_tokens:
        return f"finish 'length' after {output_tokens} of {job.max_tokens} tokens"
    if job.exact_length and (finish, output_tokens) != ("length", job.max_tokens):
        return f"ignore_eos reply ended {finish!r} after {output_tokens} of {job.max_tokens} tokens"
    if any(stop in text for stop in job.stop):
        return "a stop string is in the reply"
    return None


def _post(base: tuple[str, int], job: Job, timeout: float, source: str):
    connection = http.client.HTTPConnection(*base, timeout=timeout, source_address=(source, 0))
    connection.request("POST", job.route, body=job.body, headers={"Content-Type": "application/json"})
    return connection, connection.getresponse()


def _events(response):
    """The JSON payloads of a server-sent event stream, then None for `[DONE]`."""
    for line in response:
        line = line.strip()
        if line.startswith(b"data: "):
            data = line[len(b"data: "):]
            yield None if data == b"[DONE]" else json.loads(data)


def run_http(base: tuple[str, int], job: Job, timeout: float, source: str) -> Outcome:
    """Send `job` from the loopback address `source` (its client) and judge what comes back."""
    outcome = Outcome(job.index, job.kind, asked_tokens=job.max_tokens if job.kind == "hang-up" else 0)
    connection, response = _post(base, job, timeout, source)
    outcome.status = response.status
    try:
        if job.kind == "poison":
            _judge_poison(job, response, outcome)
        elif response.status != 200:
            outcome.problem = f"HTTP {response.status}: {response.read()[:300]!r}"
        elif job.kind == "hang-up":
            _hang_up(job, connection, response, outcome)
        elif job.kind == "chat-stream":
            _judge_stream(job, response, outcome)
        else:
            _judge_whole(job, json.loads(response.read()), outcome)
    finally:
        connection.close()
    return outcome


def _judge_poison(job: Job, response, outcome: Outcome) -> None:
    outcome.error, outcome.problem = refusal_problem(response.status, response.read(), job.expect, job.field)


def _hang_up(job: Job, connection, response, outcome: Outcome) -> None:
    """Read a few text events, then drop the connection as a closed browser tab would."""
    texts = 0
    for event in _events(response):
        if event is None or "error" in event:
            outcome.problem = f"stream ended before the hang-up: {event}"
            return
        if event["choices"] and event["choices"][0].get("text"):
            texts += 1
            if texts >= job.hang_up_after:
                break
    outcome.finish = "hung up"
    connection.sock.shutdown(socket.SHUT_RDWR)


def _judge_stream(job: Job, response, outcome: Outcome) -> None:
    text, finish, usage, done = "", None, None, False
    for event in _events(response):
        if event is None:
            done = True
        elif "error" in event:
            outcome.problem = f"error event: {event['error']}"
            return
        elif event.get("usage"):
            usage = event
        elif event["choices"]:
            choice = event["choices"][0]
            text += choice["delta"].get("content") or ""
            finish = choice["finish_reason"] or finish
    if not done or usage is None:
        outcome.problem = "the stream ended without usage and [DONE]"
        return
    outcome.finish, outcome.output_tokens = finish, usage["usage"]["completion_tokens"]
    outcome.problem = _finished_right(job, finish, outcome.output_tokens, text)


def _judge_whole(job: Job, reply: dict, outcome: Outcome) -> None:
    choices = reply["choices"]
    if len(choices) != job.prompts or len(reply["metrics"]) != job.prompts:
        outcome.problem = f"{len(choices)} choices for {job.prompts} prompts"
        return
    for choice, figures in zip(choices, reply["metrics"], strict=True):
        text = choice["message"]["content"] if "message" in choice else choice["text"]
        outcome.finish = choice["finish_reason"]
        outcome.problem = _finished_right(job, outcome.finish, figures["output_tokens"], text)
        if outcome.problem:
            return
    outcome.output_tokens = reply["usage"]["completion_tokens"]
    if outcome.output_tokens != sum(f["output_tokens"] for f in reply["metrics"]):
        outcome.problem = "usage disagrees with the per-choice figures"


def run_gradio(client, job: Job) -> Outcome:
    outcome = Outcome(job.index, job.kind, status=200)
    text, figures = client.predict(QUESTIONS[job.index % len(QUESTIONS)], "", job.max_tokens, 0.0, 1.0, 0, "", [],
                                   api_name="/chat")
    outcome.finish, outcome.output_tokens = figures.get("finish_reason") or "", figures.get("output_tokens") or 0
    outcome.problem = figures.get("error") or _finished_right(job, outcome.finish, outcome.output_tokens, "")
    return outcome


# ----- the soak --------------------------------------------------------------------------------------


@dataclass
class Snapshot:
    """The server process at one moment: memory, threads, child processes and its engines."""

    rss_mib: float
    kv_resident_mib: float
    engine_mib: float
    threads: dict[str, int]
    children: int
    engines: list[dict] = field(default_factory=list)
    measurement_slot_free: bool = True

    @classmethod
    def take(cls, app, ignore: set[threading.Thread]) -> Snapshot:
        """`ignore`: the clients' own threads, which share this process with the server.

        Memory is read after glibc has returned its free pages (`malloc_trim`): requests served from many
        threads leave each thread's malloc arena fragmented, which is not memory anything holds.
        """
        gc.collect()
        _release_free_pages()
        names = Counter(_thread_kind(t.name) for t in threading.enumerate() if t not in ignore)
        engines = []
        for entry in app.pool.entries():
            stats = entry.engine.stats()
            engines.append({key: getattr(stats, key) for key in ("kv_blocks_free", "kv_blocks_total", "num_running",
                                                                 "num_waiting")} | {"config": entry.key})
        children = [c for c in psutil.Process().children(recursive=True) if not _is_resource_tracker(c)]
        probe = app.measurements.take(object())  # holds the slot at once when no measurement holds or waits for it
        slot_free = probe.holding
        app.measurements.release(probe)
        return cls(psutil.Process().memory_info().rss / MIB, _kv_resident_bytes(app) / MIB,
                   app.pool.total_bytes() / MIB, dict(names), len(children), engines, slot_free)

    @property
    def rss_beside_kv_mib(self) -> float:
        return self.rss_mib - self.kv_resident_mib


def _release_free_pages() -> None:
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: RSS then includes the allocator's free pages
        pass


def _kv_resident_bytes(app) -> int:
    """Resident bytes of the pooled engines' KV pools (from /proc/self/smaps).

    The pools are not zero-filled, so their pages become resident as blocks are first written: that part
    of RSS grows under load up to the pools' allocated size, legitimately. Everything else must not grow.
    """
    pools = []
    for entry in app.pool.entries():
        storage = EngineProbe(entry.engine).kv_storage()
        pools.append((storage.data_ptr(), storage.data_ptr() + storage.nbytes))
    resident, inside = 0, False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            head = line.split(maxsplit=1)[0]
            if "-" in head and not head.endswith(":"):
                low, high = (int(part, 16) for part in head.split("-"))
                inside = any(low < end and start < high for start, end in pools)
            elif inside and head == "Rss:":
                resident += int(line.split()[1]) * 1024
    return resident


def _client_threads(gradio_clients):
    """A function giving the threads of the `gradio_client` clients (their executors grow as they are used)."""
    executors = [pool for client in gradio_clients
                 for pool in (client.executor, client.helper_executor, client.stream_executor)]

    def threads() -> set[threading.Thread]:
        found = {thread for pool in executors for thread in pool._threads}
        return found | {client.heartbeat for client in gradio_clients} | {
            t for t in threading.enumerate() if t.name.startswith(("soak-client", "soak-attacker"))}

    return threads


def _thread_kind(name: str) -> str:
    """A thread's name without its number and target ("Thread-12 (run)" -> "Thread")."""
    return re.sub(r"[-_ ]?\d+", "", name.split(" (")[0]) or name


def _is_resource_tracker(process) -> bool:
    try:
        return any("resource_tracker" in part for part in process.cmdline())
    except psutil.Error:
        return True


def _settle(app, seconds: float) -> None:
    """Wait until every engine is idle and no request thread is left (cancellations take a step to land)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        busy = any(e.engine.stats().num_running or e.engine.stats().num_waiting for e in app.pool.entries())
        streaming = any(t.name == "openai-stream" for t in threading.enumerate())
        if not busy and not streaming:
            return
        time.sleep(0.1)


class EngineWatch:
    """Every engine the pool holds while the block runs, kept to count the tokens they generated afterwards
    (an engine evicted meanwhile is closed, but its step records stay)."""

    def __init__(self, app):
        self.app = app
        self.engines: dict[int, object] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="soak-engine-watch", daemon=True)

    def _watch(self) -> None:
        while not self._stop.is_set():
            for entry in self.app.pool.entries():
                self.engines[id(entry.engine)] = entry.engine
            self._stop.wait(0.05)

    def __enter__(self) -> EngineWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def output_tokens(self, since: float) -> int:
        return sum(step.num_output_tokens for engine in self.engines.values()
                   for step in engine.step_history(since=since))


@dataclass
class Report:
    """The calm and the attacked round: what was sent, what came back, the server before and after both."""

    requests: int
    clients: int
    seconds: float
    kinds: dict
    poison_refused: int
    hung_up: int
    hung_up_tokens: int
    completed: int
    latency_p50_s: float
    latency_p99_s: float
    attacked_latency_p50_s: float
    attacked_latency_p99_s: float
    attacks: dict
    before: Snapshot
    after: Snapshot
    problems: list[str]


def _percentile(values: list[float], fraction: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def soak(app, url: str, requests: int = 200, clients: int = 16, max_tokens: int = 48, seed: int = 0,
         timeout: float = 300.0, attacks: Attacks = EVERY_ATTACK) -> Report:
    """Run the load against the app at `url` (in this process) and check the server afterwards.

    A warm-up round of the same shape comes first, so that the snapshot taken before the calm round holds the
    steady sizes of the server's thread pools and allocator; the calm round gives the visitors' latency without an
    attacker, the attacked round the same traffic with every attack of `attacks` at once. Every round's requests
    are checked.
    """
    from gradio_client import Client

    base = (url.split("//")[1].split(":")[0], int(url.rstrip("/").rsplit(":", 1)[1]))
    model = app.default_config.model
    gradio_clients = [Client(url, verbose=False) for _ in range(max(1, clients // 4))]
    attacker = Client(url, verbose=False)
    client_threads = _client_threads([*gradio_clients, attacker])
    rounds, before = [], None
    for number, switch in enumerate(SWITCHES):
        jobs = plan_jobs(requests, app.settings, model, max_tokens, random.Random(seed + number), switch)
        _settle(app, 30)
        if number == 1:
            before = Snapshot.take(app, client_threads())
        attack = (base, attacker, model, app.settings.max_new_tokens, attacks) if number == 2 else None
        rounds.append((jobs, *_run_round(app, jobs, base, gradio_clients, clients, timeout, switch[1], attack)))
    after = Snapshot.take(app, client_threads())
    for client in [*gradio_clients, attacker]:
        client.close()
    problems = [f"request {o.index} ({o.kind}): {o.problem}" for _, round_outcomes, *_ in rounds
                for o in round_outcomes if o.problem]
    problems += [f"request {o.index} ({o.kind}): HTTP {o.status}" for _, round_outcomes, *_ in rounds
                 for o in round_outcomes if o.status >= 500 and not o.problem]
    problems += _server_problems(before, after)
    (jobs, outcomes, seconds, generated), (_, attacked, _, attacked_generated) = rounds[1], rounds[2]
    for round_outcomes, round_generated in ((outcomes, generated), (attacked, attacked_generated)):
        problems += _cancellation_problems(round_outcomes, round_generated)
    for round_jobs, round_outcomes, *_ in rounds:
        if len(round_outcomes) < len(round_jobs):
            problems.append(f"{len(round_jobs) - len(round_outcomes)} requests never finished")
    calm, under_attack = _latencies(outcomes), _latencies(attacked)
    if _percentile(under_attack, 0.99) > ATTACKED_P99_RATIO * _percentile(calm, 0.99):
        problems.append(f"the visitors' p99 latency went from {_percentile(calm, 0.99):.2f} s to "
                        f"{_percentile(under_attack, 0.99):.2f} s under attack (at most {ATTACKED_P99_RATIO:g}x)")
    attack_kinds = Counter(o.kind for o in attacked if o.index < 0)
    return Report(requests=len(jobs), clients=clients, seconds=round(seconds, 1),
                  kinds=dict(Counter(j.kind for j in jobs)),
                  poison_refused=sum(o.kind == "poison" and not o.problem for o in outcomes),
                  hung_up=sum(o.finish == "hung up" for o in outcomes),
                  hung_up_tokens=generated - sum(o.output_tokens for o in outcomes if not o.asked_tokens),
                  completed=len(calm), latency_p50_s=round(_percentile(calm, 0.5), 3),
                  latency_p99_s=round(_percentile(calm, 0.99), 3),
                  attacked_latency_p50_s=round(_percentile(under_attack, 0.5), 3),
                  attacked_latency_p99_s=round(_percentile(under_attack, 0.99), 3),
                  attacks={kind: {"sent": count, "answered right": sum(o.kind == kind and not o.problem
                                                                       for o in attacked)}
                           for kind, count in attack_kinds.items()},
                  before=before, after=after, problems=problems)


def _latencies(outcomes: list[Outcome]) -> list[float]:
    """The request-to-last-byte times of the visitors' well-formed requests that were answered right."""
    return [o.seconds for o in outcomes if o.index >= 0 and o.kind not in ("poison", "hang-up") and not o.problem]


def _cancellation_problems(outcomes: list[Outcome], generated: int) -> list[str]:
    """The tokens the engines generated for clients that left (hang-ups, non-streaming disconnects) must stay under
    HANG_UP_SHARE of what those clients asked for: leaving cancels."""
    delivered = sum(o.output_tokens for o in outcomes if not o.asked_tokens)
    asked = sum(o.asked_tokens for o in outcomes)
    left = sum(bool(o.asked_tokens) for o in outcomes)
    if generated - delivered > asked * HANG_UP_SHARE:
        return [f"the engines generated {generated - delivered} tokens for {left} clients that left (asking for "
                f"{asked} in all): leaving did not cancel their requests"]
    return []


def _run_round(app, jobs: list[Job], base, gradio_clients, clients: int, timeout: float, preset: str,
               attack: tuple | None) -> tuple[list[Outcome], float, int]:
    """(outcomes, seconds, tokens the engines generated) of one round, once the server has settled; with `attack`
    (base, its Gradio client, model, max_new_tokens, Attacks), the attacks run alongside the visitors, and their
    outcomes come with negative indexes."""
    started = time.perf_counter()
    attacked: list[Outcome] = []
    attacker = None
    if attack is not None:
        attacker = threading.Thread(target=lambda: attacked.extend(run_attacks(*attack, ATTACKER_ADDRESS)),
                                    name="soak-attacker-main")
        attacker.start()
    with EngineWatch(app) as engines:
        outcomes = _run_all(jobs, base, gradio_clients, clients, timeout, app, preset)
        if attacker is not None:
            attacker.join()
        seconds = time.perf_counter() - started
        _settle(app, 30)
    for number, outcome in enumerate(attacked, start=1):
        outcome.index = -number
    return outcomes + attacked, seconds, engines.output_tokens(since=started)


def _server_problems(before: Snapshot, after: Snapshot) -> list[str]:
    problems = []
    for engine in after.engines:
        if engine["num_running"] or engine["num_waiting"]:
            problems.append(f"an engine still has requests: {engine}")
        if engine["kv_blocks_free"] != engine["kv_blocks_total"]:
            problems.append(f"KV blocks not freed: {engine}")
    if after.threads.get("engine-loop", 0) > len(after.engines):  # an idle engine's loop thread ends
        problems.append(f"{after.threads.get('engine-loop', 0)} engine threads for {len(after.engines)} engines")
    if after.threads.get("openai-stream", 0):
        problems.append(f"{after.threads['openai-stream']} request threads left")
    if after.threads.get("AnyIO worker thread", 0) > ANYIO_THREADS:
        problems.append(f"{after.threads['AnyIO worker thread']} AnyIO worker threads")
    pooled = ("engine-loop", "AnyIO worker thread")
    grown = {name: count - before.threads.get(name, 0) for name, count in after.threads.items()
             if name not in pooled and count > before.threads.get(name, 0)}
    if grown:
        problems.append(f"threads left over: {grown}")
    if after.children > before.children:
        problems.append(f"{after.children - before.children} child processes left over")
    if not after.measurement_slot_free:
        problems.append("a measurement still holds or waits for the measurement slot")
    allowed = max(0.0, after.engine_mib - before.engine_mib) + RSS_SLACK_MIB
    grown = after.rss_beside_kv_mib - before.rss_beside_kv_mib
    if grown > allowed:
        problems.append(f"RSS beside the KV pools grew {grown:.0f} MiB (allowed {allowed:.0f}: the growth of the "
                        f"pool's engines plus {RSS_SLACK_MIB} MiB)")
    return problems


def _run_all(jobs: list[Job], base, gradio_clients, clients: int, timeout: float, app, preset: str) -> list[Outcome]:
    """Run `jobs` from `clients` threads, in order; half-way the Gradio sessions apply `preset`."""
    from engine import load_preset

    switch_at = len(jobs) // 2
    expected = {key: value for key, value in load_preset(preset).items() if key != "description"}
    pending = list(jobs)
    outcomes: list[Outcome] = []
    lock = threading.Lock()
    free_gradio = list(gradio_clients)

    def take_gradio_client():
        while True:
            with lock:
                if free_gradio:
                    return free_gradio.pop()
            time.sleep(0.05)

    def switch() -> None:
        """Every Gradio session applies `preset` (each waits until its session is not chatting)."""
        taken = [take_gradio_client() for _ in gradio_clients]
        try:
            for client in taken:
                status, config, _ = client.predict(preset, api_name="/apply_preset")
                if any(config.get(key) != value for key, value in expected.items()):
                    raise AssertionError(f"preset {preset} did not apply: {status}")
        finally:
            with lock:
                free_gradio.extend(taken)

    def run(job: Job, source: str) -> Outcome:
        if job.index == switch_at:
            switch()
        if job.kind != "gradio-chat":
            return run_http(base, job, timeout, source)
        client = take_gradio_client()
        try:
            return run_gradio(client, job)
        finally:
            with lock:
                free_gradio.append(client)

    def worker(source: str) -> None:
        while True:
            with lock:
                if not pending:
                    return
                job = pending.pop(0)
            started = time.perf_counter()
            try:
                outcome = run(job, source)
            except Exception as error:  # a failure of the server as seen from a client
                outcome = Outcome(job.index, job.kind, problem=f"{type(error).__name__}: {error}")
            outcome.seconds = time.perf_counter() - started
            with lock:
                outcomes.append(outcome)

    # each client its own loopback address, as each visitor has its own on a public server
    threads = [threading.Thread(target=worker, args=(f"127.0.0.{10 + i}",), name=f"soak-client-{i}")
               for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return outcomes


# ----- the command -----------------------------------------------------------------------------------


def start_public_app(settings_env: dict | None = None):
    """The playground in public mode (as on a Space) on a free loopback port: (app, demo, url)."""
    from engine import list_models
    from playground.shared.settings import Settings
    from tests.support.ui_helpers import start_app

    env = {"PLAYGROUND_PUBLIC": "1", **(settings_env or {})}
    settings = Settings.from_env(list(list_models()), env=env)
    return start_app("demo", settings)


def format_report(report: Report) -> str:
    before, after = report.before, report.after
    lines = [f"{report.requests} requests from {report.clients} clients in {report.seconds} s: {report.kinds}",
             f"calm round: completed {report.completed} (p50 {report.latency_p50_s} s, p99 {report.latency_p99_s} s), "
             f"hung up {report.hung_up} (the engines generated {report.hung_up_tokens} tokens for them), "
             f"poison refused {report.poison_refused}",
             f"attacked round: visitors' p50 {report.attacked_latency_p50_s} s, p99 {report.attacked_latency_p99_s} s; "
             "attacks " + ", ".join(f"{kind} {counts['answered right']}/{counts['sent']}"
                                    for kind, counts in report.attacks.items()),
             f"RSS {before.rss_mib:.0f} -> {after.rss_mib:.0f} MiB, of which KV pages {before.kv_resident_mib:.0f} -> "
             f"{after.kv_resident_mib:.0f} MiB (engines {before.engine_mib:.0f} -> "
             f"{after.engine_mib:.0f} MiB); threads {sum(before.threads.values())} -> {sum(after.threads.values())}; "
             f"engines {len(before.engines)} -> {len(after.engines)}, KV blocks free "
             + ", ".join(f"{e['kv_blocks_free']}/{e['kv_blocks_total']}" for e in after.engines)
             + f"; measurement slot {'free' if after.measurement_slot_free else 'held'}",
             f"problems: {len(report.problems)}"] + [f"  {p}" for p in report.problems]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=48, help="longest well-formed reply asked for")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="write the report here")
    args = parser.parse_args(argv)
    app, demo, url = start_public_app()
    try:
        report = soak(app, url, args.requests, args.clients, args.max_tokens, args.seed)
    finally:
        demo.close()
        app.pool.close()
    print(format_report(report))
    if args.json:
        Path(args.json).write_text(json.dumps(asdict(report), indent=1))
    return 1 if report.problems else 0


if __name__ == "__main__":
    sys.exit(main())

"""Chat's "measure" action: the message asked several times on the session's configuration, one request at a time,
and the median and range of its engine TTFT and decode speed.

Why: one reply's figure is noise on a shared machine (the same prompt gave TTFT 8 then 188 ms), so the page offers
a figure a person can trust: the same prompt, the same history, repeated (at most `max_measure_repeats`), through
the measurement slot like every other measurement. The replies are not added to the conversation.
"""

from __future__ import annotations

from playground.figures.configuration import config_tag
from playground.figures.replies import reply_figures
from playground.figures.spread import Spread
from playground.shared.context import PlaygroundContext
from playground.shared.conversation import Conversation, Exchange, fit_exchange
from playground.shared.errors import Refused
from playground.shared.session import Session

DEFAULT_REPEATS = 5


def measure_prompt(context: PlaygroundContext, session: Session, message: str, params, repeats: int) -> str:
    """The message (after this conversation's history) asked `repeats` times: a notice with the median and range of
    engine TTFT and decode speed. Refused above the server's cap, or when the prompt cannot run."""
    cap = context.settings.max_measure_repeats
    if not 2 <= repeats <= cap:
        raise Refused(f"measure repeats the prompt 2 to {cap} times on this server (PLAYGROUND_MAX_MEASURE_REPEATS), "
                      f"not {repeats}")
    conversation = session.conversation
    trial = Conversation(conversation.system_prompt, [*conversation.exchanges, Exchange(message)])
    figures = []
    with context.measurements.held(session), context.pool.lease(session.config) as entry:
        engine = entry.engine
        fitted = fit_exchange(engine, trial, len(trial.exchanges) - 1, params.max_tokens,
                              context.settings.max_prompt_tokens, context.settings.max_conversation_chars)
        for _ in range(repeats):
            output = engine.generate([fitted.token_ids], params)[0]
            figures.append(reply_figures(output.metrics, False))
    parts = [f"measured {repeats}× on {config_tag(session.config)}"]
    for key, name, number, unit in (("engine_ttft_ms", "engine TTFT", "{:.0f}", "ms"),
                                    ("decode_tokens_per_s", "decode", "{:.1f}", "tok/s")):
        values = [f[key] for f in figures if f.get(key) is not None]
        if values:
            parts.append(f"{name} {Spread.of(values).range_text(number, unit)}")
    return " · ".join(parts)

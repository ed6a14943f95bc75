"""The Roofline tab: the chart draws what the report says, the probe and the handlers show the engine's numbers."""

from __future__ import annotations

import re

import pytest

from engine import Engine, EngineConfig, StepRecord, engine_roofline
from engine.tools.roofline import DeviceCeilings, ModelWork, analyze
from playground.app import create_playground
from playground.figures.roofline_chart import LogAxes, roofline_summary_html, roofline_svg
from playground.roofline.handlers import EVERYTHING, PROBE, RooflineHandlers, roofline_view
from playground.roofline.probe import PROBE_BATCHES, run_probe
from playground.shared.settings import Settings

CEILINGS = DeviceCeilings(device="test device", dtype="float32", threads=1, peak_flops=1e11, bandwidth=1e10,
                          matmul_size=8, bandwidth_bytes=8, measured_at="now", seconds=0.0)
WORK = ModelWork(linear_flops_per_token=2e6, lm_head_flops_per_row=1e5, attention_flops_per_pair=1e3,
                 weight_bytes_per_step=4_000_000, embedding_bytes_per_token=256, kv_bytes_per_token=1024,
                 logits_bytes_per_row=4000)


def _step(batch: int, tokens: int, context: int, pairs: int, seconds: float) -> StepRecord:
    return StepRecord(time=0.0, duration=seconds, batch_size=batch, num_tokens=tokens, num_decode_tokens=batch,
                      num_running=batch, kv_blocks_used=0, context_tokens=context, attention_pairs=pairs)


def _drawn_points(svg: str) -> dict[str, dict]:
    points = {}
    for match in re.finditer(r'<g class="rl-point" data-phase="([^"]+)" data-intensity="([^"]+)" data-flops="([^"]+)"'
                             r'.*?<circle cx="([^"]+)" cy="([^"]+)"', svg):
        phase, intensity, flops, cx, cy = match.groups()
        points[phase] = {"intensity": float(intensity), "flops": float(flops), "x": float(cx), "y": float(cy)}
    return points


def test_chart_places_each_phase_at_its_intensity_and_achieved_flops():
    steps = [_step(1, 1, 100, 100, 2e-3), _step(8, 8, 800, 800, 3e-3), _step(1, 512, 512, 131_328, 0.5)]
    report = analyze(steps, WORK, CEILINGS)
    svg = roofline_svg(report)
    points = _drawn_points(svg)
    assert set(points) == {"prefill", "decode, batch 1", "decode, batch 8"}  # decode per batch size, when several
    assert points["decode, batch 1"]["x"] < points["decode, batch 8"]["x"] < points["prefill"]["x"]
    assert points["prefill"]["intensity"] == pytest.approx(report.prefill.intensity, rel=1e-5)
    axes = LogAxes.around([CEILINGS.ridge_intensity, *(p["intensity"] for p in points.values())],
                          [CEILINGS.peak_flops, *(p["flops"] for p in points.values())])
    for name, phase in (("prefill", report.prefill), ("decode, batch 8", report.decode_by_batch[1])):
        assert points[name]["x"] == pytest.approx(axes.x(phase.intensity), abs=0.1)
        assert points[name]["y"] == pytest.approx(axes.y(phase.achieved_flops), abs=0.1)
    # the roof bends at the ridge, at the measured peak
    roof = re.search(r'<polyline points="([^"]+)" class="rl-roof"', svg).group(1).split()
    ridge_x, ridge_y = (float(v) for v in roof[1].split(","))
    assert ridge_x == pytest.approx(axes.x(CEILINGS.ridge_intensity), abs=0.1)
    assert ridge_y == pytest.approx(axes.y(CEILINGS.peak_flops), abs=0.1)
    one_size = analyze(steps[:1] + steps[2:], WORK, CEILINGS)
    assert set(_drawn_points(roofline_svg(one_size))) == {"prefill", "decode"}  # one batch size: decode as a whole
    summary = roofline_summary_html(report)
    assert "decode (2 steps, mean batch 4.5) is neither bound: overhead" in summary and "prefill (1 steps" in summary
    assert "<td>neither bound: overhead</td><td>16%</td>" in summary  # the table says it too, far below its roof
    assert summary.count("<tr>") == 1 + 4  # header, prefill, decode, decode at batch 1 and 8


def test_chart_without_a_report_says_so():
    assert "no roofline yet" in roofline_svg(None)
    assert "not loaded" in roofline_summary_html(None, "not loaded")


@pytest.fixture(scope="module")
def tiny_engine(tiny_llama_dir):
    with Engine(EngineConfig(model=tiny_llama_dir)) as engine:
        yield engine


def test_probe_shows_decode_at_each_batch_size_with_the_engine_numbers(tiny_engine):
    started = run_probe(tiny_engine)
    view = roofline_view(tiny_engine, started)
    report = engine_roofline(tiny_engine, started)
    assert view.report["decode"] == report.to_dict()["decode"]
    by_batch = view.report["decode_by_batch"]
    assert [point["phase"] for point in by_batch] == [f"decode, batch {b}" for b in PROBE_BATCHES]
    intensities = [point["intensity"] for point in by_batch]
    assert intensities == sorted(intensities)
    sequences = sum(PROBE_BATCHES)
    assert view.report["prefill"]["tokens"] + view.report["decode"]["tokens"] == sequences * (128 + 31)
    assert set(_drawn_points(view.chart)) == {"prefill", *(f"decode, batch {b}" for b in PROBE_BATCHES)}


def test_tab_handlers_load_probe_show_and_refuse(tiny_llama_dir):
    app = create_playground(Settings(), default_model=tiny_llama_dir, models={})
    tab = RooflineHandlers(app)
    session = app.new_session()
    try:
        chart, summary, projection, report, started, window = tab.show(PROBE, 0.0, session)
        assert report is None and "not loaded" in summary and window == EVERYTHING
        assert "appear here once" in projection
        chart, summary, projection, report, started, window = tab.probe(session)
        assert window == PROBE and started > 0 and report["decode"]["steps"] > 0
        # the what-if section: the probe's phases on every device, marked as estimates, in the HTML and the answer
        devices = [device["device"] for device in report["projection"]["devices"]]
        assert devices[0].endswith("(measured here)") and "NVIDIA H200" in devices and len(devices) == 7
        assert projection.count('class="pj-row"') == 7 * (1 + len(PROBE_BATCHES)) and "estimates, not" in projection
        assert any(verdict in summary for verdict in ("memory-bound", "compute-bound", "neither bound: overhead"))
        again = tab.show(PROBE, started, session)[3]
        assert again["decode"] == report["decode"]  # the probe's window: the same steps, the same numbers
        everything = tab.show(EVERYTHING, started, session)[3]
        assert everything["decode"]["steps"] >= report["decode"]["steps"]
        assert tab.api_roofline(False, session)["ceilings"]["source"] == "cache"
        session.config = session.config.replace(backend="hf")
        with app.pool.lease(session.config):
            assert "transformers backend" in tab.show(EVERYTHING, 0.0, session)[1]
    finally:
        app.pool.close()

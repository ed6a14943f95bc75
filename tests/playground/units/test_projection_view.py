"""The what-if section's figures: the table has a row per device and phase marked as estimates, the chart a bar
per device whose parts are the step's terms, the committed runs stand beside their projections."""

from __future__ import annotations

import re

import pytest

from engine.tools.hardware_projection import MeasuredCheck, Overhead, project
from engine.tools.roofline import analyze
from playground.figures.projection_view import LABEL, projection_chart_svg, projection_html, projection_table_html
from tests.support.roofline_steps import CEILINGS, DEVICE, INFO, WORK, decode_step, prefill_step

CHECK = MeasuredCheck("test GPU", "run-1: a model", 1, 0.0120, 0.0114)


@pytest.fixture
def projection():
    steps = [decode_step(1, 100, 2e-3), decode_step(4, 100, 3e-3), prefill_step(512, 0.5)]
    return project(analyze(steps, WORK, CEILINGS), INFO, (DEVICE,), Overhead(0.011, 0.0002), [CHECK])


def test_table_has_a_row_per_device_and_phase_marked_as_estimates(projection):
    table = projection_table_html(projection)
    rows = re.findall(r'<tr class="pj-row" data-device="([^"]+)" data-phase="([^"]+)" data-bound="(\w+)"', table)
    assert [(device, phase) for device, phase, _ in rows] == [
        (device, phase) for device in ("test CPU (measured here)", "test GPU")
        for phase in ("prefill", "decode, batch 1", "decode, batch 4")]
    gpu = projection.devices[1]
    assert [bound for _, _, bound in rows[3:]] == [gpu.prefill.bound, *(step.bound for step in gpu.decode)]
    assert "estimates, not measurements" in table and table.count("≈") >= 2 * len(rows)
    assert f"≈ {1e3 * gpu.decode[0].seconds:.3g} ms" in table and gpu.decode[0].toggle in table
    assert "TTFT: one prefill step (512 tokens" in table
    # the committed run beside its projection, with the error, under the device it ran on
    assert "checked on its committed run: -5.0% to -5.0%" in table
    assert re.search(r"<td>run-1: a model</td><td>1</td><td>12</td><td>≈ 11.4</td><td>-5.0%</td>", table)


def test_chart_draws_each_devices_decode_step_as_its_terms(projection):
    svg = projection_chart_svg(projection)
    bars = re.findall(r'<g class="pj-bar" data-device="([^"]+)" data-seconds="([^"]+)".*?<rect x="[^"]+" y="[^"]+" '
                      r'width="([^"]+)".*?<rect x="([^"]+)" y="[^"]+" width="([^"]+)"', svg)
    assert [bar[0] for bar in bars] == ["this machine (measured)", "test GPU"]
    longest = max(float(bar[1]) for bar in bars)
    for (_, seconds, roof, overhead_x, overhead), device in zip(bars, projection.devices, strict=True):
        step = device.decode[-1]  # the largest batch
        assert float(seconds) == pytest.approx(step.seconds, rel=1e-5)
        assert float(roof) + float(overhead) == pytest.approx((float(seconds) / longest) * (640 - LABEL - 70), abs=0.2)
        assert float(overhead_x) == pytest.approx(LABEL + float(roof), abs=0.1)
    assert "decode TPOT at batch 4, estimated" in svg


def test_without_steps_the_section_says_what_it_waits_for():
    assert "appear here once" in projection_html(None)
    assert "no decode steps" in projection_chart_svg(None)
    empty = project(analyze([], WORK, CEILINGS), INFO, (DEVICE,), Overhead(0.0, 0.0))
    assert "no decode steps" in projection_chart_svg(empty)

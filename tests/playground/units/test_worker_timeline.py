"""The worker timeline: busy shares over a window, and one bar per span."""

from __future__ import annotations

import pytest

from playground.figures.worker_timeline import Span, busy_share, timeline_svg


def test_busy_share_counts_overlaps_once_and_clips_to_the_window():
    spans = [Span(0, 0.0, 2.0), Span(0, 1.0, 3.0), Span(0, 9.0, 12.0), Span(1, 0.0, 10.0)]
    assert busy_share(spans, 0, (0.0, 10.0)) == pytest.approx(0.4)  # [0, 3] and [9, 10]
    assert busy_share(spans, 1, (0.0, 10.0)) == pytest.approx(1.0)
    assert busy_share(spans, 2, (0.0, 10.0)) == 0.0
    assert busy_share(spans, 0, (5.0, 5.0)) == 0.0


def test_the_chart_draws_a_lane_per_worker_and_a_bar_per_span():
    spans = [Span(0, 0.0, 0.001, 0), Span(1, 0.001, 0.002, 0), Span(0, 0.001, 0.002, 1, "micro-batch 1")]
    svg = timeline_svg(["stage 0", "stage 1"], spans, "pipeline")
    assert svg.count('class="busy"') == 3
    assert "stage 0" in svg and "stage 1" in svg and "micro-batch 1" in svg
    assert "100%" in svg and "50%" in svg  # stage 0 busy the whole window, stage 1 half of it
    assert "no work recorded" in timeline_svg(["stage 0"], [], "pipeline")

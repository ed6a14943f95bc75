"""The Roofline tab through the running app's API (gradio_client): `/roofline` runs the probe and answers with the
roofline and its what-if projection onto the device table, the committed H200 run beside its projection.
The app runs in-process with the real engine pool (see tests/support/ui_helpers.py)."""

from __future__ import annotations

import pytest

from playground.shared.settings import Settings
from tests.support.ui_helpers import api_client, serving

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def running_app(tmp_path_factory):
    with serving(tmp_path_factory, Settings(max_new_tokens=8, max_prompt_tokens=400, max_queue=8)) as running:
        yield running


def test_roofline_answers_with_the_probes_steps_projected_onto_every_device(running_app):
    answer = api_client(running_app.url).predict(True, api_name="/roofline")
    projection = answer["projection"]
    assert projection["estimate"] is True and "estimates" in projection["notes"][0]
    devices = {device["device"]: device for device in projection["devices"]}
    here = projection["devices"][0]
    assert here["measured_here"] and here["device"].endswith("(measured here)")
    assert {"NVIDIA L4", "NVIDIA A10G", "NVIDIA A100 80GB", "NVIDIA H100 SXM", "NVIDIA H200"} < set(devices)
    assert "ZeroGPU (half an H200, assumed)" in devices
    batches = [point["mean_batch_size"] for point in answer["decode_by_batch"]]
    for device in projection["devices"]:
        assert device["prefill"]["phase"] == "prefill" and device["source"]
        assert [step["batch"] for step in device["decode"]] == batches  # the measured batch sizes, each projected
        for step in (device["prefill"], *device["decode"]):
            assert step["bound"] in ("compute", "memory", "overhead") and step["toggle"]
            assert step["seconds"] == pytest.approx(max(step["compute_seconds"], step["memory_seconds"])
                                                    + step["overhead_seconds"])
    # on the device it ran on, the projection is the measurement; the H200 carries its committed run's error
    decode_here = here["decode"][0]
    measured = answer["decode_by_batch"][0]
    assert decode_here["seconds"] == pytest.approx(max(measured["seconds"] / measured["steps"],
                                                       decode_here["compute_seconds"], decode_here["memory_seconds"]))
    checks = devices["NVIDIA H200"]["checks"]
    assert checks and all(abs(check["error"]) < 0.1 for check in checks)
    assert all(not device["checks"] for name, device in devices.items() if name != "NVIDIA H200")

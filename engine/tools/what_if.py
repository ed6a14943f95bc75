"""What-if hardware, assembled: a roofline report projected onto the device table with the calibrated GPU overhead.

Why a module apart: the projection's arithmetic (`hardware_projection.py`) takes its devices and overhead as
arguments, so it is tested on hand-computed cases; this one supplies the real ones (the published table,
the overhead fitted to the committed GPU runs, read once per process) for the Roofline tab, and is the
command-line view: `python -m engine.what_if` prints the device table, the fitted overhead and the
projection of each committed run beside its measurement.
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from functools import cache

from engine.info import EngineInfo
from engine.tools.device_table import GPUS
from engine.tools.gpu_calibration import checks, committed_runs, fit_overhead
from engine.tools.hardware_projection import HardwareProjection, MeasuredCheck, Overhead, project
from engine.tools.roofline import RooflineReport

NO_RUNS = Overhead(0.0, 0.0)


@cache
def calibration() -> tuple[Overhead, tuple[MeasuredCheck, ...]]:
    """The GPU overhead fitted to the committed runs and each run's check (no overhead without a run)."""
    runs = committed_runs()
    if not runs:
        return NO_RUNS, ()
    overhead = fit_overhead(runs)
    return overhead, tuple(checks(runs, overhead))


def project_hardware(report: RooflineReport, info: EngineInfo) -> HardwareProjection:
    """`report`'s phases on the device they ran on and on every GPU of the table (an estimate)."""
    overhead, measured = calibration()
    projection = project(report, info, GPUS, overhead, list(measured))
    if overhead != NO_RUNS:
        return projection
    return replace(projection, notes=[*projection.notes, "no committed GPU run to calibrate the overhead on: the "
                                                         "GPU rows are roofline only"])


def describe_calibration() -> str:
    """The device table, the fitted overhead and the checks, as the command prints them."""
    overhead, measured = calibration()
    lines = ["device | fp32 TFLOP/s | bf16 TFLOP/s | int8 TOP/s | GB/s | GB | source"]
    lines += [f"{d.name} | {d.peak_flops['fp32'] / 1e12:g} | {d.peak_flops['bf16'] / 1e12:g} | "
              f"{d.peak_flops['int8'] / 1e12:g} | {d.bandwidth / 1e9:g} | {d.memory_bytes / 1e9:g} | {d.source}"
              for d in GPUS]
    lines.append(f"\nGPU overhead per step (eager, no CUDA graphs): {1e3 * overhead.base:.2f} ms + "
                 f"{1e3 * overhead.per_sequence:.3f} ms per sequence")
    lines.append("run | batch | measured TPOT ms | projected TPOT ms | error")
    lines += [f"{c.device}, {c.run} | {c.batch} | {1e3 * c.measured_seconds:.2f} | {1e3 * c.projected_seconds:.2f} | "
              f"{c.error:+.1%}" for c in measured]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(prog="python -m engine.what_if", description=__doc__.split("\n\n")[0]).parse_args(
        argv)
    print(describe_calibration())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

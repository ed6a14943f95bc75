"""What a ZeroGPU call costs on this machine before it serves: `python -m tests.support.zero_gpu_rebuild [model]
[replies]` opens the model in ZeroGPU mode over the forking `spaces` stand-in (tests/support/fake_spaces) and sends
`replies` short replies, each its own call, printing per call the engine's rebuild (`EngineInfo.load_seconds` in the
worker) and the call's wall time in the server (fork, pickling, rebuild, reply). docs/hosting.md quotes it."""

from __future__ import annotations

import statistics
import sys

from tests.support.paths import PROJECT_ROOT

sys.path.insert(0, str(PROJECT_ROOT / "tests" / "support" / "fake_spaces"))

from engine import EngineConfig, SamplingParams  # noqa: E402
from playground.shared.zero_gpu import ZeroGpu, ZeroGpuEngine  # noqa: E402


def main(model: str = "demo", replies: int = 5) -> None:
    engine = ZeroGpuEngine(EngineConfig(model=model), ZeroGpu(600))
    print(f"{model}: the first call (the start-up check) rebuilt the engine in {engine.info.load_seconds:.2f} s")
    rebuilds, walls = [], []
    for _ in range(replies):
        for _delta in engine.stream(engine.encode("Hello"), SamplingParams(max_tokens=8, temperature=0.0)):
            pass
        call = engine.thread_call()
        rebuilds.append(call.load_seconds)
        walls.append(call.wall_seconds)
        print(f"  {call.line()}")
    print(f"median over {replies} replies of 8 tokens: rebuild {statistics.median(rebuilds):.2f} s, "
          f"call {statistics.median(walls):.2f} s")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "demo", int(sys.argv[2]) if len(sys.argv) > 2 else 5)

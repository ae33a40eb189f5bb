"""CPU time of the flow simulator's numba kernels: compiled (cold cache) against loaded (warm cache).

    python benchmarks/sim_compile.py --repeats 3

Each repeat deletes this tree's ``src/mccl/sim/__pycache__/*.nb[ic]`` (numba's file cache of the
simulator; nothing else), then runs, in a fresh interpreter each, one small flow-engine simulation
(direct AllToAll on an 8-GPU switch: every kernel of ``mccl.sim.kernels`` runs) twice: cold, which
compiles and writes the cache, and warm, which loads it. Prints CPU seconds (``time.process_time``
of the child) and the medians, and how many cache files the cold run wrote. To compare two trees
(a split of the kernels), run it in a fresh clone of each.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / "src" / "mccl" / "sim" / "__pycache__"
CHILD = """
import time
start = time.process_time()
from mccl.sim import SimOptions, simulate_schedule
from mccl.synth.direct import direct_alltoall
from mccl.topology import single_switch
fabric = single_switch(8, 100)
simulate_schedule(direct_alltoall(fabric), fabric, 1 << 20, options=SimOptions(engine="flows"))
print(time.process_time() - start)
"""


def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def child_cpu() -> float:
    env_path = str(ROOT / "src")
    result = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, check=True,
                            env={"PYTHONPATH": env_path, "PATH": "/usr/bin:/bin"})
    return float(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=positive, default=3)
    args = parser.parse_args()
    cold, warm = [], []
    for repeat in range(args.repeats):
        for path in CACHE.glob("*.nb[ic]"):
            path.unlink()
        cold.append(child_cpu())
        files = len(list(CACHE.glob("*.nbc")))
        warm.append(child_cpu())
        print(f"repeat {repeat}: cold {cold[-1]:.2f} s CPU, warm {warm[-1]:.2f} s CPU, {files} cache files")
    print(f"median: cold {statistics.median(cold):.2f} s, warm {statistics.median(warm):.2f} s, "
          f"compile ≈ {statistics.median(cold) - statistics.median(warm):.2f} s CPU")


if __name__ == "__main__":
    main()

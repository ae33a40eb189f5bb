"""CPU time of ``Topology.with_capacities`` on a rail-optimized fabric (the controller re-weights the
fabric with it per measured drift), optionally against another checkout's ``src`` in the same run.

    python benchmarks/with_capacities.py --gpus 512 --repeats 30 --before-src /work/main/src

Each side runs in a fresh interpreter, alternately, ``--rounds`` times; a round reports the median
``time.process_time`` of ``--repeats`` calls (every link's capacity changed; the source topology's
lookups cached, as the controller's is). Prints the median over rounds per side and after ÷ before.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

_WORKER = """
import json, statistics, sys, time
import numpy as np
from mccl.topology import rail_optimized
gpus, repeats = int(sys.argv[1]), int(sys.argv[2])
fabric = rail_optimized(1, gpus // 8, 8)
_ = fabric.node_index, fabric.out_links, fabric.link_endpoints, fabric.latencies_us, fabric.capacities_gbps
values = fabric.capacities_gbps * np.linspace(0.5, 1.0, len(fabric.links))
times = []
for _ in range(repeats):
    start = time.process_time()
    fabric.with_capacities(values)
    times.append(time.process_time() - start)
print(json.dumps({"links": len(fabric.links), "ms": 1000 * statistics.median(times)}))
"""


def _side(src: Path, gpus: int, repeats: int) -> dict:
    env_path = str(src)
    result = subprocess.run([sys.executable, "-c", _WORKER, str(gpus), str(repeats)], capture_output=True, text=True,
                            check=True, env={"PYTHONPATH": env_path, "PATH": "/usr/bin:/bin"})
    return json.loads(result.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpus", type=int, default=512, help="GPUs, a multiple of 8 (rail_optimized(1, gpus/8, 8))")
    parser.add_argument("--repeats", type=int, default=30, help="calls per round")
    parser.add_argument("--rounds", type=int, default=5, help="fresh interpreters per side")
    parser.add_argument("--before-src", type=Path, default=None, help="another checkout's src, measured alongside")
    args = parser.parse_args()
    if args.gpus < 16 or args.gpus % 8 or args.repeats < 1 or args.rounds < 1:
        parser.error("--gpus must be a multiple of 8 of at least 16; --repeats and --rounds at least 1")
    if args.before_src is not None and not (args.before_src / "mccl" / "__init__.py").is_file():
        parser.error(f"--before-src {args.before_src}: no mccl package there (give a checkout's src)")
    sides = {"after": Path(__file__).resolve().parents[1] / "src"}
    if args.before_src is not None:
        sides = {"before": args.before_src.resolve(), **sides}
    rounds: dict[str, list[float]] = {name: [] for name in sides}
    links = 0
    for _ in range(args.rounds):
        for name, src in sides.items():
            row = _side(src, args.gpus, args.repeats)
            rounds[name].append(row["ms"])
            links = row["links"]
    medians = {name: statistics.median(values) for name, values in rounds.items()}
    for name, value in medians.items():
        print(f"{name}: {args.gpus} GPUs, {links} links: with_capacities {value:.3f} ms CPU "
              f"(median of {args.rounds} rounds, each the median of {args.repeats} calls)")
    if "before" in medians:
        print(f"after / before: {medians['after'] / medians['before']:.4f}")


if __name__ == "__main__":
    main()

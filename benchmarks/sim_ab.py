"""CPU time of the flow simulator on a 128-GPU ring AllGather (both engines) and a digest of its results,
for a before/after comparison of a kernel change: run it once per side, alternating, e.g.

    PYTHONPATH=/path/to/before/src python benchmarks/sim_ab.py 3
    PYTHONPATH=src python benchmarks/sim_ab.py 3

Prints per case the median ``time.process_time`` of ``simulate_schedule`` over the given number of runs
(kernels compiled before the timing) and a hash of the end time, algbw and critical chain, which must be
equal on both sides. Cases: healthy on the per-flow and the grouped engine, Fail2 on the grouped engine
(Fail2 on the per-flow engine takes ~64 s CPU per run, left out).
"""

import argparse
import hashlib
import json
import statistics
import time

from mccl.schedule import Collective
from mccl.sim import SimOptions
from mccl.sim.engine import simulate_schedule
from mccl.synth import optimize
from mccl.topology import apply_fault, rail_optimized

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("repeats", nargs="?", type=int, default=3, help="timed runs per case (default 3)")
repeats = parser.parse_args().repeats
if repeats < 1:
    parser.error("repeats must be at least 1")
base = rail_optimized(1, 16, 8)
rows = {}
for fault in ("healthy", "Fail2"):
    topo = base if fault == "healthy" else apply_fault(base, fault)
    sched = optimize(topo, Collective.ALLGATHER, None, method="ring.nccl").schedule
    for engine in (("flows", "grouped") if fault == "healthy" else ("grouped",)):
        opts = SimOptions(engine=engine, slices=4, step_priority=1.0)
        simulate_schedule(sched, topo, 128 * 2**20 * 128, options=opts)  # compile / warm
        times, digest = [], None
        for _ in range(repeats):
            t0 = time.process_time()
            r = simulate_schedule(sched, topo, 128 * 2**20 * 128, options=opts)
            times.append(time.process_time() - t0)
            chain = [(c.transfer, c.sent_s, c.arrive_s) for c in r.critical_chain]
            d = hashlib.sha1(repr((r.end_s, r.algbw_gbs, chain)).encode()).hexdigest()[:12]
            digest = d if digest in (None, d) else "NONDETERMINISTIC"
        rows[f"{fault}/{engine}"] = {"cpu_s": statistics.median(times), "end_s": r.end_s, "digest": digest}
print(json.dumps(rows))

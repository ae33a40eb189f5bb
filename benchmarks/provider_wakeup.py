"""What a wake-up costs here: a pipe round trip between two processes, on one CPU, across two, or where the
scheduler puts them, back to back and after an idle gap (issue 16's per-call path, ``mccl.provider.fastpath``).

    python benchmarks/provider_wakeup.py            # ~10 s; run it on a quiet machine to see the halted-vCPU cost

Why. The provider's call wakes a thread of the other process twice (the request, the reply). On this VM an idle
vCPU halts at once, and waking a halted vCPU is an interrupt through the hypervisor; a wake-up on the waker's own
CPU, which then sleeps, is a context switch. The gap variant sleeps between calls, as the benchmark's other
variants separate two collectives; the compute variant busy-loops the caller's thread instead (as
``provider_bar.py``'s gap: a training step's compute keeps the caller's CPU busy while the other side sleeps). Medians
and quartiles of the round trip (µs).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time


def round_trips(parent_cpu: int | None, child_cpu: int | None, calls: int, gap_us: int,
                busy: bool = False) -> list[float]:
    """``calls`` round trips of 100 bytes with a forked echo; the CPUs pin each side (None: the scheduler's)."""
    request_read, request_write = os.pipe()
    reply_read, reply_write = os.pipe()
    allowed = os.sched_getaffinity(0)
    child = os.fork()
    if child == 0:  # the echo
        if child_cpu is not None:
            os.sched_setaffinity(0, {child_cpu})
        while True:
            data = os.read(request_read, 100)
            if data == b"q":
                os._exit(0)
            os.write(reply_write, data)
    if parent_cpu is not None:
        os.sched_setaffinity(0, {parent_cpu})
    samples = []
    try:
        for _ in range(calls):
            if gap_us and busy:
                end = time.perf_counter_ns() + gap_us * 1000
                while time.perf_counter_ns() < end:
                    pass
            elif gap_us:
                time.sleep(gap_us / 1e6)
            start = time.perf_counter_ns()
            os.write(request_write, b"x" * 100)
            os.read(reply_read, 100)
            samples.append((time.perf_counter_ns() - start) / 1e3)
    finally:
        os.write(request_write, b"q")
        os.waitpid(child, 0)
        os.sched_setaffinity(0, allowed)
        for fd in (request_read, request_write, reply_read, reply_write):
            os.close(fd)
    return samples


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()
    cpus = sorted(os.sched_getaffinity(0))
    placements = {"scheduler": (None, None), "one CPU": (cpus[0], cpus[0])}
    if len(cpus) > 1:
        placements["two CPUs"] = (cpus[0], cpus[1])
    print(f"pipe round trip between two processes (µs: median [q1, q3]); load average {os.getloadavg()[0]:.1f}, "
          f"{len(cpus)} CPUs")
    for gap_us, busy, title in ((0, False, "back to back"), (1000, False, "after 1 ms idle"),
                                (1000, True, "after 1 ms compute")):
        for name, (parent, child) in placements.items():
            samples = round_trips(parent, child, args.calls if not gap_us else args.calls // 4, gap_us, busy)
            q1, median, q3 = statistics.quantiles(samples, n=4)
            print(f"  {title:<19} {name:<10} {median:7.1f} [{q1:.1f}, {q3:.1f}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())

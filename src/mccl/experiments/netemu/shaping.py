"""The ``ip``/``tc`` commands of the emulated fabric, run as subprocesses (iproute2).

Why iproute2 and not pyroute2: the commands are the ones measured on this machine
(``/work/shared/reference/netemu.md``), iproute2 is installed here and in CI, batch
mode (``ip -batch -``, ``tc -batch -``) builds 8 hosts in well under a second, and a
failing command prints iproute2's own message, which :class:`FabricError` carries.
pyroute2 would add a dependency for no capability we use.

Shaping is ``htb`` (one class) on the egress of both ends of a veth (uplink in the GPU's
namespace, downlink on the switch port): ingress policing is not built in this kernel.
htb counts L2 bytes, so TCP goodput is 1448/1514 = 95.6 % of the configured rate at MTU
1500 (netemu.md §2a).
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence

from mccl.errors import MCCLError

__all__ = ["FabricError", "GOODPUT", "run", "batch", "htb_burst", "shaper_lines"]

GOODPUT = 1448 / 1514  # TCP payload per L2 byte at MTU 1500 (htb counts the Ethernet, IP and TCP headers)


class FabricError(MCCLError):
    """The emulated fabric could not be built, changed or torn down; the message names the command."""


def run(argv: Sequence[str], *, check: bool = True, stdin: str | None = None) -> str:
    """One iproute2 command; its stdout. A failure raises :class:`FabricError` with iproute2's message."""
    if shutil.which(argv[0]) is None:
        raise FabricError(f"{argv[0]} is not installed (apt-get install -y iproute2)")
    done = subprocess.run(list(argv), input=stdin, capture_output=True, text=True, timeout=60)
    if check and done.returncode != 0:
        shown = " ".join(argv) + (" <batch>" if stdin else "")
        raise FabricError(f"`{shown}` failed: {(done.stderr or done.stdout).strip()[:400]}")
    return done.stdout


def batch(tool: str, namespace: str | None, lines: Sequence[str]) -> None:
    """Run ``lines`` through one ``ip -batch -`` or ``tc -batch -`` (in ``namespace`` if given)."""
    if not lines:
        return
    argv = [tool] + (["-n", namespace] if namespace else []) + ["-batch", "-"]
    run(argv, stdin="\n".join(lines) + "\n")


def htb_burst(mbit: float) -> int:
    """Bucket size in bytes: 2 ms of traffic, at least two full-size frames. Small on purpose: at the
    scaled-down rates the demo uses (tens of Mbit/s) a 128 KiB bucket would let a quarter of a
    collective's bytes through at veth speed after every idle gap."""
    return max(3028, int(mbit * 1e6 / 8 * 0.002))


def shaper_lines(device: str, mbit: float, *, add: bool = False) -> list[str]:
    """The ``tc`` batch lines that shape ``device``'s egress to ``mbit`` Mbit/s: an htb root with one
    class (``add`` the first time, then a ``class change``, which keeps the queue and takes effect at
    once). htb, not tbf: htb does not software-segment GSO super-packets however small its bucket is,
    tbf does below a 64 KiB burst (netemu.md §2e), and the burst must be small here (:func:`htb_burst`).
    (Tried and measured no better, so not kept: a priority class for packets under 128 bytes (ACKs), and
    GSO off on the veths — see BENCHMARKS.md, 2026-11-30 netemu.)"""
    if not mbit > 0:
        raise FabricError(f"a shaped rate must be positive, got {mbit} Mbit/s")
    burst = htb_burst(mbit)
    rate = f"rate {mbit:.4f}mbit ceil {mbit:.4f}mbit burst {burst} cburst {burst}"
    if add:
        return [f"qdisc add dev {device} root handle 1: htb default 10",
                f"class add dev {device} parent 1: classid 1:10 htb {rate}"]
    return [f"class change dev {device} parent 1: classid 1:10 htb {rate}"]

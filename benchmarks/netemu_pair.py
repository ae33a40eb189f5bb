"""Minimal reproduction, outside mccl, of "gloo gets about half the shaped rate when a pair sends both ways".

    PYTHONPATH=src .venv/bin/python benchmarks/netemu_pair.py            # needs root; ~2 min
    PYTHONPATH=src .venv/bin/python benchmarks/netemu_pair.py --gso 3000 # segments of ≤ 2 MSS on the veth
    PYTHONPATH=src .venv/bin/python benchmarks/netemu_pair.py --gso 3000 --modes gloo-lockstep-sendfirst,gloo-lockstep

Two network namespaces joined by one veth, shaped on both ends with exactly the emulated fabric's
htb lines and TCP settings (:func:`mccl.experiments.netemu.shaping.shaper_lines`,
``fabric.TCP_SYSCTLS``), at 20 Mbit/s (a NIC of the demo). Measured, each one way and both ways at once:

* ``tcp-2sock``: raw TCP, one connection per direction (a thread sends, the peer reads);
* ``tcp-duplex``: raw TCP, both directions on one connection (as gloo has one per pair);
* ``gloo-lockstep``: 2 gloo ranks, per 256 KiB block ``irecv`` + ``isend`` then wait both (nothing in flight
  across blocks: every block needs gloo's receive-ready round trip); ``gloo-lockstep-sendfirst``: the same
  with the send posted before the receive;
* ``gloo-pipelined``: 2 gloo ranks, 24 blocks of 64 KiB all posted at once, receives first (as mccl's
  eager driver posts them).

Per direction, Mbit/s of payload and the ratio to the TCP goodput of the shaped rate (1448/1514 of it).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import socket
import sys
import threading
import time
from datetime import timedelta

from mccl.experiments.netemu.fabric import BASE_PREFIX, TCP_SYSCTLS, sweep, unsupported_reason
from mccl.experiments.netemu.ranks import enter_netns
from mccl.experiments.netemu.shaping import GOODPUT, batch, run, shaper_lines

ADDRESSES = ("10.66.0.1", "10.66.0.2")
BLOCK = 256 << 10


def build(prefix: str, mbit: float, gso: int | None) -> tuple[str, str]:
    a, b = f"{prefix}a", f"{prefix}b"
    batch("ip", None, [f"netns add {a}", f"netns add {b}", f"link add eth0 netns {a} type veth peer name eth0 netns {b}"])
    for ns, address in zip((a, b), ADDRESSES, strict=True):
        batch("ip", ns, ["link set lo up", f"addr add {address}/24 dev eth0", "link set eth0 up"]
              + ([f"link set dev eth0 gso_max_size {gso}"] if gso else []))
        batch("tc", ns, shaper_lines("eth0", mbit, add=True))
        run(["ip", "netns", "exec", ns, "sysctl", "-q", "-w", *TCP_SYSCTLS])
    return a, b


# ---- raw TCP ---------------------------------------------------------------------------------
def _tcp_side(namespace: str, me: int, mode: str, both: bool, nbytes: int, results: mp.Queue) -> None:
    """Side ``me`` (0 listens): sends ``nbytes`` if it is side 0 or ``both``; reads what the other sends."""
    enter_netns(namespace)
    payload = b"x" * BLOCK
    sends = me == 0 or both
    receives = me == 1 or both

    def connect(port: int) -> socket.socket:
        if me == 0:
            server = socket.socket()
            server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            server.bind((ADDRESSES[0], port))
            server.listen(1)
            conn, _ = server.accept()
            server.close()
            return conn
        for _ in range(100):
            try:
                return socket.create_connection((ADDRESSES[0], port))
            except OSError:
                time.sleep(0.05)
        raise OSError(f"no connection to {ADDRESSES[0]}:{port}")

    out_sock = connect(5101)
    in_sock = out_sock if mode == "tcp-duplex" else connect(5102)
    if me == 1 and mode != "tcp-duplex":
        out_sock, in_sock = in_sock, out_sock  # side 1 sends on the second connection, reads the first
    received = {"first": None, "last": None}

    def read() -> None:
        got = 0
        while got < nbytes:
            chunk = in_sock.recv(1 << 20)
            if not chunk:
                break
            received["first"] = received["first"] or time.perf_counter()
            got += len(chunk)
        received["last"] = time.perf_counter()

    reader = threading.Thread(target=read) if receives else None
    if reader:
        reader.start()
    if sends:
        sent = 0
        while sent < nbytes:
            out_sock.sendall(payload)
            sent += len(payload)
    if reader:
        reader.join()
        results.put((me, nbytes * 8 / (received["last"] - received["first"]) / 1e6))
    else:
        results.put((me, None))
    time.sleep(0.2)


# ---- gloo ------------------------------------------------------------------------------------
def _gloo_side(namespace: str, me: int, mode: str, both: bool, nbytes: int, results: mp.Queue) -> None:
    enter_netns(namespace)
    os.environ["GLOO_SOCKET_IFNAME"] = "eth0"
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://{ADDRESSES[0]}:29611", rank=me, world_size=2,
                            timeout=timedelta(seconds=120))
    peer = 1 - me
    sends, receives = me == 0 or both, me == 1 or both
    lockstep = mode.startswith("gloo-lockstep")
    block = BLOCK if lockstep else 64 << 10
    count = nbytes // block
    xs = [torch.zeros(block // 4, dtype=torch.int32) for _ in range(count if mode == "gloo-pipelined" else 1)]
    ys = [torch.empty(block // 4, dtype=torch.int32) for _ in range(len(xs))]
    rates = []
    for _ in range(2):
        dist.barrier()
        start = time.perf_counter()
        if lockstep:
            for _ in range(count):
                recv = [dist.irecv(ys[0], peer)] if receives and mode == "gloo-lockstep" else []
                works = recv + ([dist.isend(xs[0], peer)] if sends else [])
                works += [dist.irecv(ys[0], peer)] if receives and not recv else []
                for work in works:
                    work.wait()
        else:
            works = [dist.irecv(ys[i], peer, tag=i) for i in range(count)] if receives else []
            works += [dist.isend(xs[i], peer, tag=i) for i in range(count)] if sends else []
            for work in works:
                work.wait()
        dist.barrier()
        rates.append(count * block * 8 / (time.perf_counter() - start) / 1e6)
    dist.destroy_process_group()
    results.put((me, max(rates) if receives else None))  # the better of two: the first includes connection set-up


def measure(namespaces: tuple[str, str], mode: str, both: bool, nbytes: int) -> float:
    """Mbit/s per direction (the slower direction when both)."""
    context = mp.get_context("spawn")
    results = context.Queue()
    target = _tcp_side if mode.startswith("tcp") else _gloo_side
    processes = [context.Process(target=target, args=(namespaces[me], me, mode, both, nbytes, results), daemon=True)
                 for me in (0, 1)]
    for process in processes:
        process.start()
    values = [results.get(timeout=300) for _ in processes]
    for process in processes:
        process.join(timeout=30)
        if process.is_alive():
            process.kill()
    return min(rate for _, rate in values if rate is not None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mbit", type=float, default=20.0)
    parser.add_argument("--mbytes", type=float, default=6.0, help="per direction and measurement")
    parser.add_argument("--gso", type=int, default=None, help="gso_max_size of the veth ends (default: the kernel's)")
    parser.add_argument("--modes", default="tcp-2sock,tcp-duplex,gloo-lockstep,gloo-pipelined",
                        help="comma-separated, of those and gloo-lockstep-sendfirst")
    args = parser.parse_args()
    reason = unsupported_reason()
    if reason is not None:
        sys.exit(f"netemu: {reason}")
    prefix = f"{BASE_PREFIX}{os.getpid()}-"
    nbytes = int(args.mbytes * 1e6) // BLOCK * BLOCK
    goodput = args.mbit * GOODPUT
    try:
        namespaces = build(prefix, args.mbit, args.gso)
        print(f"one veth, htb {args.mbit:g} Mbit/s both ends (goodput {goodput:.2f}), gso_max_size {args.gso or 'default'}, "
              f"{nbytes / 1e6:.1f} MB per direction; {time.strftime('%H:%M UTC', time.gmtime())}, load {os.getloadavg()[0]:.1f}")
        for mode in args.modes.split(","):
            one = measure(namespaces, mode, False, nbytes)
            both = measure(namespaces, mode, True, nbytes)
            print(f"{mode:<15} one way {one:6.2f} Mbit/s ({one / goodput:.2f})   both ways {both:6.2f} per direction "
                  f"({both / goodput:.2f})", flush=True)
    finally:
        sweep(prefix=prefix)


if __name__ == "__main__":
    main()

"""The compiled rip-up-and-reroute of :mod:`.railadapt`: one rail tree per source, re-chosen around hot links.

Every decision of a rail tree (which host rank receives a source's buffer from outside, which rank
sends it, which rank of a segment is its hub, whether a rank takes it from its host's entry over the
NVSwitch or straight from a sender) takes the option whose links end least loaded (the maximum of
buffers ÷ capacity over the option's links, with every other tree's loads) among the ranks that
already hold the buffer at a bounded level; ties go to the rail hierarchy's own option, then to the
shallower sender, then to the fewer changes, then to the lower rank. (Keeping the rail option
whenever it stays below the fabric's maximum stalls: under Fail2 at 2×8 gpu0's slow NIC carries one
buffer each way, and each direction is "below the maximum" set by the other.) Pass 0 is the rail
hierarchy; each later pass re-chooses every source's tree against the others' loads; passes repeat
until none changes.

Why compiled: a pass weighs about 10⁸ options at 512 GPUs (every holder × every rank of a host);
each is a few array reads.
"""

from __future__ import annotations

import numba
import numpy as np

__all__ = ["reroute"]

_jit = numba.njit(cache=True, nogil=True)
_inline = numba.njit(cache=True, nogil=True, inline="always")
_TOLERANCE = 1e-9


@_inline
def _route_cost(pair: int, add: float, r_off: np.ndarray, r_links: np.ndarray, load: np.ndarray,
                cap: np.ndarray) -> float:
    worst = 0.0
    for i in range(r_off[pair], r_off[pair + 1]):
        link = r_links[i]
        value = (load[link] + add) / cap[link]
        if value > worst:
            worst = value
    return worst


@_inline
def _add_route(pair: int, add: float, r_off: np.ndarray, r_links: np.ndarray, load: np.ndarray) -> None:
    for i in range(r_off[pair], r_off[pair + 1]):
        load[r_links[i]] += add


@_jit
def _spread_cost(entry: int, host: int, n: int, mem_off: np.ndarray, mem: np.ndarray, r_off: np.ndarray,
                 r_links: np.ndarray, load: np.ndarray, cap: np.ndarray, delta: np.ndarray) -> float:
    """Max normalized load if ``entry`` passes the buffer to every other rank of ``host``."""
    for i in range(mem_off[host], mem_off[host + 1]):
        rank = mem[i]
        if rank != entry:
            _add_route(entry * n + rank, 1.0, r_off, r_links, delta)
    worst = 0.0
    for i in range(mem_off[host], mem_off[host + 1]):
        rank = mem[i]
        if rank != entry:
            pair = entry * n + rank
            for j in range(r_off[pair], r_off[pair + 1]):
                link = r_links[j]
                value = (load[link] + delta[link]) / cap[link]
                if value > worst:
                    worst = value
    for i in range(mem_off[host], mem_off[host + 1]):
        rank = mem[i]
        if rank != entry:
            pair = entry * n + rank
            for j in range(r_off[pair], r_off[pair + 1]):
                delta[r_links[j]] = 0.0
    return worst


@_jit
def _better(cost: float, level: int, penalty: int, best_cost: float, best_level: int, best_penalty: int) -> bool:
    if cost < best_cost * (1.0 - _TOLERANCE) - 1e-15:
        return True
    if cost > best_cost * (1.0 + _TOLERANCE) + 1e-15:
        return False
    if (penalty == 0) != (best_penalty == 0):
        return penalty == 0  # the rail hierarchy's own option first
    if level != best_level:
        return level < best_level
    return penalty < best_penalty


@_jit
def _build_root(root: int, structural: bool, n: int, host_of: np.ndarray, mem_off: np.ndarray,
                mem: np.ndarray, seg_off: np.ndarray, seg_hosts: np.ndarray, host_seg: np.ndarray,
                entry_struct: np.ndarray, hub_struct: np.ndarray, nic_out: np.ndarray, r_off: np.ndarray,
                r_links: np.ndarray, load: np.ndarray, cap: np.ndarray, max_level: int, delta: np.ndarray,
                level: np.ndarray, holders: np.ndarray, snd: np.ndarray, rcv: np.ndarray, lvl: np.ndarray) -> None:
    """Root's tree into ``snd/rcv/lvl`` (n − 1 edges) and its loads into ``load``."""
    level[:] = -1
    level[root] = 0
    holders[0] = root
    held = 1
    count = 0
    home = host_of[root]
    for i in range(mem_off[home], mem_off[home + 1]):
        rank = mem[i]
        if rank != root:
            snd[count], rcv[count], lvl[count] = root, rank, 0
            count += 1
            level[rank] = 1
            holders[held] = rank
            held += 1
            _add_route(root * n + rank, 1.0, r_off, r_links, load)
    n_segments = len(seg_off) - 1
    home_segment = host_seg[home]
    hub = root
    for step in range(n_segments):
        segment = (home_segment + step) % n_segments
        first = 0
        if segment != home_segment:
            # the hub: one host of the segment, its entry (from a holder), its NIC forwarding to the others
            hub_host = hub_struct[root, segment]
            s_best, e_best, best_cost, best_level, best_penalty = root, entry_struct[root, hub_host], np.inf, 1 << 30, 1 << 30
            others = float(seg_off[segment + 1] - seg_off[segment] - 1)
            struct_entry = entry_struct[root, hub_host]
            cost = max(_route_cost(root * n + struct_entry, 1.0, r_off, r_links, load, cap),
                       _spread_cost(struct_entry, hub_host, n, mem_off, mem, r_off, r_links, load, cap, delta))
            if nic_out[struct_entry] >= 0:
                cost = max(cost, (load[nic_out[struct_entry]] + others) / cap[nic_out[struct_entry]])
            best_cost, best_level, best_penalty = cost, 0, 0
            if not structural:
                for k in range(seg_off[segment], seg_off[segment + 1]):
                    host = seg_hosts[k]
                    for j in range(mem_off[host], mem_off[host + 1]):
                        entry = mem[j]
                        spread = _spread_cost(entry, host, n, mem_off, mem, r_off, r_links, load, cap, delta)
                        if nic_out[entry] >= 0:
                            spread = max(spread, (load[nic_out[entry]] + others) / cap[nic_out[entry]])
                        if spread > best_cost * (1.0 + _TOLERANCE) + 1e-15:
                            continue
                        for h in range(held):
                            sender = holders[h]
                            if level[sender] > max_level:
                                continue
                            cost = max(spread, _route_cost(sender * n + entry, 1.0, r_off, r_links, load, cap))
                            penalty = (sender != root) * 4 + (host != hub_host) * 2 + (entry != struct_entry)
                            if _better(cost, level[sender], penalty, best_cost, best_level, best_penalty):
                                s_best, e_best, best_cost, best_level, best_penalty = sender, entry, cost, level[sender], penalty
                hub_host = host_of[e_best]
            hub = e_best
            count, held = _deliver(s_best, e_best, hub_host, structural, n, mem_off, mem, r_off, r_links,
                                   load, cap, level, holders, held, snd, rcv, lvl, count)
            first = -1
        # the segment's other hosts (``seg_hosts``: larger hosts first, so a host of one rank can take
        # the buffer from a neighbour that already holds it)
        for k in range(seg_off[segment], seg_off[segment + 1]):
            host = seg_hosts[k]
            if host == home or (first == -1 and host == hub_host):
                continue
            struct_sender = root if segment == home_segment else hub
            struct_entry = entry_struct[root, host]
            s_best, e_best = struct_sender, struct_entry
            cost = max(_route_cost(struct_sender * n + struct_entry, 1.0, r_off, r_links, load, cap),
                       _spread_cost(struct_entry, host, n, mem_off, mem, r_off, r_links, load, cap, delta))
            if not structural:
                best_cost, best_level, best_penalty = cost, level[struct_sender], 0
                for j in range(mem_off[host], mem_off[host + 1]):
                    entry = mem[j]
                    spread = _spread_cost(entry, host, n, mem_off, mem, r_off, r_links, load, cap, delta)
                    if spread > best_cost * (1.0 + _TOLERANCE) + 1e-15:
                        continue
                    for h in range(held):
                        sender = holders[h]
                        if level[sender] > max_level:
                            continue
                        cost = max(spread, _route_cost(sender * n + entry, 1.0, r_off, r_links, load, cap))
                        penalty = (sender != struct_sender) * 2 + (entry != struct_entry)
                        if _better(cost, level[sender], penalty, best_cost, best_level, best_penalty):
                            s_best, e_best, best_cost, best_level, best_penalty = sender, entry, cost, level[sender], penalty
            count, held = _deliver(s_best, e_best, host, structural, n, mem_off, mem, r_off, r_links,
                                   load, cap, level, holders, held, snd, rcv, lvl, count)


@_jit
def _deliver(sender: int, entry: int, host: int, structural: bool, n: int,
             mem_off: np.ndarray, mem: np.ndarray, r_off: np.ndarray, r_links: np.ndarray, load: np.ndarray,
             cap: np.ndarray, level: np.ndarray, holders: np.ndarray, held: int, snd: np.ndarray, rcv: np.ndarray,
             lvl: np.ndarray, count: int) -> tuple[int, int]:
    """``sender → entry``, then every other rank of ``host`` from ``entry`` or, where that is hot, from the
    holder (level ≤ the entry's sender's) whose route is least loaded."""
    snd[count], rcv[count], lvl[count] = sender, entry, level[sender]
    count += 1
    level[entry] = level[sender] + 1
    _add_route(sender * n + entry, 1.0, r_off, r_links, load)
    fresh = held
    holders[held] = entry
    held += 1
    for i in range(mem_off[host], mem_off[host + 1]):
        rank = mem[i]
        if rank == entry:
            continue
        parent = entry
        cost = _route_cost(entry * n + rank, 1.0, r_off, r_links, load, cap)
        if not structural:
            best_level, best_penalty = level[entry], 0
            for h in range(fresh):
                other = holders[h]
                if level[other] > level[entry]:
                    continue
                value = _route_cost(other * n + rank, 1.0, r_off, r_links, load, cap)
                if _better(value, level[other], 1, cost, best_level, best_penalty):
                    parent, cost, best_level, best_penalty = other, value, level[other], 1
        snd[count], rcv[count], lvl[count] = parent, rank, level[parent]
        count += 1
        level[rank] = level[parent] + 1
        holders[held] = rank
        held += 1
        _add_route(parent * n + rank, 1.0, r_off, r_links, load)
    return count, held


@_jit
def reroute(n: int, host_of: np.ndarray, mem_off: np.ndarray, mem: np.ndarray, seg_off: np.ndarray,
            seg_hosts: np.ndarray, host_seg: np.ndarray, entry_struct: np.ndarray, hub_struct: np.ndarray,
            nic_out: np.ndarray, r_off: np.ndarray, r_links: np.ndarray, cap: np.ndarray, max_level: int,
            passes: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]:
    """Every root's tree ``(senders, receivers, sender levels)`` as ``[n, n − 1]`` arrays, link loads, passes run.

    Pass 0 is the rail hierarchy itself; each later pass re-chooses every root's tree against the
    loads of all the others (module docstring) until a pass changes nothing or ``passes`` are run.
    """
    n_links = len(cap)
    load = np.zeros(n_links)
    delta = np.zeros(n_links)
    level = np.empty(n, dtype=np.int64)
    holders = np.empty(n, dtype=np.int64)
    snd = np.empty((n, n - 1), dtype=np.int64)
    rcv = np.empty((n, n - 1), dtype=np.int64)
    lvl = np.empty((n, n - 1), dtype=np.int64)
    new_snd = np.empty(n - 1, dtype=np.int64)
    new_rcv = np.empty(n - 1, dtype=np.int64)
    new_lvl = np.empty(n - 1, dtype=np.int64)
    for root in range(n):
        _build_root(root, True, n, host_of, mem_off, mem, seg_off, seg_hosts, host_seg, entry_struct, hub_struct,
                    nic_out, r_off, r_links, load, cap, max_level, delta, level, holders, snd[root], rcv[root], lvl[root])
    done = 0
    for _ in range(passes):
        done += 1
        changed = False
        for root in range(n):
            for i in range(n - 1):
                _add_route(snd[root, i] * n + rcv[root, i], -1.0, r_off, r_links, load)
            _build_root(root, False, n, host_of, mem_off, mem, seg_off, seg_hosts, host_seg, entry_struct,
                        hub_struct, nic_out, r_off, r_links, load, cap, max_level, delta, level, holders,
                        new_snd, new_rcv, new_lvl)
            for i in range(n - 1):
                if new_snd[i] != snd[root, i] or new_rcv[i] != rcv[root, i]:
                    changed = True
                snd[root, i], rcv[root, i], lvl[root, i] = new_snd[i], new_rcv[i], new_lvl[i]
        if not changed:
            break
    return snd, rcv, lvl, load, done

"""The packing checks: Phase 3's with most sinks proven without a max-flow, Phase 2's as one rooted cut.

Phase 2 (:func:`packing_ok`: does the whole forest, ``need`` = Σ k trees into every rank, fit the
split?) asks the rooted minimum cut of :mod:`.rootcut` once; the rules below do not help there (at
need = n·k no host split carries n·k: 31 flows for 32 ranks, BENCHMARKS.md third session).
Phase 3 (:func:`packs`, issue 17: 2048 GPUs) asks it of the residual many times, with small
``need``, where the rules prove most sinks and one rooted cut over the ranks they leave decides
the rest (fifth session; before, one OR-Tools max-flow per such rank, ~100 per check at 2048):

The trees still to pack fit the residual iff every rank v has ``maxflow(s*, v) >= need``
(s* → r of capacity ``untouched[r]``, need = Σ untouched; :mod:`.arborescence`). Asked
naively that is n max-flows per check, and late in the packing every one of them is tight
(each host's ingress is its cut and it is exactly spent), so OR-Tools pays its full
work n times: 2 s per check at 1024 GPUs, ~15 s at 2048, two checks per stuck root.

Most sinks follow from the ones already proven. Let S be the proven ranks plus s*:

* **rank rule**: if ``c(S → u) >= need`` then ``maxflow(s*, u) >= need``. A cut X ∋ u
  (s* ∉ X) either meets S — then it is at least the max-flow to a proven rank — or every
  arc from S into u enters it.
* **host rule**: for a host H whose every split (a non-empty proper subset Z of H:
  ``c(H \\ Z → Z)``) carries ``>= need``, with unproven members T: if one member is proven,
  or ``c(S → T) >= need``, all of T is. A cut X meeting T but not S either holds all of T
  (then H has no proven member and every arc from S into T enters X) or splits H (then the
  arcs of H across the split enter it).

The ranks no rule reaches are the candidate sinks of one rooted minimum cut (Hao–Orlin,
:mod:`.rootcut`: the least ``maxflow(s*, v)`` over them, in about one max-flow's work, deciding
against ``need`` so that a failing check stops at its first failing sink). The proven ranks stay
in its network as ordinary nodes, so the verdict is exactly the definition's (the tests compare it
with a max-flow per rank). Hosts bigger than ``_SPLIT_LIMIT`` ranks skip the host rule (2^size splits).
"""

from __future__ import annotations

import numba
import numpy as np

from mccl.synth.maxflow import FlowNet
from mccl.synth.treepack.rootcut import rooted_min_cut

__all__ = ["packing_ok", "packing_ok_by_flows", "packs", "prove"]

_jit = numba.njit(cache=True, nogil=True)
_SPLIT_LIMIT = 12


@_jit
def _host_splits(members: np.ndarray, member_start: np.ndarray, tails: np.ndarray, heads: np.ndarray,
                 residual: np.ndarray, position: np.ndarray, host: np.ndarray, limit: int) -> np.ndarray:
    """Per host, the least capacity of its arcs across any split (``c(H \\ Z → Z)``, Z non-empty proper;
    -1 for a host above ``limit`` ranks, unbounded for a single rank)."""
    n_hosts = len(member_start) - 1
    out = np.zeros(n_hosts, dtype=np.int64)
    size_of = member_start[1:] - member_start[:-1]
    biggest = size_of.max() if n_hosts else 0
    dim = max(min(biggest, limit), 1)
    cap = np.zeros((n_hosts, dim, dim), dtype=np.int64)
    for arc in range(len(tails)):
        u, v = tails[arc], heads[arc]
        if host[u] == host[v] and size_of[host[u]] <= limit:
            cap[host[u], position[u], position[v]] += residual[arc]
    for h in range(n_hosts):
        size = size_of[h]
        if size > limit:
            out[h] = -1
            continue
        if size <= 1:
            out[h] = 1 << 62
            continue
        least = 1 << 62
        for mask in range(1, (1 << size) - 1):
            total = 0
            for a in range(size):
                if mask >> a & 1:
                    continue
                for b in range(size):
                    if mask >> b & 1:
                        total += cap[h, a, b]
            if total < least:
                least = total
        out[h] = least
    return out


@_jit
def prove(start_nodes: np.ndarray, proven: np.ndarray, into: np.ndarray, host_in: np.ndarray,
           host_ok: np.ndarray, out_start: np.ndarray, out_arc: np.ndarray, heads: np.ndarray,
           residual: np.ndarray, host: np.ndarray, members: np.ndarray, member_start: np.ndarray,
           need: int) -> int:
    """Mark ``start_nodes`` proven and everything the two rules then reach; how many ranks became proven."""
    stack = np.empty(len(proven) + len(start_nodes), dtype=np.int64)
    size = 0
    for v in start_nodes:
        if not proven[v]:
            proven[v] = True
            host_in[host[v]] -= into[v]
            stack[size] = v
            size += 1
    done = size
    while size:
        size -= 1
        w = stack[size]
        h = host[w]
        if host_ok[h]:  # a proven rank of a host whose every split carries ``need`` proves the host
            for i in range(member_start[h], member_start[h + 1]):
                x = members[i]
                if not proven[x]:
                    proven[x] = True
                    host_in[h] -= into[x]
                    stack[size] = x
                    size += 1
                    done += 1
        for position in range(out_start[w], out_start[w + 1]):
            arc = out_arc[position]
            u = heads[arc]
            if proven[u]:
                continue
            into[u] += residual[arc]
            g = host[u]
            host_in[g] += residual[arc]
            if into[u] >= need or (host_ok[g] and host_in[g] >= need):
                proven[u] = True
                host_in[g] -= into[u]
                stack[size] = u
                size += 1
                done += 1
    return done


def packs(n: int, tails: np.ndarray, heads: np.ndarray, residual: np.ndarray, untouched: np.ndarray,
          host: np.ndarray) -> tuple[bool, int]:
    """Whether the untouched roots' trees still fit (module docstring), and the solves that took (0: the
    rules proved every rank; 1: one rooted cut).

    ``host``: each rank's host 0, 1, … (:func:`~.growkernel.host_index`).
    """
    need = int(untouched.sum())
    if need == 0:
        return True, 0
    positive = residual > 0  # late in the packing most arcs are spent; neither the solver nor the rules need them
    arc_tail, arc_head, arc_cap = tails[positive], heads[positive], residual[positive]
    out_arc = np.argsort(arc_tail, kind="stable").astype(np.int64)
    out_start = np.searchsorted(arc_tail[out_arc], np.arange(n + 1)).astype(np.int64)
    members = np.argsort(host, kind="stable").astype(np.int64)
    member_start = np.searchsorted(host[members], np.arange(int(host.max()) + 2)).astype(np.int64)
    position = np.empty(n, dtype=np.int64)
    position[members] = np.arange(n) - member_start[host[members]]
    splits = _host_splits(members, member_start, arc_tail, arc_head, arc_cap, position, host, _SPLIT_LIMIT)
    host_ok = splits >= need
    into = np.asarray(untouched, dtype=np.int64).copy()  # c(S → u), S = {s*} so far
    host_in = np.bincount(host, weights=into, minlength=len(member_start) - 1).astype(np.int64)
    proven = np.zeros(n, dtype=np.bool_)
    full = host_ok & (host_in >= need)  # the host rule with S = {s*}
    seeds = np.flatnonzero((into >= need) | full[host]).astype(np.int64)
    prove(seeds, proven, into, host_in, host_ok, out_start, out_arc, arc_head, arc_cap, host, members,
           member_start, need)
    unproven = ~proven
    if not unproven.any():
        return True, 0
    # The rest in one rooted minimum cut over the unproven ranks (:mod:`.rootcut`): the least
    # maxflow(s*, v) over them, stopping at the first below ``need``; about one max-flow's work.
    tails_all = np.concatenate([arc_tail, np.full(n, n, dtype=np.int64)])
    heads_all = np.concatenate([arc_head, np.arange(n, dtype=np.int64)])
    caps_all = np.concatenate([arc_cap, np.asarray(untouched, dtype=np.int64)])
    candidates = np.concatenate([unproven, [False]])
    try:
        return rooted_min_cut(n + 1, n, tails_all, heads_all, caps_all, candidates, need=need).value >= need, 1
    except ArithmeticError:  # the label guard of :mod:`.rootcut` (never seen): a max-flow per unproven rank
        return _packs_by_flows(n, arc_tail, arc_head, arc_cap, untouched, np.flatnonzero(unproven), need)


def _packs_by_flows(n: int, tails: np.ndarray, heads: np.ndarray, caps: np.ndarray, untouched: np.ndarray,
                    sinks: np.ndarray, need: int) -> tuple[bool, int]:
    """``maxflow(s*, v) >= need`` for each of ``sinks``, one OR-Tools max-flow each (the fallback)."""
    net = FlowNet(n + 1)
    net.add_arcs(tails, heads, caps)
    net.add_arcs(np.full(n, n), np.arange(n), untouched)
    for solves, v in enumerate(sinks.tolist(), start=1):
        if net.max_flow(n, v) < need:
            return False, solves
    return True, len(sinks)


def packing_ok(n_nodes: int, n_ranks: int, tail: np.ndarray, head: np.ndarray, caps: np.ndarray,
               k: int | np.ndarray) -> bool:
    """Phase 2's condition: ``maxflow(s*, v) >= Σ k`` for every rank v (s* feeds rank r its k[r] trees;
    k may be uniform), as one rooted minimum cut (:mod:`.rootcut`, Hao–Orlin) instead of n max-flows.

    Nodes ``0 … n_ranks-1`` are the ranks, ``n_ranks … n_nodes-1`` switches (never sinks), s* is
    node ``n_nodes`` (arcs into it, a switch's drained excess, carry nothing from it). Exactly
    :func:`packing_ok_by_flows`' answer (tests compare them), at 2,048 GPUs in ≈ one max-flow's time.
    """
    demand = np.broadcast_to(np.asarray(k, dtype=np.int64), (n_ranks,))
    need = int(demand.sum())
    source = n_nodes
    tails = np.concatenate([np.asarray(tail, dtype=np.int64), np.full(n_ranks, source, dtype=np.int64)])
    heads = np.concatenate([np.asarray(head, dtype=np.int64), np.arange(n_ranks, dtype=np.int64)])
    capacities = np.concatenate([np.asarray(caps, dtype=np.int64), demand])
    candidates = np.zeros(n_nodes + 1, dtype=np.bool_)
    candidates[:n_ranks] = True
    try:
        return rooted_min_cut(n_nodes + 1, source, tails, heads, capacities, candidates, need=need).value >= need
    except ArithmeticError:  # the label guard of :mod:`.rootcut` (never seen): the n max-flows decide
        return packing_ok_by_flows(n_nodes, n_ranks, tail, head, caps, k)


def packing_ok_by_flows(n_nodes: int, n_ranks: int, tail: np.ndarray, head: np.ndarray, caps: np.ndarray,
                        k: int | np.ndarray) -> bool:
    """:func:`packing_ok` by one OR-Tools max-flow per rank (the former check; the tests' reference)."""
    demand = np.broadcast_to(np.asarray(k, dtype=np.int64), (n_ranks,))
    net = FlowNet(n_nodes + 1)
    source = n_nodes
    net.add_arcs(tail, head, caps)
    net.add_arcs(np.full(n_ranks, source), np.arange(n_ranks), demand)
    need = int(demand.sum())
    return all(net.max_flow(source, v) >= need for v in range(n_ranks))

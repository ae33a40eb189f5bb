"""Phase 3: k spanning out-trees (arborescences) per rank on the logical graph.

Edmonds' branching theorem with root sets: groups of trees ``j`` (``m_j`` identical
partial trees with vertex set ``R_j``) extend to spanning arborescences within the
residual integer capacities c iff every non-empty rank set X has
``c_in(X) >= Σ_{j : R_j ∩ X = ∅} m_j``. With a super-source s* and one node t_j
per group (``s* → t_j`` of capacity m_j, ``t_j → R_j`` unbounded) that is
``maxflow(s*, v) >= M = Σ m_j`` for every rank v (Phase 2 ends with this check).

Growing group i by μ copies of an arc ``u → v`` (u ∈ R_i, v ∉ R_i) only tightens
the sets X ∋ v, u ∉ X that meet R_i, by μ. So the largest safe μ is
``min(m_i, c_uv, F - M + m_i)`` with F the max-flow from s* (plus an unbounded
arc s* → u) to v in the network *without* group i's node: sets that miss R_i get
m_i of headroom for free there (proof in the design notes of issue 3). When
μ < m_i the group splits: μ copies take the arc, the other ``m_i - μ`` wait on a
stack (integral multiplicities, as ForestColl's packing). The first arc of a group
(R = {root}) needs no max-flow: no X can meet R without containing u.

That exact rule costs one max-flow per arc added (n·(n-1)·groups in all), so it is
the fallback. The packing runs in optimistic batches instead: the next roots' trees
grow greedily (:mod:`.greedy`, no max-flow), then n max-flows prove that every root
still to come can be packed in what is left (the theorem above with untouched roots
only). A batch that passes is kept and the next one is twice as large (the first
has 16 roots: early on there is slack everywhere); one that fails is rolled back and
retried smaller, then with a few randomized greedy orders, and only then is one root
grown arc by arc with the exact rule. Roots
go host by host in turn, so that no host's egress is spent on relays before its own
roots' trees leave it. On HPN fabrics the exact rule is needed for about one root.

Each exact-rule root gets its own network: logical arcs at their residual capacity,
group nodes added as groups split. Candidate arcs come from a heap: the previous
tree's arcs first (warm start), then by capacity (throughput) or by the depth of u
within a capacity class (latency-aware); an arc refused is retried only when
nothing else is left.

Warm budget: the previous trees' arcs (``prefer``) are only an ordering, and a bad one
when the previous fabric differed where it matters (trees made for a degraded fabric
relay around its faults, spending other hosts' egress that the healthy fabric's roots
need): their greedy batches fail the check again and again and end in the exact rule,
one max-flow per arc (512 GPUs, Fail2 → healthy: 539 s against cold's ~30 s). So the
preference lasts until the first batch that fails; then the packing starts over cold,
from the full capacities (the third value returned; ``warm_prefer_dropped`` in the
stats). Restarting, not going on cold from the trees the preference grew: those
passed the check, yet left a residual where even the cold greedy kept failing (512
GPUs: 8 roots by the exact rule, against cold's 1). So a misled warm packing costs
the preferred prefix plus exactly cold's packing, and returns cold's trees.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Set

import numpy as np

from mccl.errors import SynthesisError
from mccl.synth.maxflow import BIG, FlowNet
from mccl.synth.treepack.greedy import GreedyGrower
from mccl.synth.treepack.tree import Tree

__all__ = ["Tree", "pack_arborescences"]


def pack_arborescences(
    n: int,
    units: dict[tuple[int, int], int],
    k: int,
    *,
    latency_aware: bool = False,
    prefer: Callable[[int], Set[tuple[int, int]]] | None = None,
    first_batch: int = 16,
    greedy_retries: int = 3,
    root_seed: int = 0,
    groups: np.ndarray | None = None,
    demand: np.ndarray | None = None,
) -> tuple[list[Tree], int, bool]:
    """k spanning out-trees per rank within ``units``; the trees, the max-flows used, and whether
    ``prefer`` was dropped (the warm budget of the module docstring).

    ``prefer(root)``: arcs to try first for that root's trees (warm start), until a batch fails.
    """
    keys = list(units)
    out: list[list[int]] = [[] for _ in range(n)]
    for index, (u, _) in enumerate(keys):
        out[u].append(index)
    residual = np.array([units[key] for key in keys], dtype=np.int64)
    tails = np.array([u for u, _ in keys], dtype=np.int64)
    heads = np.array([v for _, v in keys], dtype=np.int64)
    untouched = np.full(n, k, dtype=np.int64) if demand is None else np.asarray(demand, dtype=np.int64).copy()
    wanted = untouched.copy()
    trees: list[Tree] = []
    solves = 0
    grower = GreedyGrower(n, tails, heads, latency_aware)
    index_of = {key: i for i, key in enumerate(keys)}
    order = _interleaved(n, groups)
    root, batch, retries = 0, first_batch, 0
    rng = np.random.default_rng(root_seed)
    dropped = False
    initial = (residual.copy(), untouched.copy())
    while root < n:
        # Optimistic batch: grow the next roots' trees greedily (no checks), then prove the rest
        # still packs with n max-flows; on failure roll back and retry smaller, then with a few
        # randomized orders, and only then grow one root with every arc checked.
        roots = order[root:min(n, root + batch)]
        saved = (residual.copy(), untouched.copy())
        greedy: list[Tree] = []
        stalled = False
        grower.jitter = rng if retries else None
        for r in roots:
            untouched[r] = 0
            if wanted[r] == 0:
                continue
            grown = grower.grow_root(r, int(wanted[r]), residual, _mask(prefer, r, index_of, len(keys)))
            if grown is None:
                stalled = True
                break
            greedy.extend(grown)
        if not stalled:
            ok, used = _packs(n, tails, heads, residual, untouched)
            solves += used
            stalled = not ok
        if not stalled:
            trees.extend(greedy)
            root += len(roots)
            batch *= 2
            retries = 0
            continue
        residual[:], untouched[:] = saved
        if prefer is not None:  # the warm budget (module docstring): start over, cold
            prefer, dropped = None, True
            residual[:], untouched[:] = initial
            trees, root, batch, retries = [], 0, first_batch, 0
            rng = np.random.default_rng(root_seed)
            continue
        if batch > 1:
            batch = max(1, batch // 4)
            continue
        if retries < greedy_retries:
            retries += 1
            continue
        retries = 0
        trees.extend(_checked_root(order[root], n, int(wanted[order[root]]), keys, out, tails, heads, residual, untouched,
                                   latency_aware, prefer))
        solves += _checked_root.solves  # type: ignore[attr-defined]
        root += 1
    return trees, solves, dropped


def _interleaved(n: int, groups: np.ndarray | None) -> list[int]:
    """Roots host by host in turn (first rank of every host, then the second, ...).

    A host's egress must carry its own roots' trees out; packed last, a host's roots find
    it spent on relays of earlier trees. Interleaving spreads that demand over the packing.
    """
    if groups is None:
        return list(range(n))
    seen: dict[int, int] = {}
    position = []
    for rank in range(n):
        group = int(groups[rank]) if groups[rank] >= 0 else -1 - rank
        position.append((seen.get(group, 0), group, rank))
        seen[group] = seen.get(group, 0) + 1
    return [rank for _, _, rank in sorted(position)]


def _mask(prefer: Callable[[int], Set[tuple[int, int]]] | None, root: int, index_of: dict[tuple[int, int], int],
          n_arcs: int) -> np.ndarray:
    """The previous tree's arcs for ``root`` as a mask over the logical arcs."""
    mask = np.zeros(n_arcs, dtype=bool)
    if prefer is not None:
        for key in prefer(root):
            index = index_of.get(key)
            if index is not None:
                mask[index] = True
    return mask


def _packs(n: int, tails: np.ndarray, heads: np.ndarray, residual: np.ndarray,
           untouched: np.ndarray) -> tuple[bool, int]:
    """Whether the untouched roots' trees still fit (``maxflow(s*, v) >= Σ untouched`` for every v),
    and the max-flows that took."""
    need = int(untouched.sum())
    if need == 0:
        return True, 0
    net = FlowNet(n + 1)
    net.add_arcs(tails, heads, residual)
    net.add_arcs(np.full(n, n), np.arange(n), untouched)
    ok = all(net.max_flow(n, v) >= need for v in range(n))
    return ok, net.solves


def _checked_root(root: int, n: int, k: int, keys: list[tuple[int, int]], out: list[list[int]],
                  tails: np.ndarray, heads: np.ndarray, residual: np.ndarray, untouched: np.ndarray,
                  latency_aware: bool, prefer: Callable[[int], Set[tuple[int, int]]] | None) -> list[Tree]:
    """One root's k trees, every arc checked by the max-flow of the module docstring."""
    if k == 0:
        untouched[root] = 0
        _checked_root.solves = 0  # type: ignore[attr-defined]
        return []
    preferred = prefer(root) if prefer is not None else frozenset()
    untouched[root] = 0
    total = int(untouched.sum()) + k
    net = FlowNet(n + 1)
    arc_ids = net.add_arcs(tails, heads, residual)
    source_arcs = net.add_arcs(np.full(n, n), np.arange(n), untouched)
    stack: list[tuple[Tree, int | None]] = [(Tree(root, k, depth={root: 0}), None)]
    trees = []
    while stack:
        tree, group_arc = stack.pop()
        if group_arc is not None:
            net.set_capacity(group_arc, 0)  # the group being grown leaves the network
        if not _grow(tree, n, keys, out, residual, net, arc_ids, source_arcs, untouched, total,
                     latency_aware, preferred, stack):
            raise SynthesisError(f"tree packing stalled for root rank {tree.root} with {len(tree.depth)} of {n} "
                                 "ranks reached; the logical graph lost the cut condition (a bug)")
        total -= tree.multiplicity
        trees.append(tree)
    _checked_root.solves = net.solves  # type: ignore[attr-defined]
    return trees


def _grow(tree: Tree, n: int, keys: list[tuple[int, int]], out: list[list[int]], residual: np.ndarray,
          net: FlowNet | None, arc_ids: np.ndarray | None, source_arcs: np.ndarray | None,
          untouched: np.ndarray, total: int, latency_aware: bool, preferred: Set[tuple[int, int]],
          stack: list) -> bool:
    """Grow one group until it spans all ranks, splitting off remainders onto ``stack``.

    With ``net`` None, greedily (μ = min(m, c_uv)); False when no arc is left to grow by.
    """
    heap: list[tuple[tuple, int]] = []

    def push_from(u: int) -> None:
        for index in out[u]:
            v = keys[index][1]
            if v in tree.depth or residual[index] == 0:
                continue
            warm = 0 if keys[index] in preferred else 1
            cap = int(residual[index])
            # Latency-aware: among arcs of the same capacity class (a power of two), the shallowest first.
            order = (-cap.bit_length(), tree.depth[u], -cap) if latency_aware else (-cap, tree.depth[u])
            heapq.heappush(heap, ((warm, *order, index), index))

    for u in tree.depth:
        push_from(u)
    failed: list[tuple[tuple, int]] = []
    grown = False  # whether the tree grew since the failed arcs were last retried
    while len(tree.depth) < n:
        if not heap:
            # An arc refused now may fit once the tree holds more ranks: retry the refused ones lazily,
            # only when nothing else is left (each retry costs a max-flow).
            if not failed or not grown:
                return False
            for again in failed:
                heapq.heappush(heap, again)
            failed.clear()
            grown = False
            continue
        item = heapq.heappop(heap)
        index = item[1]
        u, v = keys[index]
        if v in tree.depth or residual[index] == 0:
            continue
        m = tree.multiplicity
        mu = min(m, int(residual[index]))
        if net is not None and len(tree.depth) > 1:
            saved = int(untouched[u])
            net.set_capacity(source_arcs[u], BIG)
            flow = net.max_flow(n, v)
            net.set_capacity(source_arcs[u], saved)
            mu = min(mu, flow - total + m)
        if mu <= 0:
            failed.append(item)
            continue
        if mu < m:
            rest = Tree(tree.root, m - mu, list(tree.edges), dict(tree.depth), tree.preferred)
            group_arc = None
            if net is not None:
                node = net.n_nodes
                group_arc = net.add_arc(n, node, m - mu)
                members = np.fromiter(rest.depth, dtype=np.int64)
                net.add_arcs(np.full(len(members), node), members, np.full(len(members), BIG))
            stack.append((rest, group_arc))
            tree.multiplicity = mu
        residual[index] -= mu
        if net is not None:
            net.set_capacity(arc_ids[index], int(residual[index]))
        tree.depth[v] = tree.depth[u] + 1
        tree.edges.append((u, v))
        tree.preferred += (u, v) in preferred
        push_from(v)
        grown = True
    return True

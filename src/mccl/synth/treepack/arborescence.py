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
the fallback. The packing is optimistic instead (issue 17: checks only where needed):

1. every root, host by host in turn (so that no host's egress is spent on relays before
   its own roots' trees leave it), grows its trees with the compiled guarded greedy
   (:mod:`.growkernel`, no max-flow). Its guard refuses arcs that would break the
   condition above for sets it tracks cheaply (each host's egress against its untouched
   roots, each pending group's partial tree), so it rarely paints itself into a corner;
2. only if a root gets stuck: it is regrown with randomized greedy orders until one
   passes the check (:mod:`.packcheck`: ``maxflow(s*, v) >= M`` for every rank, most ranks
   proven by a rank or a host rule instead of a max-flow; one check passing proves the
   prefix and that root). If none does, the last prefix of roots after which the rest
   still packs (each check one rooted cut after the rules, stopping at the first rank it
   fails) is found by backing off from the stall 0, 1, 2, 4, … roots and
   bisecting — the grown roots are released and re-applied, not regrown;
3. the root after that prefix is grown greedily with its result checked, then with a
   few randomized greedy orders, then with the exact rule; and step 1 resumes after it.

Healthy rail-optimized fabrics get stuck only in the last few roots (1024 GPUs: 17
stuck roots, 12 past with a randomized order, the last 5 by the exact rule, whose flows
are then capped augmenting paths, :mod:`.smallflow`). Max-flows see only arcs with units
left (late in the packing most are spent). Trees are arrays (:class:`~.treeset.TreeSet`).

Each exact-rule root gets its own network: logical arcs at their residual capacity,
group nodes added as groups split. Candidate arcs come from a heap: the previous
tree's arcs first (warm start), then by capacity (throughput) or by the depth of u
within a capacity class (latency-aware); an arc refused is retried only when
nothing else is left.

Warm budget: the previous trees' arcs (``prefer``) are only an ordering, and a bad one
when the previous fabric differed where it matters (trees made for a degraded fabric
relay around its faults, spending other hosts' egress that the healthy fabric's roots
need): their greedy trees fail the check again and again and end in the exact rule,
one max-flow per arc (512 GPUs, Fail2 → healthy: 539 s against cold's ~30 s). So the
preference lasts until the greedy first gets stuck; then the packing starts over cold,
from the full capacities (the third value returned; ``warm_prefer_dropped`` in the
stats). Restarting, not going on cold from the trees the preference grew: those
passed the check, yet left a residual where even the cold greedy kept failing (512
GPUs: 8 roots by the exact rule, against cold's 1). So a misled warm packing costs
the preferred prefix plus exactly cold's packing, and returns cold's trees.
"""

from __future__ import annotations

from collections.abc import Callable, Set

import numpy as np

from mccl.synth.treepack.exactrule import checked_root
from mccl.synth.treepack.growkernel import FastGrower, GrownRoot
from mccl.synth.treepack.packcheck import packs
from mccl.synth.treepack.tree import Tree
from mccl.synth.treepack.treeset import TreeSet

__all__ = ["Tree", "TreeSet", "pack_arborescences"]


def pack_arborescences(
    n: int,
    units: dict[tuple[int, int], int],
    k: int,
    *,
    latency_aware: bool = False,
    prefer: Callable[[int], Set[tuple[int, int]]] | None = None,
    greedy_retries: int = 8,
    root_seed: int = 0,
    groups: np.ndarray | None = None,
    demand: np.ndarray | None = None,
) -> tuple[TreeSet, int, bool]:
    """k spanning out-trees per rank within ``units`` (``demand``: per rank instead); the trees, the
    max-flows used, and whether ``prefer`` was dropped (the warm budget of the module docstring).

    ``prefer(root)``: arcs to try first for that root's trees (warm start), until the greedy stalls.
    """
    keys = list(units)
    residual = np.fromiter(units.values(), dtype=np.int64, count=len(keys))
    pairs = np.array(keys, dtype=np.int64).reshape(len(keys), 2)
    tails, heads = pairs[:, 0].copy(), pairs[:, 1].copy()
    wanted = np.full(n, k, dtype=np.int64) if demand is None else np.asarray(demand, dtype=np.int64).copy()
    packer = _Packer(n, keys, tails, heads, residual, wanted, latency_aware, prefer, groups)
    rng = np.random.default_rng(root_seed)
    position = 0
    while position < n:
        stalled = packer.optimistic(position)
        if stalled is None:
            break
        if packer.prefer is not None:  # the warm budget (module docstring): start over, cold
            packer.prefix(0)
            packer.prefer, packer.dropped = None, True
            position = 0
            continue
        # The greedy got stuck on the root at ``stalled``. Usually the prefix before it still packs and a
        # randomized order gets past it: one check proves both. Else find the last prefix that still packs,
        # then get past the root after it with randomized greedy orders or, failing those, the exact rule.
        if packer.randomized_root(stalled, greedy_retries, rng):
            position = stalled + 1
            continue
        boundary = packer.last_packing_prefix(position, stalled)
        packer.prefix(boundary)
        packer.careful_root(boundary, greedy_retries if boundary < stalled else 0, rng)
        position = boundary + 1
    packer.prefix(n)
    return packer.tree_set(), packer.solves, packer.dropped


class _Packer:
    """The packing's state: the roots grown so far in ``order`` and the residual they leave.

    ``grown[i]`` is the i-th root's groups (None: no trees wanted); :meth:`prefix` moves the residual
    to "the first p roots applied" by releasing or re-applying grown roots (no regrowth needed).
    """

    def __init__(self, n: int, keys: list[tuple[int, int]], tails: np.ndarray, heads: np.ndarray,
                 residual: np.ndarray, wanted: np.ndarray, latency_aware: bool,
                 prefer: Callable[[int], Set[tuple[int, int]]] | None, groups: np.ndarray | None) -> None:
        self.n, self.keys, self.tails, self.heads = n, keys, tails, heads
        self.residual, self.wanted = residual, wanted
        self.latency_aware, self.prefer, self.dropped = latency_aware, prefer, False
        by_tail = np.argsort(tails, kind="stable")  # each rank's out-arcs, ascending ids (the exact rule's order)
        self.out: list[np.ndarray] = np.split(by_tail, np.cumsum(np.bincount(tails, minlength=n))[:-1])
        self._index_of: dict[tuple[int, int], int] | None = None  # built when first needed (a warm or exact root)
        self._no_preference = np.zeros(len(keys), dtype=bool)  # the mask of a cold root, shared (read only)
        self.grower = FastGrower(n, tails, heads, latency_aware, groups)
        self.order = _interleaved(n, groups)
        self.grown: list[GrownRoot | None] = []
        self.applied = 0  # how many of ``grown`` are in the residual
        self.solves = 0

    def untouched(self) -> np.ndarray:
        """Trees still wanted by the roots not yet applied."""
        untouched = self.wanted.copy()
        untouched[self.order[:self.applied]] = 0
        return untouched

    def prefix(self, count: int, *, keep: bool = False) -> None:
        """Residual as if exactly the first ``count`` grown roots were packed (releasing or re-applying
        grown roots, no regrowth); the roots beyond are forgotten unless ``keep``."""
        while self.applied > count:
            self.applied -= 1
            grown = self.grown[self.applied]
            if grown is not None:
                grown.release(self.residual)
                self.grower.released()
        while self.applied < min(count, len(self.grown)):
            grown = self.grown[self.applied]
            if grown is not None:
                grown.take(self.residual)
            self.applied += 1
        if not keep:
            del self.grown[count:]

    def optimistic(self, position: int) -> int | None:
        """Grow every root from ``position`` on greedily, no check; None, or where it got stuck."""
        self.prefix(position)
        untouched = self.untouched()
        reserve = self.grower.reserve(untouched)
        for index in range(position, self.n):
            root = self.order[index]
            reserve[self.grower.host[root]] -= untouched[root]
            untouched[root] = 0
            if self.wanted[root] == 0:
                self.grown.append(None)
                self.applied += 1
                continue
            grown = self.grower.grow_root(root, int(self.wanted[root]), self.residual, self._mask(root),
                                          untouched=untouched, reserve=reserve)
            if grown is None:
                return index
            self.grown.append(grown)
            self.applied += 1
        return None

    def last_packing_prefix(self, lowest: int, stalled: int) -> int:
        """The largest p in [lowest, stalled] whose prefix provably packs (``lowest``'s does).

        Backs off from the stall by 0, 1, 2, 4, … roots, then bisects between the last prefix that
        failed and the first that passed: ``log`` checks rather than one per root.
        """
        failed = stalled + 1
        step = 0
        good = lowest
        while True:
            probe = stalled - step
            if probe <= lowest:
                break
            if self._packs_at(probe):
                good = probe
                break
            failed = probe
            step = 1 if step == 0 else 2 * step
        while failed - good > 1:
            probe = (good + failed) // 2
            if self._packs_at(probe):
                good = probe
            else:
                failed = probe
        return good

    def randomized_root(self, index: int, retries: int, rng: np.random.Generator) -> bool:
        """Grow the root at ``index`` (after the first ``index`` roots, not proven to pack) with randomized
        greedy orders until one passes the check, which proves the prefix and it; whether one did."""
        root = self.order[index]
        self.prefix(index)
        want = int(self.wanted[root])
        untouched = self.untouched()
        untouched[root] = 0
        reserve = self.grower.reserve(untouched)
        for _ in range(retries):
            grown = self.grower.grow_root(root, want, self.residual, self._mask(root), int(rng.integers(2**31)),
                                          untouched, reserve)
            if grown is None:
                continue
            self.grown.append(grown)
            self.applied += 1
            if self._packs_now():
                return True
            self.prefix(index)
        return False

    def careful_root(self, index: int, retries: int, rng: np.random.Generator) -> None:
        """Pack the root at ``index`` (the prefix before it packs) so that the rest still packs."""
        root = self.order[index]
        self.prefix(index)
        want = int(self.wanted[root])
        if want == 0:
            self.grown.append(None)
            self.applied += 1
            return
        untouched = self.untouched()
        untouched[root] = 0
        reserve = self.grower.reserve(untouched)
        for attempt in range(1 + retries):
            seed = -1 if attempt == 0 else int(rng.integers(2**31))
            grown = self.grower.grow_root(root, want, self.residual, self._mask(root), seed, untouched, reserve)
            if grown is None:
                continue
            self.grown.append(grown)
            self.applied += 1
            if self._packs_now():
                return
            self.prefix(index)
        untouched = self.untouched()
        trees = checked_root(root, self.n, want, self.keys, self.out, self.tails, self.heads, self.residual,
                              untouched, self.latency_aware, self.prefer(root) if self.prefer else None)
        self.solves += checked_root.solves  # type: ignore[attr-defined]
        self.grown.append(_as_grown(root, trees, self.index_of, self.n))
        self.applied += 1

    def _packs_at(self, count: int) -> bool:
        self.prefix(count, keep=True)
        return self._packs_now()

    def _packs_now(self) -> bool:
        ok, used = packs(self.n, self.tails, self.heads, self.residual, self.untouched(), self.grower.host)
        self.solves += used
        return ok

    @property
    def index_of(self) -> dict[tuple[int, int], int]:
        """Each logical arc's id (1 M arcs under Fail1 at 1,024 GPUs: built only for a warm or an exact root)."""
        if self._index_of is None:
            self._index_of = {key: i for i, key in enumerate(self.keys)}
        return self._index_of

    def _mask(self, root: int) -> np.ndarray:
        if self.prefer is None:
            return self._no_preference
        return _mask(self.prefer, root, self.index_of, len(self.keys))

    def tree_set(self) -> TreeSet:
        done = [grown for grown in self.grown[:self.applied] if grown is not None]
        edges = max(self.n - 1, 0)
        if not done:
            empty = np.zeros(0, dtype=np.int64)
            return TreeSet(self.n, empty, empty, np.zeros((0, edges), dtype=np.int64),
                           np.zeros((0, self.n), dtype=np.int32), self.tails, self.heads)
        return TreeSet(self.n, np.concatenate([np.full(len(g.multiplicity), g.root) for g in done]),
                       np.concatenate([g.multiplicity for g in done]), np.concatenate([g.arcs for g in done]),
                       np.concatenate([g.depth for g in done]), self.tails, self.heads)


def _as_grown(root: int, trees: list[Tree], index_of: dict[tuple[int, int], int], n: int) -> GrownRoot:
    """The exact rule's :class:`Tree` groups as arrays."""
    arcs = np.array([[index_of[edge] for edge in tree.edges] for tree in trees], dtype=np.int64).reshape(
        len(trees), max(n - 1, 0))
    depth = np.zeros((len(trees), n), dtype=np.int32)
    for row, tree in enumerate(trees):
        depth[row, list(tree.depth)] = list(tree.depth.values())
    return GrownRoot(root, np.array([tree.multiplicity for tree in trees], dtype=np.int64), arcs, depth)


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

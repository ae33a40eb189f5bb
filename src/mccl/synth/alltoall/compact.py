"""The compact arc-based multi-commodity-flow LP (mccl-paper App. G.3), solved directly.

One commodity per (source s, destination d) pair; f^{sd}_ã is its flow on arc ã
of the time-expanded graph G̃ (see :mod:`.pricing`), plus exit arcs
``(d at layer ℓ) → σ_d``::

    max z
    s.t. in − out = −z at (s, layer 0),  +z at σ_d,  0 elsewhere   (per commodity)
         Σ_{sd} Σ_{ã copies of a} f^{sd}_ã ≤ cap_a                 (per link a)
         f ≥ 0

Without a step bound G̃ collapses to the plain graph (one layer, no climbing),
the same equivalence the pricing uses. This is the model column generation
decomposes; it has n(n−1)·|Ã| variables, which is why it is only the
independent check in tests and the baseline in the benchmark. The matrix is
assembled with numpy in CSC order and handed to HiGHS in one call.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from mccl.synth import highs
from mccl.synth.alltoall.network import build_network
from mccl.topology import Topology

__all__ = ["CompactResult", "compact_lp"]


@dataclass(frozen=True)
class CompactResult:
    z_gbps: float  # rate per block, Gbit/s
    algbw_gbs: float  # n · z / 8
    variables: int
    constraints: int
    iterations: int


def compact_lp(topology: Topology, ranks: Sequence[str] | None = None, *, max_steps: int | None = None,
               time_limit_s: float | None = None) -> CompactResult:
    """Solve the compact LP; raises :class:`SynthesisError` if HiGHS does not reach optimality."""
    net = build_network(topology, ranks)
    n, n_nodes, n_links = net.n_ranks, net.n_nodes, net.n_links
    layers = 1 if max_steps is None else max_steps + 1
    into_gpu = net.is_gpu[net.head]
    arc_link, arc_from, arc_to = [], [], []
    for layer in range(layers):
        usable = np.ones(n_links, dtype=bool) if max_steps is None or layer < layers - 1 else ~into_gpu
        links = np.flatnonzero(usable)
        climb = 0 if max_steps is None else into_gpu[links].astype(np.int64)
        arc_link.append(links)
        arc_from.append(layer * n_nodes + net.tail[links])
        arc_to.append((layer + climb) * n_nodes + net.head[links])
    arc_link_all = np.concatenate(arc_link)
    tail, head = np.concatenate(arc_from), np.concatenate(arc_to)
    n_arcs = len(arc_link_all)
    sink = layers * n_nodes  # σ_d of the commodity
    per_commodity_rows = sink + 1
    src, dst = np.nonzero(~np.eye(n, dtype=bool))
    n_com = len(src)
    n_cons = n_com * per_commodity_rows
    # Flow columns: commodity k, arc j -> column k * n_arcs + j; entries: -1 at tail (out), +1 at head (in),
    # +1 in the capacity row of its link.
    k = np.repeat(np.arange(n_com), n_arcs)
    j = np.tile(np.arange(n_arcs), n_com)
    base = k * per_commodity_rows
    flow_rows = np.stack([base + tail[j], base + head[j], n_cons + arc_link_all[j]], axis=1)
    flow_vals = np.tile(np.array([-1.0, 1.0, 1.0]), (len(k), 1))
    # Exit columns: commodity k, layer l: (d at l) -> σ_d.
    ek = np.repeat(np.arange(n_com), layers)
    el = np.tile(np.arange(layers), n_com)
    exit_rows = np.stack([ek * per_commodity_rows + el * n_nodes + net.rank_node[dst[ek]],
                          ek * per_commodity_rows + sink], axis=1)
    exit_vals = np.tile(np.array([-1.0, 1.0]), (len(ek), 1))
    # z: +1 at (s, layer 0) (in − out + z = 0), −1 at σ (in − z = 0).
    z_rows = np.concatenate([np.arange(n_com) * per_commodity_rows + net.rank_node[src],
                             np.arange(n_com) * per_commodity_rows + sink])
    z_vals = np.concatenate([np.ones(n_com), -np.ones(n_com)])
    n_flow, n_exit = len(k), len(ek)
    starts = np.concatenate([np.arange(n_flow) * 3, n_flow * 3 + np.arange(n_exit) * 2,
                             [n_flow * 3 + n_exit * 2]]).astype(np.int32)
    index = np.concatenate([flow_rows.ravel(), exit_rows.ravel(), z_rows]).astype(np.int32)
    value = np.concatenate([flow_vals.ravel(), exit_vals.ravel(), z_vals])
    n_cols = n_flow + n_exit + 1
    model = highs.new_model()
    highs.set_limits(model, time_limit_s=time_limit_s)
    highs.maximize(model)
    inf = highs.INF
    scale = float(net.capacity.max())
    model.addRows(n_cons + n_links, np.concatenate([np.zeros(n_cons), np.full(n_links, -inf)]),
                  np.concatenate([np.zeros(n_cons), net.capacity / scale]), 0,
                  np.zeros(0, np.int32), np.zeros(0, np.int32), np.zeros(0))
    costs = np.zeros(n_cols)
    costs[-1] = 1.0
    model.addCols(n_cols, costs, np.zeros(n_cols), np.full(n_cols, inf), len(index), starts, index, value)
    highs.require_optimal(model, "the compact AllToAll LP")
    z = float(model.getSolution().col_value[-1]) * scale
    return CompactResult(z, n * z / 8.0, n_cols, n_cons + n_links, int(model.getInfo().simplex_iteration_count))

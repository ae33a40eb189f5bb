"""Compiled (numba) steps of one running collective: a transfer sent, arrived, started.

The engine calls these once per event batch and run (:mod:`mccl.sim.runs` holds
the arrays). Each is a short loop over the few transfers an event concerns; as
numpy code each cost a dozen array calls (``unique``, ``union1d``, CSR gathers),
which at ~140 k batches (tree packing on 128 GPUs) was seconds of overhead.

Connections (:mod:`mccl.sim.compiled`): transfers of connection c are
``conn_bounds[c]:conn_bounds[c+1]`` in queue order; a free connection starts its
first ready transfer. ``conn_scan[c]`` skips the connection's started prefix, and
only *candidate* connections (freed, or given a newly ready transfer since the last
start) are looked at. ``state`` holds two counters, named by ``ARRIVED`` and ``QUEUED``.
"""

from __future__ import annotations

import numba
import numpy as np

__all__ = ["ARRIVED", "QUEUED", "arrive", "sent", "start"]

_jit = numba.njit(cache=True, nogil=True)
# No kernel calls a jitted function of another module: numba's file cache does not notice when a
# callee in another file changes, so such a call could run stale code. Small helpers are repeated
# per module (e.g. the "append to a work list once" helpers) rather than shared.
_LAUNCH, _CHUNK, _QUEUE = 0, 1, 2  # mccl.sim.results.Cause
# Slots of a run's int64[2] ``state`` (mccl.sim.runs.RunState.state); named here, beside the kernels that
# compile them in, so a change to them recompiles those kernels.
ARRIVED = 0  # transfers arrived
QUEUED = 1  # candidate connections queued in ``cand``


@_jit
def _candidate(c, cand, cand_mark, state):
    if not cand_mark[c]:
        cand_mark[c] = True
        cand[state[QUEUED]] = c
        state[QUEUED] += 1


@_jit
def sent(transfers, bottleneck, now, connection, latency, busy, conn_last, t_sent, t_bneck, arrival, cand, cand_mark,
         state):
    """The last bytes of ``transfers`` left: free their connections; write arrival times to ``arrival``."""
    for j in range(len(transfers)):
        t = transfers[j]
        c = connection[t]
        busy[c] = False
        conn_last[c] = t
        t_sent[t] = now
        t_bneck[t] = bottleneck[j]
        arrival[j] = now + latency[t]
        _candidate(c, cand, cand_mark, state)


@_jit
def arrive(transfers, now, dep_offsets, dep_targets, connection, pending, last_dep, t_ready, t_arrive, ready, cand,
           cand_mark, state):
    """``transfers`` arrived: release the transfers that waited for them."""
    for j in range(len(transfers)):
        t = transfers[j]
        t_arrive[t] = now
        state[ARRIVED] += 1
        for k in range(dep_offsets[t], dep_offsets[t + 1]):
            d = dep_targets[k]
            pending[d] -= 1
            if pending[d] == 0:
                last_dep[d] = t
                t_ready[d] = now
                ready[d] = True
                _candidate(connection[d], cand, cand_mark, state)


@_jit
def start(now, tolerance, out, conn_bounds, conn_scan, ready, busy, t_ready, t_start, last_dep, conn_last, enabler,
          cause, cand, cand_mark, state):
    """Start on every free candidate connection its first ready transfer; return how many (in ``out``)."""
    started = 0
    for j in range(state[QUEUED]):
        c = cand[j]
        cand_mark[c] = False
        if busy[c]:
            continue
        t = conn_scan[c]
        end = conn_bounds[c + 1]
        while t < end and not np.isnan(t_start[t]):
            t += 1
        conn_scan[c] = t
        while t < end and not ready[t]:
            t += 1
        if t == end:
            continue
        ready[t] = False
        busy[c] = True
        t_start[t] = now
        if t_ready[t] < now - tolerance:
            enabler[t] = conn_last[c]
            cause[t] = _QUEUE
        else:
            enabler[t] = last_dep[t]
            cause[t] = _CHUNK if last_dep[t] >= 0 else _LAUNCH
        out[started] = t
        started += 1
    state[QUEUED] = 0
    return started

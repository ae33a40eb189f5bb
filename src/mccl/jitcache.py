"""numba's file cache, made to notice the other files a kernel depends on.

numba (``cache=True``) keys a compiled function's cache on its own source file only
(modification time and size, plus the function's bytecode): a callee, a global or a
``NamedTuple`` layout defined in another file can change and the cached machine code
keeps the old one (a type is keyed by its class and field types, not its field names,
so two fields swapped in another file leave a kernel reading the wrong arrays). The
flow table's kernels therefore lived in one 721-line file. :func:`cached_njit` lets
them live in several: it compiles as ``numba.njit(cache=True)`` and, at import, drops
the function's cache index when one of the files it names is newer than the index, so
numba compiles it afresh (once; the new index is newer than them all).

A leaf module (it imports nothing of mccl): the simulator's kernels (:mod:`mccl.sim.kernels` & co.)
and the treepack repair kernel (:mod:`mccl.synth.treepack.regrowkernel`) both compile with it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

import numba

__all__ = ["cached_njit"]


def _newest_source(modules: Sequence[ModuleType]) -> float:
    """The newest modification time of the modules' files; 0 when one lies in the future (a clock or
    copy skew): an index written now would look older than it forever and every process recompile."""
    newest = max(os.stat(module.__file__).st_mtime for module in modules)
    return newest if newest <= time.time() else 0.0


def cached_njit(depends_on: Sequence[ModuleType], **options: Any) -> Callable[[Callable], Any]:
    """``numba.njit(cache=True, **options)`` whose cache is dropped when a module of ``depends_on`` changed."""
    newest = _newest_source(depends_on) if depends_on else 0.0

    def decorate(function: Callable) -> Any:
        dispatcher = numba.njit(cache=True, **options)(function)
        cache_file = getattr(getattr(dispatcher, "_cache", None), "_cache_file", None)  # numba 0.68's layout
        index = getattr(cache_file, "_index_path", None)
        if index is not None:
            try:
                if os.stat(index).st_mtime < newest:
                    os.unlink(index)
            except FileNotFoundError:
                pass  # not compiled yet, or another process dropped it first
        return dispatcher

    return decorate

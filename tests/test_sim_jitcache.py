"""mccl.sim.jitcache: a kernel's numba file cache is dropped when a file it depends on changed
(numba itself checks only the kernel's own file), and kept otherwise."""

from __future__ import annotations

import importlib
import os
import sys
import time

DEPENDENCY = "SCALE = 2\n"
KERNEL = '''
from mccl.sim.jitcache import cached_njit
import jitdep

@cached_njit((jitdep,))
def twice(x):
    return x * 2
'''


def _load(name):
    sys.modules.pop(name, None)
    return importlib.import_module(name)


def test_a_changed_dependency_drops_the_kernels_cache(tmp_path, monkeypatch):
    (tmp_path / "jitdep.py").write_text(DEPENDENCY)
    (tmp_path / "jitkernel.py").write_text(KERNEL)
    monkeypatch.syspath_prepend(str(tmp_path))
    _load("jitdep")
    kernel = _load("jitkernel")
    assert kernel.twice(3) == 6  # compiled and cached
    index = kernel.twice._cache._cache_file._index_path
    assert os.path.exists(index)
    _load("jitkernel")
    assert os.path.exists(index), "an unchanged dependency must keep the cache"
    later = time.time() + 5
    os.utime(tmp_path / "jitdep.py", (later, later))
    _load("jitkernel")
    assert not os.path.exists(index), "a newer dependency must drop the cache index"
    sys.modules.pop("jitkernel", None)
    sys.modules.pop("jitdep", None)

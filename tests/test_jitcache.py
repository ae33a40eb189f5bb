"""mccl.jitcache: a kernel's numba file cache is dropped when a file it depends on changed
(numba itself checks only the kernel's own file), and kept otherwise."""

from __future__ import annotations

import importlib
import os
import sys
import time

DEPENDENCY = "SCALE = 2\n"
KERNEL = '''
from mccl.jitcache import cached_njit
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
    now = time.time()
    os.utime(index, (now - 100, now - 100))
    os.utime(tmp_path / "jitdep.py", (now - 50, now - 50))  # edited after the kernel was cached
    _load("jitkernel")
    assert not os.path.exists(index), "a newer dependency must drop the cache index"
    assert _load("jitkernel").twice(4) == 8  # compiled afresh
    assert os.path.exists(index)
    os.utime(tmp_path / "jitdep.py", (now + 3600, now + 3600))  # a file dated in the future: kept, not
    _load("jitkernel")                                             # dropped (and recompiled) by every process
    assert os.path.exists(index)
    sys.modules.pop("jitkernel", None)
    sys.modules.pop("jitdep", None)

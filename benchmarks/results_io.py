"""Writing benchmark results: one CSV per run, the same way for every benchmark script.

The scripts run as ``python benchmarks/<name>.py``, so this directory is on ``sys.path``.
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path

__all__ = ["write_csv"]


def write_csv(path: Path, rows: Sequence[dict], columns: Sequence[str] | None = None) -> None:
    """``rows`` as CSV at ``path`` (parents created); columns default to the first row's keys."""
    if not rows:
        raise ValueError(f"no rows to write to {path}")
    fields = list(rows[0]) if columns is None else list(columns)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields)
        writer.writeheader()
        writer.writerows({key: row.get(key, "") for key in fields} for row in rows)

"""A group of identical spanning out-trees of one root (the unit Phase 3 packs and lowers)."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Tree"]


@dataclass
class Tree:
    """``multiplicity`` identical trees of ``root``; ``edges`` in the order added; ``depth`` per rank."""

    root: int
    multiplicity: int
    edges: list[tuple[int, int]] = field(default_factory=list)
    depth: dict[int, int] = field(default_factory=dict)
    preferred: int = 0  # edges that came from the previous tree (warm start)

"""Topology files: YAML or JSON, versioned, with errors that name line and field.

Format ``mccl-topology/1``::

    format: mccl-topology/1
    name: rail_optimized(1,2,8)
    nodes:
      - {id: gpu0, kind: gpu, host: host0, rail: 0, rack: seg0, segment: seg0, pod: pod0}
      - {id: nvs0, kind: nvswitch, host: host0}
    links:
      - {id: 0, src: gpu0, dst: nvs0, gbps: 2880.0, latency_us: 0.025}
      - {src: gpu1, dst: nvs0, gbps: 2880, latency_us: 0.025, duplex: true}

Link ids are positions; a hand-written file may leave them out. ``duplex: true``
stands for a cable (two directed links). JSON is read by the same parser (it is
YAML), so line numbers work for both.

Reading is bounded: a file that is not UTF-8, nested deeper than libyaml's limit (or
Python's, for JSON), or whose YAML aliases would expand to more than
``MAX_EXPANDED_NODES`` nodes (a "billion laughs" file of 333 bytes expands to 10⁹) is
refused with a :class:`~mccl.errors.TopologyFileError` before anything is expanded.
Files are written to a temporary file renamed over the target (:func:`write_atomic`).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any

import yaml

from mccl.errors import TopologyError, TopologyFileError
from mccl.topology.model import Link, Node, NodeKind, Topology, disconnected_gpu

__all__ = ["FORMAT", "load_topology", "loads_topology", "dump_topology", "dumps_topology", "topology_to_dict",
           "write_atomic", "new_file_mode"]

FORMAT = "mccl-topology/1"
MAX_EXPANDED_NODES = 1_000_000  # YAML nodes after alias expansion: a 512-GPU fabric file has ~50k
_NODE_FIELDS = {"id", "kind", "host", "rail", "rack", "segment", "pod"}
_LINK_FIELDS = {"id", "src", "dst", "gbps", "latency_us", "duplex"}
_KIND_ALIASES = {"spine": NodeKind.AGGREGATION, "leaf": NodeKind.TOR}


def topology_to_dict(topology: Topology) -> dict[str, Any]:
    nodes = []
    for node in topology.nodes:
        entry: dict[str, Any] = {"id": node.id, "kind": node.kind.value}
        for key in ("host", "rail", "rack", "segment", "pod"):
            value = getattr(node, key)
            if value is not None:
                entry[key] = value
        nodes.append(entry)
    links = [
        {"id": link.id, "src": link.src, "dst": link.dst, "gbps": link.gbps, "latency_us": link.latency_us}
        for link in topology.links
    ]
    return {"format": FORMAT, "name": topology.name, "nodes": nodes, "links": links}


def dumps_topology(topology: Topology, fmt: str = "yaml") -> str:
    data = topology_to_dict(topology)
    if fmt == "json":
        return json.dumps(data, indent=1) + "\n"
    if fmt != "yaml":
        raise TopologyFileError(f"unknown topology file format {fmt!r}; use yaml or json")
    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    return yaml.dump(data, Dumper=dumper, sort_keys=False, default_flow_style=None, width=200)


def dump_topology(topology: Topology, path: str | Path) -> None:
    path = Path(path)
    fmt = "json" if path.suffix.lower() == ".json" else "yaml"
    write_atomic(path, dumps_topology(topology, fmt))


def write_atomic(path: str | Path, data: str | bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same directory, renamed over it:
    a write that fails (disk full, a file-size limit, an interrupt) leaves the old file as it was and
    no partial new one. OSError as the system reports it."""
    path = Path(path)
    payload = data.encode() if isinstance(data, str) else data
    descriptor, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent or ".")
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(payload)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temporary, new_file_mode())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def new_file_mode() -> int:
    """The mode open() gives a new file (0o666 less the umask), read without changing the umask
    (os.umask would, for a moment, in every thread)."""
    return 0o666 & ~_umask()


def _umask() -> int:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o022


def load_topology(path: str | Path) -> Topology:
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as error:
        raise TopologyFileError(f"{path}: cannot read topology file: {error.strerror or error}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise TopologyFileError(f"{path}: not UTF-8 text (byte {error.start})") from None
    return loads_topology(text, source=str(path))


class _Reader:
    """Turns a composed YAML tree into plain data, remembering each field's line."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.lines: dict[str, int] = {}
        self.constructor = yaml.constructor.SafeConstructor()

    def fail(self, where: str, message: str) -> TopologyFileError:
        line = self.lines.get(where)
        prefix = f"{self.source}:{line}" if line is not None else self.source
        return TopologyFileError(f"{prefix}: {where}: {message}" if where else f"{prefix}: {message}")

    def plain(self, node: yaml.Node, where: str) -> Any:
        self.lines[where] = node.start_mark.line + 1
        if isinstance(node, yaml.MappingNode):
            result: dict[str, Any] = {}
            for key_node, value_node in node.value:
                key = str(key_node.value)
                child = f"{where}.{key}" if where else key
                if key in result:
                    self.lines[child] = key_node.start_mark.line + 1
                    raise self.fail(child, "field given twice")
                result[key] = self.plain(value_node, child)
            return result
        if isinstance(node, yaml.SequenceNode):
            return [self.plain(item, f"{where}[{i}]") for i, item in enumerate(node.value)]
        return self.constructor.construct_object(node)


def loads_topology(text: str, source: str = "<topology>") -> Topology:
    """Parse a topology file's text.

    The fast path parses with libyaml (or json) and keeps no positions; only when the
    content is wrong is the text parsed again, slowly, to name the line of the fault.
    """
    if "&" in text:
        _check_aliases(text, source)
    data = _parse_fast(text, source)  # a syntax error is reported here, with its line
    try:
        return _build(data, _Reader(source))
    except TopologyFileError as first:
        reader = _Reader(source)
        try:
            data = reader.plain(_compose(text, source), "")
        except (RecursionError, yaml.YAMLError, TopologyFileError) as second:
            # deep (within libyaml's limit) or a tag the pure-Python reader refuses: the first report stands
            if isinstance(second, TopologyFileError) and "given twice" in str(second):
                raise second from None
            raise first from None
        return _build(data, reader)


_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _yaml_error(error: yaml.YAMLError, source: str) -> TopologyFileError:
    mark = getattr(error, "problem_mark", None)
    line = f":{mark.line + 1}" if mark is not None else ""
    problem = getattr(error, "problem", None) or error
    return TopologyFileError(f"{source}{line}: not valid YAML/JSON: {str(problem).splitlines()[0][:200]}")


def _parse_fast(text: str, source: str) -> Any:
    if text.lstrip().startswith("{"):
        try:
            return json.loads(text)
        except RecursionError:
            raise TopologyFileError(f"{source}: nested too deeply for a topology file") from None
        except ValueError:
            pass  # not JSON: read as YAML, which names the line
    try:
        return yaml.load(text, Loader=_LOADER)  # noqa: S506 - a safe loader
    except yaml.YAMLError as error:
        raise _yaml_error(error, source) from None


def _compose(text: str, source: str) -> yaml.Node:
    try:
        tree = yaml.compose(text)
    except yaml.YAMLError as error:
        raise _yaml_error(error, source) from None
    if tree is None:
        raise TopologyFileError(f"{source}: the file is empty")
    return tree


def _check_aliases(text: str, source: str) -> None:
    """Refuse a file whose aliases expand to more than MAX_EXPANDED_NODES nodes, from libyaml's event
    stream (nothing is expanded): each node's expanded size is 1 + its children's, an alias's that of
    its anchor."""
    sizes: dict[str, int] = {}
    stack: list[list] = [[0, None]]  # [expanded size so far, anchor] per open collection
    try:
        for event in yaml.parse(text, Loader=_LOADER):
            if isinstance(event, yaml.AliasEvent):
                stack[-1][0] += sizes.get(event.anchor, 1)
            elif isinstance(event, yaml.ScalarEvent):
                stack[-1][0] += 1
                if event.anchor is not None:
                    sizes[event.anchor] = 1
            elif isinstance(event, yaml.CollectionStartEvent):
                stack.append([1, event.anchor])
            elif isinstance(event, yaml.CollectionEndEvent):
                size, anchor = stack.pop()
                if anchor is not None:
                    sizes[anchor] = size
                stack[-1][0] += size
            else:
                continue
            if stack[-1][0] > MAX_EXPANDED_NODES or any(entry[0] > MAX_EXPANDED_NODES for entry in stack[-2:]):
                line = event.start_mark.line + 1 if event.start_mark is not None else 0
                raise TopologyFileError(f"{source}:{line}: YAML aliases expand to more than {MAX_EXPANDED_NODES} "
                                        "nodes; refused (alias expansion is bounded)")
    except yaml.YAMLError as error:
        raise _yaml_error(error, source) from None


def _build(data: Any, reader: _Reader) -> Topology:
    if isinstance(data, yaml.Node):
        data = reader.plain(data, "")
    if data is None:
        raise TopologyFileError(f"{reader.source}: the file is empty")
    if not isinstance(data, dict):
        raise reader.fail("", "the top level must be a mapping with format, name, nodes and links")
    if data.get("format") != FORMAT:
        raise reader.fail("format", f"expected format {FORMAT!r}, got {data.get('format')!r}")
    for key in ("nodes", "links"):
        if not isinstance(data.get(key), list):
            raise reader.fail(key, f"'{key}' must be a list")
    nodes = _read_nodes(reader, data["nodes"])
    links = _read_links(reader, data["links"], {node.id for node in nodes})
    cut = disconnected_gpu(nodes, links)
    if cut is not None:  # reported at the GPU to fix (the one outside the largest connected part)
        raise reader.fail(next(f"nodes[{i}]" for i, node in enumerate(nodes) if node.id == cut[0]), cut[1])
    name = str(data.get("name", Path(reader.source).stem))
    try:
        return Topology(name, tuple(nodes), tuple(links))
    except TopologyError as error:  # any remaining rule, reported against the file
        raise reader.fail("", str(error)) from None


def _entry(reader: _Reader, where: str, entry: Any, allowed: set[str], what: str) -> dict[str, Any]:
    """One list entry: a mapping with only known fields."""
    if not isinstance(entry, dict):
        raise reader.fail(where, f"{what} must be a mapping")
    unknown = set(entry) - allowed
    if unknown:
        raise reader.fail(where, f"unknown field(s) {sorted(unknown)}; allowed: {sorted(allowed)}")
    return entry


def _read_nodes(reader: _Reader, entries: list[Any]) -> list[Node]:
    nodes: list[Node] = []
    seen: dict[str, int] = {}
    for i, entry in enumerate(entries):
        where = f"nodes[{i}]"
        entry = _entry(reader, where, entry, _NODE_FIELDS, "a node (with at least id and kind)")
        node_id = entry.get("id")
        if not isinstance(node_id, str) or not node_id:
            raise reader.fail(f"{where}.id", f"node id must be a non-empty string, got {node_id!r}")
        if node_id in seen:
            raise reader.fail(f"{where}.id", f"duplicate node id {node_id!r} (first at nodes[{seen[node_id]}])")
        seen[node_id] = i
        kind_text = entry.get("kind")
        try:
            kind = _KIND_ALIASES.get(str(kind_text)) or NodeKind(kind_text)
        except ValueError:
            raise reader.fail(
                f"{where}.kind", f"unknown node kind {kind_text!r}; known: {', '.join(k.value for k in NodeKind)}"
            ) from None
        rail = entry.get("rail")
        if rail is not None and (not isinstance(rail, int) or isinstance(rail, bool) or rail < 0):
            raise reader.fail(f"{where}.rail", f"rail must be a non-negative integer, got {rail!r}")
        labels = {key: (None if entry.get(key) is None else str(entry[key])) for key in ("host", "rack", "segment", "pod")}
        nodes.append(Node(node_id, kind, rail=rail, **labels))
    return nodes


def _number(reader: _Reader, where: str, value: Any, *, positive: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise reader.fail(where, f"must be a finite number, got {value!r}")
    if positive and value <= 0:
        raise reader.fail(where, f"capacity must be positive, got {value}")
    if not positive and value < 0:
        raise reader.fail(where, f"must be >= 0, got {value}")
    return float(value)


def _read_links(reader: _Reader, entries: list[Any], node_ids: set[str]) -> list[Link]:
    links: list[Link] = []
    for i, entry in enumerate(entries):
        where = f"links[{i}]"
        entry = _entry(reader, where, entry, _LINK_FIELDS, "a link (with src, dst, gbps and latency_us)")
        for end in ("src", "dst"):
            if end not in entry:
                raise reader.fail(where, f"missing field '{end}'")
            if not isinstance(entry[end], str) or entry[end] not in node_ids:
                raise reader.fail(f"{where}.{end}", f"unknown node {str(entry[end])[:80]!r}")
        if entry["src"] == entry["dst"]:
            raise reader.fail(where, f"a link cannot connect {entry['src']!r} to itself")
        if "gbps" not in entry:
            raise reader.fail(where, "missing field 'gbps' (capacity in Gbit/s)")
        gbps = _number(reader, f"{where}.gbps", entry["gbps"], positive=True)
        latency = _number(reader, f"{where}.latency_us", entry.get("latency_us", 0.0), positive=False)
        duplex = entry.get("duplex", False)
        if not isinstance(duplex, bool):
            raise reader.fail(f"{where}.duplex", f"must be true or false, got {duplex!r}")
        if "id" in entry and (duplex or entry["id"] != len(links)):
            raise reader.fail(
                f"{where}.id",
                f"link id {entry['id']!r} must equal its position {len(links)} (ids are positions; "
                "leave them out of hand-written files, and out of duplex entries)",
            )
        links.append(Link(len(links), entry["src"], entry["dst"], gbps, latency))
        if duplex:
            links.append(Link(len(links), entry["dst"], entry["src"], gbps, latency))
    return links

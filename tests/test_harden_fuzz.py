"""Issue 13, fuzz: topology files, builder specs, schedule files and CLI flags, fixed seed (derandomized).

Every input must end in an MCCLError subclass (library) or one line on stderr and exit 2 (CLI) —
never another exception, never a hang (each example is bounded by the test's timeout). The
controller's messages are fuzzed in test_harden_control.py. Counts: FUZZ_EXAMPLES per test.
"""

from __future__ import annotations

import contextlib
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mccl.cli.main import main
from mccl.errors import MCCLError
from mccl.schedule import dumps_schedule, loads_schedule, validate
from mccl.synth.ring import naive_ring
from mccl.topology import dumps_topology, loads_topology, parse_topology, single_switch

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]

FUZZ_EXAMPLES = 300
FUZZ = settings(max_examples=FUZZ_EXAMPLES, derandomize=True, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

TOPOLOGY = single_switch(3, 100)
TOPOLOGY_DOC = json.loads(dumps_topology(TOPOLOGY, "json"))
SCHEDULE_DOC = json.loads(dumps_schedule(naive_ring(TOPOLOGY, "allgather")))

_LEAF = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12)
_JSON = st.recursive(_LEAF, lambda children: st.lists(children, max_size=4)
                     | st.dictionaries(st.text(max_size=6), children, max_size=4), max_leaves=20)


def _paths(document, prefix=()):
    """Every (path, value) in a JSON document."""
    yield prefix, document
    if isinstance(document, dict):
        for key, value in document.items():
            yield from _paths(value, (*prefix, key))
    elif isinstance(document, list):
        for index, value in enumerate(document[:3]):
            yield from _paths(value, (*prefix, index))


def _mutated(document, data) -> object:
    """The document with one field replaced by random JSON (or deleted)."""
    paths = [path for path, _ in _paths(document) if path]
    path = data.draw(st.sampled_from(paths))
    copy = json.loads(json.dumps(document))
    target = copy
    for key in path[:-1]:
        target = target[key]
    if data.draw(st.booleans()) and isinstance(target, dict):
        del target[path[-1]]
    else:
        target[path[-1]] = data.draw(_JSON)
    return copy


@FUZZ
@given(data=st.data())
def test_mutated_topology_files_end_in_a_topology_error(data):
    text = json.dumps(_mutated(TOPOLOGY_DOC, data), allow_nan=True)
    if data.draw(st.booleans()):  # the YAML reader too
        text = "# yaml\n" + text
    with contextlib.suppress(MCCLError):
        loads_topology(text)


@FUZZ
@given(text=st.text(max_size=200) | st.binary(max_size=200).map(lambda b: b.decode("latin-1")))
def test_random_text_as_a_topology_file(text):
    with contextlib.suppress(MCCLError):
        loads_topology(text)


@FUZZ
@given(spec=st.one_of(
    st.text(max_size=60),
    st.builds(lambda name, args: f"{name}({','.join(args)})",
              st.sampled_from(["rail_optimized", "spine_leaf", "switch_ring", "single_switch", "eval", "open"]),
              st.lists(st.sampled_from(["1", "2", "0", "-1", "True", "1e400", "2.5", "'x'", "[1]", "9" * 30,
                                        "None", "float('nan')", "x=1"]), max_size=7)),
    st.builds(lambda fault: f"single_switch(3,100)+{fault}",
              st.sampled_from(["Fail2", "gpu0->nvs0=1e+5", "gpu0<->nvs0*0.5", "gpu0<->nvs0*nan", "a->b=1",
                               "gpu0->nvs0=-1", "gpu0->nvs0*1e400", "+", "++"])),
))
def test_random_builder_specs_end_in_an_mccl_error(spec):
    with contextlib.suppress(MCCLError):
        parse_topology(spec)


@FUZZ
@given(data=st.data())
def test_mutated_schedule_files_end_in_an_invalid_schedule(data):
    text = json.dumps(_mutated(SCHEDULE_DOC, data), allow_nan=True)
    with contextlib.suppress(MCCLError):
        validate(loads_schedule(text), TOPOLOGY)


_FLAG_VALUES = st.sampled_from(["nan", "inf", "-1e9", "1" * 400, "0.1", "0", "-1", "1e+5", "[/x]", "[bold]",
                                "\udcff", "rail_optimized(True,2,2)", "single_switch(3,100)", "", " "])


@FUZZ
@given(args=st.one_of(
    st.builds(lambda size, over, model: ["eval", "SCHEDULE", "--topology", "single_switch(3,100)", "--size", size,
                                         "--step-overhead-us", over, "--model", model],
              _FLAG_VALUES, _FLAG_VALUES, st.sampled_from(["alpha-beta", "flow", "x"])),
    st.builds(lambda spec, fault: ["topo", "show", spec, "--fault", fault], _FLAG_VALUES, _FLAG_VALUES),
    st.builds(lambda topo, chunks: ["synth", "ring", "--topology", topo, "--chunks", chunks, "--out", "OUT"],
              _FLAG_VALUES, _FLAG_VALUES),
    st.builds(lambda gamma, alpha: ["controller", "--topology", "single_switch(3,100)", "--gamma", gamma, "--alpha",
                                    alpha, "--bind", "tcp://127.0.0.1:1", "--insecure"],
              _FLAG_VALUES.filter(lambda v: v not in ("0.1", "1e+5")), _FLAG_VALUES),
))
def test_random_cli_flags_exit_0_or_2_with_one_line(args, tmp_path_factory, capsys):
    folder = tmp_path_factory.mktemp("cli")
    schedule = folder / "s.json"
    schedule.write_text(dumps_schedule(naive_ring(TOPOLOGY, "allgather")))
    args = [str(schedule) if a == "SCHEDULE" else str(folder / "o.json") if a == "OUT" else a for a in args]
    if args[0] == "controller" and all(
            _finite_in(v, 0, float("inf")) for v in (args[args.index("--gamma") + 1],)) and _finite_in(
            args[args.index("--alpha") + 1], 0, 1):
        return  # a valid controller would serve until interrupted
    code = main(args)
    err = capsys.readouterr().err
    assert code in (0, 2), err
    if code == 2:
        assert err.count("\n") == 1 and "Traceback" not in err, err


def _finite_in(text: str, low: float, high: float) -> bool:
    try:
        value = float(text)
    except ValueError:
        return False
    return low < value <= high

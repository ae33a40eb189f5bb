"""``python -m mccl.experiments.netemu cleanup [--all | --prefix P]``: delete what emulated fabrics left behind.

Default: the namespaces and root links of runs whose process is gone (a SIGKILLed demo or test);
``--all`` also those of live runs; ``--prefix`` exactly one run's (``mne<pid>-``).
"""

from __future__ import annotations

import argparse
import sys

from mccl.experiments.netemu.fabric import sweep, unsupported_reason


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mccl.experiments.netemu", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    cleanup = commands.add_parser("cleanup", help="delete leftover namespaces and links")
    cleanup.add_argument("--all", action="store_true", help="live runs' too")
    cleanup.add_argument("--prefix", default=None, help="exactly this run's names (mne<pid>-)")
    args = parser.parse_args(argv)
    reason = unsupported_reason()
    if reason is not None:
        print(f"netemu: {reason}; nothing to clean up here", file=sys.stderr)
        return 2
    gone = sweep(only_dead=not args.all, prefix=args.prefix)
    print(f"deleted {len(gone)}: {' '.join(gone)}" if gone else "nothing to delete")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The ``vmem`` command: train, plan, trace, bench, list models and devices, check the installation. Every
command has ``--help`` and ``--json``.

Each command is a translator (:mod:`.train`, :mod:`.plan`, :mod:`.trace`, :mod:`.bench`, :mod:`.listing`): it
parses its options (:mod:`.options`), calls the library and prints; :mod:`.progress` says what a long
command is doing."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Sequence

from ..errors import VmemError
from ..units import printable_lines
from ..training.callbacks import StopOnSignal, Terminated
from . import bench, plan, trace, train
from .listing import cmd_devices, cmd_models
from .progress import stopped, warnings_as_lines

__all__ = ["main", "build_parser"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vmem", description="Train deep networks in a GPU memory budget.")
    parser.add_argument("--version", action="version", version=f"vmem {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command in (train, plan, trace, bench):
        command.add_parser(sub)
    p = sub.add_parser("models", help="list the model zoo")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_models)

    # listed for --help; main() hands `vmem check ...` to vmem.selfcheck, which parses its own options
    sub.add_parser("check", help="check this installation (modules, package files, kernels), GPU or not")

    p = sub.add_parser("devices", help="list devices")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_devices)
    return parser


def _version() -> str:
    from .. import __version__

    return __version__


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["check"]:
        from .. import selfcheck

        return selfcheck.main(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = argv
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    args.saved = False
    try:
        # Ctrl-C and SIGTERM raise at once (no training step is in flight outside a fit), so that the
        # command's ``with`` blocks close devices and remove temporaries (Python's SIGTERM would not)
        with warnings_as_lines(args.command), StopOnSignal():
            return args.func(args)
    except BrokenPipeError:  # e.g. `vmem models | head`
        sys.stderr.close()
        return 0
    except KeyboardInterrupt as exc:  # the devices are closed by the context managers on the way out
        with StopOnSignal():  # a signal while saying so still ends the command at once
            print(f"vmem {args.command}: {stopped(exc, args)}", file=sys.stderr, flush=True)
        return 143 if isinstance(exc, Terminated) else 130
    except (ValueError, MemoryError, ImportError, FileNotFoundError, VmemError) as exc:  # user errors: one clear line
        if getattr(args, "json", False):
            print(json.dumps({"command": args.command, "error": str(exc), "type": type(exc).__name__}))
        else:
            print(f"vmem {args.command}: error: {printable_lines(str(exc))}", file=sys.stderr)  # escapes as text
        return 1


if __name__ == "__main__":
    sys.exit(main())

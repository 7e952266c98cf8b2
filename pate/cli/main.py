"""The ``pate`` command line: one parser, one sub-command per module of ``pate.cli``; any
``pate.errors.PateError`` is printed as one line, ``pate: error: <message>``, exit status 2."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import select
import signal
import sys
import threading
import traceback
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NoReturn

from analysis.mechanisms import ParameterError
from pate import SIBLING_PACKAGES, __version__
from pate.errors import TRACEBACK_VARIABLE, PateError, tracebacks_shown
from pate.progress import quiet, set_quiet

COMMAND_MODULES: tuple[str, ...] = (
    "pate.cli.teachers",
    "pate.cli.serve",
    "pate.cli.analyze",
    "pate.cli.report",
    "pate.cli.run",
    "pate.cli.epsilon",
    "pate.cli.dpsgd",
    "pate.cli.student",
    "pate.cli.audit",
    "pate.cli.status",
)


class _OneLineParser(argparse.ArgumentParser):
    """argparse's parser, its mistakes said in one line, ``PROG: error: MESSAGE (PROG --help
    for its usage)``, exit 2, not after the usage block (26 lines for ``pate student train``).
    Its sub-commands' parsers are of this class too (``add_subparsers`` makes them so)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} ({self.prog} --help for its usage)\n")


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser of every sub-command, or, when ``argv`` names one, of that one only: each
    module imports what its command needs (torch, scipy) only when it runs, and ``pate serve``
    should not wait for the others' registration."""
    named = next((a for a in argv or () if not a.startswith("-")), None)
    modules = [m for m in COMMAND_MODULES if m.rsplit(".", 1)[1] == named] or COMMAND_MODULES
    parser = _OneLineParser(
        prog="pate",
        description="Private Aggregation of Teacher Ensembles: train teachers on disjoint "
                    "partitions, answer a student's queries with an accounted aggregator, "
                    "train the student and report privacy and utility.")
    parser.add_argument("--version", action="version", version=f"pate {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in modules:
        importlib.import_module(name).register(subparsers)
    for command in _leaf_parsers(parser):  # `pate --quiet run` and `pate run --quiet` alike
        command.add_argument("-q", "--quiet", action="store_true", default=argparse.SUPPRESS,
                             help="no progress bars or progress lines")
        command.set_defaults(command_parser=command)  # whose usage a mistake shows
        _say_defaults(command)
    return parser


def _say_defaults(command: argparse.ArgumentParser) -> None:
    """``--help`` gives each option's default where it has one (not a flag's False, not None,
    whose meaning its help says), unless its help names it already."""
    for action in command._actions:
        if (action.option_strings and action.default not in (None, False, argparse.SUPPRESS)
                and "default" not in (action.help or "")):
            action.help = ("default: %(default)s" if not action.help
                           else f"{action.help} (default: %(default)s)")


def _leaf_parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """The parser itself and every sub-command's parser, at any depth."""
    found = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):
                found += _leaf_parsers(sub)
    return found


def _warning_printer() -> Callable[..., None]:
    """``warnings.showwarning`` for one command: each warning as one ``pate: warning:`` line,
    once (the stages of ``pate run`` read the same data again, and every change of the warning
    filters would otherwise let a warning shown before through again)."""
    shown: set[str] = set()

    def show(message, category, filename, lineno, file=None, line=None) -> None:
        if str(message) not in shown:
            shown.add(str(message))
            print(f"pate: warning: {message}", file=sys.stderr)

    return show


_INTERRUPTS: list[int] = [0]  # the Ctrl-Cs and SIGTERMs the command has had (``_interrupt``)
_SIGTERM_RECEIVED: list[bool] = [False]  # set by the handler: Ray re-raises it as a plain
# KeyboardInterrupt when it arrives while Ray waits for a shard


def _terminate(signum: int, frame: object) -> None:
    """SIGTERM: raised in the main thread as Ctrl-C's KeyboardInterrupt is, so that the same
    clean-up runs (a local Ray shut down, the stage marked stopped) and no ``except
    Exception`` of the way takes it for an error."""
    _SIGTERM_RECEIVED[0] = True
    _INTERRUPTS[0] += 1  # a Ctrl-C after it finds the clean-up under way
    raise KeyboardInterrupt


def _interrupt(signum: int, frame: object) -> None:
    """SIGINT of the ``pate`` command: the first (or a SIGTERM, ``_terminate``) is Python's
    KeyboardInterrupt, whose clean-up (the stage marked stopped, a local Ray shut down, at
    exit too) takes seconds; a second during it is said to be waited on, not raised into that
    clean-up (it printed Ray's traceback); a third leaves at once."""
    _INTERRUPTS[0] += 1
    if _INTERRUPTS[0] == 1:
        raise KeyboardInterrupt
    if _INTERRUPTS[0] == 2:  # os.write: print may be amid a write to stderr (a progress bar)
        with contextlib.suppress(OSError):
            os.write(2, b"pate: stopping cleanly, a few seconds; Ctrl-C again leaves at once\n")
        return
    os._exit(130)


def main(argv: Sequence[str] | None = None) -> int:
    _INTERRUPTS[0] = 0
    if argv is None and threading.current_thread() is threading.main_thread() and (
            signal.getsignal(signal.SIGINT) is signal.default_int_handler):  # not if ignored
        signal.signal(signal.SIGINT, _interrupt)  # the command's, until its process ends
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        parser = build_parser(argv)  # the command's imports: a second or more
    except KeyboardInterrupt:  # Ctrl-C at once: one line, as later, not a traceback
        print("pate: interrupted", file=sys.stderr)
        return 130
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # said by the sub-command's parser, not the top level's
        args.command_parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    warnings.showwarning = _warning_printer()
    was_quiet = quiet()
    if getattr(args, "quiet", False):
        set_quiet(True)
    on_sigterm, _SIGTERM_RECEIVED[0] = None, False
    if threading.current_thread() is threading.main_thread():
        on_sigterm = signal.signal(signal.SIGTERM, _terminate)
    try:
        status = _dispatch(args)
        sys.stdout.flush()  # a reader that left (`| head`) is found here, not at exit
        return status
    except BrokenPipeError:
        if not _stdout_gone():  # another pipe (a socket, a child process): a real error
            raise
        _stdout_to_devnull()
        return 141  # as a program ended by SIGPIPE: 128 + 13
    finally:  # `--quiet` and the handler hold for this command only, also when called in-process
        set_quiet(was_quiet)
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, signal.SIG_DFL if on_sigterm is None else on_sigterm)


def _stdout_gone() -> bool:
    """Whether standard output is a pipe whose reader has left (poll says POLLERR); False for
    a stdout that is no file (replaced in-process) or one that still has its reader."""
    try:
        fd = sys.stdout.fileno()
        poller = select.poll()
        poller.register(fd, select.POLLOUT)
        return any(events & select.POLLERR for _, events in poller.poll(0))
    except (OSError, ValueError, AttributeError):  # no fd, or no poll on this system
        return False


def _stdout_to_devnull() -> None:
    """Point standard output at /dev/null once its reader has gone, so that the interpreter's
    last flush at exit finds no broken pipe to report (the recipe of Python's documentation,
    "Note on SIGPIPE" in the signal module)."""
    with contextlib.suppress(OSError, ValueError):  # stdout replaced (tests) or closed
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


def _dispatch(args: argparse.Namespace) -> int:
    """Run the command's handler: a PateError (or a mechanism's ParameterError) becomes one
    error line and exit status 2, an error of the system (OSError: a full disk, a folder not
    writable) one line and 74, any other exception one line naming its class and place, not
    its message (privacy rule 2), and 70; a failed command leaves no empty run directory
    behind."""
    run = getattr(args, "run", None)
    new_run = run is not None and not Path(run).exists()
    try:
        return int(args.handler(args) or 0)
    except PateError as exc:
        print(f"pate: error: {exc}", file=sys.stderr)
        status = 2
    except ParameterError as exc:  # a mechanism's parameter, named as its flag
        print(f"pate: error: {exc.named('--')}", file=sys.stderr)
        status = 2
    except BrokenPipeError:
        raise  # standard output's reader left: main says so
    except OSError as exc:  # the system refused (a full disk, a folder not writable)
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"pate: error: {where}{exc.strerror or exc}", file=sys.stderr)
        status = 74  # EX_IOERR (sysexits.h)
    except Exception as exc:  # a fault: its message or traceback may hold private values
        if tracebacks_shown():
            raise
        print(f"pate: internal error: {exc.__class__.__name__} at {_where(exc)}; its message "
              f"is not shown, as it may hold private values ({TRACEBACK_VARIABLE}=1 shows the "
              "traceback, for data you may see)", file=sys.stderr)
        status = 70  # EX_SOFTWARE (sysexits.h)
    except KeyboardInterrupt:
        if _SIGTERM_RECEIVED[0]:
            print("pate: terminated", file=sys.stderr)
            status = 143  # 128 + SIGTERM
        else:
            print("pate: interrupted", file=sys.stderr)
            status = 130
    if new_run:
        _remove_empty_folders(Path(run))
    return status


# the project's packages: the line of theirs that a fault went through is the one to name
_PACKAGES = tuple(str(Path(__file__).resolve().parents[2] / name) + os.sep
                  for name in ("pate", *SIBLING_PACKAGES))


def _where(exc: BaseException) -> str:
    """The file name and line where ``exc`` was raised, and the project's own line it was
    raised under where that is another (a library's function it called): no folder, no
    value."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return "?"
    said = [f"{Path(f.filename).name}:{f.lineno}" for f in frames]
    ours = [i for i, f in enumerate(frames) if f.filename.startswith(_PACKAGES)]
    if not ours or ours[-1] == len(frames) - 1:
        return said[-1]
    return f"{said[-1]}, under {said[ours[-1]]}"


def _remove_empty_folders(root: Path) -> None:
    """Remove ``root`` and its folders if they hold no file: a failed command leaves no empty
    run directory behind (never a file: a folder that holds one stays)."""
    for folder, _, _ in sorted(os.walk(root), key=lambda entry: -len(entry[0])):
        with contextlib.suppress(OSError):
            os.rmdir(folder)

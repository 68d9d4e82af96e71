"""weft's command-line tools from the Python package: weftrun, weft-bench and
weft-info, as console scripts (pyproject.toml's [project.scripts]) and as
python -m weft run|bench|info.

A wheel (pip install) holds the programs in weft/_bin; a meson install puts
them in the prefix's bin folder, beside the library that _install.py names.
Each entry execs the program, so its exit status and signals are the
program's own."""
import os
import sys

# python -m weft's words, and the programs they run
COMMANDS = {"run": "weftrun", "bench": "weft-bench", "info": "weft-info"}


def _candidates(program):
    here = os.path.dirname(os.path.abspath(__file__))
    yield os.path.join(here, "_bin", program)  # a wheel
    try:
        from . import _install  # a meson install: PREFIX/lib*/libweft.so.0 -> PREFIX/bin
    except ImportError:
        pass
    else:
        prefix = os.path.dirname(os.path.dirname(_install.LIBRARY))
        yield os.path.join(prefix, "bin", program)


def tool_path(program):
    """The path of one of weft's programs installed with this package.
    Raises FileNotFoundError saying where it looked."""
    tried = []
    for path in _candidates(program):
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
        tried.append(path)
    raise FileNotFoundError(
        "weft: %s is not installed with this package (looked in %s); pip install weft puts it "
        "in the wheel, a meson install in PREFIX/bin (a build tree: build/tools/%s)"
        % (program, ", ".join(tried), program))


def _exec(program, args):
    try:
        path = tool_path(program)
    except FileNotFoundError as e:
        print(e, file=sys.stderr)
        return 127
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(path, [program] + list(args))
    return 127  # not reached


def weftrun():
    """Console script weftrun: starts N ranks (weftrun -h)."""
    return _exec("weftrun", sys.argv[1:])


def weft_bench():
    """Console script weft-bench: the collectives' benchmark (weft-bench -h)."""
    return _exec("weft-bench", sys.argv[1:])


def weft_info():
    """Console script weft-info: the build, the machine and every setting."""
    return _exec("weft-info", sys.argv[1:])


def main(argv=None):
    """python -m weft run|bench|info [ARGS...]"""
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in COMMANDS:
        asked = bool(argv) and argv[0] in ("-h", "--help")
        print("usage: python -m weft run|bench|info [ARGS...]\n"
              "  run    weftrun: start N ranks of a program (python -m weft run -n 4 prog)\n"
              "  bench  weft-bench: the collectives' benchmark (under run for several ranks)\n"
              "  info   weft-info: the build, transports, topology and every setting",
              file=sys.stdout if asked else sys.stderr)
        return 0 if asked else 2
    return _exec(COMMANDS[argv[0]], argv[1:])

"""``pip install`` into a venv: by uv where it is installed, or by the venv's own pip
(``STEADYTUNE_INSTALLER=pip``, or no uv).

The project's venv (the Makefile) and the third-party tools' venvs (``tests/tools.py``) are installed
through here. uv installs the same packages several times faster than pip (it downloads and unpacks
in parallel and links wheels from its cache): a tool's venv, the longest setup of the suite, is built
in a fifth of pip's time or less (docs/testing.md). uv does not read pip's configuration, though: the
find-links folders, index URLs and constraint files pip is given (``pip.conf``, ``PIP_*`` variables)
are read from ``pip config list`` and handed to it, so both take their packages from the same places.
On a machine whose CPU build of torch lies in a local folder, that is what keeps ``torch==2.13.0``
from resolving to the multi-GB CUDA build of the package index.

uv also takes a version's files from one index only, the first that has the version, where pip takes
the best file for this Python among all of them. Where a local mirror holds only ``multiprocess``
0.70's ``py310`` wheel (each a copy of one Python's ``multiprocessing``), uv installed it into Python
3.11, whose ``fork_exec`` takes other arguments, and the ``datasets`` map of axolotl's preprocessing
failed with ``TypeError: fork_exec() takes exactly 23 arguments (21 given)``. uv is therefore given
pip's main index (which holds every file) first: it then picks what pip picks. uv is looked for beside
the python running this, then on ``PATH``; ``make`` installs it into ``.venv`` first.

Usage: ``python tests/pip_install.py VENV_PYTHON [pip install arguments]``
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

# pip's configuration keys that say where packages come from, and uv's flag for each.
_SOURCES = {
    "index-url": "--index-url",
    "extra-index-url": "--extra-index-url",
    "find-links": "--find-links",
    "constraint": "--constraint",
}
_PIP = ["-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
_PYPI = "https://pypi.org/simple"


def pip_sources(config_list: str) -> list[str]:
    """uv's arguments for the sources in ``pip config list``'s output (``scope.key='value'`` lines).

    Values hold several entries separated by whitespace, as pip reads them; an entry given in two
    scopes is passed once. pip takes one index URL, the first scope's (the environment's), so
    only that one is passed, PyPI where none is set. It is also passed first of the extra index
    URLs: uv takes a version's files from the first index that has the version, and the main index
    holds all of them where the extra ones (local mirrors) may hold a few.
    """
    args: list[str] = []
    for line in config_list.splitlines():
        key, sep, value = line.partition("=")
        flag = _SOURCES.get(key.rsplit(".", 1)[-1].strip())
        if not sep or flag is None:
            continue
        for entry in value.strip().strip("'\"").split():
            taken = [args[i + 1] for i in range(0, len(args), 2) if args[i] == flag]
            if entry not in taken and not (flag == "--index-url" and taken):
                args += [flag, entry]
    main = next((args[i + 1] for i in range(0, len(args), 2) if args[i] == "--index-url"), _PYPI)
    if "--extra-index-url" not in args:
        return args
    first = args.index("--extra-index-url")
    return [*args[:first], "--extra-index-url", main, *args[first:]]


def find_uv() -> str | None:
    """uv beside this python or on ``PATH``; ``None`` (pip) where there is none or
    ``STEADYTUNE_INSTALLER=pip`` asks for pip."""
    if os.environ.get("STEADYTUNE_INSTALLER") == "pip":
        return None
    beside = Path(sys.executable).parent / "uv"
    return str(beside) if beside.exists() else shutil.which("uv")


def install_command(python: str, args: list[str], uv: str | None) -> list[str]:
    """The command that installs ``args`` (``pip install``'s arguments) into ``python``'s venv."""
    if uv is None:
        return [python, *_PIP, *args]
    config = subprocess.run(
        [python, "-m", "pip", "config", "list"], capture_output=True, text=True, check=False
    ).stdout
    # pip picks the best version among all its sources; uv's default stops at the first source that
    # has the package at all (a partial local index would then pin an old release). pip compiles each
    # module's bytecode as it installs, uv only when asked: without it, where PYTHONDONTWRITEBYTECODE is
    # set, every process compiled torch's and transformers' sources again (their import 17.5 s against 7.0).
    return [uv, "pip", "install", "--quiet", "--python", python, "--index-strategy", "unsafe-best-match",
            "--compile-bytecode", *pip_sources(config), *args]  # fmt: skip


def pip_install(python: str, args: list[str]) -> None:
    """Install ``args`` into ``python``'s venv; raises ``CalledProcessError`` when the install fails."""
    subprocess.run(install_command(python, args, find_uv()), check=True)


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    return subprocess.run(install_command(argv[0], argv[1:], find_uv()), check=False).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The environment that injects the guard into a child process (a tool's trainer).

Stdlib only: the supervisor (torch-free) calls :func:`inject_env`, and the child,
which may run in a virtualenv without steadytune's dependencies, imports this package.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Mapping
from pathlib import Path

from steadytune.secretfile import private_dir

RUN_ENV = "STEADYTUNE_INJECT_RUN"  # the run directory root; its presence switches injection on
ATTEMPT_ENV = "STEADYTUNE_ATTEMPT"  # the (re)start number, written into every record
SWITCH_ENV = "STEADYTUNE_INJECT"  # "off" (or 0/false/no) disables injection even when RUN_ENV is set
STARTUP_DIR = Path(__file__).resolve().parent / "startup"  # holds the sitecustomize.py the child runs
PACKAGE_DIR = Path(__file__).resolve().parents[1]  # the steadytune package itself

_METADATA = (".dist-info", ".egg-info", ".egg-link", ".pth")


def shim_home(environ: Mapping[str, str] | None = None) -> Path:
    """Where the package links live: ``$STEADYTUNE_CACHE/inject``, else ``~/.cache/steadytune/inject``."""
    environ = os.environ if environ is None else environ
    base = environ.get("STEADYTUNE_CACHE") or str(Path("~/.cache/steadytune").expanduser())
    return Path(base) / "inject"


def package_root(package_dir: Path = PACKAGE_DIR, home: Path | None = None) -> Path:
    """A folder to put on the child's ``PYTHONPATH`` from which ``import steadytune`` works.

    In a source checkout that is the folder above the package (``src/``). When steadytune is
    installed into a ``site-packages`` that holds other packages (torch, transformers...), that
    folder would shadow the tool's own: a private folder (mode 700, outside every run folder)
    holding only a link to the package is used instead. It comes ahead of the standard library
    on the trainer's path, so whoever could write it would run code in the trainer: it was in
    the run folder, where a planted ``json.py`` ran.
    """
    parent = package_dir.parent
    others = [
        p.name
        for p in parent.iterdir()
        if p.name not in {package_dir.name, "__pycache__"} and not p.name.endswith(_METADATA)
    ]
    if not others:
        return parent
    home = shim_home() if home is None else home
    private_dir(home, "the folder of steadytune's package links")
    key = hashlib.sha256(str(package_dir.resolve()).encode()).hexdigest()[:16]
    shim = home / key
    private_dir(shim, "the folder of steadytune's package link")
    link = shim / package_dir.name
    for entry in os.scandir(shim):  # the link alone: nothing else may come ahead of the stdlib
        if entry.name == package_dir.name and entry.is_symlink() and link.resolve() == package_dir.resolve():
            continue
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path)
        else:
            os.unlink(entry.path)
    if not link.is_symlink():
        try:
            link.symlink_to(package_dir.resolve(), target_is_directory=True)
        except FileExistsError:  # another supervisor made the same link meanwhile
            pass
    return shim


def inject_env(
    run_root: Path, attempt: int, env: Mapping[str, str], package_dir: Path = PACKAGE_DIR
) -> dict[str, str]:
    """Environment additions that give the child's HF ``Trainer`` the guard.

    Args:
        run_root: the run directory (``runs/<id>``); the guard writes ``telemetry/rank-N.jsonl`` there.
        attempt: the (re)start number of the child.
        env: the environment the child would get otherwise (its ``PYTHONPATH`` is kept, after ours).
        package_dir: the steadytune package to import in the child (injected for tests).

    Returns:
        ``PYTHONPATH``, ``STEADYTUNE_INJECT_RUN`` and ``STEADYTUNE_ATTEMPT``, to update ``env`` with.
    """
    ours = [str(STARTUP_DIR), str(package_root(package_dir))]
    theirs = env.get("PYTHONPATH")
    kept = [p for p in theirs.split(os.pathsep) if p not in ours] if theirs else []
    return {
        "PYTHONPATH": os.pathsep.join(ours + kept),
        RUN_ENV: str(Path(run_root).resolve()),
        ATTEMPT_ENV: str(int(attempt)),
    }

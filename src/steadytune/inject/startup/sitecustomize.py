"""steadytune's guard, injected into a training tool's own process.

``steadytune supervise --inject`` puts this folder first on the tool's ``PYTHONPATH``,
so Python runs this file at startup. With ``$STEADYTUNE_INJECT_RUN`` set it arranges
that, once ``transformers.trainer`` is imported, every HF ``Trainer`` carries the guard
(see :mod:`steadytune.inject.trainer`); nothing is imported before the program imports
it. Without the variable, or with ``STEADYTUNE_INJECT=off``, it does nothing.

It must never break the tool: any failure is one line on stderr and the tool runs as
it would without it. The ``sitecustomize`` this one shadows (one later on ``sys.path``)
still runs, after it.
"""

import os
import sys


def _install() -> None:
    if not os.environ.get("STEADYTUNE_INJECT_RUN"):
        return
    if os.environ.get("STEADYTUNE_INJECT", "").strip().lower() in {"0", "off", "false", "no"}:
        return
    try:
        from steadytune.inject.hook import when_imported
        from steadytune.inject.patch import patch_transformers_trainer

        when_imported("transformers.trainer", patch_transformers_trainer)
    except Exception as exc:
        print(f"steadytune: guard not injected: {type(exc).__name__}: {exc}", file=sys.stderr)


def _chain() -> None:
    """Run the ``sitecustomize`` Python would have run had this folder not come first."""
    here = os.path.dirname(os.path.abspath(__file__))
    positions = [i for i, p in enumerate(sys.path) if os.path.abspath(p or os.curdir) == here]
    if not positions:
        return
    me = sys.modules.pop(__name__, None)
    saved = sys.path[:]
    sys.path[:] = [p for i, p in enumerate(saved) if i not in positions]
    try:
        import sitecustomize  # noqa: F401  (the next one on sys.path, if any)
    except ModuleNotFoundError as exc:
        if exc.name != "sitecustomize":
            raise
    finally:
        # Put this folder back where it was; keep whatever the other one added.
        for i in positions:
            sys.path.insert(i, saved[i])
        if "sitecustomize" not in sys.modules and me is not None:
            sys.modules[__name__] = me


_install()
_chain()

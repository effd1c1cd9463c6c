"""The real-log development set, as the tests and benchmarks read it.

The logs are vendored gzipped under ``tests/assets/real-logs/`` (sources in its
SOURCES.tsv), so the real-log tests run on a clean clone with nothing beside it.
:func:`materialize` unpacks them once into a folder; ``$STEADYTUNE_REAL_LOGS``
points the tests at another labelled folder instead.
"""

from __future__ import annotations

import gzip
import os
import shutil
from pathlib import Path

VENDORED = Path(__file__).resolve().parent / "assets" / "real-logs"
SHARED = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "real-logs"


def labels_path() -> Path:
    """LABELS.tsv of the set the tests use (readable at collection time, before any unpacking)."""
    env = os.environ.get("STEADYTUNE_REAL_LOGS")
    return Path(env) / "LABELS.tsv" if env else VENDORED / "LABELS.tsv"


def materialize(dest: Path) -> Path:
    """A folder holding every log of the set, uncompressed; ``dest`` is filled when it is needed."""
    env = os.environ.get("STEADYTUNE_REAL_LOGS")
    if env:
        return Path(env)
    dest.mkdir(parents=True, exist_ok=True)
    for src in VENDORED.iterdir():
        if src.suffix == ".gz":
            out = dest / src.name[: -len(".gz")]
            if not out.exists():
                with gzip.open(src, "rb") as fin, open(out, "wb") as fout:
                    shutil.copyfileobj(fin, fout)
        else:
            shutil.copyfile(src, dest / src.name)
    return dest

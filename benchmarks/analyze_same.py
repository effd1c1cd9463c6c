"""Whether ``steadytune analyze --format json`` reports the same, byte for byte, on this code and another's.

    python benchmarks/analyze_same.py --baseline ../other-checkout/src [LOG ...]

Runs ``analyze --format json`` as a new process on every log of ``benchmarks/corpus/logs``, on the
real-log set of ``tests/assets/real-logs`` (unpacked, and as vendored: the gzipped copies are read
whole, the unpacked JSON-lines ones streamed), and on each ``LOG`` given (e.g. the 1M-step log
``benchmarks/scale.py`` writes), once with this checkout's ``src`` and once with ``--baseline``'s,
and compares the two reports. A change meant to make ``analyze`` cheaper must leave every one of
them as it was. Exit code 0 when all are the same, 1 when one differs (its first differing line is
printed).
"""

from __future__ import annotations

import argparse
import difflib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.realdata import VENDORED, materialize  # noqa: E402

_ENTRY = "import sys; from steadytune.cli.main import entrypoint; sys.exit(entrypoint())"


def report(src: Path, paths: list[str]) -> bytes:
    """The JSON report of one ``analyze`` process over ``paths`` on ``src``'s code."""
    env = {**os.environ, "PYTHONPATH": str(src), "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-c", _ENTRY, "analyze", "--format", "json", *paths]
    done = subprocess.run(cmd, env=env, capture_output=True, check=False)
    if done.returncode not in (0, 1):  # 1: a file has an anomaly or is unreadable
        sys.exit(f"analyze on {src} failed ({done.returncode}): {done.stderr.decode()[-2000:]}")
    return done.stdout


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--baseline", type=Path, required=True, help="the other checkout's src folder")
    p.add_argument("logs", nargs="*", help="more logs, each compared in a process of its own")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="steadytune-same-") as tmp:
        corpus = sorted(str(f) for f in (ROOT / "benchmarks" / "corpus" / "logs").iterdir())
        real = sorted(str(f) for f in materialize(Path(tmp)).iterdir())
        vendored = sorted(str(f) for f in VENDORED.iterdir() if f.suffix == ".gz")
        groups = [("corpus", corpus), ("real logs", real), ("real logs, gzipped", vendored)]
        groups += [(log, [log]) for log in args.logs]
        bad = 0
        for name, paths in groups:
            ours, theirs = report(ROOT / "src", paths), report(args.baseline, paths)
            same = ours == theirs
            print(f"{name}: {len(paths)} file(s), {len(ours):,} bytes: {'same' if same else 'DIFFERENT'}")
            if not same:
                bad += 1
                diff = difflib.unified_diff(
                    theirs.decode().splitlines(),
                    ours.decode().splitlines(),
                    "baseline",
                    "this",
                    n=2,
                    lineterm="",
                )
                print("\n".join(list(diff)[:40]))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

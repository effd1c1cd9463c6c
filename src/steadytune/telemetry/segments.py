"""Segments of a rotated JSONL stream: ``rank-0.jsonl`` goes on as ``rank-0.00001.jsonl.gz``, ...

A week-long run writes gigabytes of telemetry (~600 MB per million steps). Once a stream's
live file passes ``run.telemetry_segment_bytes``, its writer seals it as the next segment,
compresses that, and goes on in a fresh live file. Every reader
(:class:`~steadytune.telemetry.jsonl.JsonlReader`) reads the segments in order, then the live
file, as one stream.

Names, for the live file ``<stem>.jsonl``:

- ``<stem>.<n>.jsonl``: segment ``n`` (five digits or more, from 1), sealed, not compressed yet;
- ``<stem>.<n>.jsonl.gz``: the same segment, compressed;
- ``.<stem>.<n>.jsonl.gz.<random>.tmp``: a compression under way. No reader looks at it.

The rotation (:func:`seal`, then :func:`compress`), and what a crash at each moment leaves:

1. the live file is renamed to ``<stem>.<n>.jsonl`` (one atomic rename: the sealed segment
   holds exactly the lines the live file held) and the writer opens a fresh live file. A crash
   between the two leaves no live file, which a reader takes as an empty one;
2. the segment is gzipped into a temp name, fsync'd, checked, and renamed to ``.jsonl.gz``. A
   crash before the rename leaves a temp file nobody reads (removed when the stream's writer
   next opens), and the sealed segment, read as it is;
3. the plain segment is removed. A crash before that leaves both forms of segment ``n``: a
   reader takes the plain one and never both, since they are one segment under one number.

A reader trusts a ``.gz`` only once its whole stream has been inflated and its trailer (CRC and
length) checked; one that fails is reported in :data:`BAD_SEGMENTS` and the log, and skipped.
"""

from __future__ import annotations

import contextlib
import gzip
import logging
import os
import re
import shutil
import tempfile
import threading
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from steadytune.regularfile import open_regular
from steadytune.rundir import DEFAULT_SEGMENT_BYTES, MIN_SEGMENT_BYTES, fsync_dir

log = logging.getLogger(__name__)

SEGMENT_ENV = "STEADYTUNE_SEGMENT_BYTES"
GZIP_LEVEL = 6  # zlib's default: ~6-8x on our JSONL; 9 costs twice the CPU for a few percent
_DIGITS = 5


@dataclass(frozen=True)
class Segment:
    """One sealed segment of a stream: its number, and the form a reader should open."""

    number: int
    path: Path  # the plain form if it is there (it is whole: sealed by a rename), else the .gz

    @property
    def compressed(self) -> bool:
        return self.path.suffix == ".gz"


def _stem(live: Path) -> str:
    return live.name[: -len(".jsonl")] if live.name.endswith(".jsonl") else live.name


def segment_path(live: Path, number: int, gz: bool = False) -> Path:
    """Where segment ``number`` of the stream whose live file is ``live`` lives."""
    return live.with_name(f"{_stem(live)}.{number:0{_DIGITS}d}.jsonl{'.gz' if gz else ''}")


def _pattern(live: Path) -> re.Pattern[str]:
    return re.compile(rf"^{re.escape(_stem(live))}\.(\d{{{_DIGITS},}})\.jsonl(\.gz)?$")


def is_segment_name(name: str) -> bool:
    """Whether a file name is a segment of some stream (``rank-0.00003.jsonl.gz``), not a live file."""
    return re.search(rf"\.\d{{{_DIGITS},}}\.jsonl(\.gz)?$", name) is not None


def segments(live: Path) -> list[Segment]:
    """The sealed segments of a stream, oldest first (the plain form where both are there)."""
    pattern = _pattern(live)
    found: dict[int, Path] = {}
    try:
        names = os.listdir(live.parent)
    except OSError:
        return []
    for name in names:
        m = pattern.match(name)
        if m is None:
            continue
        n = int(m.group(1))
        if n not in found or not m.group(2):
            found[n] = live.parent / name
    return [Segment(n, found[n]) for n in sorted(found)]


def segment(live: Path, number: int) -> Segment | None:
    """Segment ``number`` of a stream if it is there (two ``stat`` calls; no listing)."""
    for gz in (False, True):
        p = segment_path(live, number, gz)
        if p.exists():
            return Segment(number, p)
    return None


def _is_temp(live: Path, name: str) -> bool:
    return name.startswith(f".{_stem(live)}.") and name.endswith(".tmp")


# ---- reading ------------------------------------------------------------------------------------

BAD_SEGMENTS: dict[Path, str] = {}  # a .gz that failed its check, and why: reported once, never read
_verified: dict[Path, tuple[int, int]] = {}  # a .gz whose check passed, by its (size, mtime)
_verify_lock = threading.Lock()


def _check_gzip(path: Path) -> str | None:
    """Why ``path`` is not a whole gzip stream (a bad CRC or length, a cut end); None when it is."""
    try:
        with open_regular(path, "rb") as raw, gzip.GzipFile(fileobj=raw, mode="rb") as f:
            while f.read(1 << 20):
                pass
    except (OSError, EOFError, zlib.error) as exc:  # BadGzipFile is an OSError
        return f"{type(exc).__name__}: {exc}"
    return None


def trusted(seg: Segment) -> bool:
    """Whether a reader may read ``seg``: a plain segment always; a .gz once its trailer checks out."""
    if not seg.compressed:
        return True
    try:
        st = seg.path.stat()
    except OSError:
        return False
    stamp = (st.st_size, st.st_mtime_ns)
    with _verify_lock:
        if _verified.get(seg.path) == stamp:
            return True
    problem = _check_gzip(seg.path)
    with _verify_lock:
        if problem is None:
            if len(_verified) > 4096:
                _verified.clear()
            _verified[seg.path] = stamp
            BAD_SEGMENTS.pop(seg.path, None)
            return True
        if BAD_SEGMENTS.get(seg.path) != problem:
            log.error(
                "telemetry segment %s is damaged (%s): its lines are left out, not trusted", seg.path, problem
            )
        BAD_SEGMENTS[seg.path] = problem
    return False


@contextlib.contextmanager
def open_segment(seg: Segment) -> Iterator[IO[bytes]]:
    """The segment's bytes as one file (inflated on the fly for a .gz; seeking forward is allowed)."""
    with open_regular(seg.path, "rb") as raw:
        if seg.compressed:
            with gzip.GzipFile(fileobj=raw, mode="rb") as f:
                yield f  # type: ignore[misc]
        else:
            yield raw


# ---- writing ------------------------------------------------------------------------------------


def seal(live: Path) -> Path:
    """Rename the live file to the stream's next segment number; the sealed segment's path.

    Only the file's writer calls this, between two of its lines, and then opens a fresh live
    file: a rename by anyone else would leave the writer appending to the sealed segment.
    """
    existing = segments(live)
    sealed = segment_path(live, (existing[-1].number if existing else 0) + 1)
    os.rename(live, sealed)
    fsync_dir(live.parent)
    return sealed


def compress(sealed: Path, level: int = GZIP_LEVEL) -> Path | None:
    """Turn a sealed plain segment into its ``.gz`` (temp name, fsync, check, rename, then drop the plain).

    Returns the .gz, or None when the plain segment is gone (another process compressed it) or
    the compression failed (the plain segment is then left, and read as it is).
    """
    gz = sealed.with_name(sealed.name + ".gz")
    fd, tmp = tempfile.mkstemp(prefix=f".{gz.name}.", suffix=".tmp", dir=sealed.parent)
    try:
        with os.fdopen(fd, "wb") as raw:
            with (
                open(sealed, "rb") as src,
                gzip.GzipFile(filename="", mode="wb", compresslevel=level, fileobj=raw, mtime=0) as z,
            ):
                shutil.copyfileobj(src, z, 1 << 20)
            raw.flush()
            os.fsync(raw.fileno())
        problem = _check_gzip(Path(tmp))
        if problem is not None:
            raise OSError(f"the compressed copy does not read back ({problem})")
        os.replace(tmp, gz)
        fsync_dir(sealed.parent)
    except FileNotFoundError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        return None
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        log.warning("could not compress telemetry segment %s (%s): it stays as it is", sealed, exc)
        return None
    with contextlib.suppress(FileNotFoundError):
        os.unlink(sealed)
    fsync_dir(sealed.parent)
    return gz


def finish(live: Path) -> list[Path]:
    """What a crash mid-rotation left of a stream, put right: temp files removed, plain segments compressed.

    The stream's writer calls it when it opens the stream (a new attempt of the worker, a new
    supervisor). Returns the segments compressed.
    """
    with contextlib.suppress(OSError):
        for entry in os.scandir(live.parent):
            if _is_temp(live, entry.name):
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)
    done = []
    for seg in segments(live):
        if not seg.compressed:
            gz = compress(seg.path)
            if gz is not None:
                done.append(gz)
    return done


def segment_bytes_from_env(env: dict[str, str] | None = None) -> int:
    """The rotation size the supervisor handed its worker (``$STEADYTUNE_SEGMENT_BYTES``), else the default.

    0 turns rotation off. A value that is not a whole number is ignored for the default: the
    supervisor validated the config that set it, so only a hand-set variable can be wrong.
    """
    raw = (os.environ if env is None else env).get(SEGMENT_ENV, "")
    try:
        value = int(raw)
    except ValueError:
        return DEFAULT_SEGMENT_BYTES
    return 0 if value <= 0 else max(MIN_SEGMENT_BYTES, value)

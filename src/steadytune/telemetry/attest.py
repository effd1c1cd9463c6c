"""What makes ``events.jsonl`` evidence: a key that signs it and an anchor that pins its end.

The hash chain alone proves nothing against someone who can write the run folder:
sha256 is public, so they can edit an entry, recompute every hash after it, update
``run.db`` and the chain is whole again; or cut the tail off and delete ``run.db``.
Two things kept *outside* the run folder close that:

- **The audit key** (``audit.key``, 32 random bytes as hex, mode 600, created on
  first use). Every entry also carries ``mac = HMAC-SHA256(key, hash)``; without the
  key no one can make an edited (or invented) entry whose MAC checks.
- **The anchor**: after every append the event log writes its head (``seq`` and
  ``hash`` of the last entry, MACed too) to
  ``anchors/<run-id>/<hash of the first entry>.json``. A log that no longer reaches
  its anchor lost its tail; a log with no anchor was not written here (or its
  anchor was removed) and fails unless the verifier is told to accept that.

Both live in one directory: ``$STEADYTUNE_AUDIT_DIR``, else
``$XDG_CONFIG_HOME/steadytune`` (``~/.config/steadytune``). ``steadytune audit verify``
reads the same directory (or ``--audit-dir``).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import secrets
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from steadytune.rundir import atomic_write_text
from steadytune.secretfile import InsecureSecretFile, read_secret_file

ENV_DIR = "STEADYTUNE_AUDIT_DIR"
KEY_FILE = "audit.key"
ANCHORS = "anchors"


class AuditKeyError(RuntimeError):
    """The audit key cannot be read or made; the message says which file and why."""


def audit_dir(environ: Mapping[str, str] | None = None) -> Path:
    """Where the audit key and the anchors live."""
    environ = os.environ if environ is None else environ
    if environ.get(ENV_DIR):
        return Path(environ[ENV_DIR]).expanduser()
    base = environ.get("XDG_CONFIG_HOME") or str(Path("~/.config").expanduser())
    return Path(base) / "steadytune"


def _make_key(path: Path) -> None:
    path.parent.parent.mkdir(parents=True, exist_ok=True)
    path.parent.mkdir(exist_ok=True, mode=0o700)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return  # another process made it first: use that one
    with os.fdopen(fd, "w", encoding="ascii") as f:
        f.write(secrets.token_hex(32) + "\n")
        f.flush()
        os.fsync(f.fileno())


def load_key(path: Path, create: bool = False) -> bytes | None:
    """The key in ``path``; made (mode 600) when absent and ``create``, else ``None`` when absent."""
    if create and not path.exists():
        try:
            _make_key(path)
        except OSError as exc:
            raise AuditKeyError(f"cannot create the audit key {path}: {exc.strerror}") from exc
    try:
        text = read_secret_file(path)
    except FileNotFoundError:
        return None
    except InsecureSecretFile as exc:
        raise AuditKeyError(f"audit key: {exc}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise AuditKeyError(f"cannot read the audit key {path}: {exc}") from exc
    if len(text) < 32:
        raise AuditKeyError(f"the audit key {path} is too short ({len(text)} characters, 32 at least)")
    return text.encode("utf-8")


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", name)[:128] or "_"


@dataclass(frozen=True)
class Anchor:
    """The head of one run's event log, as its writer last recorded it."""

    run_id: str
    genesis: str  # hash of the log's first entry (seq 0): names the log
    seq: int
    hash: str
    key_id: str | None = None
    mac: str | None = None
    log: str = ""  # where the log was, for people
    ts: float = 0.0

    def signed_part(self) -> bytes:
        body = {"run_id": self.run_id, "genesis": self.genesis, "seq": self.seq, "hash": self.hash}
        return json.dumps(body, sort_keys=True, separators=(",", ":")).encode("utf-8")


class AuditTrust:
    """The audit key (if any) and the anchors of one audit directory."""

    def __init__(self, directory: Path, key: bytes | None) -> None:
        self.directory = Path(directory)
        self.key = key

    @classmethod
    def open(cls, directory: Path | None = None, create: bool = False) -> AuditTrust:
        """The trust of ``directory`` (default :func:`audit_dir`); ``create`` makes the key if absent."""
        directory = audit_dir() if directory is None else Path(directory)
        return cls(directory, load_key(directory / KEY_FILE, create=create))

    @property
    def key_path(self) -> Path:
        return self.directory / KEY_FILE

    @property
    def key_id(self) -> str | None:
        """A short public name of the key (not the key): tells two keys apart in messages."""
        if self.key is None:
            return None
        return hashlib.sha256(b"steadytune audit key id\0" + self.key).hexdigest()[:16]

    def _mac(self, data: bytes) -> str:
        assert self.key is not None
        return hmac.new(self.key, data, hashlib.sha256).hexdigest()

    def sign(self, entry_hash: str) -> str:
        """The MAC of an entry (of its hash, which covers its content and the previous hash)."""
        return self._mac(entry_hash.encode("ascii"))

    def mac_ok(self, entry_hash: str, mac: object) -> bool:
        return isinstance(mac, str) and hmac.compare_digest(self.sign(entry_hash), mac)

    # ---- anchors ---------------------------------------------------------------------

    def anchor_path(self, run_id: str, genesis: str) -> Path:
        return self.directory / ANCHORS / _safe(run_id) / f"{_safe(genesis)[:64]}.json"

    def write_anchor(self, run_id: str, genesis: str, seq: int, head: str, log: Path | str = "") -> Path:
        anchor = Anchor(run_id, genesis, seq, head, key_id=self.key_id, log=str(log), ts=time.time())
        if self.key is not None:
            anchor = Anchor(**{**asdict(anchor), "mac": self._mac(anchor.signed_part())})
        path = self.anchor_path(run_id, genesis)
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        for d in (path.parent.parent, path.parent):  # mkdir's mode would reach the last one only
            d.mkdir(exist_ok=True, mode=0o700)
        atomic_write_text(path, json.dumps(asdict(anchor), indent=1) + "\n")
        return path

    def read_anchor(self, run_id: str, genesis: str) -> tuple[Anchor | None, str]:
        """The anchor of a log, or ``None`` with why: ``""`` when there is none."""
        path = self.anchor_path(run_id, genesis)
        try:
            raw: Any = json.loads(path.read_text(encoding="utf-8"))
            anchor = Anchor(
                run_id=str(raw["run_id"]),
                genesis=str(raw["genesis"]),
                seq=int(raw["seq"]),
                hash=str(raw["hash"]),
                key_id=raw.get("key_id"),
                mac=raw.get("mac"),
                log=str(raw.get("log", "")),
                ts=float(raw.get("ts", 0.0)),
            )
        except FileNotFoundError:
            return None, ""
        except (OSError, ValueError, KeyError, TypeError) as exc:
            return None, f"the anchor {path} cannot be read ({exc})"
        if (anchor.run_id, anchor.genesis) != (run_id, genesis):
            return None, f"the anchor {path} names another log ({anchor.run_id}, {anchor.genesis[:12]}…)"
        return anchor, ""

    def anchor_mac_ok(self, anchor: Anchor) -> bool:
        return isinstance(anchor.mac, str) and hmac.compare_digest(
            self._mac(anchor.signed_part()), anchor.mac
        )

    def anchors_of(self, run_id: str) -> list[Path]:
        """Every anchor kept for a run id (several runs may share one id)."""
        return sorted((self.directory / ANCHORS / _safe(run_id)).glob("*.json"))

"""The one vocabulary of steadytune: every record that flows between the parts.

Records are frozen dataclasses. They are serialized in exactly one place
(:func:`to_json` / :func:`from_json`), as one JSON object per line with a ``type``
tag, so the JSONL files of a run directory are the truth and the fixtures alike.

This module imports nothing heavy: the supervisor, detectors, policy, store and
web all depend on it.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

Severity = Literal["info", "warning", "critical"]
EventKind = Literal["anomaly", "resolved", "action", "alert", "lifecycle", "control"]

SEVERITY_ORDER: dict[str, int] = {"info": 0, "warning": 1, "critical": 2}
# The largest step number any reader takes: exact as a float (the detectors fit lines through
# steps) and within SQLite's INTEGER. A log that claims more (a 400-digit step ended `analyze` in
# OverflowError) is damaged there, and that record is left out.
MAX_STEP = 2**53


@dataclass(frozen=True)
class BatchFingerprint:
    """Which samples made up an optimizer step, and what they contained.

    ``indices`` are dataset row ids; ``hashes`` are short content hashes of the
    tokenized samples, so a later reader can tell whether the dataset changed.
    """

    indices: tuple[int, ...] = ()
    hashes: tuple[str, ...] = ()


@dataclass(frozen=True)
class StepRecord:
    """One optimizer step, as seen by one rank of the worker."""

    step: int
    ts: float
    rank: int = 0
    attempt: int = 0
    loss: float | None = None
    grad_norm: float | None = None
    lr: float | None = None
    tokens: int | None = None
    samples: int | None = None
    step_time_s: float | None = None
    epoch: float | None = None
    mem_allocated_bytes: int | None = None
    mem_reserved_bytes: int | None = None
    mem_peak_bytes: int | None = None
    rss_bytes: int | None = None
    eval_loss: float | None = None
    skipped: bool = False
    batch: BatchFingerprint | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def tokens_per_s(self) -> float | None:
        if self.tokens is None or not self.step_time_s:
            return None
        return self.tokens / self.step_time_s


# The keys of an HF-style log dict (``{'loss': 1.2, 'grad_norm': 3.4, 'learning_rate': 2e-05}``) that a
# StepRecord holds in fields of its own (``num_tokens``, a running count, becomes its ``tokens``); every
# other number a trainer logs rides in its ``extra`` (DPO's rewards/margins, GRPO's reward and kl: the
# detectors judge such runs by them). The log adapter and the guard inside a trainer both file a log so.
RECORD_LOG_KEYS = frozenset(
    {"loss", "grad_norm", "learning_rate", "lr", "epoch", "eval_loss", "num_tokens", "total_steps"}
)


def logged_extra(logs: dict[str, Any]) -> dict[str, Any]:
    """The numbers of a trainer's log dict that a :class:`StepRecord` has no field for: its ``extra``."""
    return {
        k: v
        for k, v in logs.items()
        if k not in RECORD_LOG_KEYS and isinstance(v, (int, float)) and not isinstance(v, bool)
    }


@dataclass(frozen=True)
class Heartbeat:
    """Proof of life from a worker rank; ``phase`` says what it is doing."""

    ts: float
    rank: int = 0
    step: int = 0
    pid: int = 0
    attempt: int = 0
    phase: str = "train"


@dataclass(frozen=True)
class WorkerExit:
    """The last words of a worker: written just before it exits on its own."""

    ts: float
    rank: int = 0
    attempt: int = 0
    step: int = 0
    status: Literal["completed", "stopped", "paused", "error"] = "completed"
    error_type: str | None = None
    error_message: str | None = None
    traceback_tail: str | None = None
    deterministic: bool = False


@dataclass(frozen=True)
class GpuSample:
    """One GPU at one moment. A reading that is unavailable is ``None``."""

    index: int
    name: str = ""
    util_ratio: float | None = None
    mem_used_bytes: int | None = None
    mem_total_bytes: int | None = None
    temperature_c: float | None = None
    power_w: float | None = None
    ecc_errors: int | None = None
    xid_errors: int | None = None


@dataclass(frozen=True)
class SystemSample:
    """The host at one moment (CPU, RAM, disk of the run directory, GPUs)."""

    ts: float
    cpu_ratio: float | None = None
    ram_used_bytes: int | None = None
    ram_total_bytes: int | None = None
    disk_free_bytes: int | None = None
    disk_total_bytes: int | None = None
    worker_rss_bytes: int | None = None
    gpus: tuple[GpuSample, ...] = ()


@dataclass(frozen=True)
class Anomaly:
    """Something a detector found, with the evidence and what to do about it.

    One *episode* (detect/episodes.py): ``count`` is how many times its condition fired
    (a firing that comes back soon after it cleared is the same episode), ``peak`` the
    most extreme value its evidence reported. Records written before episodes read as
    one firing with no peak.
    """

    kind: str
    severity: Severity
    start_step: int
    end_step: int
    metric: str
    evidence: dict[str, Any] = field(default_factory=dict)
    cause: str = ""
    suggestion: str = ""
    rank: int | None = None
    count: int = 1
    peak: float | None = None

    @property
    def key(self) -> tuple[str, str, int | None]:
        """Identity for raise-once/resolve-once bookkeeping."""
        return (self.kind, self.metric, self.rank)


@dataclass(frozen=True)
class Event:
    """An entry of ``events.jsonl``: an anomaly, action, alert, lifecycle or control.

    ``name`` is the anomaly kind, action name or lifecycle phase. The audit
    fields (``seq``, ``prev_hash``, ``hash``, ``mac``, ``run_id``, ``host``,
    ``user``, ``pid``) are filled in by the event log when the event is appended.
    """

    ts: float
    kind: EventKind
    name: str
    message: str = ""
    severity: Severity = "info"
    step: int | None = None
    data: dict[str, Any] = field(default_factory=dict)
    seq: int | None = None
    run_id: str | None = None
    host: str | None = None
    user: str | None = None
    pid: int | None = None
    prev_hash: str | None = None
    hash: str | None = None
    mac: str | None = None  # HMAC of ``hash`` with the audit key (see telemetry/attest.py)


# The lifecycle steps that end a run: the supervisor files one of them, its last word on the run.
RUN_END_NAMES = frozenset({"run_completed", "run_failed", "run_stopped"})


def is_run_end(event: Event) -> bool:
    """Whether ``event`` is the supervisor's end of the run (not an alert that tells of it).

    An alert's delivery record is an ``alert`` event under the name of the event it tells of
    (``run_stopped``), filed when its delivery ends: after the run's end, often the log's last
    line. Only the kind tells the two apart.
    """
    return event.kind == "lifecycle" and event.name in RUN_END_NAMES


def run_end(events: Iterable[Event]) -> Event | None:
    """The event that ended the run (the last one where a run was resumed after an end), or
    None while it runs. The one way to ask for it: never the log's last event."""
    found = None
    for e in events:
        if is_run_end(e):
            found = e
    return found


def grew_out_of(data: Any) -> list[tuple[str, str]]:
    """The (kind, metric) of the episodes an anomaly event's episode grew out of (a spike that became
    an explosion: its ``data.grew_out_of``), which are that one episode now; none for any other."""
    parts = data.get("grew_out_of") if isinstance(data, dict) else None
    if not isinstance(parts, list):
        return []
    return [(str(p[0]), str(p[1] or "")) for p in parts if isinstance(p, list) and len(p) == 2]


@dataclass(frozen=True)
class PlanRevision:
    """How the worker is to be (re)started. One per start, each naming its cause."""

    revision: int
    ts: float
    reason: str
    attempt: int = 0
    cause_event_seq: int | None = None
    per_device_train_batch_size: int | None = None
    gradient_accumulation_steps: int | None = None
    micro_batch_split: int = 1
    lr_scale: float = 1.0
    # The effective LR of each configured optimizer group (train.lr_groups, LoRA+), before
    # layer decay, rollbacks included; empty when the run has one group.
    lr_groups: tuple[tuple[str, float], ...] = ()
    skip_ranges: tuple[tuple[int, int], ...] = ()
    # The optimizer steps whose samples skip_ranges holds (inclusive, merged): what a person reads.
    skip_steps: tuple[tuple[int, int], ...] = ()
    resume_checkpoint: str | None = None
    gradient_checkpointing: bool | None = None
    max_seq_length: int | None = None
    # Set by autoscaling (scale: in the config): the processes (GPUs) and input workers of the attempt;
    # None keeps the config's run.nproc_per_node and train.dataloader_num_workers.
    nproc_per_node: int | None = None
    dataloader_num_workers: int | None = None
    world_size: int | None = None  # training processes, where the engine sizes the job itself (Ray)
    notes: str = ""


Record = StepRecord | Heartbeat | WorkerExit | SystemSample | Event | PlanRevision | Anomaly

_TYPES: dict[str, type] = {
    "step": StepRecord,
    "heartbeat": Heartbeat,
    "exit": WorkerExit,
    "system": SystemSample,
    "event": Event,
    "plan": PlanRevision,
    "anomaly": Anomaly,
}
_TAGS: dict[type, str] = {cls: tag for tag, cls in _TYPES.items()}
_NESTED: dict[tuple[type, str], type] = {
    (StepRecord, "batch"): BatchFingerprint,
    (SystemSample, "gpus"): GpuSample,
}


# JSON has no NaN/Inf: they travel as these strings, so a NaN loss survives a round trip.
NONFINITE_TEXT: dict[str, float] = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def nonfinite_text(value: float) -> float | str:
    """``value`` as JSON can carry it: NaN/Inf as ``"nan"``/``"inf"``/``"-inf"``, a finite float unchanged."""
    if math.isfinite(value):
        return value
    return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")


def json_safe(value: Any, nonfinite: Callable[[float], Any] = nonfinite_text) -> Any:
    """``value`` with every NaN/Inf float, however deep, replaced by ``nonfinite(x)``.

    Files keep them as text (the default, so they read back); the dashboard's API sends
    ``None`` (a gap the charts leave undrawn): one walk, two spellings.
    """
    if isinstance(value, float) and not math.isfinite(value):
        return nonfinite(value)
    if isinstance(value, dict):
        return {k: json_safe(v, nonfinite) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v, nonfinite) for v in value]
    return value


def _float_fields(cls: type) -> frozenset[str]:
    return frozenset(
        f.name for f in dataclasses.fields(cls) if "float" in str(f.type) and "str" not in str(f.type)
    )


_FLOAT_FIELDS: dict[type, frozenset[str]] = {cls: _float_fields(cls) for cls in _TYPES.values()}


_FIELD_NAMES: dict[type, tuple[str, ...]] = {
    cls: tuple(f.name for f in dataclasses.fields(cls))
    for cls in (*_TYPES.values(), BatchFingerprint, GpuSample)
}


def _plain(value: Any) -> Any:
    """``dataclasses.asdict`` and :func:`json_safe` in one pass, without asdict's deep copies.

    The worker serializes a record at every step; asdict copied each value on the way and
    was most of that cost.
    """
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else json_safe(value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    names = _FIELD_NAMES.get(type(value))
    if names is not None:
        return {name: _plain(getattr(value, name)) for name in names}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return json_safe(dataclasses.asdict(value))
    return value


def to_dict(record: Record) -> dict[str, Any]:
    """A record as a plain, JSON-safe dict with its ``type`` tag first."""
    out: dict[str, Any] = {"type": _TAGS[type(record)]}
    for name in _FIELD_NAMES[type(record)]:
        value = getattr(record, name)
        if value is not None:
            out[name] = _plain(value)
    return out


_HEADS: dict[type, str] = {cls: '{"type":' + json.dumps(tag) for cls, tag in _TAGS.items()}
_KEYS: dict[type, tuple[tuple[str, str], ...]] = {
    cls: tuple((name, json.dumps(name) + ":") for name in names) for cls, names in _FIELD_NAMES.items()
}
_encode_str: Callable[[str], str] = json.encoder.encode_basestring_ascii


def _text(value: Any) -> str:
    """``json.dumps(_plain(value))``'s text, spelled directly for the shapes records hold."""
    kind = type(value)
    if value is None:
        return "null"
    if kind is bool:
        return "true" if value else "false"
    if kind is int:
        return int.__repr__(value)
    if kind is float:
        return float.__repr__(value) if math.isfinite(value) else _encode_str(str(nonfinite_text(value)))
    if kind is str:
        return _encode_str(value)
    if kind is list or kind is tuple:
        return "[" + ",".join([_text(v) for v in value]) + "]"
    if kind is dict and all(type(k) is str for k in value):
        return "{" + ",".join([_encode_str(k) + ":" + _text(v) for k, v in value.items()]) + "}"
    keys = _KEYS.get(kind)
    if keys is not None:  # a nested record keeps its None fields, as _plain does
        return "{" + ",".join([key + _text(getattr(value, name)) for name, key in keys]) + "}"
    return json.dumps(_plain(value), separators=(",", ":"))  # anything rarer: json's own rules


def to_json(record: Record) -> str:
    """One line of JSONL for ``record`` (no trailing newline): ``json.dumps(to_dict(record))``'s text.

    The worker writes one at every step, right after the step's compute has pushed the
    interpreter out of the CPU's caches: there every line of Python run costs about ten
    times its warm price, and ``json.dumps`` (a new encoder per call, the walk of a fresh
    dict built for it) was most of the step record's cost. The text is spelled here
    directly instead; a test holds it to ``json.dumps``'s, byte for byte.
    """
    parts = [_HEADS[type(record)]]
    for name, key in _KEYS[type(record)]:
        value = getattr(record, name)
        if value is not None:
            parts.append(key + _text(value))
    return ",".join(parts) + "}"


# The head :func:`to_json` gives a step record whose ts and rank are set: what a look for each step's
# latest attempt needs, read without parsing the line (its batch, its gradient flow).
_STEP_HEAD = re.compile(rb'\{"type":"step","step":(-?\d+),"ts":[-+.\deE]+,"rank":-?\d+,"attempt":(-?\d+),')
_ANY_HEAD = re.compile(rb'\{"type":"([a-z_]+)",')


def step_head(raw: bytes) -> tuple[int, int] | tuple[()] | None:
    """A JSONL line's ``(step, attempt)`` if it is a step record as :func:`to_json` writes it and no
    eval; ``()`` if it surely is no step record (another record's head); None: parse it to know.

    Only a line with one ``"type"`` key is read this way: a torn line with the next one written onto
    its end is not JSON, and is left to the parser to refuse.
    """
    if raw.count(b'"type":') != 1 or b'"eval"' in raw:
        return None
    m = _STEP_HEAD.match(raw)
    if m is not None:
        step = int(m[1])
        return (step, int(m[2])) if valid_step(step) else None
    other = _ANY_HEAD.match(raw)
    if other is not None and other[1] != b"step" and raw.endswith(b"}"):
        return ()
    return None


def _in_float_range(value: int) -> float | int:
    """``value``, or ±inf past a float's range: a 400-digit loss has no float, and the detectors need one."""
    if -sys.float_info.max <= value <= sys.float_info.max:
        return value
    return math.inf if value > 0 else -math.inf


def valid_step(step: Any) -> bool:
    """Whether ``step`` is a step number: an integer no larger than :data:`MAX_STEP` either way."""
    return type(step) is int and -MAX_STEP <= step <= MAX_STEP


# How each field of each record class is read back: one look-up a key, where each key was tested
# against every special case (and the class's fields listed anew) for every record the supervisor read.
_PLAIN, _STEP, _FLOAT, _EPOCH, _EXTRA, _BATCH, _GPUS, _PAIRS, _LR_GROUPS = range(9)


def _field_kinds(cls: type) -> dict[str, int]:
    floats = _FLOAT_FIELDS.get(cls, frozenset())
    kinds: dict[str, int] = {}
    for name in _FIELD_NAMES[cls]:
        nested = _NESTED.get((cls, name))
        if name == "step":
            kinds[name] = _STEP
        elif name in floats:
            kinds[name] = _EPOCH if name == "epoch" else _FLOAT
        elif name == "extra":
            kinds[name] = _EXTRA
        elif nested is BatchFingerprint:
            kinds[name] = _BATCH
        elif nested is GpuSample:
            kinds[name] = _GPUS
        elif cls is PlanRevision and name in ("skip_ranges", "skip_steps"):
            kinds[name] = _PAIRS
        elif cls is PlanRevision and name == "lr_groups":
            kinds[name] = _LR_GROUPS
        else:
            kinds[name] = _PLAIN
    return kinds


_KINDS: dict[type, dict[str, int]] = {cls: _field_kinds(cls) for cls in _FIELD_NAMES}


def _float_value(value: Any) -> Any:
    if type(value) is str:
        return NONFINITE_TEXT.get(value, value)
    if type(value) is int:
        return _in_float_range(value)
    return value


def _build(cls: type, data: dict[str, Any]) -> Any:
    kinds = _KINDS[cls]
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        kind = kinds.get(key)
        if kind is None:
            continue  # forward compatibility: newer writers may add fields
        if kind == _PLAIN:
            pass
        elif kind == _FLOAT:
            value = _float_value(value)
        elif kind == _STEP:
            if value is not None and not valid_step(value):
                raise ValueError(f"step {str(value)[:40]!r} is not an integer within ±{MAX_STEP}")
        elif kind == _EPOCH:
            value = _float_value(value)
            if isinstance(value, float) and not math.isfinite(value):
                value = None  # an infinite epoch says nothing of where the data is (and int() of it raises)
        elif kind == _EXTRA:
            if isinstance(value, dict):
                value = {k: _in_float_range(v) if type(v) is int else v for k, v in value.items()}
        elif kind == _BATCH:
            if isinstance(value, dict):
                value = BatchFingerprint(
                    indices=tuple(value.get("indices", ())), hashes=tuple(value.get("hashes", ()))
                )
        elif kind == _GPUS:
            if isinstance(value, list):
                value = tuple(_build(GpuSample, g) for g in value)
        elif kind == _PAIRS:
            value = tuple((int(a), int(b)) for a, b in value)
        else:  # _LR_GROUPS
            value = tuple((str(n), float(lr)) for n, lr in value)
        kwargs[key] = value
    return cls(**kwargs)


def from_dict(data: dict[str, Any]) -> Record:
    """The record a :func:`to_dict` dict stands for. Raises ``ValueError`` on an unknown type."""
    tag = data.get("type")
    cls = _TYPES.get(tag)  # type: ignore[arg-type]
    if cls is None:
        raise ValueError(f"unknown record type {tag!r}; expected one of {sorted(_TYPES)}")
    return _build(cls, data)


def from_json(line: str) -> Record:
    """Parse one JSONL line written by :func:`to_json`."""
    return from_dict(json.loads(line))


def replace(record: Any, **changes: Any) -> Any:
    """A copy of a frozen record with some fields changed."""
    return dataclasses.replace(record, **changes)

"""Property tests for the parsers of files other tools or users write: whatever the input,
they answer with a value or their documented error, never a crash or a wrong acceptance."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from steadytune.checkpoint.manifest import MANIFEST, ManifestError, load_manifest
from steadytune.config.load import ConfigError, apply_overrides
from steadytune.importers import UnreadableLog, load, parse_number
from steadytune.records import from_dict
from steadytune.telemetry.jsonl import JsonlReader

FAST = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
json_scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20)
json_values = st.recursive(
    json_scalars,
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4),
    max_leaves=12,
)


@FAST
@given(st.one_of(st.text(max_size=30), json_scalars))
def test_parse_number_returns_a_float_or_none(raw: object) -> None:
    value = parse_number(raw)
    assert value is None or isinstance(value, float)


@FAST
@given(st.dictionaries(st.text(max_size=12), json_values, max_size=8))
def test_records_from_any_dict_are_a_record_or_a_named_error(data: dict) -> None:
    try:
        from_dict(data)
    except (ValueError, TypeError):
        pass


@FAST
@given(st.lists(st.binary(max_size=60), max_size=20))
def test_the_jsonl_reader_never_fails_and_yields_only_objects(
    tmp_path_factory: pytest.TempPathFactory, lines
) -> None:
    path = tmp_path_factory.mktemp("jsonl") / "f.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    reader = JsonlReader(path, max_line_bytes=40)
    assert all(isinstance(d, dict) for d in reader.read_dicts())
    assert reader.offset == path.stat().st_size


steps = st.lists(
    st.tuples(st.integers(0, 10**6), st.floats(allow_nan=True, allow_infinity=True, width=32)),
    min_size=3,
    max_size=30,
)


@FAST
@given(steps)
def test_a_text_log_gives_back_the_steps_and_losses_it_was_written_with(
    tmp_path_factory: pytest.TempPathFactory, rows
) -> None:
    rows = sorted({s: v for s, v in rows}.items())
    if len(rows) < 3:
        return
    path = tmp_path_factory.mktemp("text") / "train.log"
    path.write_text("".join(f"[rank0]: step {s} | loss {v!r} | lr 1e-4\n" for s, v in rows))
    series = load(path)
    got = {r.step: r.loss for r in series.records}
    for s, v in rows:
        assert s in got
        value = got[s]
        assert (math.isnan(v) and value is not None and math.isnan(value)) or value == pytest.approx(
            v, rel=1e-6
        )


@FAST
@given(st.text(max_size=200))
def test_any_text_is_a_log_or_an_unreadable_log(tmp_path_factory: pytest.TempPathFactory, text: str) -> None:
    path = tmp_path_factory.mktemp("any") / "notes.txt"
    path.write_text(text)
    try:
        series = load(path)
    except UnreadableLog as e:
        assert str(e) and "\n" not in str(e)
    else:
        assert series.records


names = st.one_of(
    st.text(min_size=1, max_size=12),
    st.builds(
        lambda a, b: f"{a}/{b}", st.sampled_from(["..", ".", "/etc", "a", "", "sub"]), st.text(max_size=6)
    ),
    st.sampled_from(["/etc/shadow", "../../etc/shadow", "a/../../b", "a\\..\\b", "C:\\x", "ok.bin", "\x00"]),
)


@FAST
@given(st.dictionaries(names, st.integers(0, 10), max_size=5))
def test_a_manifest_never_accepts_a_path_outside_its_checkpoint(
    tmp_path_factory: pytest.TempPathFactory, files: dict
) -> None:
    ckpt = tmp_path_factory.mktemp("ckpt") / "checkpoint-1"
    ckpt.mkdir()
    entries = {name: {"size": size, "sha256": "0" * 64} for name, size in files.items()}
    (ckpt / MANIFEST).write_text(json.dumps({"files": entries, "step": 1}))
    try:
        manifest = load_manifest(ckpt)
    except ManifestError:
        return
    root = ckpt.resolve()
    for name in manifest.files:
        assert (ckpt / name).resolve().is_relative_to(root), name


override_values = st.one_of(st.integers(), st.floats(allow_nan=False), st.text(max_size=10), st.booleans())
keys = st.lists(
    st.sampled_from(["train", "max_steps", "detect", "loss", "spike_z", "x", "", "a.b"]),
    min_size=1,
    max_size=3,
)


@FAST
@given(
    st.lists(st.builds(lambda k, v: f"{'.'.join(k)}={v}", keys, override_values), max_size=4),
    st.lists(st.text(max_size=12), max_size=2),
)
def test_config_overrides_are_applied_or_refused_with_the_key(overrides: list, junk: list) -> None:
    base = {"model": {"name_or_path": "m"}, "data": {"train_file": "t.jsonl"}, "train": {"max_steps": 5}}
    try:
        out = apply_overrides(base, overrides + junk)
    except ConfigError as e:
        assert e.issues and all(i.key for i in e.issues)
    else:
        assert isinstance(out, dict) and out is not base


@pytest.mark.parametrize(
    "text", ["x=@", "train.max_steps=[", "x=!!python/object:os.system ls", "x=*a", "=1", "a..b=1"]
)
def test_an_override_yaml_cannot_read_names_its_key(text: str) -> None:
    """Found by the property test above: these raised a yaml traceback, or were accepted with an empty key."""
    with pytest.raises(ConfigError) as e:
        apply_overrides({}, [text])
    issue = e.value.issues[0]
    assert issue.key and issue.fix

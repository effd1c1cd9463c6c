"""Checkpoint manifests: any ``MANIFEST.json`` is a manifest naming files inside its checkpoint, or refused.

Documented clean error: :class:`~steadytune.checkpoint.manifest.ManifestError`.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from steadytune.checkpoint.manifest import MANIFEST, ManifestError, load_manifest, verify
from tests.fuzz.conftest import cases
from tests.fuzz.strategies import json_values

names = st.one_of(
    st.text(max_size=12),
    st.sampled_from(
        ["../x", "/etc/passwd", "a/../../b", "a\\b", "C:\\x", "ok.bin", ".", "", "\x00", "link/x"]
    ),
)
entries = st.dictionaries(
    names,
    st.fixed_dictionaries({}, optional={"size": json_values, "sha256": json_values}) | json_values,
    max_size=4,
)
manifests = st.one_of(
    st.fixed_dictionaries({"files": entries}, optional={"step": json_values, "format": json_values}).map(
        lambda d: json.dumps(d, allow_nan=True, default=str).encode()
    ),
    json_values.map(lambda v: json.dumps(v, allow_nan=True, default=str).encode()),
    st.binary(max_size=300),
    st.integers(1, 3000).map(lambda n: b'{"files": ' + b"[" * n),
)


@cases(150)
@given(manifests)
def test_any_manifest_names_only_files_inside_or_is_refused(
    tmp_path_factory: pytest.TempPathFactory, raw: bytes
) -> None:
    root = tmp_path_factory.mktemp("run")
    ckpt = root / "checkpoint-1"
    ckpt.mkdir()
    (ckpt / "ok.bin").write_bytes(b"x")
    (root / "outside").mkdir()
    (ckpt / "link").symlink_to(root / "outside", target_is_directory=True)
    (ckpt / MANIFEST).write_bytes(raw)
    try:
        manifest = load_manifest(ckpt)
    except ManifestError as exc:
        assert str(exc)
        event("refused: ManifestError")
        return
    event("accepted")
    inside = ckpt.resolve()
    assert all((ckpt / name).resolve().is_relative_to(inside) for name in manifest.files)
    verify(ckpt)  # and the check that uses it answers too

"""Control requests: whatever is in a run's ``control/``, each reader takes requests or refuses files.

Documented clean error: :class:`~steadytune.protocol.RefusedRequest` from ``read_request``;
``RequestQueue.new`` never raises, and what it hands out passes ``check_request``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from steadytune.protocol import (
    COMMANDS,
    RefusedRequest,
    RequestQueue,
    check_request,
    read_request,
    request_name,
)
from tests.fuzz.conftest import cases
from tests.fuzz.strategies import json_values

requests = st.fixed_dictionaries(
    {},
    optional={
        "id": st.text(max_size=8) | json_values,
        "command": st.sampled_from([*COMMANDS, "reboot", ""]) | json_values,
        "issuer": st.sampled_from(["alice (cli)", "policy:loss_spike", "signal SIGTERM"]) | json_values,
        "args": st.fixed_dictionaries({}, optional={"mode": st.sampled_from(["hold", "release", "x"])})
        | json_values,
        "ts": json_values,
        "attempt": json_values,
    },
)
files = st.one_of(
    requests.map(lambda r: json.dumps(r, allow_nan=True, default=str).encode()),
    st.binary(max_size=400),
    st.integers(1, 3000).map(lambda n: b"[" * n),
    st.sampled_from(["fifo", "symlink", "dir"]),
)


def _queue(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An empty control queue, beside a request file a planted link can point at."""
    directory = tmp_path_factory.mktemp("run") / "control"
    directory.mkdir()
    (directory.parent / "target.json").write_text('{"command": "stop", "issuer": "x"}')
    return directory


def _place(directory, name: str, content: bytes | str) -> None:
    path = directory / name
    if content == "fifo":
        os.mkfifo(path)
    elif content == "symlink":
        path.symlink_to(directory.parent / "target.json")
    elif content == "dir":
        path.mkdir()
    else:
        path.write_bytes(content)  # type: ignore[arg-type]


@cases(200)
@given(files)
def test_any_control_file_is_a_valid_request_or_refused(
    tmp_path_factory: pytest.TempPathFactory, content
) -> None:
    directory = _queue(tmp_path_factory)
    _place(directory, request_name(1, "a"), content)
    try:
        request = read_request(directory / request_name(1, "a"))
    except RefusedRequest as exc:
        assert str(exc)
        event("refused: RefusedRequest")
        return
    assert request is not None
    check_request(request["command"], request.get("args"), request.get("issuer"))
    event(f"taken: {request['command']}")


@cases(60)
@given(st.lists(files, max_size=5))
def test_a_queue_of_anything_never_stops_its_reader(
    tmp_path_factory: pytest.TempPathFactory, contents
) -> None:
    directory = _queue(tmp_path_factory)
    for i, content in enumerate(contents):
        _place(directory, request_name(i, f"r{i}"), content)
    queue = RequestQueue(directory)
    taken = queue.new()
    assert len(taken) + len(queue.refused) == len(contents)
    assert queue.new() == []

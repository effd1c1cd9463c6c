"""The leak fault keeps what it allocates alive, in the first attempt only."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from steadytune.guard import faults  # noqa: E402
from steadytune.guard.faults import Faults  # noqa: E402


def test_leak_fault_keeps_its_tensors_alive(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(faults, "_HOARD", [])
    f = Faults.from_env({"STEADYTUNE_FAULTS": '{"leak_mib_per_step": 1}'})
    for step in (1, 2, 3):
        f.after_step(step, attempt=0)
    assert len(faults._HOARD) == 3
    assert all(t.numel() * t.element_size() == 2**20 for t in faults._HOARD)
    f.after_step(4, attempt=1)  # a restarted worker is left alone
    assert len(faults._HOARD) == 3

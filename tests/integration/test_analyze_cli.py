"""``steadytune analyze``: JSON schema, text verdicts, unreadable files, --plot, exit codes."""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

import pytest

from steadytune.cli.main import main
from tests.conftest import STEADYTUNE

FILE_KEYS = {"path", "format", "steps", "metrics", "objective", "notes", "anomalies"}
ANOMALY_KEYS = {
    "kind", "severity", "start_step", "end_step", "metric", "evidence", "cause", "suggestion", "count", "peak"
}  # fmt: skip


def _state(path: Path, losses: list[float], grads: list[float] | None = None) -> Path:
    history = []
    for i, loss in enumerate(losses):
        entry = {"epoch": i / len(losses), "learning_rate": 1e-4, "loss": loss, "step": 10 * (i + 1)}
        if grads is not None:
            entry["grad_norm"] = grads[i]
        history.append(entry)
    path.write_text(json.dumps({"global_step": 10 * len(losses), "log_history": history}))
    return path


def _healthy(n: int = 120) -> list[float]:
    return [2.0 * (0.6 + 0.4 * math.exp(-i / 30)) * (1 + 0.01 * ((i * 7) % 5 - 2)) for i in range(n)]


@pytest.fixture
def spiky(tmp_path: Path) -> Path:
    losses = _healthy()
    losses[80] *= 4.0
    return _state(tmp_path / "trainer_state.json", losses)


def test_json_output_has_exactly_the_documented_schema(
    spiky: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["analyze", str(spiky), "--format", "json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert set(doc) == {"files", "unreadable"} and doc["unreadable"] == []
    (f,) = doc["files"]
    assert set(f) == FILE_KEYS
    assert (f["path"], f["format"], f["steps"]) == (str(spiky), "hf_trainer_state", 120)
    assert "loss" in f["metrics"]
    (a,) = f["anomalies"]
    assert set(a) == ANOMALY_KEYS
    assert (a["kind"], a["severity"], a["start_step"], a["metric"]) == ("loss_spike", "warning", 810, "loss")
    assert a["evidence"]["ratio"] > 3 and a["cause"] and a["suggestion"]


def test_healthy_file_exits_zero_with_a_verdict(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _state(tmp_path / "ok.json", _healthy())
    assert main(["analyze", str(path)]) == 0
    out = capsys.readouterr().out
    assert "ok.json" in out and "healthy" in out


def test_unreadable_file_gets_one_line_and_the_others_go_on(
    spiky: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "notes.txt"
    bad.write_text("nothing to see\n")
    assert main(["analyze", str(bad), str(spiky), "--format", "json"]) == 1
    cap = capsys.readouterr()
    errors = [line for line in cap.err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith(
        f"error: {bad}: unrecognised format: no line with a step"
    )
    assert "formats tried:" in errors[0]
    doc = json.loads(cap.out)
    assert [f["path"] for f in doc["files"]] == [str(spiky)]
    assert doc["unreadable"] == [{"path": str(bad), "error": errors[0].split(": ", 2)[2]}]


def test_a_folder_of_logs_gives_each_file_a_verdict_or_a_reason(
    spiky: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "logs"
    folder.mkdir()
    (folder / "train.log").write_text(
        "".join(f"[rank0]: step {s} | loss {2.0 - s / 100:.3f}\n" for s in range(50))
    )
    (folder / "README.md").write_text("# My run\nThe loss went down.\n")
    (folder / "empty.txt").write_text("")
    (folder / "ckpt").mkdir()
    (folder / "ckpt" / "trainer_state.json").write_text(spiky.read_text())
    (folder / "not-a-log").mkdir()  # a subfolder that is no log is not descended into
    assert main(["analyze", str(folder), "--format", "json"]) == 1
    cap = capsys.readouterr()
    doc = json.loads(cap.out)
    assert [(Path(f["path"]).name, f["format"]) for f in doc["files"]] == [
        ("ckpt", "hf_trainer_state"),
        ("train.log", "text_log"),
    ]
    assert sorted(Path(u["path"]).name for u in doc["unreadable"]) == ["README.md", "empty.txt"]
    assert len([line for line in cap.err.splitlines() if line.startswith("error:")]) == 2


def test_text_output_shows_the_table_cause_and_fix(spiky: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["analyze", str(spiky)]) == 1
    out = capsys.readouterr().out
    assert "warning: 1 anomaly" in out and "loss_spike" in out and "810" in out and "→" in out


def test_plot_writes_a_png(spiky: Path, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    out = tmp_path / "plots" / "anomalies.png"
    assert main(["analyze", str(spiky), "--plot", str(out), "--format", "json"]) == 1
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def test_overrides_change_the_verdict(spiky: Path) -> None:
    assert main(["analyze", str(spiky), "--set", "disabled_kinds=[loss_spike]", "--format", "json"]) == 0
    assert main(["analyze", str(spiky), "--set", "loss.nonsense=1"]) == 2


@pytest.mark.parametrize(
    ("item", "says"),
    [
        (
            "loss.spike_zz=8",
            ["detect.loss.spike_zz: unknown key (got 8)", "did you mean 'detect.loss.spike_z'"],
        ),
        ("rl.signal_window=abc", ["detect.rl.signal_window", "(got 'abc')", "Fix:"]),
        ("detect.loss.spike_z=-1", ["detect.loss.spike_z", "(got -1)", "greater than 0"]),
    ],
)
def test_a_bad_override_names_the_key_the_value_and_the_fix(
    spiky: Path, item: str, says: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """It said only `invalid --set: 1 validation error for DetectConfig`."""
    assert main(["analyze", str(spiky), "--set", item]) == 2
    err = capsys.readouterr().err
    assert all(s in err for s in says), err
    assert "DetectConfig" not in err


def test_console_script_on_a_megatron_log(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    lines = [
        f" iteration {s:8d}/ 1000 | learning rate: 1.0E-04 | lm loss: "
        f"{2.8 - 0.001 * s + (3.0 if s == 300 else 0.0):E} |"
        f" grad norm: 1.5 | number of skipped iterations: 0 |"
        for s in range(10, 500, 10)
    ]
    log.write_text("\n".join(lines) + "\n")
    proc = subprocess.run(
        [STEADYTUNE, "analyze", str(log), "--format", "json"], capture_output=True, text=True
    )
    assert proc.returncode == 1, proc.stderr
    (f,) = json.loads(proc.stdout)["files"]
    assert f["format"] == "megatron_text"
    assert [(a["kind"], a["start_step"]) for a in f["anomalies"]] == [("loss_spike", 300)]


def test_a_missing_path_is_told_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nonexistent.log"
    assert main(["analyze", str(missing)]) == 1
    cap = capsys.readouterr()
    assert (cap.out + cap.err).count("no such file") == 1
    assert cap.err.startswith(f"error: {missing}: no such file")

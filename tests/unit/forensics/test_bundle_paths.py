"""A repro bundle carries no absolute path, home directory or user name unless asked to.

Paths inside the run become relative to the run directory, the home directory
becomes ``~``, any other absolute path ``<abs>/<name>``; the event fields ``user``
and ``host`` become placeholders. ``--no-redact-paths`` keeps everything. A bundle
checked next to its run still finds the checkpoint, model and data it names.
"""

from __future__ import annotations

import getpass
import json
import socket
import tarfile
from pathlib import Path

import pytest
import yaml

from steadytune.checkpoint.manifest import write_manifest
from steadytune.forensics.bundle import build_bundle
from steadytune.forensics.bundlerun import bundle_rows, locate_run, prepare, resolve_checkpoint
from steadytune.forensics.unpack import opened
from steadytune.records import BatchFingerprint, Event, PlanRevision, StepRecord
from steadytune.redact.paths import PathRedactor
from steadytune.rundir import RunDir
from steadytune.telemetry.events import EventLog
from steadytune.telemetry.stream import JsonlWriter


@pytest.fixture()
def run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tiny_model: Path) -> RunDir:
    """A run whose files name paths everywhere: in the run, under $HOME, elsewhere under tmp."""
    home = tmp_path / "home" / "alice"
    model = home / "models" / "tiny"
    model.parent.mkdir(parents=True)
    tiny_model.rename(model)
    monkeypatch.setenv("HOME", str(home))
    data = tmp_path / "datasets" / "train.jsonl"
    data.parent.mkdir()
    data.write_text("".join(json.dumps({"text": f"the cat sat {i}"}) + "\n" for i in range(8)))
    run = RunDir(tmp_path / "runs" / "r1").create()
    cfg = {
        "model": {"name_or_path": str(model)},
        "method": "full",
        "data": {"train_file": str(data), "format": "text", "max_seq_length": 16},
        "train": {"max_steps": 10, "per_device_train_batch_size": 2, "seed": 3},
        "run": {"runs_dir": str(tmp_path / "runs")},
    }
    run.config.write_text(yaml.safe_dump(cfg))
    with JsonlWriter(run.telemetry(0)) as w:
        for s in range(1, 6):
            w.write(StepRecord(step=s, ts=float(s), loss=1.0, grad_norm=1.0, lr=1e-4,
                               batch=BatchFingerprint((2 * s % 8, 2 * s % 8 + 1), ("", ""))))  # fmt: skip
    ckpt = run.checkpoints / "checkpoint-2"
    ckpt.mkdir()
    (ckpt / "rng_state.pth").write_bytes(b"\x80rng")
    (ckpt / "model.safetensors").write_bytes(b"w" * 32)
    (ckpt / "trainer_state.json").write_text(
        json.dumps({"best_model_checkpoint": str(ckpt), "global_step": 2})
    )
    write_manifest(ckpt, 2, {"attempt": 0})
    with JsonlWriter(run.plan) as w:
        w.write(PlanRevision(revision=0, ts=0.0, reason="initial"))
        w.write(PlanRevision(revision=1, ts=3.0, reason="restart", attempt=1, resume_checkpoint=str(ckpt)))
    log = EventLog(run.events, run_id="r1")
    log.append(Event(ts=1.0, kind="lifecycle", name="worker_started", step=1, data={"attempt": 0}))
    log.append(Event(ts=2.5, kind="action", name="checkpoint_saved", step=2, data={"path": str(ckpt)},
                     message=f"saved {ckpt} (model {model}, data {data})"))  # fmt: skip
    log.append(Event(ts=4.0, kind="anomaly", name="loss_spike", severity="warning", step=4,
                     data={"dir": str(run.root / "stacks"), "cwd": str(tmp_path)}))  # fmt: skip
    return run


def members(bundle: Path) -> dict[str, bytes]:
    with tarfile.open(bundle) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


REAL_HOME = Path.home()  # before any test points $HOME elsewhere


def forbidden(tmp_path: Path) -> list[str]:
    homes = (Path.home(), Path.home().resolve(), REAL_HOME, REAL_HOME.resolve())
    return sorted({str(tmp_path), str(tmp_path.resolve()), *(str(h) for h in homes if h != Path("/"))})


def test_a_bundle_names_no_absolute_path_home_or_user(run: RunDir, tmp_path: Path) -> None:
    info = build_bundle(run, step=4)
    files = members(info.path)
    assert {n.split("/", 1)[1] for n in files} >= {
        "bundle.json",
        "config.yaml",
        "plan.jsonl",
        "events.jsonl",
        "environment.json",
        "metrics.jsonl",
        "rng/rng_state.pth",
    }
    for name, blob in files.items():
        text = blob.decode("utf-8", "replace")
        for bad in forbidden(tmp_path):
            assert bad not in text, f"{name} names {bad}"
    with tarfile.open(info.path) as tar:  # nor do the tar headers (owner names of copied files)
        assert {(m.uname, m.gname) for m in tar.getmembers()} == {("", "")}
    top = next(iter(files)).split("/", 1)[0]
    meta = json.loads(files[f"{top}/bundle.json"])
    assert meta["checkpoint"]["path"] == "checkpoints/checkpoint-2"  # relative to the run
    assert meta["data"]["path"] == "<abs>/train.jsonl"
    assert meta["bundle_in_run"] == "repro/repro-step4.tar.gz" and meta["paths_redacted"] is True
    cfg = yaml.safe_load(files[f"{top}/config.yaml"])
    assert (
        cfg["model"]["name_or_path"] == "~/models/tiny"
    )  # under $HOME: ~, which expands where it is checked
    assert cfg["data"]["train_file"] == "<abs>/train.jsonl" and cfg["run"]["runs_dir"] == "<abs>/runs"
    events = [json.loads(line) for line in files[f"{top}/events.jsonl"].decode().splitlines()]
    saved = next(e for e in events if e["name"] == "checkpoint_saved")
    assert saved["data"]["path"] == "checkpoints/checkpoint-2"
    assert saved["message"] == "saved checkpoints/checkpoint-2 (model ~/models/tiny, data <abs>/train.jsonl)"
    assert {(e["user"], e["host"]) for e in events} == {("<user>", "<host>")}
    assert getpass.getuser() not in {e["user"] for e in meta["events_at_step"]}
    assert socket.gethostname() not in {e["host"] for e in meta["events_at_step"]}
    plan = [json.loads(line) for line in files[f"{top}/plan.jsonl"].decode().splitlines()]
    assert plan[1]["resume_checkpoint"] == "checkpoints/checkpoint-2"


def test_no_redact_paths_keeps_them(run: RunDir, tmp_path: Path) -> None:
    info = build_bundle(run, step=4, out=tmp_path / "raw.tar.gz", redact_paths=False)
    blob = b"".join(members(info.path).values()).decode("utf-8", "replace")
    assert str(run.root.resolve()) in blob and str(Path.home()) in blob  # the fixture does name them


def test_a_copied_checkpoint_stays_byte_for_byte_and_the_maker_is_told(run: RunDir, tmp_path: Path) -> None:
    info = build_bundle(run, step=4, include_checkpoint=True, out=tmp_path / "full.tar.gz")
    copied = next(b for n, b in members(info.path).items() if n.endswith("checkpoint-2/trainer_state.json"))
    assert copied == (run.checkpoints / "checkpoint-2" / "trainer_state.json").read_bytes()  # sha256 holds
    assert len(info.notes) == 1 and "trainer_state.json" in info.notes[0] and "unchanged" in info.notes[0]


def test_a_redacted_bundle_checked_next_to_its_run_finds_what_it_names(run: RunDir, tmp_path: Path) -> None:
    info = build_bundle(run, step=4)
    original = yaml.safe_load(run.config.read_text())
    with opened(info.path) as folder:
        meta = json.loads((folder / "bundle.json").read_text())
        assert locate_run(meta, info.path, None) == run.root  # RUN/repro/<bundle>: the run is found
        _, cfg = prepare(folder, run=run.root)
        assert cfg.model.name_or_path == original["model"]["name_or_path"]
        assert cfg.data.train_file == original["data"]["train_file"]
        assert resolve_checkpoint(folder, meta, None, run.root) == run.checkpoints / "checkpoint-2"
        with pytest.raises(ValueError, match=r"redacted.*steadytune repro --check BUNDLE RUN"):
            prepare(folder)  # elsewhere, without the run: say what to pass
        with pytest.raises(FileNotFoundError, match=r"relative to its run.*--checkpoint PATH"):
            resolve_checkpoint(folder, meta, None, None)
    moved = tmp_path / "elsewhere" / "b.tar.gz"
    moved.parent.mkdir()
    moved.write_bytes(info.path.read_bytes())
    with opened(moved) as folder:
        assert locate_run(json.loads((folder / "bundle.json").read_text()), moved, None) is None


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("/R/run/checkpoints/c-1", "checkpoints/c-1"),
        ("/R/run", "."),
        ("/H/me/models/x and /H/me", "~/models/x and ~"),
        ("/H/meat/x", "<abs>/x"),
        ("see /opt/data/train.jsonl.", "see <abs>/train.jsonl."),
        ("file:///H/me/a", "file://~/a"),
        (
            "https://pytorch.org/memory_viz 3 tokens/s 1/2 N/A",
            "https://pytorch.org/memory_viz 3 tokens/s 1/2 N/A",
        ),
        ("loss / baseline", "loss / baseline"),
    ],
)
def test_the_redactor_rules(text: str, want: str) -> None:
    assert PathRedactor(Path("/R/run"), home=Path("/H/me")).text(text) == want


def test_a_bundles_samples_are_read_and_a_damaged_line_is_named(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    good = [{"st_sample_id": 3, "row": {"text": "a"}}, {"st_sample_id": 9, "row": {"text": "b"}}]
    (data / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in good))
    meta = {"replay": [{"indices": [3, 9]}]}
    assert bundle_rows(tmp_path, meta, None, None) == {3: {"text": "a"}, 9: {"text": "b"}}
    with open(data / "samples.jsonl", "a") as f:
        f.write('{"st_sample_id": 12, "ro\n')  # cut short
    with pytest.raises(ValueError, match=r"samples.jsonl line 3 is not a sample of the bundle.*--data PATH"):
        bundle_rows(tmp_path, meta, None, None)

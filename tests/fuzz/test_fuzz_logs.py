"""``analyze``'s readers (``steadytune.importers.load`` / ``detect_format``) and the detectors after them.

Documented clean error: :class:`~steadytune.importers.UnreadableLog`, a one-line reason. A file
that reads must also go through detection (``detect.offline.replay``) without an exception.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from steadytune.config.detect import DetectConfig
from steadytune.detect.offline import replay
from steadytune.importers import UnreadableLog, detect_format, load
from tests.fuzz.conftest import cases
from tests.fuzz.strategies import json_values, metric_rows, number_text, numbers

TEMPLATES = [
    "step {s} | loss {v} | lr {v}",
    "[rank0]: iteration {s}/ {s} | lm loss: {v} | grad norm: {v} |",
    "{{'loss': {v}, 'grad_norm': {v}, 'learning_rate': {v}, 'epoch': {v}}}",
    "s:{s} trl:{v}",
    "s:{s} tel:{v}",
    "{s} train {v}",
    "step {s}/{s} | train loss {v} | norm {v} | lr {v} | {v} ms",
    "[batch={s}/{s}]:\n\t Train loss/train/total: {v}",
    "Step [{s}/{s}], Loss: {v}",
    "iter {s}: loss={v}",
    "2024-05-01 12:00:00,123 - INFO - step={s} loss={v}",
    'train_inner | {{"loss": "{v}", "num_updates": "{s}"}}',
]

text_lines = st.lists(
    st.builds(lambda t, s, v: t.format(s=s, v=v), st.sampled_from(TEMPLATES), number_text, number_text)
    | st.text(max_size=60),
    max_size=40,
)
# Rows that name a step and a loss, whatever their values: these get past detection to the readers.
plausible = st.fixed_dictionaries(
    {"step": numbers | number_text, "loss": numbers | number_text},
    optional={"grad_norm": numbers, "learning_rate": numbers, "epoch": numbers, "eval_loss": numbers,
              "type": st.sampled_from(["train", "eval", "x"]), "reward": numbers, "kl": numbers},
)  # fmt: skip
llamafactory = st.fixed_dictionaries(
    {"current_steps": numbers, "total_steps": numbers, "loss": numbers | number_text},
    optional={"lr": numbers, "epoch": numbers, "elapsed_time": st.text(max_size=8)},
)
anything_rows = st.lists(plausible | llamafactory | metric_rows | json_values, max_size=30)
jsonl = (st.lists(plausible, min_size=3, max_size=30) | anything_rows).map(
    lambda rows: "\n".join(json.dumps(r, allow_nan=True, default=str) for r in rows)
)
csv_text = st.lists(
    st.lists(number_text | st.sampled_from(["step", "loss", "Step", "train/loss"]), max_size=5), max_size=20
).map(lambda rows: "\n".join(",".join(r) for r in rows))
trainer_state = st.fixed_dictionaries(
    {"log_history": st.lists(plausible | metric_rows, max_size=20)}, optional={"global_step": json_values}
).map(lambda d: json.dumps(d, allow_nan=True, default=str))
deep = st.integers(1, 5000).flatmap(
    lambda n: st.sampled_from(
        [
            '{"a": ' + "[" * n,
            '{"log_history": ' + "[" * n,
            '{"step": 1, "loss": 2}\n{"step": 2, "loss": ' + "[" * n,
        ]
    )
)
contents = st.one_of(
    deep,
    st.binary(max_size=3000),
    text_lines.map("\n".join),
    jsonl,
    csv_text,
    trainer_state,
    st.text(max_size=500),
)
NAMES = [
    "train.log",
    "log.txt",
    "trainer_log.jsonl",
    "trainer_state.json",
    "metrics.csv",
    "main.log",
    "events.out.tfevents.1.host",
    "x.jsonl",
]


def _judge(path: Path) -> None:
    try:
        detect_format(path)
        series = load(path)
    except UnreadableLog as exc:
        assert str(exc) and "\n" not in str(exc), repr(exc)
        event("refused: UnreadableLog")
        return
    event(f"read as {series.format}")
    replay(series.records, series.system, DetectConfig())


@cases(150)
@given(contents, st.sampled_from(NAMES), st.booleans())
def test_any_file_is_read_or_refused_as_unreadable_and_its_steps_judged(
    tmp_path_factory: pytest.TempPathFactory, content: str | bytes, name: str, gz: bool
) -> None:
    raw = content.encode("utf-8", "surrogatepass") if isinstance(content, str) else content
    folder = tmp_path_factory.mktemp("log")
    path = folder / (name + ".gz" if gz else name)
    path.write_bytes(gzip.compress(raw) if gz else raw)
    _judge(path)


@cases(40)
@given(
    st.dictionaries(
        st.sampled_from(
            [
                "trainer_state.json",
                "trainer_log.jsonl",
                "telemetry/rank-0.jsonl",
                "events.jsonl",
                "config.yaml",
                "run.db",
                "status.json",
            ]
        ),
        contents,
        min_size=1,
        max_size=4,
    )
)
def test_any_folder_is_read_or_refused_as_unreadable(
    tmp_path_factory: pytest.TempPathFactory, files: dict[str, str | bytes]
) -> None:
    folder = tmp_path_factory.mktemp("dir")
    for name, content in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(
            content.encode("utf-8", "surrogatepass") if isinstance(content, str) else content
        )
    _judge(folder)

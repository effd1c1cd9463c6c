"""The fields a trainer logs reach the guard's step record of the step they belong to.

A real HF ``Trainer`` on the demo model, with the guard's callback, runs its own loop: ``on_step_end``,
then, on a step it logs, ``on_log`` with the log dict. ``ScoredTrainer`` adds a reward and a KL to that
dict from its ``log`` override, which is how TRL's trainers hand the callbacks theirs. The detectors must
then judge the guard's records (``analyze`` on the run directory) as they judge the trainer's own log.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, Trainer, TrainingArguments

from steadytune.detect.offline import replay
from steadytune.guard.core import Guard
from steadytune.guard.hf import GuardCallback
from steadytune.importers import load
from steadytune.records import Heartbeat, StepRecord
from steadytune.telemetry.stream import iter_records

Score = Callable[[int], float]


class ScoredTrainer(Trainer):
    """An RL-style trainer in miniature: its training log carries ``reward``, ``reward_std`` and ``kl``."""

    def __init__(self, *args: Any, reward: Score, kl: Score, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.reward, self.kl = reward, kl

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        if "loss" in logs:
            step = self.state.global_step
            logs = {**logs, "reward": self.reward(step), "reward_std": 0.05, "kl": self.kl(step)}
        super().log(logs, start_time)


class SilentTrainer(Trainer):
    """Says it logs (HF's flow sets ``should_log``) but hands the callbacks no training log."""

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        if "loss" not in logs:
            super().log(logs, start_time)


def trainer(
    tmp_path: Path,
    assets: Path,
    guard: Guard,
    cls: type[Trainer],
    steps: int,
    logging_steps: int,
    save_steps: int = 0,
    **kw: Any,
) -> Trainer:
    tok = AutoTokenizer.from_pretrained(assets / "model")
    rows = [json.loads(line) for line in (assets / "train.jsonl").read_text().splitlines()[:32]]
    enc = [
        tok(f"{r['instruction']}\n{r['output']}", truncation=True, max_length=32)["input_ids"] for r in rows
    ]

    def collate(batch: list[list[int]]) -> dict[str, torch.Tensor]:
        width = max(len(ids) for ids in batch)
        ids = torch.full((len(batch), width), tok.pad_token_id)
        labels = torch.full((len(batch), width), -100)
        for i, row in enumerate(batch):
            ids[i, : len(row)] = labels[i, : len(row)] = torch.tensor(row)
        return {"input_ids": ids, "labels": labels, "attention_mask": (labels != -100).long()}

    args = TrainingArguments(
        output_dir=str(tmp_path / "out"),
        max_steps=steps,
        save_strategy="steps" if save_steps else "no",
        save_steps=save_steps or 500,
        per_device_train_batch_size=2,
        learning_rate=1e-4,
        logging_steps=logging_steps,
        eval_strategy="steps",
        eval_steps=3,
        per_device_eval_batch_size=4,
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        seed=0,
    )
    callback = GuardCallback(guard, None, None, final_checkpoint=False)
    model = AutoModelForCausalLM.from_pretrained(assets / "model")
    return cls(
        model=model,
        args=args,
        train_dataset=enc,
        eval_dataset=enc[:4],
        data_collator=collate,
        callbacks=[callback],
        **kw,
    )


def step_records(guard: Guard) -> list[StepRecord]:
    guard.writer.sync()
    return [
        r
        for r in iter_records(guard.run.telemetry(0))
        if isinstance(r, StepRecord) and not r.extra.get("eval")
    ]


def test_a_logged_steps_record_carries_what_the_trainer_logged_for_it(
    tmp_path: Path, demo_assets: Path
) -> None:
    guard = Guard(tmp_path / "run", rank=0, attempt=0)
    t = trainer(
        tmp_path, demo_assets, guard, ScoredTrainer, 6, 2, reward=lambda s: s / 10, kl=lambda s: s / 100
    )
    t.train()
    recs = step_records(guard)
    assert [r.step for r in recs] == [1, 2, 3, 4, 5, 6]  # one record per step, in order
    # (The loss is the tool's trainer's to report: only steadytune's Trainer and --inject hand it over.)
    assert all(r.grad_norm is not None and r.lr is not None and r.step_time_s is not None for r in recs)
    logged = {e["step"]: e for e in t.state.log_history if "loss" in e}
    assert sorted(logged) == [2, 4, 6]
    for r in recs:
        if r.step in logged:
            # The trainer's own numbers, on the step it logged them, beside the guard's loss and norm.
            assert (r.extra["reward"], r.extra["kl"]) == (logged[r.step]["reward"], logged[r.step]["kl"])
            assert not {"loss", "grad_norm", "learning_rate", "epoch"} & set(r.extra)
        else:
            assert "reward" not in r.extra
    # The evaluation (steps 3 and 6) logs too: its dict is no training log and stays out of the records.
    assert not any(k.startswith("eval_") for r in recs for k in r.extra)
    evals = [
        r for r in iter_records(guard.run.telemetry(0)) if isinstance(r, StepRecord) and r.extra.get("eval")
    ]
    assert [r.step for r in evals] == [3, 6]
    guard.close()


def test_a_step_whose_log_never_reaches_the_callbacks_is_still_recorded(
    tmp_path: Path, demo_assets: Path
) -> None:
    guard = Guard(tmp_path / "run", rank=0, attempt=0)
    trainer(tmp_path, demo_assets, guard, SilentTrainer, 5, 1).train()
    recs = step_records(guard)
    assert [r.step for r in recs] == [1, 2, 3, 4, 5]
    assert all(r.grad_norm is not None for r in recs)
    guard.close()


def test_analyze_on_the_run_directory_judges_the_logged_reward_as_it_judges_the_trainers_log(
    tmp_path: Path, demo_assets: Path
) -> None:
    """A reward that climbs, holds and then falls below where it began: reward_collapse, at the same
    step whether read from the guard's records or from the log the trainer kept (trainer_state.json)."""

    def reward(step: int) -> float:
        wobble = 0.02 * (-1) ** step
        return wobble + (min(step, 10) / 10 if step < 18 else -0.3)

    guard = Guard(tmp_path / "run", rank=0, attempt=0)
    t = trainer(tmp_path, demo_assets, guard, ScoredTrainer, 30, 1, reward=reward, kl=lambda s: 0.01)
    t.train()
    guard.close()
    t.state.save_to_json(str(tmp_path / "trainer_state.json"))
    from_guard = replay(load(tmp_path / "run").records)
    from_log = replay(load(tmp_path / "trainer_state.json").records)
    assert from_guard.objective == from_log.objective == "RL (GRPO/RLOO)"
    collapse = [(a.kind, a.metric, a.start_step) for a in from_guard.anomalies if a.kind == "reward_collapse"]
    assert collapse and collapse == [
        (a.kind, a.metric, a.start_step) for a in from_log.anomalies if a.kind == "reward_collapse"
    ]
    assert 18 <= collapse[0][2] <= 30


def test_the_phases_say_what_the_loop_waits_on(tmp_path: Path, demo_assets: Path) -> None:
    """At a step that evaluates and saves, the evaluation comes first (the trainer's order), then the save;
    after the last step, the worker finishes: no phase is named for what it is not doing."""
    guard = Guard(tmp_path / "run", rank=0, attempt=0)
    trainer(tmp_path, demo_assets, guard, Trainer, 6, 1, save_steps=3).train()
    guard.writer.sync()
    said = []
    for r in iter_records(guard.run.telemetry(0)):
        if isinstance(r, Heartbeat):
            said.append(r.phase)
        elif isinstance(r, StepRecord):
            said.append("eval record" if r.extra.get("eval") else f"step {r.step}")
    at_3 = said[said.index("step 3") : said.index("step 4")]
    assert at_3 == ["step 3", "eval", "eval record", "save", "train"], said
    assert said[said.index("step 6") :] == ["step 6", "eval", "eval record", "save", "train", "finish"], said
    guard.close()

"""The guard records the gradient norm clipping computed, before clipping scales it, and so does
gradient flow: on the steadytune Trainer (``steadytune run``) and on a plain HF ``Trainer`` that
only has the guard callback.

``max_grad_norm`` is tiny, so clipping engages on every step: a post-clip reading would be
``MAX_NORM`` and could not be mistaken for the raw norm.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, Trainer, TrainerCallback, TrainingArguments

from steadytune.config.load import validate_dict
from steadytune.guard.checkpoints import CheckpointKeeper
from steadytune.guard.core import Guard
from steadytune.guard.hf import GuardCallback
from steadytune.records import PlanRevision, StepRecord
from steadytune.rundir import RunDir
from steadytune.telemetry.stream import iter_records
from steadytune.train.runner import build_trainer

MAX_NORM = 0.01
STEPS = 2


class PostClipNorm(TrainerCallback):
    """Reads the gradients as the optimizer will see them: HF fires this hook after clipping."""

    def __init__(self) -> None:
        self.norms: dict[int, float] = {}

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        grads = [p.grad.detach().float().norm() for p in kw["model"].parameters() if p.grad is not None]
        self.norms[state.global_step + 1] = float(torch.linalg.vector_norm(torch.stack(grads)))


def guard_callback(run: Path) -> GuardCallback:
    guard = Guard(run, rank=0, attempt=0)
    keeper = CheckpointKeeper(guard.run, min_free_bytes=0)
    return GuardCallback(guard, keeper, guard.run.staging, gradflow_every=1)


def plain_trainer(tmp_path: Path, assets: Path, callbacks: list[Any]) -> Trainer:
    tok = AutoTokenizer.from_pretrained(assets / "model")
    rows = [json.loads(line) for line in (assets / "train.jsonl").read_text().splitlines()[:16]]
    enc = [
        tok(f"{r['instruction']}\n{r['input']}\n{r['output']}", truncation=True, max_length=48)["input_ids"]
        for r in rows
    ]

    def collate(batch: list[list[int]]) -> dict[str, torch.Tensor]:
        width = max(len(ids) for ids in batch)
        ids = torch.full((len(batch), width), tok.pad_token_id)
        labels = torch.full((len(batch), width), -100)
        for i, row in enumerate(batch):
            ids[i, : len(row)] = torch.tensor(row)
            labels[i, : len(row)] = torch.tensor(row)
        return {"input_ids": ids, "labels": labels, "attention_mask": (labels != -100).long()}

    args = TrainingArguments(
        output_dir=str(RunDir(tmp_path / "run").staging),
        max_steps=STEPS,
        save_steps=100,
        per_device_train_batch_size=4,
        learning_rate=1e-3,
        max_grad_norm=MAX_NORM,
        logging_steps=1,
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        seed=0,
    )
    model = AutoModelForCausalLM.from_pretrained(assets / "model")
    return Trainer(model=model, args=args, train_dataset=enc, data_collator=collate, callbacks=callbacks)


def run_trainer(tmp_path: Path, assets: Path, callbacks: list[Any], guard: Guard) -> Trainer:
    cfg = validate_dict(
        {
            "model": {"name_or_path": str(assets / "model")},
            "method": "full",
            "data": {"train_file": str(assets / "train.jsonl"), "max_seq_length": 48, "max_samples": 16},
            "train": {
                "per_device_train_batch_size": 4,
                "max_steps": STEPS,
                "save_steps": STEPS,
                "logging_steps": 1,
                "learning_rate": 1e-3,
                "max_grad_norm": MAX_NORM,
                "use_cpu": True,
            },
            "run": {"runs_dir": str(tmp_path)},
        },
        base=tmp_path,
    )
    plan = PlanRevision(revision=0, ts=0, reason="start")
    return build_trainer(cfg, plan, guard, callbacks, guard.run.staging)


@pytest.mark.parametrize("path", ["plain_trainer", "steadytune_run"])
def test_guard_records_the_pre_clip_norm(path: str, tmp_path: Path, demo_assets: Path) -> None:
    callback, post = guard_callback(tmp_path / "run"), PostClipNorm()
    if path == "plain_trainer":
        trainer = plain_trainer(tmp_path, demo_assets, [callback, post])
    else:
        trainer = run_trainer(tmp_path, demo_assets, [callback, post], callback.guard)
    trainer.train()
    callback.guard.close()
    records = [
        r
        for r in iter_records(callback.guard.run.telemetry(0))
        if isinstance(r, StepRecord) and not r.extra.get("eval")
    ]
    # HF logs the norm its clipping returned, which is the norm before clipping.
    hf = {e["step"]: e["grad_norm"] for e in trainer.state.log_history if "grad_norm" in e}
    assert [r.step for r in records] == list(range(1, STEPS + 1)) == sorted(hf)
    for r in records:
        assert r.grad_norm is not None
        assert post.norms[r.step] == pytest.approx(MAX_NORM, rel=1e-3)  # clipping engaged
        assert r.grad_norm > 10 * MAX_NORM
        assert r.grad_norm == pytest.approx(hf[r.step], rel=1e-6)
        # Gradient flow sees the same gradients: its layer norms add up, in quadrature, to that norm.
        flow = r.extra["gradflow"]
        assert math.sqrt(sum(n * n for n in flow["norm"])) == pytest.approx(r.grad_norm, rel=1e-4)


def test_plain_loop_records_the_norm_clipping_returned(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    guard = Guard(tmp_path / "loop", rank=0, attempt=0)
    guard.begin_step()
    loss = model(torch.randn(4, 8)).pow(2).sum() * 100
    loss.backward()
    guard.add_microbatch(loss)
    raw = guard.grad_norm(model)
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
    assert guard.grad_norm(model) == pytest.approx(MAX_NORM, rel=1e-3)  # clipping engaged
    assert guard.before_update(model, opt, grad_norm=norm)  # a tensor is fine
    record = guard.end_step(1)
    guard.close()
    assert record.grad_norm == pytest.approx(raw, rel=1e-6) and record.grad_norm > 10 * MAX_NORM

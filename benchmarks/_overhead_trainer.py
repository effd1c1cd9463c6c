"""The bare side of benchmarks/overhead.py: the job of ``steadytune run`` on a plain HF Trainer.

    python benchmarks/_overhead_trainer.py --config demo.yaml --out OUT.json [--guard] [--launched-at TS]

It builds the Trainer from the same config with the same functions the worker uses
(``training_arguments``, ``load_model``, ``load_tokenizer``, ``build_dataset``,
``Collator``), so the arguments are identical; only the supervision differs. With
``--guard`` the :class:`~steadytune.guard.hf.GuardCallback` rides in it, with a
checkpoint keeper, as in the worker, and the time spent inside its hooks is summed.

It writes one JSON object to ``--out``: the wall clock of every step end, the first
step's time since launch, each save (HF's own and, with the guard, the publish that
follows it: the time the loop waits in the guard's ``on_save``, and the time the
keeper's publish takes, which may run beside the next steps) and the guard's in-loop
nanoseconds per step.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

LAUNCHED = time.time()
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from transformers import Trainer, TrainerCallback  # noqa: E402

from steadytune.config.load import load_config  # noqa: E402
from steadytune.records import PlanRevision  # noqa: E402
from steadytune.rundir import RunDir  # noqa: E402
from steadytune.train.data import SAMPLE_HASH, SAMPLE_ID, DataSpec, build_dataset, load_tokenizer  # noqa: E402
from steadytune.train.runner import Collator, load_model, training_arguments  # noqa: E402

_LOOP_HOOKS = ("on_step_begin", "on_pre_optimizer_step", "on_optimizer_step", "on_step_end")


class Stamps(TrainerCallback):
    """The wall clock at every step end: the same one-line hook in every variant."""

    def __init__(self) -> None:
        self.step_end: list[float] = []

    def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        self.step_end.append(time.time())


def timed(fn: Any, into: list[int]) -> Any:
    """``fn`` that adds its own duration (ns) to ``into`` at each call."""

    def wrapper(*a: Any, **kw: Any) -> Any:
        t0 = time.perf_counter_ns()
        try:
            return fn(*a, **kw)
        finally:
            into.append(time.perf_counter_ns() - t0)

    return wrapper


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--config", required=True, type=Path)
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--guard", action="store_true")
    p.add_argument("--launched-at", type=float, default=None, help="the parent's clock at launch")
    a = p.parse_args()
    launched = a.launched_at or LAUNCHED

    cfg = load_config(a.config, check_paths=False)
    work = a.out.with_suffix("")
    run = RunDir(work / "run").create()
    plan = PlanRevision(revision=0, ts=0.0, reason="start")
    tok = load_tokenizer(cfg.model.name_or_path, cfg.model.trust_remote_code)

    def dataset(path: str) -> Any:
        spec = DataSpec(path, cfg.data.format, cfg.data.text_field, cfg.data.max_seq_length,
                        cfg.data.train_on_prompt, cfg.data.max_samples)  # fmt: skip
        ds = build_dataset(tok, spec)
        # A plain Trainer passes every column to the model: the fingerprint columns are the guard's.
        return ds.remove_columns([c for c in (SAMPLE_ID, SAMPLE_HASH) if c in ds.column_names])

    train_ds = dataset(cfg.data.train_file)
    eval_ds = dataset(cfg.data.eval_file) if cfg.data.eval_file else None
    staging = run.staging if a.guard else work / "out"
    args = training_arguments(cfg, plan, staging, eval_ds is not None)
    model = load_model(cfg, args.gradient_checkpointing)
    stamps = Stamps()
    callbacks: list[Any] = [stamps]
    hook_ns: dict[int, int] = {}
    by_hook: dict[str, list[int]] = {}  # each hook's own calls, to see which part of the step costs what
    publish_s: list[float] = []
    sealing_s: list[float] = []
    if a.guard:
        from steadytune.guard.checkpoints import CheckpointKeeper
        from steadytune.guard.core import Guard
        from steadytune.guard.hf import GuardCallback

        guard = Guard(run.root, rank=0, attempt=0)
        keeper = CheckpointKeeper(
            run, keep_last=cfg.run.keep_last, min_free_bytes=cfg.run.min_free_disk_bytes
        )
        cb = GuardCallback(guard, keeper, run.staging, None, cfg.policy.checkpoint_every_s)
        for name in _LOOP_HOOKS:
            inner = getattr(cb, name)

            # Until its optimizer step, the step in progress is global_step + 1.
            ahead = 0 if name == "on_step_end" else 1

            def hook(*h: Any, _inner: Any = inner, _ahead: int = ahead, _name: str = name, **kw: Any) -> Any:
                t0 = time.perf_counter_ns()
                try:
                    return _inner(*h, **kw)
                finally:
                    took = time.perf_counter_ns() - t0
                    step = h[1].global_step + _ahead
                    hook_ns[step] = hook_ns.get(step, 0) + took
                    by_hook.setdefault(_name, []).append(took)

            setattr(cb, name, hook)
        on_save = cb.on_save

        def timed_save(*h: Any, **kw: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return on_save(*h, **kw)
            finally:
                publish_s.append(time.perf_counter() - t0)

        cb.on_save = timed_save  # type: ignore[method-assign]
        keeper_publish = keeper.publish

        def timed_publish(*h: Any, **kw: Any) -> Any:  # on the publishing thread, beside the steps
            t0 = time.perf_counter()
            try:
                return keeper_publish(*h, **kw)
            finally:
                sealing_s.append(time.perf_counter() - t0)

        keeper.publish = timed_publish  # type: ignore[method-assign]
        callbacks.append(cb)
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=train_ds,
        eval_dataset=eval_ds,
        data_collator=Collator(tok.pad_token_id),
        processing_class=tok,
        callbacks=callbacks,
    )
    hf_save_ns: list[int] = []
    trainer._save_checkpoint = timed(trainer._save_checkpoint, hf_save_ns)  # type: ignore[method-assign]
    trainer.train()
    trainer.save_model(str(work / "final"))
    if a.guard:
        guard.close("completed")
    per_step = [hook_ns.get(s, 0) for s in range(1, len(stamps.step_end) + 1)]
    result = {
        "launched": launched,
        "first_step_s": stamps.step_end[0] - launched if stamps.step_end else None,
        "step_end": stamps.step_end,
        "hf_save_s": [ns / 1e9 for ns in hf_save_ns],
        "publish_s": publish_s,
        "sealing_s": sealing_s,
        "guard_ns_per_step": per_step if a.guard else [],
        "guard_hook_ns": by_hook,
        "end": time.time(),
    }
    a.out.write_text(json.dumps(result), encoding="utf-8")


if __name__ == "__main__":
    main()

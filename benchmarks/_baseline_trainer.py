"""The baseline for benchmarks/drill_vs_baseline.py: a plain HF Trainer fine-tune, as users run it.

    python -m torch.distributed.run --standalone --nproc_per_node=1 --max-restarts=3 \
        benchmarks/_baseline_trainer.py --model M --train T.jsonl --output_dir OUT --bench_log LOG.jsonl

No guard, no supervisor: torchrun restarts a crashed worker, and each start resumes
from the newest ``checkpoint-*`` in output_dir (``resume_from_checkpoint=True``
semantics: HF's ``get_last_checkpoint`` takes the newest, complete or not). The data
path is steadytune's (same tokenization, same collator), so only the supervision differs.

Faults come from ``$BASELINE_FAULTS`` (JSON, the same keys as ``$STEADYTUNE_FAULTS``:
nan_at_step, nan_steps, oom_at_step, oom_above, lr_burst_at_step, lr_burst_factor,
lr_burst_steps, hang_at_step, step_sleep_s, slow_save_s, slow_save_step) and fire in
the first attempt only (``$TORCHELASTIC_RESTART_COUNT`` == 0). External faults (kill,
corruption) are done to this process by the benchmark, which follows ``--bench_log``: one
JSON line per training start and per optimizer step.
"""

from __future__ import annotations

import time

LAUNCHED = time.time()  # before the imports: they are this process's start-up

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402
from transformers import (  # noqa: E402
    AutoModelForCausalLM,
    AutoTokenizer,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)
from transformers.trainer_utils import get_last_checkpoint  # noqa: E402

from steadytune.train.data import SAMPLE_HASH, SAMPLE_ID, DataSpec, build_dataset  # noqa: E402
from steadytune.train.runner import Collator  # noqa: E402

ATTEMPT = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
FAULTS: dict[str, Any] = json.loads(os.environ.get("BASELINE_FAULTS") or "{}") if ATTEMPT == 0 else {}


class Log:
    """Append-only JSON lines, flushed at once so the benchmark can follow them."""

    def __init__(self, path: str) -> None:
        self.f = open(path, "a", encoding="utf-8")  # noqa: SIM115 (open for the life of the process)

    def write(self, **rec: Any) -> None:
        rec.update(attempt=ATTEMPT, pid=os.getpid(), ts=time.time())
        self.f.write(json.dumps(rec) + "\n")
        self.f.flush()


def in_window(step: int, key: str, length: int) -> bool:
    start = FAULTS.get(key)
    return start is not None and start <= step < start + length


class FaultyTrainer(Trainer):
    """A Trainer with the in-process faults: a NaN loss, an out-of-memory error, a slow save."""

    def compute_loss(
        self, model: Any, inputs: dict[str, Any], return_outputs: bool = False, num_items_in_batch: Any = None
    ) -> Any:
        step = self.state.global_step + 1
        if model.training:
            oom_at = FAULTS.get("oom_at_step")
            size = int(inputs["input_ids"].shape[0])
            if oom_at is not None and step >= oom_at and size > FAULTS.get("oom_above", 1):
                raise torch.OutOfMemoryError(
                    f"CUDA out of memory. Tried to allocate 2.00 GiB (injected: {size} samples)"
                )
        out = super().compute_loss(
            model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch
        )
        if model.training and in_window(step, "nan_at_step", FAULTS.get("nan_steps", 1)):
            return (out[0] * float("nan"), out[1]) if return_outputs else out * float("nan")
        return out

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        super().save_model(output_dir, _internal_call=_internal_call)
        # A checkpoint save: the weights are written; optimizer and trainer_state.json come after.
        slow_step = FAULTS.get("slow_save_step")
        if _internal_call and FAULTS.get("slow_save_s") and slow_step in (None, self.state.global_step):
            time.sleep(float(FAULTS["slow_save_s"]))


class Faults(TrainerCallback):
    """The callback-side faults: an LR burst, a hang, slow steps; and the log the benchmark follows."""

    def __init__(self, log: Log) -> None:
        self.log = log
        self.step_began = time.time()

    def on_train_begin(self, args, state, control, **kw):
        # Also called again when auto_find_batch_size restarts the loop after an OOM.
        self.log.write(ev="begin", step=state.global_step, batch=state.train_batch_size)

    def on_step_begin(self, args, state, control, **kw):
        self.step_began = time.time()

    def on_save(self, args, state, control, **kw):
        self.log.write(ev="saved", step=state.global_step)  # the checkpoint is written: the loop goes on

    def on_pre_optimizer_step(self, args, state, control, optimizer=None, **kw):
        if optimizer is not None and in_window(
            state.global_step + 1, "lr_burst_at_step", FAULTS.get("lr_burst_steps", 3)
        ):
            # The scheduler sets the LR again after this step, so the burst lasts one step per call.
            for group in optimizer.param_groups:
                group["lr"] *= float(FAULTS.get("lr_burst_factor", 1000.0))

    def on_step_end(self, args, state, control, **kw):
        self.log.write(ev="step", step=state.global_step, step_time_s=time.time() - self.step_began)
        if FAULTS.get("step_sleep_s"):
            time.sleep(float(FAULTS["step_sleep_s"]))
        if FAULTS.get("hang_at_step") == state.global_step:
            while True:  # alive, silent, going nowhere; torchrun does not notice
                time.sleep(3600)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--train", required=True)
    p.add_argument("--output_dir", required=True)
    p.add_argument("--bench_log", required=True)
    p.add_argument("--max_steps", type=int, default=80)
    p.add_argument("--save_steps", type=int, default=20)
    p.add_argument("--warmup_steps", type=int, default=8)
    p.add_argument("--max_seq_length", type=int, default=128)
    a = p.parse_args()

    log = Log(a.bench_log)
    log.write(ev="launch", started=LAUNCHED)
    try:
        train(a, log)
    except BaseException as exc:  # a worker's last words, as torchrun's own log would show the traceback
        log.write(ev="exit", status="error", error=f"{type(exc).__name__}: {exc}"[:200])
        raise


def train(a: argparse.Namespace, log: Log) -> None:
    tok = AutoTokenizer.from_pretrained(a.model)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    ds = build_dataset(tok, DataSpec(a.train, "instruction", max_seq_length=a.max_seq_length))
    ds = ds.remove_columns([c for c in (SAMPLE_ID, SAMPLE_HASH) if c in ds.column_names])
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32, attn_implementation="sdpa")
    args = TrainingArguments(
        output_dir=a.output_dir,
        max_steps=a.max_steps,
        per_device_train_batch_size=8,
        gradient_accumulation_steps=1,
        learning_rate=2e-3,
        lr_scheduler_type="cosine",
        warmup_steps=a.warmup_steps,
        weight_decay=0.0,
        max_grad_norm=1.0,
        optim="adamw_torch",
        seed=42,
        logging_steps=10,
        save_strategy="steps",
        save_steps=a.save_steps,
        save_total_limit=2,
        auto_find_batch_size=True,
        remove_unused_columns=False,
        report_to=[],
        disable_tqdm=True,
        use_cpu=True,
    )
    trainer = FaultyTrainer(
        model=model,
        args=args,
        train_dataset=ds,
        data_collator=Collator(tok.pad_token_id),
        processing_class=tok,
        callbacks=[Faults(log)],
    )
    resume = get_last_checkpoint(a.output_dir) if Path(a.output_dir).is_dir() else None
    log.write(ev="start", resume=resume)
    trainer.train(
        resume_from_checkpoint=resume
    )  # what resume_from_checkpoint=True does, minus its error on none
    trainer.save_model(str(Path(a.output_dir) / "final"))
    log.write(ev="done", step=trainer.state.global_step)


if __name__ == "__main__":
    main()

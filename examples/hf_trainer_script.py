"""A plain HF Trainer script, as users already have them, for `steadytune supervise`.

    steadytune supervise --output-dir out \
        --resume-arg "--resume_from_checkpoint {checkpoint}" -- \
        python examples/hf_trainer_script.py --output_dir out --model M --data train.jsonl

It knows nothing about steadytune. For tests and demos only, it can misbehave on
one attempt: HANG_AT_STEP=N makes attempt $HANG_ON_ATTEMPT (default 0, read against
$STEADYTUNE_ATTEMPT) stop making progress at step N, as a hung collective would.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, Trainer, TrainerCallback, TrainingArguments


class HangOnce(TrainerCallback):
    def __init__(self, step: int | None) -> None:
        self.step = step

    def on_step_end(self, args, state, control, **kw):
        attempt = os.environ.get("STEADYTUNE_ATTEMPT", "0")
        if self.step and state.global_step == self.step and attempt == os.environ.get("HANG_ON_ATTEMPT", "0"):
            while True:
                time.sleep(3600)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--output_dir", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--max_steps", type=int, default=60)
    p.add_argument("--save_steps", type=int, default=10)
    p.add_argument("--step_sleep", type=float, default=0.0)
    p.add_argument("--resume_from_checkpoint", default=None)
    p.add_argument("--learning_rate", type=float, default=2e-3)
    p.add_argument("--logging_steps", type=int, default=1)
    a = p.parse_args()
    tok = AutoTokenizer.from_pretrained(a.model)
    with open(a.data) as f:
        rows = [json.loads(line) for line in f][:400]
    texts = [f"{r['instruction']}\n{r['input']}\n{r['output']}" for r in rows]
    enc = [tok(t, truncation=True, max_length=64)["input_ids"] for t in texts]
    data = [{"input_ids": ids, "labels": ids} for ids in enc]

    def collate(batch):
        width = max(len(b["input_ids"]) for b in batch)
        ids = torch.full((len(batch), width), tok.pad_token_id)
        labels = torch.full((len(batch), width), -100)
        for i, b in enumerate(batch):
            ids[i, : len(b["input_ids"])] = torch.tensor(b["input_ids"])
            labels[i, : len(b["labels"])] = torch.tensor(b["labels"])
        return {"input_ids": ids, "labels": labels, "attention_mask": (labels != -100).long()}

    class Slow(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            time.sleep(a.step_sleep)

    # The progress bar stays on, as in users' scripts: its output shares the pipe with the log dicts.
    args = TrainingArguments(output_dir=a.output_dir, max_steps=a.max_steps, save_steps=a.save_steps,
                             per_device_train_batch_size=8, learning_rate=a.learning_rate,
                             logging_steps=a.logging_steps, report_to=[], use_cpu=True, save_total_limit=3)
    model = AutoModelForCausalLM.from_pretrained(a.model)
    trainer = Trainer(model=model, args=args, train_dataset=data, data_collator=collate,
                      callbacks=[HangOnce(int(os.environ.get("HANG_AT_STEP", "0")) or None), Slow()])
    trainer.train(resume_from_checkpoint=a.resume_from_checkpoint)


if __name__ == "__main__":
    main()

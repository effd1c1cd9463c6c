"""Gradient-flow recording overhead, printed side by side with the step it rides on.

    python benchmarks/gradflow_overhead.py [--steps 40] [--interval 50] [--model PATH]

Trains the demo model (or ``--model``, a local causal LM) on demo batches and
times, separately and interleaved, a full optimizer step (forward, backward,
clip, AdamW) and one call of ``layer_grad_stats`` on the same gradients.
The overhead at interval N is ``cost_of_one_call / (N * step_time)``.

target: < 2% of step time at the default interval
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--interval", type=int, default=None, help="default: guard.gradflow.DEFAULT_INTERVAL")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--model", type=Path, default=None)
    args = ap.parse_args()

    import torch
    from transformers import AutoModelForCausalLM

    from steadytune.guard.gradflow import DEFAULT_INTERVAL, columns, layer_grad_stats
    from steadytune.train.assets import ensure_demo_assets
    from steadytune.train.data import DataSpec, build_dataset
    from steadytune.train.runner import Collator

    interval = args.interval or DEFAULT_INTERVAL
    assets = ensure_demo_assets()
    model_dir = args.model or (assets / "model")
    from steadytune.forensics.tokenizer import load_hf_tokenizer

    tok = load_hf_tokenizer(model_dir)
    ds = build_dataset(tok, DataSpec(str(assets / "train.jsonl"), "instruction", max_seq_length=128))
    collate = Collator(tok.pad_token_id)
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = AutoModelForCausalLM.from_pretrained(str(model_dir)).to(device)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def batch(i: int) -> dict:
        rows = [ds[(i * args.batch + j) % len(ds)] for j in range(args.batch)]
        b = collate(rows)
        return {k: b[k].to(device) for k in ("input_ids", "labels", "attention_mask")}

    step_s, stats_s = [], []
    for i in range(args.steps + 3):
        inputs = batch(i)
        t0 = time.perf_counter()
        loss = model(**inputs).loss
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        float(norm)  # the guard reads the norm every step: a sync the real step pays anyway
        t1 = time.perf_counter()
        stats = layer_grad_stats(model)  # measured on the very gradients of this step (syncs once)
        t2 = time.perf_counter()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if device == "cuda":
            torch.cuda.synchronize()
        t3 = time.perf_counter()
        if i >= 3:  # warm-up: allocator and kernels
            step_s.append((t1 - t0) + (t3 - t2))
            stats_s.append(t2 - t1)
    step = statistics.median(step_s)
    cost = statistics.median(stats_s)
    every_step = cost / step
    at_interval = cost / (interval * step)
    layers = len(stats)
    params = sum(p.numel() for p in model.parameters())
    size = len(json.dumps(columns(stats)))
    print(
        f"model {model_dir} ({params / 1e6:.2f} M parameters, {layers} layers), batch {args.batch}, "
        f"{args.steps} timed steps, torch {torch.__version__} on {device}"
    )
    print(f"{'figure':<44} {'measured':>12} {'target':>12}")
    print(f"{'optimizer step (median)':<44} {step * 1e3:>10.2f}ms {'-':>12}")
    print(f"{'layer_grad_stats call (median)':<44} {cost * 1e3:>10.2f}ms {'-':>12}")
    print(f"{'overhead if recorded every step':<44} {every_step:>11.2%} {'-':>12}")
    print(f"{f'overhead at the default interval ({interval})':<44} {at_interval:>11.3%} {'< 2%':>12}")
    print(f"{'stored size per recording (JSON)':<44} {size:>10,}B {'-':>12}")
    return 0 if at_interval < 0.02 else 1


if __name__ == "__main__":
    raise SystemExit(main())

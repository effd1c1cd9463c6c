"""The guard in a plain PyTorch loop: step records, heartbeats and the NaN guard, no Trainer.

    python examples/plain_loop.py runs/plain-loop
    steadytune analyze runs/plain-loop

Step 30 is given a NaN loss on purpose: the guard skips that update, so the
weights never see it, and the record says ``skipped: true``.
"""

from __future__ import annotations

import sys

import torch

from steadytune import Guard


def main(run_dir: str = "runs/plain-loop", steps: int = 60) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x, y = torch.randn(512, 16), torch.randn(512, 1)
    guard = Guard(run_dir)
    for step in range(1, steps + 1):
        ids = torch.randint(0, 512, (32,))
        guard.begin_step()
        loss = torch.nn.functional.mse_loss(model(x[ids]), y[ids])
        if step == 30:
            loss = loss * float("nan")  # a poisoned batch
        loss.backward()
        guard.add_microbatch(loss, tokens=32, sample_ids=ids.tolist())
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # returns the norm before clipping
        if guard.before_update(model, optimizer, grad_norm=norm):  # False: non-finite, the update is skipped
            optimizer.step()
        optimizer.zero_grad()
        guard.end_step(step)
        guard.heartbeat(step)
    guard.close("completed")
    print(f"{steps} steps, {guard.skipped_total} update(s) skipped; records in {guard.run.telemetry(0)}")


if __name__ == "__main__":
    main(*sys.argv[1:2])

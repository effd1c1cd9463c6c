"""The anomaly kinds: what each one means, its likely cause and what to do, in plain words.

One table, so the console, alerts, ``analyze`` and the docs say the same thing.
A detector only measures; the words come from here.
"""

from __future__ import annotations

from dataclasses import dataclass

from steadytune.records import Severity


@dataclass(frozen=True)
class KindInfo:
    """Static facts about one anomaly kind."""

    title: str
    cause: str
    suggestion: str
    severity: Severity


KINDS: dict[str, KindInfo] = {
    "nan_loss": KindInfo(
        "loss is NaN/Inf",
        "the forward pass overflowed or the weights already hold NaN/Inf (fp16 overflow, log of zero, "
        "a division by an empty mask, or a bad batch)",
        "skip the update, restore the last good checkpoint, use bf16 or a lower LR, and inspect the batch",
        "critical",
    ),
    "nonfinite_grad": KindInfo(
        "gradient norm is NaN/Inf",
        "fp16 overflow: the loss scaler skipped the step and lowered the scale; harmless if rare",
        "nothing if it stays rare; if it repeats, use bf16, lower the LR or clip gradients",
        "warning",
    ),
    "loss_spike": KindInfo(
        "loss spike",
        "a vertical jump: an exploding update, usually from a bad or unusual batch or a too-high LR",
        "clip gradients (max_grad_norm=1.0) and lower the LR; if it does not recover, roll back and "
        "skip the data window",
        "warning",
    ),
    "divergence": KindInfo(
        "loss diverged",
        "the loss climbed away from its best level and did not come back: the LR is too high or the "
        "optimizer state is corrupted",
        "roll back to the last good checkpoint, lower the LR (x0.5), add warm-up and gradient clipping",
        "critical",
    ),
    "loss_collapse": KindInfo(
        "loss collapsed to zero",
        "a sudden zero: the labels are empty or fully masked (all -100), or the loss reads the inputs",
        "check the label masking and the chat template; print one batch's labels",
        "critical",
    ),
    "plateau": KindInfo(
        "loss is flat",
        "a flat line: no learning, from vanishing gradients, a frozen model (no trainable parameters, "
        "LoRA not attached) or an LR of zero",
        "check that parameters require grad and that the optimizer holds them; check the LR schedule; "
        "raise the LR",
        "warning",
    ),
    "oscillation": KindInfo(
        "loss oscillates",
        "a sawtooth: the LR is too high, so each update overshoots",
        "lower the LR (x0.3-0.5) or lengthen the warm-up; check the batch size",
        "warning",
    ),
    "grad_explosion": KindInfo(
        "gradient explosion",
        "the gradient norm jumped and stayed up: a vertical jump that the updates will follow",
        "clip gradients (max_grad_norm=1.0) and lower the LR; roll back if the loss follows",
        "critical",
    ),
    "grad_vanishing": KindInfo(
        "gradients vanished",
        "the gradient norm fell to a tiny fraction of its level: the model stopped learning "
        "(vanishing gradients, frozen layers, or an LR schedule at zero)",
        "check requires_grad and the LR schedule; check for saturated activations or a dead loss",
        "warning",
    ),
    "grad_spike": KindInfo(
        "gradient spike",
        "the gradient norm jumped while the loss did not: an unusual batch",
        "keep gradient clipping on; if it repeats, inspect the batches at these steps",
        "warning",
    ),
    "memory_leak": KindInfo(
        "memory grows steadily",
        "steady memory growth: tensors kept across steps (a loss kept with its graph, metrics "
        "accumulated without .item()/.detach(), a growing cache)",
        "log loss.item() instead of loss; detach what you keep; clear lists of tensors each step",
        "warning",
    ),
    "memory_headroom": KindInfo(
        "memory almost full",
        "memory in use is close to the total: the next longer batch or evaluation may OOM",
        "lower the micro-batch or sequence length, enable gradient checkpointing",
        "warning",
    ),
    "throughput_drop": KindInfo(
        "throughput dropped",
        "steps got much slower: thermal throttling, a competing process, a slower data source or swap",
        "check nvidia-smi for clocks and other processes, and the data loader",
        "warning",
    ),
    "stall": KindInfo(
        "training stalled",
        "no step for far longer than usual: a hang (NCCL collective, dead data worker, deadlock)",
        "dump the stacks (py-spy dump), check NCCL and the data loader; restart from the last checkpoint",
        "critical",
    ),
    "straggler": KindInfo(
        "straggler rank",
        "one rank is much slower than the others, and every collective waits for it",
        "check that rank's GPU (clocks, temperature, PCIe/NVLink) and host load",
        "warning",
    ),
    "gpu_thermal": KindInfo(
        "GPU too hot",
        "the GPU runs at a temperature where it throttles its clocks",
        "check cooling and fans, lower the power limit, space out the GPUs",
        "warning",
    ),
    "gpu_error": KindInfo(
        "GPU errors",
        "the GPU reported ECC or Xid errors: failing memory or a driver fault",
        "drain the GPU, check `nvidia-smi -q -d ECC` and the kernel log; restart on healthy GPUs",
        "critical",
    ),
    "dataloader_bottleneck": KindInfo(
        "data loader starves the GPU",
        "a large share of each step is spent waiting for data",
        "raise dataloader_num_workers, pin memory, pre-tokenize the dataset",
        "warning",
    ),
    "disk_low": KindInfo(
        "disk almost full",
        "the disk of the run directory is filling; the next checkpoint may be torn",
        "free space, lower save_total_limit, or move the run directory",
        "warning",
    ),
    "overfitting": KindInfo(
        "overfitting",
        "the eval loss rises while the training loss still falls: the model memorises the training set",
        "stop at the best checkpoint (load_best_model_at_end), fewer epochs, more data or regularisation",
        "warning",
    ),
    "reward_collapse": KindInfo(
        "reward collapsed",
        "an RL or preference run gave back everything its reward had gained: the policy drifted into "
        "degenerate outputs (reward hacking undone, a too-high LR, or a too-small KL penalty)",
        "roll back to the checkpoint at the best reward, lower the LR, raise the KL coefficient (beta)",
        "warning",
    ),
    "kl_blowup": KindInfo(
        "KL divergence blew up",
        "the policy jumped away from the reference model in a few steps: an unstable update, a too-high "
        "LR or a too-small KL penalty",
        "lower the LR, raise beta, clip gradients; roll back if the reward falls with it",
        "warning",
    ),
}

ALL_KINDS: tuple[str, ...] = tuple(KINDS)

"""Plan revisions for restarts: rollback-and-skip, OOM escalation, memory pressure. Pure.

Each function takes the current plan and the facts, and returns the next plan
(or None when there is no safe next plan), never touching a file.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence

from steadytune.records import Anomaly, PlanRevision, replace


def to_ranges(ids: Iterable[int]) -> tuple[tuple[int, int], ...]:
    """Sorted, merged inclusive ranges: [1,2,3,7,8] -> ((1,3),(7,8))."""
    out: list[list[int]] = []
    for i in sorted(set(ids)):
        if out and i == out[-1][1] + 1:
            out[-1][1] = i
        else:
            out.append([i, i])
    return tuple((a, b) for a, b in out)


def merge_ranges(*groups: Iterable[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    ranges = sorted((a, b) for g in groups for a, b in g)
    out: list[list[int]] = []
    for a, b in ranges:
        if out and a <= out[-1][1] + 1:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return tuple((a, b) for a, b in out)


def onset_step(anomaly: Anomaly) -> int:
    """Where the trouble began: a detector that confirms late (a divergence, a persisting spike)
    names the step it first suspected in its evidence, and a rollback must go back before that."""
    since = anomaly.evidence.get("since_step") if isinstance(anomaly.evidence, dict) else None
    if isinstance(since, int) and not isinstance(since, bool) and 0 < since < anomaly.start_step:
        return since
    return anomaly.start_step


def choose_rollback_checkpoint(
    anomaly_start: int,
    verified_steps: Sequence[int],
    previous_resumes: Sequence[int | None],
    came_back_within: int = 0,
) -> int | None:
    """The checkpoint to roll back to: the newest verified one from before the anomaly.

    If an earlier rollback already resumed from that same checkpoint (the trouble
    came back), go one checkpoint further back. So too when the trouble starts within
    ``came_back_within`` steps after the checkpoint the last rollback resumed: it came
    back on that timeline, and the checkpoints it wrote since descend from the one that
    led into it again, so they are no further back. ``0`` means start over from the
    initial weights; ``None`` means there is nowhere left to go.
    """
    limit = anomaly_start
    if previous_resumes:
        last = previous_resumes[-1] or 0
        if last < anomaly_start <= last + came_back_within:
            limit = last
    candidates = [*sorted((s for s in verified_steps if s < limit), reverse=True), 0]
    tried = {p or 0 for p in previous_resumes}
    for step in candidates:
        if step not in tried:
            return step
    return None


def publish_to_await(
    anomaly_start: int,
    verified_steps: Sequence[int],
    previous_resumes: Sequence[int | None],
    publishing: Collection[int],
) -> int | None:
    """The checkpoint a rollback should wait for before it chooses, or None to choose now.

    It is the newest one from before the anomaly whose publish is still under way, when the
    choice would take it once verified: newer than every verified candidate and not one an
    earlier rollback already went back to. Choosing without it goes a whole save interval
    further back and skips the samples of all of it.
    """
    on_the_way = [s for s in publishing if 0 < s < anomaly_start]
    if not on_the_way:
        return None
    step = max(on_the_way)
    chosen = choose_rollback_checkpoint(anomaly_start, [*verified_steps, step], previous_resumes)
    return step if chosen == step else None


def rollback_plan(
    current: PlanRevision,
    revision: int,
    ts: float,
    attempt: int,
    anomaly_start: int,
    anomaly_end: int,
    checkpoint_step: int,
    checkpoint_path: str | None,
    samples_by_step: Mapping[int, Sequence[int]],
    lr_scale: float,
    cause_event_seq: int | None,
    reason: str,
) -> PlanRevision:
    """Restart from ``checkpoint_step``, skipping the samples that led into the anomaly, at a lower LR."""
    window = [i for s, ids in samples_by_step.items() if checkpoint_step < s <= anomaly_end for i in ids]
    return replace(
        current,
        revision=revision,
        ts=ts,
        attempt=attempt,
        reason=reason,
        cause_event_seq=cause_event_seq,
        resume_checkpoint=checkpoint_path,
        lr_scale=current.lr_scale * lr_scale,
        lr_groups=tuple((name, lr * lr_scale) for name, lr in current.lr_groups),
        skip_ranges=merge_ranges(current.skip_ranges, to_ranges(window)),
        skip_steps=merge_ranges(current.skip_steps, ((checkpoint_step + 1, anomaly_end),) if window else ()),
        notes=f"rollback to step {checkpoint_step}; "
        f"{_window_said(window, checkpoint_step + 1, anomaly_end)}; LR x{current.lr_scale * lr_scale:g}",
    )


def _window_said(window: Sequence[int], first: int, last: int) -> str:
    """What a rollback did with the data of steps ``first..last``: skipped, or trained on again."""
    if window:
        return f"skipped {len(set(window))} samples of steps {first}..{last}"
    # No sample ids were recorded for these steps (a supervised command's data loader is its own).
    return f"the data of steps {first}..{last} is not skipped (no sample of them was recorded): trained again"


def oom_escalation(
    current: PlanRevision, seq_len: int, gradient_checkpointing: bool
) -> tuple[dict, str] | None:
    """What to change after an OOM the in-process split could not absorb.

    First gradient checkpointing, then half the sequence length (never below 64).
    """
    if not (current.gradient_checkpointing or gradient_checkpointing):
        return {
            "gradient_checkpointing": True
        }, "OOM past the split limit: restart with gradient checkpointing"
    seq = current.max_seq_length or seq_len
    if seq // 2 >= 64:
        return {
            "max_seq_length": seq // 2
        }, f"OOM even with gradient checkpointing: restart with max_seq_length {seq // 2}"
    return None


def smaller_microbatch(current: PlanRevision, batch: int, accum: int) -> dict | None:
    """The largest smaller micro-batch that divides the current one, with accumulation scaled up
    so the effective batch (micro-batch x accumulation) stays exactly the same."""
    b = current.per_device_train_batch_size or batch
    a = current.gradient_accumulation_steps or accum
    d = next((d for d in range(b // 2, 0, -1) if b % d == 0), None)
    if d is None:
        return None
    return {"per_device_train_batch_size": d, "gradient_accumulation_steps": a * (b // d)}

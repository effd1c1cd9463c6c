"""Is ``save_steps`` near the interval the measurements call for? (Young/Daly, docs/goodput.md)

``check`` reads the newest runs in the runs folder: the save stall and the step time come
from the goodput account of the newest earlier run of the same config that saved (what a save
of this model costs on this machine), the interruption rate from the plan revisions and events
of all of them (how often this machine's runs lose work: restarts and rollbacks per hour
watched), so that a folder of long runs is not read whole before a run may start. A run is never slowed
by this: the answer is ``ok``, a ``warn`` with the interval to set, or ``na`` when there is
nothing to measure from. Torch-free.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from steadytune.config.load import dump_config
from steadytune.config.schema import SteadytuneConfig
from steadytune.goodput.advice import advise
from steadytune.goodput.load import interruptions as interruption_counts
from steadytune.goodput.load import run_account
from steadytune.goodput.parts import Account
from steadytune.preflight.envdrift import config_hash, same_config
from steadytune.preflight.result import Check, na, ok, warn
from steadytune.rundir import RunDir

NEWEST = 20  # runs read: the machine's recent record, not its whole history


def recent_runs(runs_dir: Path, limit: int = NEWEST) -> list[RunDir]:
    """The newest ``limit`` runs under ``runs_dir`` (by their event log's last write), newest first."""
    found: list[tuple[float, RunDir]] = []
    try:
        children = list(runs_dir.iterdir())
    except OSError:
        return []
    for root in children:
        run = RunDir(root)
        try:
            found.append((run.events.stat().st_mtime, run))
        except OSError:
            continue
    return [run for _, run in sorted(found, key=lambda x: -x[0])[:limit]]


def checkpoint_interval_check(
    cfg: SteadytuneConfig,
    account_of: Callable[[RunDir], Account] = run_account,
    record_of: Callable[[RunDir], tuple[int, float]] = interruption_counts,
) -> Check:
    """``config``/``checkpoint_interval``: the Young/Daly interval against ``train.save_steps``.

    Args:
        cfg: the validated config (its ``run.runs_dir`` is read).
        account_of: a run's goodput account (``run_account``; injected in tests), read only for the
            newest runs of this config, until one has measured a save.
        record_of: a run's interruptions and exposure, from its plans and events alone.
    """
    runs_dir = Path(cfg.run.runs_dir)
    digest = config_hash(dump_config(cfg))
    runs = recent_runs(runs_dir)
    measured: tuple[RunDir, Account] | None = None
    for run in runs:
        if not same_config(run, cfg.run.name, digest):
            continue
        try:
            acct = account_of(run)
        except (OSError, ValueError):
            continue
        if acct.save_cost_s and acct.step_s:
            measured = (run, acct)
            break
    if measured is None:
        return na(
            "config",
            "checkpoint_interval",
            f"no earlier run of this config in {runs_dir} saved a checkpoint to measure a save's cost on",
        )
    source, acct = measured
    records = [record_of(run) for run in runs]
    interruptions = sum(n for n, _ in records)
    exposure = sum(s for _, s in records)
    max_steps = cfg.train.max_steps if cfg.train.max_steps > 0 else None
    advice = advise(acct.save_cost_s, acct.step_s, interruptions, exposure, cfg.train.save_steps, max_steps)
    if advice is None:
        return na("config", "checkpoint_interval", "the runs read hold no time to weigh a save against")
    data = {
        "measured_on": source.run_id,
        "runs": len(runs),
        "save_cost_s": advice.save_cost_s,
        "step_s": advice.step_s,
        "interruptions": interruptions,
        "mtbf_s": advice.mtbf_s,
        "mtbf_is_bound": advice.mtbf_is_bound,
        "best_steps": advice.best_steps,
        "current_loss": advice.current_loss,
        "best_loss": advice.best_loss,
    }
    where = f" (save and step measured on {source.run_id}, interruptions over the last {len(runs)} runs)"
    if advice.worth_saying:
        return warn(
            "config",
            "checkpoint_interval",
            advice.line() + where,
            f"set train.save_steps to {advice.best_steps}",
            **data,
        )
    return ok("config", "checkpoint_interval", advice.line() + where, **data)

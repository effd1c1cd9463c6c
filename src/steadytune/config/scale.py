"""``scale:`` in the run config: autoscaling a run by rules (docs/server.md; with Ray, docs/ray.md).

Utilisations are percentages (0-100), as ``nvidia-smi`` and ``top`` show them. The
defaults are deliberately slow: a resize costs a checkpoint and a relaunch (tens of
seconds on a large model), so a rule must hold for minutes before it is worth it.
"""

from __future__ import annotations

from pydantic import ConfigDict, Field, ValidationInfo, field_validator

from steadytune.config.numbers import NoBoolNumbers


class _Section(NoBoolNumbers):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class GrowRule(_Section):
    gpu_util_above: float = Field(
        85.0, gt=0, le=100, description="a percentage: add a GPU when the job's GPUs are busier than this"
    )
    for_s: float = Field(300.0, ge=0, description="seconds the utilisation must stay above it, e.g. 300")


class ShrinkRule(_Section):
    gpu_util_below: float = Field(
        30.0, ge=0, lt=100, description="a percentage: give a GPU back when the job's GPUs idle below this"
    )
    for_s: float = Field(600.0, ge=0, description="seconds the utilisation must stay below it, e.g. 600")


class CpuBoundRule(_Section):
    cpu_util_above: float = Field(90.0, gt=0, le=100, description="a percentage of the host's CPUs, e.g. 90")
    gpu_util_below: float = Field(
        50.0, gt=0, le=100, description="a percentage: the GPUs wait on the input pipeline below this"
    )
    for_s: float = Field(300.0, ge=0, description="seconds both must hold, e.g. 300")
    max_workers: int = Field(
        8,
        ge=1,
        le=256,
        description="the most dataloader workers it may raise train.dataloader_num_workers to",
    )


class ScaleConfig(_Section):
    """Grow, shrink or feed a run by rules on its GPUs' and the host's utilisation.

    A native run is relaunched at the new size; with ``run.engine: ray`` a grow or shrink is a
    resource request to Ray within ``ray.num_workers`` (SteadytuneConfig._ray_scale)."""

    min_gpus: int = Field(
        1,
        ge=1,
        le=64,
        description="the fewest processes (GPUs) the run may shrink to; with Ray: ray.num_workers' min",
    )
    max_gpus: int = Field(
        1,
        ge=1,
        le=64,
        description="the most processes (GPUs) the run may grow to; with Ray: ray.num_workers' max",
    )
    grow: GrowRule = Field(default_factory=GrowRule, description="{gpu_util_above: 85, for_s: 300}")
    shrink: ShrinkRule = Field(default_factory=ShrinkRule, description="{gpu_util_below: 30, for_s: 600}")
    cpu_bound: CpuBoundRule | None = Field(
        None,
        description="{cpu_util_above: 90, gpu_util_below: 50}: add dataloader workers, not GPUs; "
        "leave it out to never change the workers",
    )
    cooldown_s: float = Field(900.0, ge=0, description="seconds after a resize before the next one, e.g. 900")
    undo_if_slower: bool = Field(True, description="true to undo a resize that did not pay off")
    compare_steps: int = Field(
        20, ge=2, le=10_000, description="steps measured on each side of a resize to judge it, e.g. 20"
    )
    min_gain: float = Field(
        0.05, ge=0, le=10, description="the throughput gain a resize must show to stay, e.g. 0.05 (5%)"
    )

    @field_validator("max_gpus")
    @classmethod
    def _range(cls, v: int, info: ValidationInfo) -> int:
        low = info.data.get("min_gpus")
        if low is not None and v < low:
            raise ValueError(f"scale.max_gpus={v} is below scale.min_gpus={low}: make min_gpus <= max_gpus")
        return v

    @field_validator("shrink")
    @classmethod
    def _gap(cls, v: ShrinkRule, info: ValidationInfo) -> ShrinkRule:
        grow = info.data.get("grow")
        if grow is not None and v.gpu_util_below >= grow.gpu_util_above:
            raise ValueError(
                f"scale.shrink.gpu_util_below={v.gpu_util_below:g} is not below "
                f"scale.grow.gpu_util_above={grow.gpu_util_above:g}: the run would grow and shrink "
                "on the same reading; keep a gap, e.g. 30 and 85"
            )
        return v

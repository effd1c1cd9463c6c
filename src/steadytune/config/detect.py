"""Thresholds of every detector, with defaults that work without tuning.

The main config embeds :class:`DetectConfig` under the key ``detect:``; every
field can be overridden there (``detect.loss.spike_z=8``). Loss and gradient
rules work in log space, so their thresholds are ratios, not absolute values:
``0.22`` in log space is a 25% rise whatever the loss scale is.

Defaults were chosen on a synthetic suite (thousands of healthy curves of many
shapes) and a development set of real logs; ``benchmarks/detection.py`` prints
the recall and false-alarm rate they give. docs/detectors.md explains each one.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import ConfigDict, Field

from steadytune.config.numbers import NoBoolNumbers


class _Strict(NoBoolNumbers):
    """A typo in a threshold name is an error, not a silently ignored key.

    ``kinds`` names the anomaly kinds whose detectors the section's thresholds tune: the
    names a config may use (``policy.rules``) before any detector is imported.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)
    kinds: ClassVar[tuple[str, ...]] = ()


class SeriesConfig(_Strict):
    """How a noisy metric is summarised: a recent level and a noise scale."""

    level_window: int = Field(8, ge=1, description="logged points in the recent level (median)")
    noise_window: int = Field(64, ge=4, description="successive differences in the noise estimate")
    gap_factor: float = Field(
        6.0, gt=1, description="a step gap this many typical intervals long starts a new segment"
    )


class LossConfig(_Strict):
    """nan_loss, loss_spike, divergence, loss_collapse, plateau, oscillation."""

    kinds = ("nan_loss", "loss_spike", "divergence", "loss_collapse", "plateau", "oscillation")

    noise_prior: float = Field(0.17, gt=0, description="log-space noise assumed before it is measured")
    noise_prior_weight: float = Field(4.0, ge=0, description="how many differences the prior is worth")
    noise_floor: float = Field(0.01, ge=0, description="log-space noise never assumed below this")
    spike_z: float = Field(7.0, gt=0, description="robust z-score of a loss spike")
    spike_min_ratio: float = Field(
        1.1, ge=1, description="a spike is at least this many times the level (the z-score judges the noise)"
    )
    spike_min_ratio_confirmed: float = Field(
        1.1,
        ge=1,
        description="below spike_min_ratio: a jump the next point confirms (still up) needs only this",
    )
    young_spike_z: float = Field(
        4.0, gt=0, description="young baseline (< level_window points): prior sigmas for a one-point spike"
    )
    resolve_z: float = Field(3.0, gt=0, description="a spike is over once the loss is back within this z")
    suspect_z: float = Field(4.0, gt=0, description="young baseline: points this far up are held back")
    divergence_points: int = Field(3, ge=1, description="a spike still up after this many points diverged")
    divergence_rise: float = Field(
        0.35, gt=0, description="log-space rise above the best level (+ spike_z/2 sigmas)"
    )
    climb_min_rise: float = Field(
        0.1, gt=0, description="a steady climb: log-space rise of the fitted line over two level windows..."
    )
    climb_t: float = Field(
        8.0, gt=0, description="...with this t of its slope, and the level that far (+ spike_z/2 sigmas) up"
    )
    collapse_abs: float = Field(1e-6, ge=0, description="a loss at or below this is zero")
    collapse_drop: float = Field(
        3.0, gt=0, description="log-space sudden drop (3.0 = 20x) that is a collapse"
    )
    collapse_small: float = Field(0.05, ge=0, description="and the loss it dropped to is below this")
    collapse_points: int = Field(2, ge=1, description="points the collapsed value must persist")
    collapse_fraction: float = Field(
        0.1, gt=0, lt=1, description="a level below this share of the initial level has collapsed..."
    )
    collapse_memorized: float = Field(
        0.02, gt=0, description="...when it is also below this loss (nats; perplexity 1.02)"
    )
    early_points: int = Field(10, ge=3, description="points of a run or snippet judged without a baseline")
    early_rises: int = Field(3, ge=2, description="consecutive rises there that are a divergence...")
    early_rise: float = Field(0.4, gt=0, description="...when they add up to this log-space rise (1.5x)")
    early_z: float = Field(3.0, gt=0, description="...and to this many sigmas of a two-point difference")
    plateau_min_points: int = Field(30, ge=5, description="logged points before a plateau can be called")
    plateau_min_steps: int = Field(200, ge=1, description="steps before a plateau can be called")
    plateau_min_gain: float = Field(0.05, ge=0, description="log-space drop from the start expected by then")
    plateau_trend_t: float = Field(2.0, gt=0, description="a falling trend this significant (t) is learning")
    frozen_points: int = Field(6, ge=2, description="identical loss values in a row: the model is frozen")
    oscillation_window: int = Field(32, ge=8, description="logged points searched for swings")
    oscillation_ratio: float = Field(2.8, gt=1, description="regularity: largest/smallest lag difference")
    oscillation_growth: float = Field(2.2, gt=1, description="window width over the typical width before it")
    oscillation_min_amplitude: float = Field(
        0.03, ge=0, description="log-space swing spread never below this"
    )
    oscillation_crossings: int = Field(4, ge=2, description="band crossings (two full cycles) that saw")
    seasonal_margin: float = Field(0.05, ge=0, description="log-space slack over last epoch's same phase")


class GradConfig(_Strict):
    """nonfinite_grad, grad_spike, grad_explosion, grad_vanishing."""

    kinds = ("nonfinite_grad", "grad_spike", "grad_explosion", "grad_vanishing")

    noise_prior: float = Field(0.3, gt=0, description="log-space grad-norm noise before it is measured")
    noise_prior_weight: float = Field(2.0, ge=0, description="how many differences the prior is worth")
    noise_floor: float = Field(0.05, ge=0, description="log-space noise never assumed below this")
    spike_z: float = Field(5.0, gt=0, description="robust z-score of a grad-norm spike")
    spike_min_ratio: float = Field(
        8.0, ge=1, description="a grad spike is at least this many times the level"
    )
    quiet_spike_ratio: float = Field(
        4.0,
        ge=1,
        description="a one-point grad spike over a full level window is at least this many times it, "
        "however quiet the run",
    )
    explosion_points: int = Field(
        3, ge=1, description="a grad spike still up after this many points exploded"
    )
    explosion_ratio: float = Field(100.0, ge=1, description="or a single jump this many times the level")
    vanishing_ratio: float = Field(
        100.0, gt=1, description="level this many times below its established level"
    )
    vanishing_points: int = Field(5, ge=1, description="points the level must stay that low")
    warmup_points: int = Field(10, ge=0, description="points before the established level is trusted")
    # Per-layer rules on the recorded gradient flow: absolute norms of one layer's raw
    # (pre-clip) gradient. Below 1e-3 a layer barely learns; above 1e2 it is blowing up.
    layer_vanish_norm: float = Field(
        1e-3, gt=0, description="a layer's gradient norm below this is vanishing"
    )
    layer_explode_norm: float = Field(
        1e2, gt=0, description="a layer's gradient norm above this (or non-finite) is exploding"
    )
    layer_dead_zero_frac: float = Field(
        0.9, gt=0, le=1, description="a layer with more exact-zero gradient entries than this is dead"
    )


class RLConfig(_Strict):
    """RL and preference objectives: reward_collapse, kl_blowup, clip_saturation; no_learning_signal (any)."""

    kinds = ("reward_collapse", "kl_blowup", "clip_saturation", "no_learning_signal")

    collapse_z: float = Field(
        4.0, gt=0, description="a reward this many noise sigmas below its best level is down..."
    )
    collapse_share: float = Field(
        0.5, ge=0, le=1, description="...and, when it had gained, this share of its gain below that best"
    )
    collapse_points: int = Field(3, ge=1, description="points down in a row: the reward collapsed")
    kl_jump_ratio: float = Field(10.0, gt=1, description="a KL this many times its recent level blew up")
    kl_runaway_ratio: float = Field(
        100.0, gt=1, description="a KL level this many times where it stood when the reward last improved"
    )
    kl_runaway_min: float = Field(
        0.1,
        ge=0,
        description="...and at least this high: a KL still below it has run nowhere (and a fresh "
        "policy's young per-token KL is judged against it; 0: never)",
    )
    clip_saturation: float = Field(
        0.3, gt=0, le=1, description="a clipped-token share whose level reaches this saturates the update"
    )
    signal_window: int = Field(
        16, ge=4, description="logged points judged together for a learning signal (two level windows)"
    )
    no_signal_share: float = Field(
        0.05,
        ge=0,
        lt=1,
        description="a window whose batches carried this share of learning groups or less carried none",
    )
    zero_grad_norm: float = Field(
        1e-8, ge=0, description="a gradient norm at or below this is zero: no parameter moves"
    )
    flat_gain: float = Field(
        0.5,
        gt=0,
        description="a finished run's reward whose gain over the run is surely below this many noise "
        "sigmas per point, and not significant, never rose",
    )
    run_signal_share: float = Field(
        0.2,
        ge=0,
        lt=1,
        description="a finished RL run whose batches carried this share of learning groups or less over "
        "the whole run, its reward never up, learned nothing (0: never)",
    )


class EvalConfig(_Strict):
    """overfitting: eval loss rises while the training loss still falls; nan_eval: an evaluation NaN/Inf."""

    kinds = ("overfitting", "nan_eval")

    min_evals: int = Field(4, ge=2, description="evaluations before overfitting can be called")
    rise: float = Field(0.03, ge=0, description="log-space rise of eval loss above its best")
    rising_evals: int = Field(2, ge=1, description="consecutive evaluations above the best")


class MemoryConfig(_Strict):
    """memory_leak, memory_headroom."""

    kinds = ("memory_leak", "memory_headroom")

    warmup_points: int = Field(20, ge=0, description="points ignored while the allocator warms up")
    window: int = Field(64, ge=8, description="points in the robust trend")
    leak_min_growth: float = Field(0.02, ge=0, description="growth over the window, fraction of the level")
    leak_min_bytes: int = Field(64 << 20, ge=0, description="and at least this many bytes")
    leak_steadiness: float = Field(0.75, ge=0, le=1, description="share of the window's 8 segments that grow")
    device_total_bytes: int | None = Field(None, ge=1, description="device memory; else from system samples")
    headroom_warning: float = Field(0.93, gt=0, le=1, description="used/total that warns")
    headroom_critical: float = Field(0.98, gt=0, le=1, description="used/total that is critical")


class PaceConfig(_Strict):
    """throughput_drop, dataloader_bottleneck, straggler, stall."""

    kinds = ("throughput_drop", "dataloader_bottleneck", "straggler", "stall")

    warmup_points: int = Field(5, ge=0, description="points before throughput is judged")
    window: int = Field(32, ge=4, description="points in the throughput baseline (median)")
    throughput_drop: float = Field(0.4, gt=0, lt=1, description="fraction of throughput lost")
    throughput_points: int = Field(5, ge=1, description="consecutive slow points")
    throughput_min_s: float = Field(
        20.0, ge=0, description="and the slowdown lasted at least this many seconds"
    )
    data_wait_ratio: float = Field(0.3, gt=0, lt=1, description="share of step time waiting for data")
    data_wait_points: int = Field(5, ge=1, description="consecutive points waiting that long")
    straggler_ratio: float = Field(1.3, gt=1, description="rank step time over the median rank")
    straggler_points: int = Field(8, ge=1, description="consecutive points a rank must be that slow")
    straggler_lag_points: int = Field(5, ge=1, description="logging intervals a rank may trail the leader")
    stall_factor: float = Field(5.0, gt=1, description="times the longest recent step interval")
    stall_min_s: float = Field(300.0, gt=0, description="never call a stall below this many seconds")
    heartbeat_timeout_s: float | None = Field(
        None,
        gt=0,
        description="silence that is a hang; default max(hang_floor_s, hang_factor x p95 step interval)",
    )
    hang_floor_s: float = Field(
        60.0, gt=0, description="never call a hang below this many seconds of silence"
    )
    hang_factor: float = Field(10.0, gt=1, description="or this many times the p95 interval between steps")


class SystemConfig(_Strict):
    """gpu_thermal, gpu_error, disk_low, host memory headroom."""

    kinds = ("gpu_thermal", "gpu_error", "disk_low")

    gpu_temp_warning_c: float = Field(85.0, description="GPU temperature that warns (throttling starts)")
    gpu_temp_critical_c: float = Field(92.0, description="GPU temperature that is critical")
    gpu_temp_points: int = Field(2, ge=1, description="consecutive samples that hot")
    disk_free_warning: float = Field(0.05, ge=0, le=1, description="free fraction that warns")
    disk_free_critical: float = Field(0.02, ge=0, le=1, description="free fraction that is critical")
    disk_min_free_bytes: int = Field(10 << 30, ge=0, description="warn below this free space too")
    ram_warning: float = Field(0.93, gt=0, le=1, description="host RAM used/total that warns")
    ram_critical: float = Field(0.98, gt=0, le=1, description="host RAM used/total that is critical")


class DetectConfig(_Strict):
    """Every detector threshold; embedded in the main config as ``detect:``."""

    enabled: bool = True
    disabled_kinds: tuple[str, ...] = Field((), description="anomaly kinds never reported")
    episode_gap_points: int = Field(
        16,
        ge=0,
        description="logging intervals a condition may stay quiet and, firing again, be the same episode "
        "(two level windows: the level it is judged against still holds the points before it cleared)",
    )
    series: SeriesConfig = SeriesConfig()
    loss: LossConfig = LossConfig()
    grad: GradConfig = GradConfig()
    rl: RLConfig = RLConfig()
    eval: EvalConfig = EvalConfig()
    memory: MemoryConfig = MemoryConfig()
    pace: PaceConfig = PaceConfig()
    system: SystemConfig = SystemConfig()

    @classmethod
    def kind_names(cls) -> tuple[str, ...]:
        """Every anomaly kind a detector may report, by the sections that tune them."""
        out: list[str] = []
        for f in cls.model_fields.values():
            if isinstance(f.annotation, type) and issubclass(f.annotation, _Strict):
                out.extend(f.annotation.kinds)
        return tuple(out)

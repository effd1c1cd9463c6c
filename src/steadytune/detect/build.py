"""The one place a :class:`DetectConfig` becomes detectors.

Each detector takes plain numbers, named as the config names them, and knows
nothing of pydantic or of where its thresholds came from; a test builds one
from literals. This module reads every ``detect.*`` threshold and hands each to
the detectors that use it: the live engine, the system watch and the
dashboard's heat map (through :func:`layer_limits`) all build from here.
"""

from __future__ import annotations

from steadytune.config.detect import DetectConfig
from steadytune.detect.early import FallCollapseWatch, ShortRiseWatch
from steadytune.detect.grad import GradWatch
from steadytune.detect.gradflow import GradFlowWatch, LayerLimits
from steadytune.detect.loss import LossWatch
from steadytune.detect.memory import HeadroomWatch, LeakWatch
from steadytune.detect.objective import ObjectiveWatch
from steadytune.detect.pace import StallWatch, StragglerWatch, ThroughputWatch
from steadytune.detect.system import SystemWatch
from steadytune.detect.trend import OscillationWatch, OverfitWatch, PlateauWatch


def loss_watch(cfg: DetectConfig, metric: str = "loss", rank: int | None = None) -> LossWatch:
    loss, series = cfg.loss, cfg.series
    return LossWatch(
        level_window=series.level_window,
        noise_window=series.noise_window,
        gap_factor=series.gap_factor,
        noise_prior=loss.noise_prior,
        noise_prior_weight=loss.noise_prior_weight,
        noise_floor=loss.noise_floor,
        spike_z=loss.spike_z,
        spike_min_ratio=loss.spike_min_ratio,
        spike_min_ratio_confirmed=loss.spike_min_ratio_confirmed,
        young_spike_z=loss.young_spike_z,
        resolve_z=loss.resolve_z,
        suspect_z=loss.suspect_z,
        divergence_points=loss.divergence_points,
        divergence_rise=loss.divergence_rise,
        climb_min_rise=loss.climb_min_rise,
        climb_t=loss.climb_t,
        early_rise=loss.early_rise,
        collapse_abs=loss.collapse_abs,
        collapse_drop=loss.collapse_drop,
        collapse_small=loss.collapse_small,
        collapse_points=loss.collapse_points,
        seasonal_margin=loss.seasonal_margin,
        metric=metric,
        rank=rank,
    )


def short_rise_watch(cfg: DetectConfig) -> ShortRiseWatch:
    loss = cfg.loss
    return ShortRiseWatch(
        noise_prior=loss.noise_prior,
        early_points=loss.early_points,
        early_rises=loss.early_rises,
        early_rise=loss.early_rise,
        early_z=loss.early_z,
    )


def fall_collapse_watch(cfg: DetectConfig) -> FallCollapseWatch:
    return FallCollapseWatch(
        collapse_fraction=cfg.loss.collapse_fraction,
        collapse_memorized=cfg.loss.collapse_memorized,
        eval_rise=cfg.eval.rise,
    )


def plateau_watch(cfg: DetectConfig) -> PlateauWatch:
    loss = cfg.loss
    return PlateauWatch(
        frozen_points=loss.frozen_points,
        collapse_abs=loss.collapse_abs,
        plateau_min_points=loss.plateau_min_points,
        plateau_min_steps=loss.plateau_min_steps,
        plateau_min_gain=loss.plateau_min_gain,
        plateau_trend_t=loss.plateau_trend_t,
        divergence_rise=loss.divergence_rise,
    )


def oscillation_watch(cfg: DetectConfig) -> OscillationWatch:
    loss = cfg.loss
    return OscillationWatch(
        oscillation_window=loss.oscillation_window,
        oscillation_ratio=loss.oscillation_ratio,
        oscillation_growth=loss.oscillation_growth,
        oscillation_min_amplitude=loss.oscillation_min_amplitude,
        oscillation_crossings=loss.oscillation_crossings,
    )


def overfit_watch(cfg: DetectConfig) -> OverfitWatch:
    ev = cfg.eval
    return OverfitWatch(min_evals=ev.min_evals, rise=ev.rise, rising_evals=ev.rising_evals)


def objective_watch(cfg: DetectConfig) -> ObjectiveWatch:
    series = cfg.series
    return ObjectiveWatch(
        level_window=series.level_window,
        noise_window=series.noise_window,
        gap_factor=series.gap_factor,
        spike_z=cfg.loss.spike_z,
        divergence_points=cfg.loss.divergence_points,
        kl_jump_ratio=cfg.loss.kl_jump_ratio,
    )


def grad_watch(cfg: DetectConfig) -> GradWatch:
    grad, series = cfg.grad, cfg.series
    return GradWatch(
        level_window=series.level_window,
        noise_window=series.noise_window,
        gap_factor=series.gap_factor,
        noise_prior=grad.noise_prior,
        noise_prior_weight=grad.noise_prior_weight,
        noise_floor=grad.noise_floor,
        spike_z=grad.spike_z,
        spike_min_ratio=grad.spike_min_ratio,
        explosion_points=grad.explosion_points,
        explosion_ratio=grad.explosion_ratio,
        vanishing_ratio=grad.vanishing_ratio,
        vanishing_points=grad.vanishing_points,
        warmup_points=grad.warmup_points,
    )


def layer_limits(cfg: DetectConfig) -> LayerLimits:
    """The per-layer gradient-flow thresholds: for the detector and for the heat map that marks alike."""
    grad = cfg.grad
    return LayerLimits(
        vanish=grad.layer_vanish_norm,
        explode=grad.layer_explode_norm,
        dead_zero_frac=grad.layer_dead_zero_frac,
    )


def grad_flow_watch(cfg: DetectConfig) -> GradFlowWatch:
    return GradFlowWatch(**layer_limits(cfg))


def leak_watch(cfg: DetectConfig, metric: str, rank: int | None = None) -> LeakWatch:
    mem = cfg.memory
    return LeakWatch(
        metric,
        rank,
        warmup_points=mem.warmup_points,
        window=mem.window,
        leak_min_growth=mem.leak_min_growth,
        leak_min_bytes=mem.leak_min_bytes,
        leak_steadiness=mem.leak_steadiness,
    )


def headroom_watch(cfg: DetectConfig, metric: str, rank: int | None = None) -> HeadroomWatch:
    mem = cfg.memory
    return HeadroomWatch(
        metric, rank, headroom_warning=mem.headroom_warning, headroom_critical=mem.headroom_critical
    )


def throughput_watch(cfg: DetectConfig, rank: int | None = None) -> ThroughputWatch:
    pace = cfg.pace
    return ThroughputWatch(
        rank,
        warmup_points=pace.warmup_points,
        window=pace.window,
        throughput_drop=pace.throughput_drop,
        throughput_points=pace.throughput_points,
        throughput_min_s=pace.throughput_min_s,
        data_wait_ratio=pace.data_wait_ratio,
        data_wait_points=pace.data_wait_points,
    )


def straggler_watch(cfg: DetectConfig) -> StragglerWatch:
    pace = cfg.pace
    return StragglerWatch(
        straggler_ratio=pace.straggler_ratio,
        straggler_points=pace.straggler_points,
        straggler_lag_points=pace.straggler_lag_points,
    )


def stall_watch(cfg: DetectConfig) -> StallWatch:
    pace = cfg.pace
    return StallWatch(
        stall_factor=pace.stall_factor,
        stall_min_s=pace.stall_min_s,
        heartbeat_timeout_s=pace.heartbeat_timeout_s,
        hang_floor_s=pace.hang_floor_s,
        hang_factor=pace.hang_factor,
    )


def system_watch(cfg: DetectConfig) -> SystemWatch:
    sys_, mem = cfg.system, cfg.memory
    return SystemWatch(
        gpu_temp_warning_c=sys_.gpu_temp_warning_c,
        gpu_temp_critical_c=sys_.gpu_temp_critical_c,
        gpu_temp_points=sys_.gpu_temp_points,
        disk_free_warning=sys_.disk_free_warning,
        disk_free_critical=sys_.disk_free_critical,
        disk_min_free_bytes=sys_.disk_min_free_bytes,
        ram_warning=sys_.ram_warning,
        ram_critical=sys_.ram_critical,
        headroom_warning=mem.headroom_warning,
        headroom_critical=mem.headroom_critical,
    )

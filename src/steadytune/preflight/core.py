"""The preflight, top to bottom: read the host, estimate, lint, scan the data, recommend.

:func:`run_preflight` is what ``steadytune check`` and ``steadytune run`` call. Every
reading of the machine comes in through a :class:`HostFacts` (probed when not given), so
the whole preflight runs on a fake host in tests.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from steadytune.config.load import ConfigIssue
from steadytune.config.schema import SteadytuneConfig
from steadytune.estimate import (
    Architecture,
    ArchitectureError,
    SetupError,
    TrainSetup,
    format_bytes,
    load_architecture,
)
from steadytune.estimate.batch import auto_effective_batch
from steadytune.estimate.runconfig import setup_from_config_dict
from steadytune.preflight import versions as v
from steadytune.preflight.ckptinterval import checkpoint_interval_check
from steadytune.preflight.datascan import DataScan, scan_data
from steadytune.preflight.envdrift import environment_check
from steadytune.preflight.lints import config_lints
from steadytune.preflight.probe import GpuInfo, HostFacts, probe_host
from steadytune.preflight.recommend import recommend
from steadytune.preflight.resources import (
    DEFAULT_HEADROOM_BYTES,
    checkpoint_bytes,
    disk_check,
    disk_needs,
    final_model_bytes,
    gpu_process_check,
    memory_check,
    pick_device,
    ram_check,
    writable_checks,
)
from steadytune.preflight.result import Check, PreflightReport, Recommendation, fail, na, ok
from steadytune.train.data import load_tokenizer
from steadytune.units import format_count


def preflight_paths(cfg: SteadytuneConfig) -> dict[str, Path]:
    """The folders a run writes to: runs, the steadytune cache, the tokenized-data cache."""
    from steadytune.train.assets import default_cache_dir
    from steadytune.train.data import data_cache_dir

    return {"runs_dir": Path(cfg.run.runs_dir), "cache": default_cache_dir(), "data_cache": data_cache_dir()}


def model_architecture(cfg: SteadytuneConfig) -> tuple[Architecture | None, Check]:
    path = Path(cfg.model.name_or_path).expanduser()
    if not (path / "config.json").is_file() and not (path.is_file() and path.suffix == ".json"):
        return None, na(
            "memory",
            "model",
            f"{cfg.model.name_or_path} is not a local folder with config.json: memory checks skipped",
            "download the model (or just its config.json) and point model.name_or_path at the folder",
        )
    try:
        arch = load_architecture(path)
    except ArchitectureError as exc:
        return None, na("memory", "model", str(exc))
    return arch, ok(
        "memory",
        "model",
        f"{arch.model_type or 'decoder'} {format_count(arch.total_params)} params, "
        f"{arch.num_layers} layers, vocab {arch.vocab_size}, max positions {arch.max_position_embeddings}",
    )


def train_setup(cfg: SteadytuneConfig) -> tuple[TrainSetup | None, Check | None]:
    """The estimator's view of the config; an ``auto`` micro-batch is estimated at 1."""
    auto = not isinstance(cfg.train.per_device_train_batch_size, int)
    try:
        _, setup = setup_from_config_dict(
            cfg.model_dump(), batch=1 if auto else None, gpus=cfg.run.nproc_per_node
        )
    except SetupError as exc:
        return None, na("memory", "estimate", str(exc), "fix the config values it names")
    return setup, None


def model_file_bytes(
    cfg: SteadytuneConfig, patterns: tuple[str, ...] = ("*.safetensors", "*.bin")
) -> int | None:
    folder = Path(cfg.model.name_or_path).expanduser()
    if not folder.is_dir():
        return None
    files = [f for pattern in patterns for f in folder.glob(pattern)]
    return sum(f.stat().st_size for f in files) or None


# Every HF Trainer checkpoint carries a copy of the tokenizer (17 MiB for Llama 3's tokenizer.json).
TOKENIZER_FILES = (
    "tokenizer*.json",
    "tokenizer.model",
    "special_tokens_map.json",
    "vocab.*",
    "merges.txt",
    "chat_template.jinja",
)


def version_report(cfg: SteadytuneConfig, facts: HostFacts) -> list[Check]:
    installed = v.installed_versions()
    extra = (
        v.installed_versions(("flash_attn", "flash-attn"))
        if cfg.model.attn_implementation == "flash_attention_2"
        else {}
    )
    if extra:
        extra = {"flash_attn": extra.get("flash_attn") or extra.get("flash-attn")}
    return v.version_checks(
        cfg.method,
        cfg.model.attn_implementation,
        installed,
        facts.driver,
        v.torch_cuda_build(),
        v.transformers_minimums(),
        v.declared_conflicts(),
        extra,
    )


def issue_checks(issues: Sequence[ConfigIssue]) -> list[Check]:
    """Config problems found by the loader's cross-key checks (missing files, save_steps past the end,
    ...)."""
    return [
        fail("config", "config_" + i.key.replace(".", "_"), f"{i.key}: {i.problem} (got {i.value!r})", i.fix)
        for i in issues
    ]


def run_preflight(
    cfg: SteadytuneConfig,
    *,
    config_path: str | None = None,
    config_issues: Sequence[ConfigIssue] = (),
    facts: HostFacts | None = None,
    headroom: int = DEFAULT_HEADROOM_BYTES,
    device_memory: int | None = None,
    scan: bool = True,
    tokenizer_loader: Callable[[str, bool], Any] | None = load_tokenizer,
    env: dict[str, str] | None = None,
    scan_cache: Path | None = None,
) -> PreflightReport:
    """Check a run before it starts.

    Args:
        cfg: the validated config (paths absolute).
        config_path: shown in the report.
        config_issues: cross-key problems the loader found; each becomes a failed check.
        facts: the host; probed when None.
        headroom: memory kept free on every device on top of the estimate.
        device_memory: plan for GPUs with this much free memory instead of this host's.
        scan: whether to scan the dataset.
        tokenizer_loader: loads the model's tokenizer; None skips the token-level data checks.
        env: environment for ``CUDA_VISIBLE_DEVICES`` (os.environ when None).
        scan_cache: a folder where the dataset scan's answer is kept and reused while none of
            its inputs changed (:mod:`steadytune.preflight.scancache`); None scans every time.

    Returns:
        Every check, the recommendation and the verdict.
    """
    checks: list[Check] = issue_checks(config_issues)
    arch, arch_check = model_architecture(cfg)
    checks.append(arch_check)
    setup, setup_problem = train_setup(cfg)
    if setup_problem is not None:
        checks.append(setup_problem)
    facts = facts if facts is not None else probe_host(preflight_paths(cfg))
    device = pick_device(cfg.train.use_cpu, facts, device_memory)
    if setup is not None:
        setup = dataclasses.replace(setup, device=device)  # a CPU peak has no CUDA context
    visible = facts.visible_gpus(env)
    nproc = cfg.run.nproc_per_node
    data = _data_scan(cfg, arch, scan, scan_cache, tokenizer_loader)

    recommendation: Recommendation | None = None
    if arch is not None and setup is not None:
        sizing, recommendation = _sizing_checks(
            cfg, arch, setup, facts, device, headroom, device_memory, visible, data.cache_need_bytes
        )
        checks += sizing
    else:
        checks.append(na("memory", "device_memory", "no estimate without the model's config.json"))
    checks.append(gpu_process_check(facts, device, visible, nproc))
    checks += writable_checks(facts)
    checks += version_report(cfg, facts)
    checks.append(environment_check(cfg))  # vs env.json of the last completed run of this config
    checks.append(checkpoint_interval_check(cfg))  # save_steps against Young/Daly, from earlier runs
    fits = recommendation.per_device_train_batch_size if recommendation else None
    lints = config_lints(cfg, arch, data.samples, fits)
    # A save_steps problem the loader already reported is not reported twice.
    reported = {c.name for c in checks}
    checks += [c for c in lints if not (c.name == "save_steps" and "config_train_save_steps" in reported)]
    checks += data.checks
    if recommendation is not None and recommendation.peak_bytes is not None:
        recommendation = _with_estimate_note(recommendation)
    return PreflightReport(tuple(checks), recommendation, device, config_path)


def _data_scan(
    cfg: SteadytuneConfig,
    arch: Architecture | None,
    scan: bool,
    scan_cache: Path | None,
    tokenizer_loader: Callable[[str, bool], Any] | None,
) -> DataScan:
    """The dataset scan: none, the kept answer while its inputs are unchanged, or a fresh one."""
    if not scan:
        return DataScan()
    if scan_cache is not None and tokenizer_loader is not None:
        from steadytune.preflight.scancache import cached_scan, scan_key

        key = scan_key(cfg.data.model_dump(mode="json"), cfg.model.model_dump(mode="json"))
        data, _ = cached_scan(key, scan_cache, lambda: scan_data(cfg, arch, tokenizer_loader))
        return data
    return scan_data(cfg, arch, tokenizer_loader)


def _sizing_checks(
    cfg: SteadytuneConfig,
    arch: Architecture,
    setup: TrainSetup,
    facts: HostFacts,
    device: str,
    headroom: int,
    device_memory: int | None,
    visible: tuple[GpuInfo, ...],
    cache_need_bytes: int,
) -> tuple[list[Check], Recommendation]:
    """Device memory, RAM and disk against the estimate, and the micro-batch that fits the device."""
    nproc = cfg.run.nproc_per_node
    mem, budget = memory_check(arch, setup, facts, device, nproc, headroom, device_memory, visible)
    t = cfg.train
    if isinstance(t.per_device_train_batch_size, int):
        effective = t.per_device_train_batch_size * t.gradient_accumulation_steps
    else:
        effective = auto_effective_batch(
            arch, setup, budget.bytes, t.auto_effective_batch, t.gradient_accumulation_steps
        )
    recommendation = recommend(arch, setup, budget.bytes, effective)
    ram = ram_check(arch, setup, facts, device, nproc, model_file_bytes(cfg))
    ckpt = checkpoint_bytes(arch, setup, cfg.model.dtype) + (model_file_bytes(cfg, TOKENIZER_FILES) or 0)
    need = disk_needs(
        ckpt,
        cfg.run.keep_last,
        final_model_bytes(arch, setup, cfg.model.dtype),
        cfg.run.min_free_disk_bytes,
    )
    disk = disk_check(facts, need, cache_need_bytes, ckpt, cfg.run.keep_last)
    return [mem, ram, disk], recommendation


def _with_estimate_note(rec: Recommendation) -> Recommendation:
    note = (
        f"estimated peak {format_bytes(rec.peak_bytes or 0)} of {format_bytes(rec.budget_bytes or 0)} usable"
    )
    return dataclasses.replace(rec, notes=(*rec.notes, note))

"""The run configuration: pydantic models whose keys follow HF and PEFT names.

Every section forbids unknown keys, so a typo is an error with a suggestion,
never a silently ignored setting. Field descriptions double as the "fix" text of
validation errors, so keep them short and concrete.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import ClassVar, Literal

from pydantic import ConfigDict, Field, ValidationInfo, field_validator, model_validator

from steadytune.config.alerts import AlertsConfig
from steadytune.config.dashboard import DashboardConfig
from steadytune.config.detect import DetectConfig
from steadytune.config.numbers import NoBoolNumbers
from steadytune.config.policy import PolicyConfig
from steadytune.config.scale import ScaleConfig
from steadytune.rundir import DEFAULT_SEGMENT_BYTES, MIN_SEGMENT_BYTES


class Section(NoBoolNumbers):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


def _regex_problem(pattern: str) -> str | None:
    try:
        re.compile(pattern)
    except re.error as exc:
        return f"{pattern!r} is not a valid regular expression ({exc})"
    return None


def _check_regex(pattern: str) -> str:
    problem = _regex_problem(pattern)
    if problem:
        raise ValueError(problem)
    return pattern


def _check_patterns(v: Mapping[str, float], what: str, low: float, high: float) -> None:
    """Every bad key and value of a rank/alpha pattern, in one message."""
    problems = [p for key in v if (p := _regex_problem(key))]
    problems += [
        f"{what} {x:g} for {key!r} is outside {low:g}..{high:g}"
        for key, x in v.items()
        if not low <= x <= high
    ]
    if problems:
        raise ValueError("; ".join(problems))


class ModelConfig(Section):
    name_or_path: str = Field(description="a local model folder (config.json + weights) or a hub id")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "float32", description="one of auto, float32, bfloat16, float16"
    )
    attn_implementation: Literal["sdpa", "eager", "flash_attention_2"] = Field(
        "sdpa", description="one of sdpa, eager, flash_attention_2"
    )
    trust_remote_code: bool = Field(False, description="true or false")


class LoraConfig(Section):
    r: int = Field(16, ge=1, le=1024, description="the LoRA rank, an integer such as 8, 16 or 64")
    lora_alpha: float = Field(32, gt=0, description="a positive number, usually 2 x r")
    lora_dropout: float = Field(0.05, ge=0, lt=1, description="a number in [0, 1), such as 0.05")
    target_modules: list[str] | Literal["all-linear"] = Field(
        "all-linear", description='a list of module names such as [q_proj, v_proj], or "all-linear"'
    )
    bias: Literal["none", "all", "lora_only"] = Field("none", description="one of none, all, lora_only")
    # PEFT's names and matching: the first key whose regex ends a module's name wins (docs/config.md).
    rank_pattern: dict[str, int] = Field(
        default_factory=dict,
        description="a mapping of module-name regex to rank, e.g. {'layers\\.(0|1)\\.': 8, 'o_proj': 32}",
    )
    alpha_pattern: dict[str, float] = Field(
        default_factory=dict,
        description="a mapping of module-name regex to lora_alpha, e.g. {'o_proj': 64}",
    )

    @field_validator("rank_pattern")
    @classmethod
    def _ranks(cls, v: dict[str, int]) -> dict[str, int]:
        _check_patterns(v, "rank", 1, 1024)
        return v

    @field_validator("alpha_pattern")
    @classmethod
    def _alphas(cls, v: dict[str, float]) -> dict[str, float]:
        _check_patterns(v, "lora_alpha", 1e-6, 1e6)
        return v


class QuantizationConfig(Section):
    bnb_4bit_quant_type: Literal["nf4", "fp4"] = Field("nf4", description="nf4 or fp4")
    bnb_4bit_use_double_quant: bool = Field(True, description="true or false")
    bnb_4bit_compute_dtype: Literal["float32", "bfloat16", "float16"] = Field(
        "float32", description="float32, bfloat16 or float16"
    )


QUANT_CANDIDATES = ("int8", "nf4", "fp4", "fp8")


class QuantCheckConfig(Section):
    """``quant-check``: which quantized bases to try against the reference, and the go/no-go limits.

    The defaults and their sources are in docs/quant.md.
    """

    candidates: list[str] = Field(
        default_factory=lambda: ["int8", "nf4", "fp8"],
        min_length=1,
        description="a list of int8, nf4, fp4 (bitsandbytes) and fp8 (torchao, GPUs with compute "
        "capability >= 8.9)",
    )
    max_positions: int = Field(
        2048,
        ge=16,
        le=10_000_000,
        description="the most eval tokens (next-token positions) to score, an integer such as 2048 (>= 16)",
    )
    batch_size: int = Field(8, ge=1, le=4096, description="sequences per forward pass, e.g. 8")
    max_ppl_change: float = Field(
        0.02, ge=0, le=10, description="the largest relative perplexity rise that passes, e.g. 0.02 for 2%"
    )
    max_mean_kl: float = Field(
        0.05,
        ge=0,
        le=100,
        description="the largest mean per-token KL(reference || candidate) in nats, e.g. 0.05",
    )
    max_p99_kl: float = Field(
        0.5, ge=0, le=100, description="the largest 99th-percentile per-token KL in nats, e.g. 0.5"
    )
    min_top1: float = Field(
        0.90, ge=0, le=1, description="the smallest share of tokens whose top-1 prediction matches, e.g. 0.9"
    )

    @field_validator("candidates")
    @classmethod
    def _known_once(cls, v: list[str]) -> list[str]:
        unknown = [c for c in v if c not in QUANT_CANDIDATES]
        if unknown:
            raise ValueError(
                f"unknown candidate {', '.join(map(repr, unknown))}; choose from "
                f"{', '.join(QUANT_CANDIDATES)}"
            )
        twice = sorted({c for c in v if v.count(c) > 1})
        if twice:
            raise ValueError(f"{', '.join(twice)} listed more than once; list each candidate once")
        return v


class DataConfig(Section):
    train_file: str = Field(description="path to a .jsonl, .json, .csv or .parquet file")
    eval_file: str | None = Field(None, description="path to an eval split, or leave it out")
    format: Literal["auto", "text", "instruction", "messages"] = Field(
        "auto", description="auto, text, instruction (instruction/input/output) or messages (chat)"
    )
    text_field: str = Field("text", description="the column that holds the text for the text format")
    max_seq_length: int = Field(512, ge=8, le=1_048_576, description="an integer such as 512 or 2048")
    train_on_prompt: bool = Field(False, description="true to compute the loss on the prompt too")
    max_samples: int | None = Field(None, ge=1, description="a positive integer, or leave it out")


class LrGroupConfig(Section):
    """One optimizer parameter group: the parameters whose name matches, at a scaled LR."""

    match: str = Field(
        description="a regex searched in parameter names, e.g. 'self_attn' or 'layers\\.[0-3]\\.'"
    )
    lr_scale: float = Field(gt=0, le=1000, description="a positive multiplier of learning_rate, e.g. 0.5")
    name: str | None = Field(
        None,
        pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$",
        description="a short label for logs and the plan (letters, digits, '_', '.', '-'); defaults to match",
    )

    @field_validator("match")
    @classmethod
    def _regex(cls, v: str) -> str:
        return _check_regex(v)

    @property
    def label(self) -> str:
        return self.name or self.match


class TrainConfig(Section):
    """Keys and meanings of HF ``TrainingArguments``: the ones below, not all of them."""

    # TrainingArguments names people write that the run does not take, each with what to write
    # instead: the "unknown key" error says it (config/load.py).
    instead: ClassVar[dict[str, str]] = {
        "warmup_ratio": "warmup_steps, a number of steps (a ratio r is r x max_steps steps)",
    }

    learning_rate: float = Field(2e-4, gt=0, le=10, description="a positive number such as 2e-4")
    per_device_train_batch_size: int | Literal["auto"] = Field(
        4, description='a positive integer, or "auto" to find the largest that fits'
    )
    gradient_accumulation_steps: int = Field(1, ge=1, description="a positive integer")
    max_steps: int = Field(-1, ge=-1, description="a positive integer, or -1 to train num_train_epochs")
    num_train_epochs: float = Field(1.0, gt=0, description="a positive number")
    save_steps: int = Field(50, ge=1, description="a positive integer: save a checkpoint every N steps")
    eval_steps: int | None = Field(None, ge=1, description="a positive integer, or leave it out")
    logging_steps: int = Field(1, ge=1, description="a positive integer")
    warmup_steps: int = Field(0, ge=0, description="a non-negative integer")
    lr_scheduler_type: Literal[
        "linear", "cosine", "constant", "constant_with_warmup", "cosine_with_restarts", "polynomial"
    ] = Field("linear", description="linear, cosine, constant, constant_with_warmup, ...")
    weight_decay: float = Field(0.0, ge=0, description="a non-negative number such as 0.01")
    max_grad_norm: float = Field(1.0, ge=0, description="a non-negative number; 0 turns clipping off")
    optim: str = Field("adamw_torch", description="an HF optimizer name such as adamw_torch")
    # Per-group LRs (docs/config.md): all factors multiply, and a rollback's LR scale multiplies them all.
    lr_groups: list[LrGroupConfig] = Field(
        default_factory=list,
        description="a list of {match: REGEX, lr_scale: X}; the first entry that matches a parameter wins",
    )
    loraplus_lr_ratio: float | None = Field(
        None,
        gt=0,
        le=1000,
        description="LoRA+: the LR multiplier of the LoRA B matrices, e.g. 16; leave it out for plain LoRA",
    )
    layer_decay: float | None = Field(
        None,
        gt=0,
        le=1,
        description="layer-wise LR decay in (0, 1], e.g. 0.9: layer i of L trains at LR x decay^(L-1-i)",
    )
    seed: int = Field(42, description="an integer")
    bf16: bool = Field(False, description="true or false")
    fp16: bool = Field(False, description="true or false")
    gradient_checkpointing: bool = Field(False, description="true or false")
    dataloader_num_workers: int = Field(0, ge=0, description="a non-negative integer")
    use_cpu: bool | None = Field(None, description="true, false, or leave it out to decide from the machine")
    # per_device_train_batch_size: auto (docs/preflight.md).
    auto_effective_batch: int | None = Field(
        None,
        ge=1,
        description="the effective batch (micro-batch x accumulation) that auto keeps, e.g. 32; "
        "leave it out to use the estimate's largest micro-batch x gradient_accumulation_steps",
    )
    memory_cap_bytes: int | None = Field(
        None,
        ge=1,
        description="the memory auto may use per device, e.g. 2GiB (env STEADYTUNE_MEMORY_CAP); "
        "leave it out to use free device memory",
    )

    @field_validator("memory_cap_bytes", mode="before")
    @classmethod
    def _bytes(cls, v: object) -> object:
        if isinstance(v, str):
            from steadytune.units import parse_bytes

            return parse_bytes(v)
        return v

    @field_validator("per_device_train_batch_size")
    @classmethod
    def _positive_batch(cls, v: int | str) -> int | str:
        if isinstance(v, int) and v < 1:
            raise ValueError("must be at least 1")
        return v

    @field_validator("lr_groups")
    @classmethod
    def _unique_groups(cls, v: list[LrGroupConfig]) -> list[LrGroupConfig]:
        labels = [g.label for g in v]
        # 'default' holds what no entry matches, and '<label>.lora_B' is each group's LoRA+ half.
        reserved = {"default", *(f"{label}.lora_B" for label in labels)}
        for i, label in enumerate(labels):
            if label in labels[:i]:
                raise ValueError(f"two groups are labelled {label!r}; give each a distinct name")
            if label in reserved:
                raise ValueError(f"the label {label!r} is reserved; give the group another name")
        return v


class RunConfig(Section):
    runs_dir: str = Field("runs", description="the folder that holds run directories")
    name: str | None = Field(
        None,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$",
        description="letters, digits, '.', '_' and '-' only",
    )
    nproc_per_node: int = Field(1, ge=1, le=64, description="processes per node; >1 launches torchrun")
    engine: Literal["native", "ray"] = Field(
        "native",
        description="native (steadytune's own worker, torchrun for nproc_per_node>1) or ray "
        "(Ray Train on an existing cluster: the `ray:` section, `pip install steadytune[ray]`)",
    )
    max_restarts: int = Field(3, ge=0, le=100, description="a non-negative integer")
    restart_backoff_s: float = Field(
        1.0, ge=0, description="seconds before the first restart; doubles each time"
    )
    restart_backoff_max_s: float = Field(
        60.0, ge=0, description="the longest wait between restarts, in seconds"
    )
    keep_last: int = Field(3, ge=1, description="how many recent checkpoints to keep (LAST_GOOD is kept too)")
    min_free_disk_bytes: int = Field(
        256 * 1024**2, ge=0, description="refuse to save a checkpoint with less free disk than this"
    )
    good_window_steps: int = Field(
        10, ge=0, description="healthy steps after a checkpoint before it becomes LAST_GOOD"
    )
    sample_interval_s: float = Field(2.0, gt=0, description="seconds between system samples")
    poll_s: float = Field(
        0.2,
        ge=0.01,
        le=5.0,
        description="seconds between the supervisor's looks at the run's streams (0.01 to 5): how soon a "
        "step's trouble is acted on; each look costs the supervisor a few ms of CPU",
    )
    telemetry_segment_bytes: int = Field(
        DEFAULT_SEGMENT_BYTES,
        description=f"a size in bytes of at least {MIN_SEGMENT_BYTES} (such as {DEFAULT_SEGMENT_BYTES}, "
        "64 MiB) past which a telemetry stream is rotated into a compressed segment, or 0 to never rotate",
    )

    compact_index_bytes: int = Field(
        256 * 1024**2,
        ge=0,
        description="a size in bytes (such as 268435456, 256 MiB: a run of about a million steps) past "
        "which the run's index (run.db) is compacted when the run completes, as `steadytune compact` does, "
        "or 0 to keep every raw row",
    )

    @field_validator("telemetry_segment_bytes")
    @classmethod
    def _segment_size(cls, v: int) -> int:
        if v != 0 and v < MIN_SEGMENT_BYTES:
            raise ValueError(
                f"{v} bytes would rotate the telemetry every few steps (the least is {MIN_SEGMENT_BYTES})"
            )
        return v


class RecoverConfig(Section):
    """How a rollback is carried out (docs/recovery.md)."""

    in_process_rollback: bool = Field(
        True,
        description="true: a rollback of a healthy single-process worker reloads the checkpoint inside it; "
        "false: every rollback restarts the worker process",
    )
    in_process_ack_timeout_s: float = Field(
        60.0,
        gt=0,
        description="seconds the worker has to take an in-process rollback before it is restarted instead",
    )
    publish_wait_s: float = Field(
        60.0,
        ge=0,
        description="seconds a rollback waits for the checkpoint it would go back to while that "
        "checkpoint is still being published (fsync, hash, manifest); past it, or when the publish fails, "
        "it goes back to the newest verified one; 0: never wait",
    )
    standby_worker: bool = Field(
        True,
        description="true: a single-process run keeps a spare worker, imported and waiting, for the next "
        "attempt after a crash or a kill, and `run` starts the first attempt's worker during its preflight; "
        "false: every attempt starts a new process",
    )


class RayConfig(Section):
    """Where and how a ``run.engine: ray`` job runs (docs/ray.md)."""

    address: str | None = Field(
        None,
        description="the Ray cluster to join, e.g. 'auto' or 'ray://head:10001'; unset: $RAY_ADDRESS, "
        "else 'auto'",
    )
    num_workers: int | tuple[int, int] = Field(
        1,
        description="a worker count (e.g. 4) or [min, max] for elastic training (e.g. [2, 8]); min >= 1, "
        "min <= max",
    )
    use_gpu: bool = Field(False, description="true: each worker gets one GPU")
    resources_per_worker: dict[str, float] = Field(
        default_factory=dict,
        description="Ray resources per worker, e.g. {CPU: 4, GPU: 1}; empty: Ray's default (1 CPU, 1 GPU "
        "with use_gpu)",
    )
    max_failures: int = Field(
        3,
        ge=-1,
        le=1000,
        description="an integer >= -1: the worker-group restarts Ray makes on its own in one attempt "
        "(-1: no limit)",
    )
    storage_path: str | None = Field(
        None,
        description="where Ray keeps its run state (a path every node reaches, or s3://...); unset: <run "
        "dir>/ray",
    )
    keep_effective_batch: bool = Field(
        True,
        description="true: train.gradient_accumulation_steps is the accumulation at the most workers, and a "
        "smaller group accumulates more, so the effective batch stays the same; false: it is per group",
    )
    elastic_resize_monitor_interval_s: float = Field(
        60.0, gt=0, description="seconds between Ray's checks for room to grow an elastic run"
    )

    @field_validator("num_workers")
    @classmethod
    def _workers(cls, v: int | tuple[int, int]) -> int | tuple[int, int]:
        low, high = (v, v) if isinstance(v, int) else v
        if low < 1 or high < low:
            raise ValueError(
                f"{list(v) if isinstance(v, tuple) else v} is not a worker count: give n >= 1, or [min, max] "
                "with 1 <= min <= max"
            )
        return v

    @property
    def min_workers(self) -> int:
        return self.num_workers if isinstance(self.num_workers, int) else self.num_workers[0]

    @property
    def max_workers(self) -> int:
        return self.num_workers if isinstance(self.num_workers, int) else self.num_workers[1]


class SteadytuneConfig(Section):
    model: ModelConfig
    method: Literal["full", "lora", "qlora"] = Field("lora", description="full, lora or qlora")
    lora: LoraConfig = Field(default_factory=LoraConfig)
    quantization: QuantizationConfig = Field(default_factory=QuantizationConfig)
    data: DataConfig
    quant: QuantCheckConfig = Field(
        default_factory=QuantCheckConfig, description="quant-check candidates and limits (docs/quant.md)"
    )
    train: TrainConfig = Field(default_factory=TrainConfig)
    run: RunConfig = Field(default_factory=RunConfig)
    recover: RecoverConfig = Field(
        default_factory=RecoverConfig, description="how rollbacks are carried out (docs/recovery.md)"
    )
    ray: RayConfig = Field(
        default_factory=RayConfig,
        description="the Ray cluster and worker group of run.engine: ray (docs/ray.md)",
    )
    detect: DetectConfig = Field(
        default_factory=DetectConfig, description="detector thresholds (docs/detectors.md)"
    )
    policy: PolicyConfig = Field(
        default_factory=PolicyConfig, description="per-anomaly actions and budgets (docs/recovery.md)"
    )
    alerts: AlertsConfig = Field(default_factory=AlertsConfig, description="alert sinks (docs/alerts.md)")
    dashboard: DashboardConfig = Field(
        default_factory=DashboardConfig, description="dashboard settings (docs/dashboard.md)"
    )
    scale: ScaleConfig | None = Field(
        None, description="autoscaling rules (docs/server.md), e.g. {min_gpus: 1, max_gpus: 4}; leave it out"
    )

    @field_validator("scale")
    @classmethod
    def _starts_in_scale_range(cls, v: ScaleConfig | None, info: ValidationInfo) -> ScaleConfig | None:
        run = info.data.get("run")
        n = run.nproc_per_node if run is not None else 1
        if run is not None and run.engine == "ray":
            return v  # Ray's group starts at whatever size fits ray.num_workers (checked in _engine)
        if v is not None and not v.min_gpus <= n <= v.max_gpus:
            raise ValueError(
                f"run.nproc_per_node={n} is outside scale.min_gpus..scale.max_gpus "
                f"({v.min_gpus}..{v.max_gpus}): "
                "start the run inside the range, or widen it"
            )
        return v

    @model_validator(mode="after")
    def _engine(self) -> SteadytuneConfig:
        if self.run.engine == "ray" and self.run.nproc_per_node > 1:
            # Ray places the processes: one Ray worker per training process, on whichever node has room.
            raise ValueError(
                f"run.nproc_per_node={self.run.nproc_per_node} with run.engine: ray; Ray starts the "
                f"processes: "
                f"set ray.num_workers: {self.run.nproc_per_node} and leave run.nproc_per_node at 1"
            )
        if self.run.engine == "ray" and self.scale is not None:
            self._ray_scale(self.scale, self.ray)
        return self

    @staticmethod
    def _ray_scale(scale: ScaleConfig, ray: RayConfig) -> None:
        """With Ray the rules ask Ray for workers within ray.num_workers: the one range of the job."""
        if isinstance(ray.num_workers, int):
            raise ValueError(
                f"scale: with a fixed ray.num_workers={ray.num_workers}; the rules request workers from "
                "Ray within an elastic range: give ray.num_workers: [min, max] (e.g. [1, 4]), or drop scale:"
            )
        low, high = ray.num_workers
        given = scale.model_fields_set & {"min_gpus", "max_gpus"}
        if given and (scale.min_gpus, scale.max_gpus) != (low, high):
            raise ValueError(
                f"scale.min_gpus={scale.min_gpus}, scale.max_gpus={scale.max_gpus} with run.engine: ray and "
                f"ray.num_workers: [{low}, {high}]; with Ray the range is ray.num_workers': leave "
                "scale.min_gpus and scale.max_gpus out (or set them to the same numbers)"
            )
        if not given:  # the range is filled in, so the run directory's copy of the config says it
            scale.max_gpus, scale.min_gpus = high, low
        if scale.cpu_bound is not None:
            # more_workers relaunches the run with more dataloader workers; the CPU reading is this host's,
            # not the Ray nodes' that feed the training.
            raise ValueError(
                "scale.cpu_bound with run.engine: ray; the CPU reading is the supervisor's host's, not "
                "the Ray nodes': drop scale.cpu_bound and set train.dataloader_num_workers"
            )

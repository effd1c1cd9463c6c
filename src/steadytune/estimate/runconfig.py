"""Read the keys of a steadytune run config that the estimator needs, leniently.

The config package owns validation of run configs; this module only maps the handful of
keys that decide memory onto a :class:`TrainSetup`, ignores everything else and reports
every key it cannot read at once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from steadytune.estimate.setup import SetupError, TrainSetup, normalize_dtype

# HF ``TrainingArguments.optim`` names, mapped to what the estimator distinguishes.
OPTIM_NAMES: dict[str, str] = {
    "adamw": "adamw",
    "adamw_torch": "adamw",
    "adamw_torch_fused": "adamw",
    "adamw_hf": "adamw",
    "adamw_apex_fused": "adamw",
    "adam": "adamw",
    "adamw8bit": "adamw8bit",
    "adamw_8bit": "adamw8bit",
    "adamw_bnb_8bit": "adamw8bit",
    "paged_adamw_8bit": "adamw8bit",
    "adamw_torch_8bit": "adamw8bit",
    "sgd": "sgd",
    "adafactor": "adafactor",
}

ATTN_NAMES: dict[str, str] = {
    "sdpa": "sdpa",
    "eager": "eager",
    "flash": "flash",
    "flash_attention_2": "flash",
    "flash_attention_3": "flash",
}


def _section(d: dict[str, Any], key: str) -> dict[str, Any]:
    value = d.get(key)
    return value if isinstance(value, dict) else {}


def _shape_fields(
    config: dict[str, Any], lora: dict[str, Any], data: dict[str, Any], train: dict[str, Any]
) -> dict[str, Any]:
    """What trains, and in what shape: the method, the adapters, the sequence, the batch."""
    fields: dict[str, Any] = {}
    if config.get("method") is not None:
        fields["method"] = str(config["method"]).lower()
    if lora.get("r") is not None:
        fields["lora_r"] = lora["r"]
    pattern = lora.get("rank_pattern")
    if isinstance(pattern, dict) and pattern:
        fields["lora_rank_pattern"] = tuple((str(k), v) for k, v in pattern.items())
    if lora.get("lora_dropout") is not None:
        fields["lora_dropout"] = float(lora["lora_dropout"])
    targets = lora.get("target_modules")
    if isinstance(targets, str):
        fields["target_modules"] = (targets,)
    elif isinstance(targets, (list, tuple)):
        fields["target_modules"] = tuple(str(t) for t in targets)
    if data.get("max_seq_length") is not None:
        fields["seq"] = data["max_seq_length"]
    if train.get("per_device_train_batch_size") is not None:
        # "auto" is decided at start (train/autobatch.py); estimate one sample, the smallest it can pick.
        b = train["per_device_train_batch_size"]
        fields["batch"] = 1 if b == "auto" else b
    if train.get("gradient_accumulation_steps") is not None:
        fields["gradient_accumulation_steps"] = train["gradient_accumulation_steps"]
    if train.get("gradient_checkpointing") is not None:
        fields["gradient_checkpointing"] = bool(train["gradient_checkpointing"])
    return fields


def _precision_fields(model: dict[str, Any], train: dict[str, Any], problems: list[str]) -> dict[str, Any]:
    """The dtypes: the one the base is loaded in, and the one it computes in (autocast or "pure")."""
    fields: dict[str, Any] = {}
    model_dtype = model.get("dtype", model.get("torch_dtype"))
    if model_dtype is not None and str(model_dtype) != "auto":
        try:
            fields["weights_dtype"] = normalize_dtype(str(model_dtype))
        except SetupError as exc:
            problems.append(f"model.dtype: {exc}")
    if train.get("bf16"):
        fields.update(dtype="bf16", mixed_precision=True)
    elif train.get("fp16"):
        fields.update(dtype="fp16", mixed_precision=True)
    elif "weights_dtype" in fields:
        # No autocast: the model computes in the dtype it was loaded in ("pure" precision).
        fields.update(dtype=fields["weights_dtype"], mixed_precision=False)
    elif train.get("bf16") is not None or train.get("fp16") is not None:
        fields.update(dtype="fp32", mixed_precision=False)
    return fields


def setup_from_config_dict(config: dict[str, Any], **overrides: Any) -> tuple[str | None, TrainSetup]:
    """Map a run config dict onto ``(model path, TrainSetup)``.

    Reads ``model.name_or_path``, ``method``, ``lora.{r, rank_pattern, target_modules, lora_dropout}``,
    ``data.max_seq_length``, ``train.{per_device_train_batch_size, gradient_checkpointing,
    bf16, fp16, optim, gradient_accumulation_steps}`` and, when present, ``model.dtype``
    (or ``torch_dtype``) and ``model.attn_implementation``. Missing keys take the
    :class:`TrainSetup` defaults; other keys are ignored.

    Args:
        config: the parsed YAML.
        **overrides: TrainSetup fields that win over the config (CLI flags).

    Returns:
        The model path (None when the config names none) and the setup.

    Raises:
        SetupError: values that cannot be read; the message lists all of them.
    """
    model = _section(config, "model")
    lora = _section(config, "lora")
    data = _section(config, "data")
    train = _section(config, "train")
    problems: list[str] = []
    fields: dict[str, Any] = {}

    fields.update(_shape_fields(config, lora, data, train))
    fields.update(_precision_fields(model, train, problems))
    optim = train.get("optim")
    if optim is not None:
        name = str(optim).lower()
        if name in OPTIM_NAMES:
            fields["optimizer"] = OPTIM_NAMES[name]
        else:
            problems.append(
                f"train.optim={optim!r} is not known to the estimator; use one of "
                f"{', '.join(sorted(OPTIM_NAMES))}"
            )
    attn = model.get("attn_implementation")
    if attn is not None:
        if str(attn) in ATTN_NAMES:
            fields["attn"] = ATTN_NAMES[str(attn)]
        else:
            problems.append(f"model.attn_implementation={attn!r} is not one of {', '.join(ATTN_NAMES)}")

    fields.update({k: v for k, v in overrides.items() if v is not None})
    if problems:
        raise SetupError("cannot read the run config: " + "; ".join(problems))
    path = model.get("name_or_path")
    return (str(path) if path is not None else None), TrainSetup(**fields)


def load_run_config(path: str | Path) -> dict[str, Any]:
    """Parse a YAML run config into a dict.

    Raises:
        SetupError: the file is missing or is not a YAML mapping.
    """
    import yaml

    from steadytune.config.yamlsafe import read_yaml

    p = Path(path)
    try:
        data = read_yaml(p)
    except FileNotFoundError as exc:
        raise SetupError(f"config file {str(path)!r} does not exist") from exc
    except (OSError, yaml.YAMLError) as exc:
        raise SetupError(f"cannot read {str(path)!r} as YAML: {exc}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise SetupError(f"{str(path)!r} must hold a YAML mapping at the top level")
    return data

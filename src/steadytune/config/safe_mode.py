"""``--safe-mode``: a preset for a first run on new data or a new model.

It turns on, unless the config file set the key itself:

- gradient clipping at 1.0 (``train.max_grad_norm``);
- the NaN/Inf guard (always on; listed for completeness);
- checkpoints every 10 minutes of wall time at most (``policy.checkpoint_every_s: 600``),
  on top of ``save_steps``, so a crash never loses more than ~10 minutes;
- rollback on the first confirmed loss spike (``policy.spike_confirm_points: 2``);
- a learning-rate check that refuses LRs far above the method's usual range
  (``policy.max_lr``: 1e-3 for full fine-tuning, 5e-3 for LoRA/QLoRA).
"""

from __future__ import annotations

from steadytune.config.load import ConfigError, ConfigIssue
from steadytune.config.schema import SteadytuneConfig

# 10x above the top of the usual range for each method.
MAX_LR = {"full": 1e-3, "lora": 5e-3, "qlora": 5e-3}
USUAL_LR = {"full": "1e-5 to 1e-4", "lora": "1e-4 to 5e-4", "qlora": "1e-4 to 5e-4"}


def _unset(section: object, key: str) -> bool:
    return key not in getattr(section, "model_fields_set", set())


def safe_mode(cfg: SteadytuneConfig) -> SteadytuneConfig:
    train, policy = cfg.train, cfg.policy
    t_upd, p_upd = {}, {}
    if _unset(train, "max_grad_norm") or train.max_grad_norm == 0:
        t_upd["max_grad_norm"] = 1.0
    if _unset(policy, "checkpoint_every_s"):
        p_upd["checkpoint_every_s"] = 600.0
    if _unset(policy, "spike_confirm_points"):
        p_upd["spike_confirm_points"] = 2
    if _unset(policy, "max_lr"):
        p_upd["max_lr"] = MAX_LR[cfg.method]
    return cfg.model_copy(
        update={"train": train.model_copy(update=t_upd), "policy": policy.model_copy(update=p_upd)}
    )


def check_lr(cfg: SteadytuneConfig) -> None:
    """Refuse a learning rate above ``policy.max_lr`` with a message that names the fix."""
    limit = cfg.policy.max_lr
    lr = cfg.train.learning_rate
    if limit is not None and lr > limit:
        raise ConfigError(
            [
                ConfigIssue(
                    "train.learning_rate",
                    lr,
                    f"far above the usual range for {cfg.method} ({USUAL_LR[cfg.method]}); the limit is "
                    f"policy.max_lr={limit:g}",
                    "lower the learning rate, or raise policy.max_lr if you mean it",
                )
            ],
            "safe mode",
        )

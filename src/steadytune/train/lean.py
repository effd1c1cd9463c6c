"""Optional packages a run's config does not use, kept out of the worker's interpreter.

``transformers`` imports every optional integration it finds installed: ``peft`` when it is
there (and ``peft`` pulls ``bitsandbytes``, which imports ``torch._inductor``), ``torchao``
for its quantizers. On the demo that is about half of the worker's start-up, and a restart
after a crash or a kill pays it again. A full fine-tune with a torch optimizer uses none of
them, so the worker hides them before ``transformers`` is first imported: the standard
``sys.modules[name] = None`` marker, which ``importlib.util.find_spec`` reports as "not
installed" and ``import`` refuses with an ``ImportError``. transformers then takes the same
paths it takes where they are not installed, which for such a run are the paths it trains on
anyway (its checks only ask whether a model is a PEFT model or quantized).

What a config needs, it keeps: ``peft`` for LoRA and QLoRA (and for a base model folder with an
adapter in it, which transformers loads through ``peft``), ``bitsandbytes`` for QLoRA, and both
``bitsandbytes`` and ``torchao`` for any optimizer that is not one of torch's own (the 8-bit,
paged and low-bit ones come from them).
"""

from __future__ import annotations

import sys
from pathlib import Path

from steadytune.config.schema import SteadytuneConfig

# HF optimizer names that build a torch.optim optimizer (transformers' OptimizerNames values).
TORCH_OPTIMIZERS = frozenset({"adamw_torch", "adamw_torch_fused", "adafactor", "sgd", "adagrad", "rmsprop"})


def unneeded_packages(cfg: SteadytuneConfig) -> tuple[str, ...]:
    """The optional packages a worker training ``cfg`` never calls, in a fixed order."""
    torch_optimizer = cfg.train.optim in TORCH_OPTIMIZERS
    hidden: list[str] = []
    if cfg.method == "full" and not _has_adapter(cfg.model.name_or_path):
        hidden.append("peft")
    if cfg.method != "qlora" and torch_optimizer:
        hidden.append("bitsandbytes")
    if torch_optimizer:
        hidden.append("torchao")
    return tuple(hidden)


def _has_adapter(name_or_path: str) -> bool:
    """Whether transformers may find a PEFT adapter config for this model (then it needs ``peft``).

    Only a local folder can be ruled out here; a Hub name keeps ``peft``, since its files are
    not looked at before transformers does.
    """
    path = Path(name_or_path)
    return not path.is_dir() or (path / "adapter_config.json").exists()


def hide_unneeded(cfg: SteadytuneConfig) -> tuple[str, ...]:
    """Hide from this interpreter what ``cfg`` does not use; the names hidden.

    Only before ``transformers`` is imported (it reads what is installed once, at import), and
    never a package already imported: in a process that has them (a Ray worker actor, a test),
    this does nothing, and everything stays as it was.
    """
    if "transformers" in sys.modules:
        return ()
    hidden = tuple(name for name in unneeded_packages(cfg) if name not in sys.modules)
    for name in hidden:
        sys.modules[name] = None  # type: ignore[assignment]  # the import system's "not installed"
    return hidden

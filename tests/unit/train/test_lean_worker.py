"""The worker keeps out of its interpreter the optional packages its config never uses.

A restart after a kill waits on the new worker's imports, and transformers imports every
optional integration it finds installed. The checks run in fresh interpreters
(tests/fresh.py): in the pytest process another test has imported them already.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from steadytune.cli.demo import demo_config
from steadytune.config.load import validate_dict
from steadytune.config.schema import SteadytuneConfig
from steadytune.train.lean import unneeded_packages
from tests.fresh import fresh_imports

OPTIONAL = ("peft", "bitsandbytes", "torchao")


def config(assets: Path, tmp_path: Path, method: str = "full", **train: Any) -> SteadytuneConfig:
    data = demo_config(assets, str(tmp_path / "runs"), 4, method)
    data["train"].update(train)
    return validate_dict(data, tmp_path, check_paths=False)


def worker_code(cfg: SteadytuneConfig, then: str = "") -> str:
    """What the worker does before training: hide, then import its trainer side (and ``then``)."""
    return (
        "import json\n"
        "from steadytune.config.load import validate_dict\n"
        "from steadytune.train.lean import hide_unneeded\n"
        f"cfg = validate_dict(json.loads({json.dumps(cfg.model_dump_json())}), '.', check_paths=False)\n"
        "hide_unneeded(cfg)\n"
        "import steadytune.guard.hf, steadytune.train.runner, steadytune.train.rollback\n" + then
    )


def test_a_full_fine_tune_loads_and_trains_without_peft_bitsandbytes_or_torchao(
    demo_assets: Path, tmp_path: Path
) -> None:
    cfg = config(demo_assets, tmp_path)
    # A real model load and optimizer step through the runner's own functions and transformers'
    # Trainer: what a restarted worker does first, with the packages hidden.
    then = (
        "from steadytune.train.runner import load_model, training_arguments\n"
        "from steadytune.records import PlanRevision\n"
        "from transformers import Trainer\n"
        "model = load_model(cfg, False)\n"
        "args = training_arguments(cfg, PlanRevision(revision=0, ts=0.0, reason='start'), "
        f"__import__('pathlib').Path({str(tmp_path / 'out')!r}), False)\n"
        "trainer = Trainer(model=model, args=args)\n"
        "trainer.create_optimizer()  # no scheduler: its warmup would start at LR 0\n"
        "assert type(trainer.optimizer).__module__.startswith('torch.optim'), trainer.optimizer\n"
        "import torch\n"
        "ids = torch.tensor([[1, 2, 3, 4]])\n"
        "before = next(model.parameters()).detach().clone()\n"
        "model(input_ids=ids, labels=ids).loss.backward()\n"
        "trainer.optimizer.step()\n"
        "assert not torch.equal(before, next(model.parameters()).detach())\n"
    )
    assert fresh_imports(worker_code(cfg, then), watch=OPTIONAL) == []


def test_lora_keeps_peft_and_an_8bit_optimizer_keeps_bitsandbytes(demo_assets: Path, tmp_path: Path) -> None:
    lora = config(demo_assets, tmp_path, "lora")
    assert fresh_imports(worker_code(lora, "import peft\n"), watch=OPTIONAL) == ["peft"]
    assert unneeded_packages(config(demo_assets, tmp_path, "full", optim="adamw_bnb_8bit")) == ("peft",)


@pytest.mark.parametrize(
    ("method", "optim", "hidden"),
    [
        ("full", "adamw_torch", ("peft", "bitsandbytes", "torchao")),
        ("full", "adamw_torch_fused", ("peft", "bitsandbytes", "torchao")),
        ("lora", "adamw_torch", ("bitsandbytes", "torchao")),
        ("qlora", "adamw_torch", ("torchao",)),
        ("full", "paged_adamw_8bit", ("peft",)),
        ("full", "adamw_torch_4bit", ("peft",)),  # torchao's optimizer
        ("qlora", "paged_adamw_32bit", ()),
    ],
)
def test_what_each_config_does_without(
    demo_assets: Path, tmp_path: Path, method: str, optim: str, hidden: tuple[str, ...]
) -> None:
    assert unneeded_packages(config(demo_assets, tmp_path, method, optim=optim)) == hidden


def test_a_base_model_folder_with_an_adapter_keeps_peft(demo_assets: Path, tmp_path: Path) -> None:
    # transformers loads a folder with adapter_config.json through peft, even for a full fine-tune.
    model = tmp_path / "with-adapter"
    model.mkdir()
    (model / "adapter_config.json").write_text("{}")
    cfg = config(demo_assets, tmp_path)
    cfg = cfg.model_copy(update={"model": cfg.model.model_copy(update={"name_or_path": str(model)})})
    assert "peft" not in unneeded_packages(cfg)
    hub = cfg.model_copy(update={"model": cfg.model.model_copy(update={"name_or_path": "org/some-model"})})
    assert "peft" not in unneeded_packages(hub)  # a Hub name's files are not looked at before transformers


def test_nothing_is_hidden_once_transformers_is_imported(demo_assets: Path, tmp_path: Path) -> None:
    code = "import transformers\n" + worker_code(config(demo_assets, tmp_path)).replace(
        "hide_unneeded(cfg)\n", "assert hide_unneeded(cfg) == ()\n"
    )
    # Each of them imports: none was hidden (imported one by one, not through peft, whose own
    # imports of the others change between its releases).
    imports = "".join(f"import {name}\n" for name in OPTIONAL)
    assert fresh_imports(code + imports, watch=OPTIONAL) == sorted(OPTIONAL)


def test_a_standby_worker_warms_up_with_the_model_module_and_without_the_hidden_packages_or_a_device(
    demo_assets: Path, tmp_path: Path
) -> None:
    """What the spare imports ahead (train/standby.py) is what the attempt would, and no more."""
    cfg = config(demo_assets, tmp_path)
    then = (
        "import sys, torch\n"
        "from steadytune.train.standby import warm_up\n"
        "assert 'transformers.models.llama.modeling_llama' not in sys.modules\n"
        "warm_up(cfg)\n"
        "assert 'transformers.models.llama.modeling_llama' in sys.modules  # the demo model's class\n"
        "assert 'steadytune.guard.checkpoints' in sys.modules\n"
        "assert not torch.cuda.is_initialized()\n"
    )
    assert fresh_imports(worker_code(cfg, then), watch=OPTIONAL) == []
    lora = config(demo_assets, tmp_path, "lora")
    assert fresh_imports(worker_code(lora, then), watch=OPTIONAL) == ["peft"]

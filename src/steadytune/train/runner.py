"""The built-in runner: a HF Trainer fine-tune (full, LoRA, QLoRA) with the guard inside.

Read top to bottom: load the tokenizer and data, load the model for the method,
map the config to ``TrainingArguments``, train with the guard's callback.
"""

from __future__ import annotations

import contextlib
import gc
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, Trainer, TrainerCallback, TrainingArguments, set_seed

from steadytune.config.schema import SteadytuneConfig
from steadytune.data.encode import IGNORE_INDEX, DataSpec
from steadytune.guard.core import Guard
from steadytune.guard.faults import Faults
from steadytune.guard.hf import GuardCallback, load_keeping_this_runs_lr
from steadytune.layerwise import groups_of
from steadytune.policy.restart import is_oom_message
from steadytune.protocol import WorkerEvent
from steadytune.records import PlanRevision
from steadytune.train.data import SAMPLE_HASH, SAMPLE_ID, build_dataset, load_tokenizer
from steadytune.train.optim import LrPlan, group_summary, param_groups
from steadytune.train.sampling import Batching, DataPosition, SkipSampler, advance, place

# The key of the run's place in its sample order in a checkpoint's trainer_state.json (stateful_callbacks).
DATA_POSITION = "steadytune_data_position"

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class SplitExhausted(RuntimeError):
    """OOM that splitting the micro-batch could not absorb; the supervisor escalates."""


def is_oom(exc: BaseException) -> bool:
    return isinstance(exc, torch.OutOfMemoryError) or is_oom_message(f"{type(exc).__name__}: {exc}")


def free_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


@dataclass
class Collator:
    """Pads a list of tokenized samples; carries sample ids and hashes as tensors."""

    pad_token_id: int

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        width = max(len(f["input_ids"]) for f in features)
        ids, labels, mask = [], [], []
        for f in features:
            pad = width - len(f["input_ids"])
            ids.append(list(f["input_ids"]) + [self.pad_token_id] * pad)
            labels.append(list(f["labels"]) + [IGNORE_INDEX] * pad)
            mask.append([1] * len(f["input_ids"]) + [0] * pad)
        batch = {
            "input_ids": torch.tensor(ids, dtype=torch.long),
            "labels": torch.tensor(labels, dtype=torch.long),
            "attention_mask": torch.tensor(mask, dtype=torch.long),
        }
        if SAMPLE_ID in features[0]:
            batch[SAMPLE_ID] = torch.tensor([int(f[SAMPLE_ID]) for f in features], dtype=torch.long)
            batch[SAMPLE_HASH] = torch.tensor([int(f[SAMPLE_HASH]) for f in features], dtype=torch.long)
        return batch


def _stateful(state: Any) -> dict[str, Any]:
    """The states saved with a checkpoint: a dict once the TrainerState exists (typed as its input list)."""
    callbacks: dict[str, Any] = state.stateful_callbacks
    return callbacks


def _label_tokens(inputs: dict[str, Any]) -> int:
    """Tokens that carry loss in a causal LM batch (labels shift by one)."""
    labels = inputs.get("labels")
    return int((labels[:, 1:] != IGNORE_INDEX).sum()) if labels is not None else 0


class GuardedTrainer(Trainer):
    """A Trainer that feeds each micro-batch to the guard and survives OOM by splitting it.

    On an out-of-memory error the *same* micro-batch is split into 2, 4, ... chunks
    whose gradients add up to the unsplit one, and the earlier micro-batches of the
    optimizer step are redone, so the update and the effective batch are unchanged.
    """

    def __init__(
        self,
        *args: Any,
        guard: Guard,
        faults: Faults | None = None,
        split: int = 1,
        max_split: int = 16,
        skip_ids: set[int] | None = None,
        lr_plan: LrPlan | None = None,
        **kwargs: Any,
    ) -> None:
        self.st_lr_plan = lr_plan
        super().__init__(*args, **kwargs)
        self.st_guard = guard
        self.st_faults = faults or Faults()
        self.st_split = max(1, split)
        self.st_max_split = max_split
        self.st_skip = skip_ids or set()
        self._st_step_inputs: list[tuple[dict[str, Any], Any]] = []
        self._st_step_of_inputs = -1
        self._st_sampler: SkipSampler | None = None
        # (global step, data position) where this train() call started: every later position follows.
        self._st_anchor = (0, DataPosition())
        self._st_horizon: int | None = None  # the steps an epoch-based resume trains to

    def create_optimizer(self, model: Any = None) -> Any:
        """The HF optimizer, with one param group per configured LR group when there are any."""
        plan = self.st_lr_plan
        if self.optimizer is None and plan is not None and plan.grouped:
            opt_model: Any = self.model if model is None else model
            cls, kwargs = self.get_optimizer_cls_and_kwargs(self.args, opt_model)
            if {"params", "model", "optimizer_dict"} & set(kwargs):
                raise ValueError(
                    f"train.optim={self.args.optim!r} builds its own parameter groups, so train.lr_groups, "
                    "loraplus_lr_ratio and layer_decay cannot apply; use adamw_torch or remove them"
                )
            decay = set(self.get_decay_parameter_names(opt_model))
            groups = param_groups(opt_model.named_parameters(), plan, decay, self.args.weight_decay)
            self.optimizer = cls(groups, **kwargs)
        return super().create_optimizer(model)

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        # A rollback resumes at the plan's lower LRs (every group's), not at the checkpoint's.
        load_keeping_this_runs_lr(self, super()._load_optimizer_and_scheduler, checkpoint)

    def _get_train_sampler(self, train_dataset: Any = None) -> Any:
        ds = train_dataset if train_dataset is not None else self.train_dataset
        if ds is None or SAMPLE_ID not in getattr(ds, "column_names", ()):
            return super()._get_train_sampler(train_dataset)
        self._st_sampler = SkipSampler(ds[SAMPLE_ID], seed=self.args.seed, skip=self.st_skip)
        return self._st_sampler

    def _st_batching(self) -> Batching:
        return Batching(self._train_batch_size, self.args.gradient_accumulation_steps, self.args.world_size)

    def data_position(self) -> DataPosition:
        """Where the run stands in its sample order after ``state.global_step`` steps."""
        assert self._st_sampler is not None  # only asked for where the sampler is ours
        step, position = self._st_anchor
        return advance(position, self.state.global_step - step, self._st_sampler.kept, self._st_batching())

    def _init_training_state(
        self,
        max_steps: int,
        num_update_steps_per_epoch: int,
        num_train_epochs: int,
        resume_from_checkpoint: str | None,
        trial: Any,
    ) -> tuple[int, int]:
        """Place a resume by the checkpoint's data position, not by the HF arithmetic (docs/recovery.md)."""
        placed = super()._init_training_state(
            max_steps, num_update_steps_per_epoch, num_train_epochs, resume_from_checkpoint, trial
        )
        sampler = self._st_sampler
        if sampler is None:
            return placed
        step = self.state.global_step
        batching = self._st_batching()
        saved = _stateful(self.state).get(DATA_POSITION) if resume_from_checkpoint else None
        if saved is not None:
            position = DataPosition(int(saved["epoch"]), int(saved["offset"]))
        else:
            # No position saved (a fresh start, or a checkpoint from before positions were): as if the
            # present skip list had applied from the first step.
            position = advance(DataPosition(), step, sampler.kept, batching)
        tail = sum(sampler.kept(position.epoch)[position.offset :])
        placement = place(position, step, tail, len(sampler), num_update_steps_per_epoch, batching)
        sampler.start_at(position, placement, batching)
        self._st_anchor = (step, position)
        self._st_horizon = None
        if self.args.max_steps <= 0 and step:
            # An epoch-based run trains its epochs to their end. HF counts its steps as epochs x the
            # steps of an epoch now, which falls short where the epochs behind it were longer.
            steps = num_update_steps_per_epoch
            done = position.epoch * steps + steps - batching.steps(tail)
            self._st_horizon = self.state.max_steps = step + max(0, max_steps - done)
        return placement.epoch, placement.lead_batches

    def create_scheduler(self, num_training_steps: int, optimizer: Any = None) -> Any:
        # An epoch-based resume may have more steps to go than HF counted (_init_training_state).
        return super().create_scheduler(self._st_horizon or num_training_steps, optimizer)

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        if self._st_sampler is not None:
            at = self.data_position()
            _stateful(self.state)[DATA_POSITION] = {"epoch": at.epoch, "offset": at.offset}
        super()._save_checkpoint(model, trial)

    def compute_loss(
        self, model: Any, inputs: dict[str, Any], return_outputs: bool = False, num_items_in_batch: Any = None
    ) -> Any:
        out: Any = super().compute_loss(
            model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch
        )
        return self.st_faults.poison_loss(
            out, self.state.global_step + 1, self.st_guard.attempt, self.st_guard
        )

    def _run_chunks(
        self, model: Any, inputs: dict[str, Any], num_items_in_batch: Any, split: int
    ) -> torch.Tensor:
        """One micro-batch as ``split`` chunks whose losses and gradients sum to the unsplit ones."""
        size = int(inputs["input_ids"].shape[0])
        self.st_faults.check_oom(self.state.global_step + 1, self.st_guard.attempt, -(-size // split))
        if split <= 1:
            return super().training_step(model, inputs, num_items_in_batch)
        pieces = [c for c in range(split) if c < size]
        chunks = [
            {
                k: (
                    v.tensor_split(len(pieces))[c]
                    if torch.is_tensor(v) and v.dim() and v.shape[0] == size
                    else v
                )
                for k, v in inputs.items()
            }
            for c in pieces
        ]
        total = max(1, _label_tokens(inputs))
        saved_ga = getattr(self, "current_gradient_accumulation_steps", self.args.gradient_accumulation_steps)
        loss_sum = None
        try:
            for n, chunk in enumerate(chunks):
                if num_items_in_batch is None or not self.model_accepts_loss_kwargs:
                    # Mean-reduced losses: weight each chunk by its share of the tokens.
                    share = max(1, _label_tokens(chunk)) / total
                    self.current_gradient_accumulation_steps = saved_ga / share
                last = n == len(chunks) - 1
                ctx = contextlib.nullcontext() if last else self.accelerator.no_sync(model)
                with ctx:
                    part = super().training_step(model, chunk, num_items_in_batch)
                loss_sum = part if loss_sum is None else loss_sum + part
        finally:
            self.current_gradient_accumulation_steps = saved_ga
        assert loss_sum is not None  # a batch splits into at least one chunk
        return loss_sum

    def training_step(
        self, model: Any, inputs: dict[str, Any], num_items_in_batch: Any = None
    ) -> torch.Tensor:
        ids = inputs.pop(SAMPLE_ID, None)
        hashes = inputs.pop(SAMPLE_HASH, None)
        tokens = int(inputs["attention_mask"].sum()) if "attention_mask" in inputs else None
        if self._st_step_of_inputs != self.state.global_step:
            self._st_step_of_inputs, self._st_step_inputs = self.state.global_step, []
        self._st_step_inputs.append((inputs, num_items_in_batch))
        while True:
            try:
                loss = self._run_chunks(model, inputs, num_items_in_batch, self.st_split)
                break
            except Exception as exc:
                if not is_oom(exc):
                    raise
                # Only the text leaves this block: the exception's traceback holds the frames of the
                # failed forward/backward, and with them its tensors, until the block ends. Recovering
                # inside it would retry with that memory still taken (PyTorch's FAQ on OOM says so too).
                error = f"{type(exc).__name__}: {exc}"
            self._recover_from_oom(model, inputs, error)
        self.st_guard.add_microbatch(
            loss,
            tokens=tokens,
            sample_ids=ids.tolist() if ids is not None else None,
            sample_hashes=hashes.tolist() if hashes is not None else None,
        )
        return loss

    def _recover_from_oom(self, model: Any, inputs: dict[str, Any], error: str) -> None:
        size = int(inputs["input_ids"].shape[0])
        new_split = self.st_split * 2
        if new_split > self.st_max_split or self.st_split >= size:
            raise SplitExhausted(
                f"out of memory even with the micro-batch split into {self.st_split} chunks: {error}"
            )
        free_memory()
        # The failed micro-batch may have left partial gradients: redo the whole step's
        # micro-batches so far, all split, so the update still equals the unsplit one.
        model.zero_grad(set_to_none=True)
        self.st_split = new_split
        step = self.state.global_step + 1
        self.st_guard.notify(
            "action",
            WorkerEvent.REDUCE_MICROBATCH,
            f"out of memory at step {step}: micro-batch split into {new_split} chunks, "
            "same batch and effective batch",
            severity="warning",
            step=step,
            micro_batch_split=new_split,
            error=error[:300],
        )
        for prev_inputs, prev_n in self._st_step_inputs[:-1]:
            self._run_chunks(model, prev_inputs, prev_n, self.st_split)


class OptimizerGroupsReport(TrainerCallback):
    """Files each optimizer group's planned LR as an event once training begins (after any resume),
    so ``events.jsonl`` says which LRs a run actually trained with, attempt by attempt."""

    def __init__(self, guard: Guard) -> None:
        self.guard = guard

    def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        optimizer = kw.get("optimizer")
        if optimizer is None:
            return
        groups = group_summary(optimizer.param_groups)
        self.guard.notify(
            "lifecycle",
            WorkerEvent.OPTIMIZER_GROUPS,
            "optimizer groups: " + ", ".join(f"{name} {lr:.3g}" for name, lr in groups.items()),
            step=state.global_step,
            attempt=self.guard.attempt,
            groups=groups,
        )


def quantization_config(cfg: SteadytuneConfig, kind: str) -> Any:
    """The bitsandbytes loading config of one quantization: int8, or 4-bit nf4/fp4 with the
    config's double-quant and compute dtype (``quantization:``)."""
    from transformers import BitsAndBytesConfig

    if kind == "int8":
        return BitsAndBytesConfig(load_in_8bit=True)
    q = cfg.quantization
    return BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type=kind,
        bnb_4bit_use_double_quant=q.bnb_4bit_use_double_quant,
        bnb_4bit_compute_dtype=_DTYPES[q.bnb_4bit_compute_dtype],
    )


def model_kwargs(
    cfg: SteadytuneConfig, quantize: str | None = None, dtype: str | None = None
) -> dict[str, Any]:
    """``from_pretrained`` arguments of the base model: the config's dtype (or ``dtype``), and a
    bitsandbytes quantization (``int8``, ``nf4``, ``fp4``) when asked for."""
    kwargs: dict[str, Any] = {
        "trust_remote_code": cfg.model.trust_remote_code,
        "attn_implementation": cfg.model.attn_implementation,
    }
    dtype = dtype or cfg.model.dtype
    if dtype != "auto":
        kwargs["dtype"] = _DTYPES[dtype]
    if quantize is not None:
        kwargs["quantization_config"] = quantization_config(cfg, quantize)
    return kwargs


def load_model(cfg: SteadytuneConfig, gradient_checkpointing: bool) -> Any:
    """The model for the method: full (all weights train), LoRA, or QLoRA (4-bit base + LoRA).

    Seeded with ``train.seed`` first: the Trainer seeds only when it is built, after this, so each
    LoRA ``A`` matrix (and any weight the checkpoint lacks) drew from an unseeded generator, and
    one config trained twice took two different paths from its third step on.
    """
    set_seed(cfg.train.seed)
    quantize = cfg.quantization.bnb_4bit_quant_type if cfg.method == "qlora" else None
    kwargs = model_kwargs(cfg, quantize)
    model = AutoModelForCausalLM.from_pretrained(cfg.model.name_or_path, **kwargs)
    if cfg.method == "full":
        return model
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training

    if cfg.method == "qlora":
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=gradient_checkpointing)
    lora = cfg.lora
    peft_cfg = LoraConfig(
        r=lora.r,
        lora_alpha=lora.lora_alpha,  # type: ignore[arg-type]  # PEFT scales by alpha / r: a float works
        lora_dropout=lora.lora_dropout,
        target_modules=lora.target_modules,
        bias=lora.bias,
        rank_pattern=dict(lora.rank_pattern),
        alpha_pattern=dict(lora.alpha_pattern),
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, peft_cfg)


def training_arguments(
    cfg: SteadytuneConfig, plan: PlanRevision, staging: Path, has_eval: bool
) -> TrainingArguments:
    """Map the config (HF names) plus the plan's revisions onto ``TrainingArguments``."""
    t = cfg.train
    batch = plan.per_device_train_batch_size or (
        t.per_device_train_batch_size if isinstance(t.per_device_train_batch_size, int) else 1
    )
    accum = plan.gradient_accumulation_steps or t.gradient_accumulation_steps
    use_cpu = t.use_cpu if t.use_cpu is not None else not torch.cuda.is_available()
    gc = plan.gradient_checkpointing if plan.gradient_checkpointing is not None else t.gradient_checkpointing
    eval_on = has_eval and t.eval_steps is not None
    return TrainingArguments(
        output_dir=str(staging),
        max_steps=t.max_steps,
        num_train_epochs=t.num_train_epochs,
        per_device_train_batch_size=batch,
        per_device_eval_batch_size=batch,
        gradient_accumulation_steps=accum,
        learning_rate=t.learning_rate * plan.lr_scale,
        lr_scheduler_type=t.lr_scheduler_type,
        warmup_steps=t.warmup_steps,
        weight_decay=t.weight_decay,
        max_grad_norm=t.max_grad_norm,
        optim=t.optim,
        seed=t.seed,
        bf16=t.bf16,
        fp16=t.fp16,
        gradient_checkpointing=gc,
        logging_steps=t.logging_steps,
        logging_nan_inf_filter=False,  # never hide a NaN: the guard decides what to do with it
        save_strategy="steps",
        save_steps=t.save_steps,
        save_total_limit=None,  # retention is ours: it must never rotate away LAST_GOOD
        eval_strategy="steps" if eval_on else "no",
        eval_steps=t.eval_steps if eval_on else None,
        dataloader_num_workers=(
            plan.dataloader_num_workers
            if plan.dataloader_num_workers is not None
            else t.dataloader_num_workers
        ),
        remove_unused_columns=False,
        report_to=[],
        disable_tqdm=True,
        use_cpu=use_cpu,
        ddp_backend="gloo" if use_cpu and int(os.environ.get("WORLD_SIZE", "1")) > 1 else None,
    )


def lr_plan(cfg: SteadytuneConfig, plan: PlanRevision, base_lr: float) -> LrPlan:
    """The optimizer's groups: the config's, at the LRs the plan revision recorded."""
    t = cfg.train
    return LrPlan(base_lr, groups_of(t), t.loraplus_lr_ratio, t.layer_decay, dict(plan.lr_groups))


def build_trainer(
    cfg: SteadytuneConfig,
    plan: PlanRevision,
    guard: Guard,
    callbacks: list[Any],
    staging: Path,
    faults: Faults | None = None,
    max_split: int = 16,
) -> GuardedTrainer:
    tok = load_tokenizer(cfg.model.name_or_path, cfg.model.trust_remote_code)
    spec = DataSpec(
        cfg.data.train_file,
        cfg.data.format,
        cfg.data.text_field,
        plan.max_seq_length or cfg.data.max_seq_length,
        cfg.data.train_on_prompt,
        cfg.data.max_samples,
    )
    train_ds = build_dataset(tok, spec)
    eval_ds = None
    if cfg.data.eval_file:
        eval_spec = DataSpec(
            cfg.data.eval_file,
            cfg.data.format,
            cfg.data.text_field,
            spec.max_seq_length,
            cfg.data.train_on_prompt,
            None,
        )
        eval_ds = build_dataset(tok, eval_spec)
    skip = {i for a, b in plan.skip_ranges for i in range(a, b + 1)}
    args = training_arguments(cfg, plan, staging, eval_ds is not None)
    model = load_model(cfg, bool(args.gradient_checkpointing))
    groups = lr_plan(cfg, plan, args.learning_rate)
    if groups.grouped:
        callbacks = [*callbacks, OptimizerGroupsReport(guard)]
    trainer = GuardedTrainer(
        model=model,
        args=args,
        train_dataset=train_ds,
        eval_dataset=eval_ds,
        data_collator=Collator(tok.pad_token_id),
        processing_class=tok,
        callbacks=callbacks,
        guard=guard,
        faults=faults,
        split=plan.micro_batch_split,
        max_split=max_split,
        skip_ids=skip,
        lr_plan=groups,
    )
    for cb in callbacks:
        if isinstance(cb, GuardCallback):
            cb.bind(
                trainer
            )  # the guard records the norm clipping computes (on_train_begin would find it too)
    return trainer

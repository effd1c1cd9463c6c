"""A standby worker: started ahead of need, imported, and waiting for an attempt's orders.

A restart after a kill or a crash waits mostly on a new interpreter importing torch and the HF
Trainer. The supervisor keeps one spare worker that has done that already and then blocks on
its stdin (``python -m steadytune.train.worker --run-dir D --standby``). Everything it does before
the orders depends on the config alone, never on the attempt: the imports, and the module of the
model's class. It touches no accelerator (importing torch creates no CUDA context; nothing here asks
for a device), loads no weights and writes nothing of the run, so a spare that is never used leaves
no trace but its log.

The orders (one line, ``protocol.standby_orders``) say where the attempt's output goes and the
variables only an attempt reads; the worker then reads the newest plan revision from the run folder
and trains exactly as a worker started for that attempt does. It ends with the supervisor: end of
file on stdin ends it, and until then the kernel kills it when its parent dies.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import IO

from steadytune.config.schema import SteadytuneConfig
from steadytune.lifeline import parent_death_signal
from steadytune.protocol import read_standby_orders


def warm_up(cfg: SteadytuneConfig | None) -> None:
    """Import what an attempt imports, and the model's own module, without touching a device."""
    import steadytune.guard.checkpoints
    import steadytune.guard.hf
    import steadytune.guard.memcap
    import steadytune.telemetry.runenv
    import steadytune.train.rollback
    import steadytune.train.runner  # noqa: F401 - torch, transformers' Trainer, datasets

    if cfg is None:
        return
    if cfg.method != "full":
        import peft  # noqa: F401
    if not Path(cfg.model.name_or_path).is_dir():
        return  # a Hub name is looked up by the attempt: a spare waiting on the network would help no one
    try:
        from transformers import AutoConfig, AutoModelForCausalLM

        # transformers imports a model's modeling module when a model of it is first built; the
        # config file alone names it.
        model_config = AutoConfig.from_pretrained(cfg.model.name_or_path)
        AutoModelForCausalLM._model_mapping[type(model_config)]  # the lookup imports it
    except Exception as exc:  # the attempt reads the model again and reports what is wrong with it
        print(f"standby: the model's class was not imported ahead ({type(exc).__name__}: {exc})", flush=True)


def stand_by(cfg: SteadytuneConfig | None, orders: IO[bytes] | None = None) -> bool:
    """Warm up, then wait for the orders; True once they are taken, False when the supervisor is gone."""
    t0 = time.time()
    # Until the orders, it dies with the supervisor; end of file on stdin covers a death before this line.
    parent_death_signal(signal.SIGKILL)
    warm_up(cfg)
    import psutil
    import torch

    # What the spare costs while it waits (its own pages: USS; RSS counts the libraries' shared ones too).
    mem = psutil.Process().memory_full_info()
    print(
        f"standby: ready in {time.time() - t0:.2f}s, RSS {mem.rss / 2**20:.0f} MiB, "
        f"USS {mem.uss / 2**20:.0f} MiB, CUDA initialized: {torch.cuda.is_initialized()}",
        flush=True,
    )
    line = (orders or sys.stdin.buffer).readline()
    if not line.strip():
        return False
    log, env = read_standby_orders(line.decode("utf-8"))
    parent_death_signal(0)  # from here on it is a worker like any other
    for key, value in env.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    sys.stdout.flush()
    sys.stderr.flush()
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    print(f"standby: orders taken after {time.time() - t0:.2f}s", flush=True)
    return True

"""The steps of benchmarks/gpu_check.py: what each check does, on a GPU and in a dry run.

Each ``step_*`` function runs in a child process of gpu_check.py (``--child``), fills a
:class:`Check` with assertions and figures, and leaves nothing running behind it. torch is
imported inside the steps only, so gpu_check.py itself, which imports this module, stays
torch-free. Sizes for a GPU run and for a dry run are side by side in :data:`GPU_SIZES` and
:data:`DRY_SIZES`.
"""

from __future__ import annotations

import contextlib
import gc
import importlib.util
import io
import itertools
import json
import math
import os
import platform
import random
import re
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src"
MARKER = "STEADYTUNE_GPU_CHECK_TOKEN"
NO_CUDA = "dry run on CPU: needs a CUDA device"
GiB = 1024**3
MiB = 1024**2

# Seconds a step may take at most (on a GPU; gpu_check.py also keeps to its whole budget).
CAPS = {
    "probe": 90,
    "assets": 180,
    "telemetry": 180,
    "oom": 150,
    "leak": 150,
    "overhead": 180,
    "estimator": 300,
    "quant": 120,
    "unsloth": 270,
}

# Llama 3.2 1B's shape (the 3B one is examples/models/llama-3.2-3b); weights are always random.
LLAMA_1B: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 2048,
    "intermediate_size": 8192,
    "num_hidden_layers": 16,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 64,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "tie_word_embeddings": True,
    "rms_norm_eps": 1e-05,
    "rope_theta": 500000.0,
    "hidden_act": "silu",
    "attention_bias": False,
    "mlp_bias": False,
    "torch_dtype": "bfloat16",
}
# fp32, for the OOM check: activations dominate its peak, and fp32 makes the gradients comparable
# at the CPU test's tolerance.
OOM_SHAPE: dict[str, Any] = {
    "hidden_size": 1024,
    "intermediate_size": 2816,
    "num_hidden_layers": 8,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 64,
    "vocab_size": 32000,
    "max_position_embeddings": 2048,
    "tie_word_embeddings": False,
}
# Dry-run stand-ins for the 1B and 3B shapes: small enough to measure on CPU in a second.
TINY_A: dict[str, Any] = {
    "model_type": "llama",
    "hidden_size": 128,
    "intermediate_size": 352,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "vocab_size": 2048,
    "max_position_embeddings": 512,
}
TINY_B: dict[str, Any] = {
    **TINY_A,
    "hidden_size": 192,
    "intermediate_size": 512,
    "num_hidden_layers": 3,
    "num_attention_heads": 6,
}


@dataclass(frozen=True)
class Sizes:
    """Everything that differs between a GPU run and a dry run, in one place."""

    telemetry_steps: int
    telemetry_batch: int
    telemetry_seq: int
    oom_batch: int
    oom_seq: int
    leak_steps: int
    leak_mib: float
    leak_sleep_s: float
    overhead_pairs: int
    overhead_steps: int
    overhead_warmup: int
    overhead_batch: int
    overhead_seq: int
    estimate_sizes: tuple[tuple[int, int], ...]
    long_rows: int
    long_words: int


GPU_SIZES = Sizes(
    telemetry_steps=60,
    telemetry_batch=8,
    telemetry_seq=256,
    oom_batch=16,
    oom_seq=512,
    leak_steps=60,
    leak_mib=16,
    leak_sleep_s=0.15,
    overhead_pairs=3,
    overhead_steps=40,
    overhead_warmup=5,
    overhead_batch=8,
    overhead_seq=512,
    estimate_sizes=((1, 512), (4, 1024)),
    long_rows=96,
    long_words=700,
)
DRY_SIZES = Sizes(
    telemetry_steps=20,
    telemetry_batch=4,
    telemetry_seq=64,
    oom_batch=8,
    oom_seq=64,
    leak_steps=50,
    leak_mib=8,
    leak_sleep_s=0.05,
    overhead_pairs=3,
    overhead_steps=12,
    overhead_warmup=3,
    overhead_batch=4,
    overhead_seq=64,
    estimate_sizes=((1, 32), (2, 64)),
    long_rows=32,
    long_words=100,
)


# ============================================================================ results


class Check:
    """One check's assertions (pass / fail / skipped with a reason) and its figures."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.assertions: list[dict[str, Any]] = []
        self.figures: dict[str, Any] = {}
        self.notes: list[str] = []
        self.wall_s = 0.0

    def expect(self, what: str, ok: bool, detail: str = "") -> bool:
        self.assertions.append({"name": what, "status": "pass" if ok else "fail", "detail": detail})
        return bool(ok)

    def skip(self, what: str, reason: str) -> None:
        self.assertions.append({"name": what, "status": "skipped", "reason": reason})

    def cuda(self, ctx: Ctx, what: str, ok: Callable[[], tuple[bool, str]], reason: str = NO_CUDA) -> None:
        """An assertion that only means something on a GPU: skipped in a dry run, else evaluated."""
        if ctx.dry:
            self.skip(what, reason)
            return
        try:
            good, detail = ok()
        except Exception as exc:
            good, detail = False, f"{type(exc).__name__}: {exc}"
        self.expect(what, good, detail)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "assertions": self.assertions,
            "figures": self.figures,
            "notes": self.notes,
            "wall_s": round(self.wall_s, 2),
        }


def check_status(assertions: list[dict[str, Any]]) -> tuple[str, str | None]:
    states = [a["status"] for a in assertions]
    if "fail" in states:
        return "fail", None
    if "pass" in states:
        return "pass", None
    reasons = sorted({a.get("reason", "") for a in assertions if a.get("reason")})
    return "skipped", "; ".join(reasons) or "nothing ran"


# ============================================================================ processes


def marked_pids(token: str, exclude: set[int]) -> list[int]:
    """Every process whose environment carries this run's marker (any depth, any session)."""
    needle = f"{MARKER}={token}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in exclude:
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        if needle in env:
            found.append(int(entry))
    return found


def kill_marked(token: str, exclude: set[int] | None = None, wait_s: float = 10.0) -> list[int]:
    """SIGKILL every marked process but ``exclude``; returns their pids once they are gone."""
    exclude = {os.getpid(), *(exclude or set())}
    pids = marked_pids(token, exclude)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.time() + wait_s
    while pids and time.time() < deadline and marked_pids(token, exclude):
        time.sleep(0.1)
    return pids


def kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(Exception):
        proc.wait(10)


def nvml_compute_processes() -> tuple[dict[int, int] | None, str]:
    """(pid -> bytes of every compute process on every GPU, ""), or (None, why NVML cannot say)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        out: dict[int, int] = {}
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                out[int(p.pid)] = int(p.usedGpuMemory or 0)
    except Exception as exc:
        return None, f"{type(exc).__name__}: {exc}"
    return out, ""


def run_logged(
    cmd: list[str], env: dict[str, str], log: Path, timeout: float, cwd: Path | None = None
) -> int:
    """Run ``cmd`` in a session of its own, output to ``log``; on timeout kill it and all it started."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as f:
        proc = subprocess.Popen(
            cmd,
            stdout=f,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=cwd,
            start_new_session=True,
        )
        try:
            return proc.wait(max(1.0, timeout))
        except subprocess.TimeoutExpired:
            kill_group(proc)
            token = env.get(MARKER)
            if token:
                kill_marked(token)
            return 124
        finally:
            if proc.poll() is None:
                kill_group(proc)


def tail(path: Path, n: int = 3000) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")[-n:]
    except OSError:
        return ""


# ============================================================================ child: shared


@dataclass
class Ctx:
    work: Path
    dry: bool
    deadline: float
    checks: set[str]

    @property
    def sizes(self) -> Sizes:
        return DRY_SIZES if self.dry else GPU_SIZES

    def left(self) -> float:
        return self.deadline - time.time()

    def assets(self) -> dict[str, str]:
        return json.loads((self.work / "assets.json").read_text())

    def env(self) -> dict[str, str]:
        return dict(os.environ)

    def save(self, check: Check) -> None:
        """Write a check's result now (child_main writes it again when the step ends)."""
        path = self.work / "results" / f"{check.name}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(check.to_dict(), indent=1, default=str))
        tmp.replace(path)


def say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def cuda_free() -> None:
    gc.collect()
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def version_of(name: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def write_yaml(path: Path, data: dict[str, Any]) -> Path:
    import yaml

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def load_run(run_root: Path) -> tuple[list[Any], list[Any], list[Any]]:
    """(step records, system samples, events) of a run directory."""
    from steadytune.records import StepRecord, SystemSample
    from steadytune.rundir import RunDir
    from steadytune.telemetry.events import read_events
    from steadytune.telemetry.stream import iter_records

    run = RunDir(run_root)
    steps = [
        r for r in iter_records(run.telemetry(0)) if isinstance(r, StepRecord) and not r.extra.get("eval")
    ]
    system = [r for r in iter_records(run.system) if isinstance(r, SystemSample)]
    events = list(read_events(run.events)) if run.events.exists() else []
    return steps, system, events


def supervised_run(ctx: Ctx, config: Path, run_id: str, timeout: float, faults: dict | None = None) -> int:
    """``steadytune run`` as a user starts it (the CLI module: no console script is needed)."""
    env = ctx.env()
    if faults:
        env["STEADYTUNE_FAULTS"] = json.dumps(faults)
    cmd = [
        sys.executable,
        "-m",
        "steadytune.cli.main",
        "run",
        str(config),
        "--run-id",
        run_id,
        "--quiet",
        "--skip-check",
    ]
    say(f"steadytune run {config.name} --run-id {run_id}")
    return run_logged(cmd, env, ctx.work / "logs" / f"run-{run_id}.log", timeout, cwd=config.parent)


# ============================================================================ child: steps


def step_probe(ctx: Ctx, check: Check) -> None:
    """What this machine has: versions, the device, whether steadytune's paths import."""
    import torch

    env: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cuda_available": bool(torch.cuda.is_available()),
    }
    for name in (
        "transformers",
        "peft",
        "accelerate",
        "datasets",
        "pydantic",
        "bitsandbytes",
        "torchao",
        "nvidia-ml-py",
        "psutil",
        "rich",
        "pyyaml",
        "tokenizers",
        "safetensors",
    ):
        env[name] = version_of(name)
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        env.update(
            device=props.name,
            device_memory_bytes=int(props.total_memory),
            capability=f"{props.major}.{props.minor}",
            device_count=torch.cuda.device_count(),
        )
    missing = []
    for module in (
        "steadytune.config.load",
        "steadytune.train.runner",
        "steadytune.supervise.supervisor",
        "steadytune.web.server",
        "steadytune.estimate.measure",
        "datasets",
        "pydantic",
    ):
        try:
            __import__(module)
        except Exception as exc:
            missing.append(f"{module}: {type(exc).__name__}: {exc}")
    env["import_errors"] = missing
    check.figures.update(env)
    check.expect("steadytune's training paths import", not missing, "; ".join(missing))


def _long_text_rows(n: int, words: int) -> list[dict[str, str]]:
    from steadytune.train.assets import _WORDS

    rng = random.Random(7)
    return [{"text": " ".join(rng.choice(_WORDS) for _ in range(words))} for _ in range(n)]


def _save_random_llama(shape: dict[str, Any], tok_dir: Path, out: Path, dtype: str, device: str) -> int:
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(tok_dir)
    keys = (
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "vocab_size",
        "max_position_embeddings",
        "tie_word_embeddings",
        "rms_norm_eps",
        "rope_theta",
    )
    config = LlamaConfig(
        **{k: shape[k] for k in keys if k in shape},
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
    )
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(config)
    model.to(getattr(torch, dtype))
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    params = sum(p.numel() for p in model.parameters())
    del model
    cuda_free()
    return params


def step_assets(ctx: Ctx, check: Check) -> None:
    """The demo assets, a long-text data set, and on a GPU the 1B-shaped and OOM models."""
    from steadytune.train.assets import ensure_demo_assets

    t0 = time.time()
    demo = ensure_demo_assets()
    s = ctx.sizes
    long = ctx.work / "data" / "long.jsonl"
    long.parent.mkdir(parents=True, exist_ok=True)
    long.write_text("".join(json.dumps(r) + "\n" for r in _long_text_rows(s.long_rows, s.long_words)))
    assets = {
        "demo": str(demo),
        "demo_model": str(demo / "model"),
        "train": str(demo / "train.jsonl"),
        "long": str(long),
        "big_model": str(demo / "model"),
        "oom_model": str(demo / "model"),
    }
    if not ctx.dry:
        if ctx.checks & {"telemetry", "overhead"}:
            out = ctx.work / "models" / "llama-1b"
            n = _save_random_llama(LLAMA_1B, demo / "model", out, "bfloat16", "cuda")
            assets["big_model"] = str(out)
            check.figures["big_model_params"] = n
        if "oom" in ctx.checks:
            out = ctx.work / "models" / "oom-fp32"
            n = _save_random_llama(OOM_SHAPE, demo / "model", out, "float32", "cuda")
            assets["oom_model"] = str(out)
            check.figures["oom_model_params"] = n
    (ctx.work / "assets.json").write_text(json.dumps(assets, indent=1))
    check.figures["seconds"] = round(time.time() - t0, 1)
    check.expect("assets built", True)


# ---------------------------------------------------------------------------- 1. telemetry


def _series_means(series: dict[str, Any], metric: str) -> list[float | None]:
    """A metric's mean per bucket from the dashboard's answer by column (web/api.py ``columns``):
    ``mean`` is left out where it equals ``min``, a metric with no value is ``null``."""
    chart = series["columns"][metric]
    if chart is None:
        return [None] * len(series["x"])
    return list(chart.get("mean", chart["min"]))


def _http_json(url: str) -> Any:
    import urllib.request

    with urllib.request.urlopen(url, timeout=20) as r:
        body = r.read().decode("utf-8")
    return json.loads(body) if "/api/" in url else body


def step_telemetry(ctx: Ctx, check: Check) -> None:
    s = ctx.sizes
    a = ctx.assets()
    work = ctx.work / "telemetry"
    cfg = {
        "model": {"name_or_path": a["big_model"], "dtype": "auto" if ctx.dry else "bfloat16"},
        "method": "lora",
        "lora": {"target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]},
        "data": {"train_file": a["train"], "max_seq_length": s.telemetry_seq},
        "train": {
            "learning_rate": 1e-4,
            "per_device_train_batch_size": s.telemetry_batch,
            "max_steps": s.telemetry_steps,
            "save_steps": s.telemetry_steps,
            "logging_steps": 10,
            "warmup_steps": 2,
            "bf16": not ctx.dry,
        },
        "run": {"runs_dir": str(work / "runs"), "sample_interval_s": 1.0},
    }
    config = write_yaml(work / "config.yaml", cfg)
    t0 = time.time()
    rc = supervised_run(ctx, config, "telemetry", min(CAPS["telemetry"] - 30, ctx.left() - 20))
    check.figures["run_seconds"] = round(time.time() - t0, 1)
    root = work / "runs" / "telemetry"
    steps, system, _ = load_run(root)
    status = json.loads((root / "status.json").read_text()) if (root / "status.json").exists() else {}
    check.expect(
        "the supervised run completed",
        rc == 0 and status.get("state") == "completed" and len(steps) == s.telemetry_steps,
        f"exit {rc}, state {status.get('state')}, {len(steps)}/{s.telemetry_steps} step records"
        + ("" if rc == 0 else "\n" + tail(ctx.work / "logs" / "run-telemetry.log")),
    )
    if not steps:
        return
    check.figures["steps"] = len(steps)
    check.figures["system_samples"] = len(system)
    check.expect("every step record carries the process RSS", all(r.rss_bytes for r in steps))

    def cuda_fields() -> tuple[bool, str]:
        bad = [
            r.step
            for r in steps
            if None in (r.mem_allocated_bytes, r.mem_reserved_bytes, r.mem_peak_bytes)
            or not r.mem_allocated_bytes <= r.mem_peak_bytes
            or not r.mem_allocated_bytes <= r.mem_reserved_bytes
        ]
        last = steps[-1]
        check.figures.update(
            mem_allocated_last_bytes=last.mem_allocated_bytes,
            mem_reserved_last_bytes=last.mem_reserved_bytes,
            mem_peak_bytes=max(r.mem_peak_bytes or 0 for r in steps),
        )
        return (
            not bad,
            f"steps without consistent CUDA fields: {bad[:10]}" if bad else "allocated <= peak, <= reserved",
        )

    check.cuda(ctx, "every step record carries CUDA allocated/reserved/peak", cuda_fields)
    if ctx.dry:
        check.expect(
            "without CUDA the CUDA fields are absent, not zero",
            all(r.mem_allocated_bytes is None and r.mem_peak_bytes is None for r in steps),
        )
    check.expect(
        "system.jsonl has CPU/RAM/disk samples",
        len(system) >= 3 and all(x.ram_used_bytes and x.disk_free_bytes for x in system),
        f"{len(system)} samples",
    )

    def nvml_rows() -> tuple[bool, str]:
        rows = [x for x in system if x.gpus]
        full = [
            x
            for x in rows
            if all(
                v is not None
                for g in x.gpus
                for v in (g.mem_used_bytes, g.mem_total_bytes, g.util_ratio, g.temperature_c, g.power_w)
            )
        ]
        gaps = [b.ts - a.ts for a, b in itertools.pairwise(rows)]
        gap = statistics.median(gaps) if gaps else None
        check.figures.update(
            nvml_rows=len(rows),
            nvml_complete_rows=len(full),
            nvml_median_interval_s=round(gap, 3) if gap else None,
            gpu_name=rows[0].gpus[0].name if rows else None,
        )
        fields = ("mem_used_bytes", "mem_total_bytes", "util_ratio", "temperature_c", "power_w")
        seen = {f: sum(getattr(x.gpus[0], f) is not None for x in rows) for f in fields}
        ok = len(rows) >= 5 and len(full) == len(rows) and gap is not None and gap <= 1.5
        return (
            ok,
            f"{len(full)}/{len(rows)} complete NVML rows (readings per field: {seen}), median interval {gap}",
        )

    check.cuda(
        ctx,
        "system.jsonl has NVML rows (memory used/total, util, temperature, power) once a second",
        nvml_rows,
    )

    def nvml_agrees() -> tuple[bool, str]:
        g = [x.gpus[0] for x in system if x.gpus]
        util = max((x.util_ratio or 0) for x in g)
        used = max((x.mem_used_bytes or 0) for x in g)
        reserved = max(r.mem_reserved_bytes or 0 for r in steps)
        power = max((x.power_w or 0) for x in g)
        check.figures.update(
            nvml_util_max=util,
            nvml_mem_used_max_bytes=used,
            nvml_power_max_w=power,
            nvml_temperature_max_c=max((x.temperature_c or 0) for x in g),
        )
        ok = util > 0 and power > 0 and used >= reserved > 0
        return (
            ok,
            f"util max {util:.2f}, power max {power:.0f} W, NVML used {used / GiB:.2f} GiB >= reserved "
            f"{reserved / GiB:.2f} GiB",
        )

    check.cuda(ctx, "NVML saw the GPU busy, and its memory used covers what the worker reserved", nvml_agrees)

    from steadytune.web.server import start_dashboard

    dash = start_dashboard(work / "runs", port=0)
    try:
        base = f"http://127.0.0.1:{dash.port}/"
        runs = _http_json(base + "api/runs")
        check.expect("the dashboard lists the run", any(r.get("run_id") == "telemetry" for r in runs))
        detail = _http_json(base + "api/runs/telemetry")
        series = _http_json(base + "api/runs/telemetry/series?points=1000")
        losses = [v for v in _series_means(series["steps"], "loss") if v is not None]
        check.expect(
            "the dashboard API returns the loss of the steps",
            len(losses) >= min(10, s.telemetry_steps),
            f"{len(losses)} loss points",
        )
        check.expect("the dashboard API returns the system samples", bool(series["system"]["x"]))

        def api_memory() -> tuple[bool, str]:
            got = {
                m: sum(v is not None for v in _series_means(series["steps"], m))
                for m in ("mem_allocated_bytes", "mem_reserved_bytes", "mem_peak_bytes")
            }
            return all(got.values()), f"points per metric: {got}"

        check.cuda(ctx, "the dashboard API returns CUDA allocated/reserved/peak", api_memory)

        def gpu_panels() -> tuple[bool, str]:
            gpus = series.get("gpus") or {}
            g0 = gpus.get("0")
            if not g0 or 0 not in (detail.get("gpus") or []):
                return False, f"gpus in the run: {detail.get('gpus')}, series gpus: {list(gpus)}"
            got = {
                m: sum(v is not None for v in _series_means(g0, m))
                for m in ("util_ratio", "mem_used_bytes", "mem_total_bytes", "temperature_c", "power_w")
            }
            return all(got.values()), f"points per GPU panel metric: {got}"

        check.cuda(ctx, "the dashboard's GPU panels have data (series.gpus['0'])", gpu_panels)

        def prometheus() -> tuple[bool, str]:
            text = _http_json(base + "metrics")
            names = ("gpu_memory_used_bytes", "gpu_utilization_ratio", "gpu_power_watts")
            missing = [n for n in names if not re.search(rf"^\S*{n}\{{", text, re.M)]
            return not missing, f"missing in /metrics: {missing}" if missing else "GPU gauges present"

        check.cuda(ctx, "/metrics exposes the GPU gauges", prometheus)
    finally:
        dash.stop()


# ---------------------------------------------------------------------------- 2. OOM


def _grads(trainer: Any, batch: dict[str, Any], split: int, num_items: Any) -> tuple[dict[str, Any], float]:
    model = trainer.model
    model.zero_grad(set_to_none=True)
    trainer.st_split = split
    trainer._st_step_of_inputs = -1
    loss = trainer.training_step(model, dict(batch), num_items)
    grads = {
        n: p.grad.detach().float().cpu().clone() for n, p in model.named_parameters() if p.grad is not None
    }
    return grads, float(loss.detach().float().item())


def _compare(got: dict[str, Any], ref: dict[str, Any]) -> tuple[bool, float, float, str]:
    import torch

    worst_abs = worst_rel = 0.0
    problem = ""
    if got.keys() != ref.keys():
        return False, float("nan"), float("nan"), "different parameters have gradients"
    for name, r in ref.items():
        g = got[name]
        diff = (g - r).abs()
        worst_abs = max(worst_abs, float(diff.max()))
        worst_rel = max(worst_rel, float((diff / r.abs().clamp_min(1e-12)).max()))
        try:
            torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-6)
        except AssertionError as exc:
            problem = problem or f"{name}: {str(exc).splitlines()[0]}"
    return not problem, worst_abs, worst_rel, problem


def step_oom(ctx: Ctx, check: Check) -> None:
    import torch

    from steadytune.config.load import validate_dict
    from steadytune.guard.core import Guard
    from steadytune.guard.faults import Faults
    from steadytune.records import PlanRevision, StepRecord
    from steadytune.telemetry.stream import iter_records
    from steadytune.train.runner import build_trainer

    s = ctx.sizes
    a = ctx.assets()
    work = ctx.work / "oom"
    cfg = validate_dict(
        {
            "model": {"name_or_path": a["oom_model"], "dtype": "float32"},
            "method": "full",
            "data": {"train_file": a["long"], "max_seq_length": s.oom_seq},
            "train": {
                "per_device_train_batch_size": s.oom_batch,
                "max_steps": 4,
                "max_grad_norm": 0.0,
                "save_steps": 4,
                "logging_steps": 10_000,
            },
            "run": {"runs_dir": str(work)},
        },
        base=work,
    )
    guard = Guard(work / "run")
    plan = PlanRevision(revision=0, ts=0, reason="start")
    trainer = build_trainer(cfg, plan, guard, [], work / "staging")
    trainer.create_optimizer_and_scheduler(num_training_steps=4)
    trainer.current_gradient_accumulation_steps = 1  # set by the training loop in real runs
    batch = next(iter(trainer.get_train_dataloader()))
    size = int(batch["input_ids"].shape[0])
    num_items = int((batch["labels"][:, 1:] != -100).sum())
    on_gpu = not ctx.dry
    check.figures.update(
        batch=size,
        seq=int(batch["input_ids"].shape[1]),
        params=sum(p.numel() for p in trainer.model.parameters()),
    )

    if on_gpu:
        torch.cuda.reset_peak_memory_stats()
    ref, ref_loss = _grads(trainer, batch, 1, num_items)
    peak1 = torch.cuda.max_memory_allocated() if on_gpu else None
    if on_gpu:
        trainer.model.zero_grad(set_to_none=True)
        cuda_free()
        torch.cuda.reset_peak_memory_stats()
    got4, _ = _grads(trainer, batch, 4, num_items)
    peak4 = torch.cuda.max_memory_allocated() if on_gpu else None
    ok4, abs4, rel4, why4 = _compare(got4, ref)
    check.expect(
        "split into 4 without any OOM, the gradients equal the unsplit ones (rtol 1e-5, atol 1e-6)",
        ok4,
        why4 or f"max |diff| {abs4:.2e}, max rel {rel4:.2e}",
    )
    del got4
    trainer.model.zero_grad(set_to_none=True)
    cuda_free()

    cap = None
    if on_gpu:
        base = torch.cuda.memory_allocated()
        total = torch.cuda.get_device_properties(0).total_memory
        cap = (peak1 + peak4) // 2
        check.figures.update(
            peak_unsplit_bytes=peak1,
            peak_split4_bytes=peak4,
            baseline_bytes=base,
            cap_bytes=cap,
            cap_fraction=round(cap / total, 5),
        )
        # Through the server's per-process memory cap (submit --memory-cap-gib), so this OOM proves it too.
        from steadytune.guard.memcap import apply_memory_cap
        from steadytune.jobenv import MEMORY_CAP_ENV

        fraction = apply_memory_cap({MEMORY_CAP_ENV: str(cap)}, 0)
        check.expect(
            "the server's per-process memory cap (guard/memcap.py) set the allocator's fraction "
            "to cap / total",
            fraction is not None and abs(fraction - cap / total) < 1e-12,
            f"fraction {fraction}, cap / total {cap / total:.6f}",
        )
    else:
        check.skip(
            "the server's per-process memory cap (guard/memcap.py) set the allocator's fraction", NO_CUDA
        )
        # No device memory to cap on CPU: the injected OOM the CPU tests use stands in for it.
        trainer.st_faults = Faults(oom_at_step=1, oom_above=max(1, size // 4))
    pid = os.getpid()
    try:
        guard.begin_step()
        got, loss = None, None
        try:
            got, loss = _grads(trainer, batch, 1, num_items)
        except Exception as exc:
            check.expect("the guard absorbed the OOM in-process", False, f"{type(exc).__name__}: {exc}"[:800])
        split = trainer.st_split
        check.figures["split"] = split
        if got is not None:
            record: StepRecord = guard.end_step(1)
            check.expect(
                "the guard split the same micro-batch in-process (no restart)",
                split > 1 and os.getpid() == pid,
                f"split into {split} chunks",
            )
            ok, worst_abs, worst_rel, why = _compare(got, ref)
            check.figures.update(
                max_abs_diff=worst_abs, max_rel_diff=worst_rel, loss=loss, loss_unsplit=ref_loss
            )
            check.expect(
                "the split gradients equal the unsplit ones (rtol 1e-5, atol 1e-6)",
                ok,
                why or f"max |diff| {worst_abs:.2e}, max rel {worst_rel:.2e}",
            )
            check.expect(
                "effective batch unchanged: the step record holds every sample of the micro-batch",
                record.samples == size and abs(loss - ref_loss) <= 1e-4 * max(1.0, abs(ref_loss)),
                f"{record.samples}/{size} samples, loss {loss:.6f} vs {ref_loss:.6f} unsplit",
            )
        guard.writer.sync()
        events = [
            r
            for r in iter_records(work / "run" / "telemetry" / "rank-0.jsonl")
            if getattr(r, "name", None) == "reduce_microbatch"
        ]
        errors = [str(e.data.get("error", "")) for e in events]
        check.figures["oom_errors"] = [e[:200] for e in errors]
        check.expect("the worker filed reduce_microbatch events", bool(events), f"{len(events)} events")
        check.cuda(
            ctx,
            "the OOM was a real CUDA one (set_per_process_memory_fraction), not an injected one",
            lambda: (
                bool(errors) and all("CUDA out of memory" in e and "injected" not in e for e in errors),
                errors[0][:200] if errors else "no OOM recorded",
            ),
        )
        # The loop goes on under the same cap, with the split it found kept: no restart, same batches.
        try:
            trainer.train()
            check.expect(
                "training went on under the cap for 4 steps",
                trainer.state.global_step == 4,
                f"{trainer.state.global_step} steps, split {trainer.st_split}",
            )
        except Exception as exc:
            check.expect(
                "training went on under the cap for 4 steps", False, f"{type(exc).__name__}: {exc}"[:800]
            )
    finally:
        if on_gpu:
            torch.cuda.set_per_process_memory_fraction(1.0)
    del trainer
    cuda_free()


# ---------------------------------------------------------------------------- 3. estimator


def step_estimator(ctx: Ctx, check: Check) -> None:
    import torch

    from steadytune.cli.main import main as steadytune_cli

    s = ctx.sizes
    device = "cpu" if ctx.dry else "cuda"
    models_dir = ctx.work / "estimate"
    shapes = {"1B": TINY_A, "3B": TINY_B} if ctx.dry else {"1B": LLAMA_1B, "3B": None}
    paths: dict[str, Path] = {}
    for label, shape in shapes.items():
        if shape is None:
            paths[label] = REPO / "examples" / "models" / "llama-3.2-3b" / "config.json"
            continue
        p = models_dir / label / "config.json"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps(shape))
        paths[label] = p
    has_bnb = importlib.util.find_spec("bitsandbytes") is not None
    cases = [
        (m, method, b, q, False)
        for m in paths
        for method in ("full", "lora", "qlora")
        for b, q in s.estimate_sizes
    ]
    big_b, big_q = s.estimate_sizes[-1]
    cases.append(("1B", "full", big_b, big_q, True))
    rows = []
    for model, method, batch, seq, ckpt in cases:
        key = f"{model} {method} b{batch} s{seq}" + (" +ckpt" if ckpt else "")
        if method == "qlora" and not has_bnb:
            rows.append(
                {
                    "case": key,
                    "status": "skipped",
                    "reason": "bitsandbytes is not installed here (optional: gpu_wheels.sh WITH_BNB=1)",
                }
            )
            continue
        if ctx.left() < (45 if model == "3B" else 25):
            rows.append({"case": key, "status": "skipped", "reason": "time budget spent"})
            continue
        argv = [
            "estimate",
            "--model",
            str(paths[model]),
            "--method",
            method,
            "--batch",
            str(batch),
            "--seq",
            str(seq),
            "--device",
            device,
            "--measure",
            "--format",
            "json",
        ]
        if ckpt:
            argv.append("--gradient-checkpointing")
        cuda_free()
        leftover = torch.cuda.memory_allocated() if device == "cuda" else 0
        out, err = io.StringIO(), io.StringIO()
        t0 = time.time()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = steadytune_cli(argv)
        seconds = time.time() - t0
        found = re.search(r"measured peak (\d+) bytes on (\w+)", err.getvalue())
        try:
            est = json.loads(next(ln for ln in out.getvalue().splitlines() if ln.startswith("{")))
        except (ValueError, StopIteration):
            est = None
        if code != 0 or not found or est is None:
            rows.append({"case": key, "status": "fail", "reason": f"exit {code}: {err.getvalue()[-500:]}"})
            continue
        b = est["breakdown"]
        estimated = est["peak_bytes"] - b.get("cuda_context", 0) - b.get("allocator_margin", 0)
        measured = int(found.group(1))
        error = 100.0 * (estimated - measured) / measured
        rows.append(
            {
                "case": key,
                "status": "measured",
                "device": found.group(2),
                "estimated_bytes": estimated,
                "measured_bytes": measured,
                "error_pct": round(error, 2),
                "seconds": round(seconds, 1),
                "leftover_bytes_before": int(leftover),
            }
        )
        say(
            f"estimate {key}: estimated {estimated / GiB:.2f} GiB, measured {measured / GiB:.2f} GiB "
            f"({error:+.1f}%)"
        )
        # What was measured so far survives a kill at the time limit, marked as cut short.
        partial = Check(check.name)
        judge_estimates(ctx, partial, rows, device)
        partial.expect("the step ran to its end", False, f"cut short after {len(rows)} of {len(cases)} cases")
        ctx.save(partial)
    judge_estimates(ctx, check, rows, device)


def judge_estimates(ctx: Ctx, check: Check, rows: list[dict[str, Any]], device: str) -> None:
    check.figures["cases"] = rows
    measured_rows = [r for r in rows if r["status"] == "measured"]
    failed = [r for r in rows if r["status"] == "fail"]
    check.expect(
        "every case ran through `steadytune estimate --measure`",
        not failed and bool(measured_rows),
        "; ".join(f"{r['case']}: {r['reason'][:200]}" for r in failed) or f"{len(measured_rows)} cases",
    )
    errors = [abs(r["error_pct"]) for r in measured_rows]
    if errors:
        check.figures.update(
            median_abs_error_pct=round(statistics.median(errors), 2),
            worst_abs_error_pct=round(max(errors), 2),
        )
    check.expect(f"every case was measured on {device}", all(r["device"] == device for r in measured_rows))
    reason = "dry run: CPU measurements of tiny stand-in shapes; the goal is for the 1B/3B shapes on a GPU"
    check.cuda(
        ctx,
        "median |error| <= 5%",
        lambda: (bool(errors) and statistics.median(errors) <= 5.0, f"{statistics.median(errors):.2f}%"),
        reason,
    )
    check.cuda(
        ctx,
        "worst |error| <= 10%",
        lambda: (bool(errors) and max(errors) <= 10.0, f"{max(errors):.2f}%"),
        reason,
    )
    skipped = [r for r in rows if r["status"] == "skipped"]
    if skipped:
        check.notes.append("not measured: " + "; ".join(f"{r['case']} ({r['reason']})" for r in skipped))


# ---------------------------------------------------------------------------- 4. memory leak


def step_leak(ctx: Ctx, check: Check) -> None:
    s = ctx.sizes
    a = ctx.assets()
    work = ctx.work / "leak"
    cfg = {
        "model": {"name_or_path": a["demo_model"]},
        "method": "full",
        "data": {"train_file": a["train"], "max_seq_length": 64},
        "train": {
            "learning_rate": 1e-3,
            "per_device_train_batch_size": 4,
            "max_steps": s.leak_steps,
            "save_steps": s.leak_steps,
            "logging_steps": 10,
            "warmup_steps": 2,
        },
        "run": {"runs_dir": str(work / "runs"), "sample_interval_s": 1.0},
        # A shorter warm-up and window than the defaults, so a leak of a few MiB a step is called
        # within tens of steps; the rule itself is the default one.
        "detect": {"memory": {"warmup_points": 5, "window": 32}},
    }
    config = write_yaml(work / "config.yaml", cfg)
    faults = {"leak_mib_per_step": s.leak_mib, "step_sleep_s": s.leak_sleep_s}
    rc = supervised_run(ctx, config, "leak", min(CAPS["leak"] - 30, ctx.left() - 20), faults=faults)
    root = work / "runs" / "leak"
    steps, _, events = load_run(root)
    check.figures.update(leak_mib_per_step=s.leak_mib, steps=len(steps))
    check.expect(
        "the supervised run completed",
        rc == 0 and len(steps) == s.leak_steps,
        f"exit {rc}, {len(steps)}/{s.leak_steps} steps"
        + ("" if rc == 0 else "\n" + tail(ctx.work / "logs" / "run-leak.log")),
    )
    # On a GPU the leak is device memory (allocated bytes); on CPU it is host memory (RSS).
    want = "rss_bytes" if ctx.dry else "mem_allocated_bytes"
    every = [e for e in events if e.kind == "anomaly" and e.name == "memory_leak"]
    leak = [e for e in every if e.data.get("metric") == want]
    check.figures.update(
        leak_step=leak[0].step if leak else None,
        leak_metrics=sorted({str(e.data.get("metric")) for e in every}),
        leak_evidence=leak[0].data.get("evidence") if leak else None,
    )
    check.expect(
        f"memory_leak fired on {want}",
        bool(leak),
        f"at step {leak[0].step}" if leak else f"no memory_leak on {want} ({len(every)} on other metrics)",
    )
    if not leak:
        return
    at = leak[0].step or 0
    acted = [e for e in events if e.kind == "action" and e.name == "reduce_microbatch"]
    saved = [
        e
        for e in events
        if e.name == "checkpoint_saved" and (e.step or 0) >= at and (e.step or 0) < s.leak_steps
    ]
    check.expect("the policy acted (reduce_microbatch: checkpoint now)", bool(acted))
    from steadytune.checkpoint.manifest import verify

    verdict = verify(Path(saved[0].data["path"])) if saved else None
    check.figures["checkpoint"] = Path(saved[0].data["path"]).name if saved else None
    check.expect(
        "a checkpoint was written after the alarm, and it verifies",
        bool(verdict and verdict.ok),
        f"{check.figures['checkpoint']}: "
        f"{'ok' if verdict and verdict.ok else getattr(verdict, 'reason', 'none')}",
    )
    acks = [e for e in events if e.name == "ack_memory_snapshot"]
    check.expect(
        "the worker answered the allocator-snapshot request",
        bool(acks),
        acks[0].message if acks else "no ack_memory_snapshot event",
    )

    def snapshot() -> tuple[bool, str]:
        import pickle

        path = acks[0].data.get("path") if acks else None
        if not path or not Path(path).exists():
            return False, f"no snapshot file ({acks[0].message if acks else 'no ack'})"
        with open(path, "rb") as f:
            snap = pickle.load(f)
        segments = snap.get("segments", [])
        leaked = int(s.leak_mib * MiB)
        blocks = [
            b
            for seg in segments
            for b in seg.get("blocks", [])
            if b.get("size") == leaked and b.get("state") == "active_allocated"
        ]
        reserved = sum(seg.get("total_size", 0) for seg in segments)
        check.figures.update(
            snapshot=Path(path).name,
            snapshot_bytes=Path(path).stat().st_size,
            snapshot_segments=len(segments),
            snapshot_reserved_bytes=reserved,
            snapshot_leaked_blocks=len(blocks),
        )
        ok = bool(segments) and len(blocks) >= at // 2
        return (
            ok,
            f"{len(segments)} segments, {reserved / MiB:.0f} MiB reserved, {len(blocks)} live blocks of "
            f"{s.leak_mib:g} MiB",
        )

    check.cuda(ctx, "the allocator snapshot was saved and reads back, the leaked blocks in it", snapshot)


# ---------------------------------------------------------------------------- 5. overheads


def step_overhead(ctx: Ctx, check: Check) -> None:
    import torch
    from transformers import Trainer, TrainerCallback

    from steadytune.config.load import validate_dict
    from steadytune.guard.checkpoints import CheckpointKeeper
    from steadytune.guard.core import Guard
    from steadytune.guard.gradflow import DEFAULT_INTERVAL, layer_grad_stats
    from steadytune.guard.hf import GuardCallback
    from steadytune.records import PlanRevision
    from steadytune.rundir import RunDir
    from steadytune.train.data import SAMPLE_HASH, SAMPLE_ID, DataSpec, build_dataset, load_tokenizer
    from steadytune.train.runner import Collator, build_trainer, load_model, training_arguments

    s = ctx.sizes
    a = ctx.assets()
    work = ctx.work / "overhead"
    cfg = validate_dict(
        {
            "model": {"name_or_path": a["big_model"], "dtype": "auto" if ctx.dry else "bfloat16"},
            "method": "lora",
            "lora": {"target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]},
            "data": {"train_file": a["long"], "max_seq_length": s.overhead_seq},
            "train": {
                "learning_rate": 1e-4,
                "per_device_train_batch_size": s.overhead_batch,
                "max_steps": s.overhead_steps,
                "save_steps": s.overhead_steps,
                "logging_steps": s.overhead_steps,
                "bf16": not ctx.dry,
            },
            "run": {"runs_dir": str(work)},
        },
        base=work,
    )
    plan = PlanRevision(revision=0, ts=0, reason="start")
    device = "cpu" if ctx.dry else "cuda"

    class StepTimer(TrainerCallback):
        def __init__(self) -> None:
            self.ends: list[float] = []

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.ends.append(time.perf_counter())

    def per_step(timer: StepTimer) -> float:
        gaps = [
            b - a
            for a, b in zip(
                timer.ends[s.overhead_warmup :], timer.ends[s.overhead_warmup + 1 :], strict=False
            )
        ]
        return statistics.median(gaps)

    def bare(i: int) -> float:
        tok = load_tokenizer(cfg.model.name_or_path, cfg.model.trust_remote_code)
        d = cfg.data
        ds = build_dataset(tok, DataSpec(d.train_file, d.format, d.text_field, d.max_seq_length))
        ds = ds.remove_columns([SAMPLE_ID, SAMPLE_HASH])
        args = training_arguments(cfg, plan, work / f"bare-{i}", has_eval=False)
        timer = StepTimer()
        trainer = Trainer(
            model=load_model(cfg, args.gradient_checkpointing),
            args=args,
            train_dataset=ds,
            data_collator=Collator(tok.pad_token_id),
            processing_class=tok,
            callbacks=[timer],
        )
        trainer.train()
        del trainer
        cuda_free()
        return per_step(timer)

    last: dict[str, Any] = {}

    def guarded(i: int) -> float:
        run = RunDir(work / f"guarded-{i}").create()
        guard = Guard(run.root)
        callback = GuardCallback(guard, CheckpointKeeper(run, keep_last=1, min_free_bytes=0), run.staging)
        timer = StepTimer()
        trainer = build_trainer(cfg, plan, guard, [callback, timer], run.staging)
        trainer.train()
        guard.close()
        last["trainer"] = trainer
        return per_step(timer)

    pairs = []
    for i in range(s.overhead_pairs):
        last.pop("trainer", None)
        cuda_free()
        order = ("bare", "guarded") if i % 2 == 0 else ("guarded", "bare")
        t = {arm: (bare if arm == "bare" else guarded)(i) for arm in order}
        pairs.append(
            {
                "order": "/".join(order),
                "bare_ms": round(t["bare"] * 1e3, 3),
                "guarded_ms": round(t["guarded"] * 1e3, 3),
                "overhead_pct": round(100 * (t["guarded"] - t["bare"]) / t["bare"], 3),
            }
        )
        say(f"overhead pair {i + 1}: bare {t['bare'] * 1e3:.2f} ms, guarded {t['guarded'] * 1e3:.2f} ms")
    overhead = statistics.median(p["overhead_pct"] for p in pairs)
    step_s = statistics.median(p["guarded_ms"] for p in pairs) / 1e3
    check.figures.update(
        pairs=pairs,
        median_overhead_pct=round(overhead, 3),
        steps_per_arm=s.overhead_steps,
        warmup_steps=s.overhead_warmup,
        device=device,
    )
    check.expect(f"{len(pairs)} interleaved A/B pairs timed on {device}", len(pairs) >= 3)

    # Gradient flow: one layer_grad_stats call on real gradients, against the step it rides on.
    trainer = last.pop("trainer")
    model = trainer.model
    batch = next(iter(trainer.get_train_dataloader()))
    inputs = {k: batch[k].to(device) for k in ("input_ids", "labels", "attention_mask")}
    model.zero_grad(set_to_none=True)
    with torch.autocast(device, dtype=torch.bfloat16, enabled=not ctx.dry):
        loss = model(**inputs).loss
    loss.backward()
    costs = []
    for _ in range(5):
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        layer_grad_stats(model)
        if device == "cuda":
            torch.cuda.synchronize()
        costs.append(time.perf_counter() - t0)
    cost = statistics.median(costs)
    flow = 100 * cost / (DEFAULT_INTERVAL * step_s)
    check.figures.update(
        gradflow_call_ms=round(cost * 1e3, 3),
        gradflow_interval=DEFAULT_INTERVAL,
        gradflow_overhead_pct=round(flow, 4),
        gradflow_every_step_pct=round(100 * cost / step_s, 2),
    )
    check.notes.append(
        f"Gradient flow is recorded at step 1 and every {DEFAULT_INTERVAL}th: inside the warm-up of the "
        f"{s.overhead_steps}-step arms, so the A/B figure is the guard's per-step cost, and the "
        "gradient-flow figure is one layer_grad_stats call on real gradients spread over its interval."
    )
    del trainer, model, loss
    cuda_free()
    reason = "dry run: CPU timings on a shared machine say nothing about the GPU overhead"
    check.cuda(
        ctx,
        "guard overhead < 1% of the step (median of the pairs)",
        lambda: (overhead < 1.0, f"{overhead:+.3f}%"),
        reason,
    )
    check.cuda(
        ctx,
        f"gradient-flow overhead at its default interval ({DEFAULT_INTERVAL}) < 2%",
        lambda: (flow < 2.0, f"{flow:.4f}%"),
        reason,
    )


# ---------------------------------------------------------------------------- 6. quant-check and later


def step_quant(ctx: Ctx, check: Check) -> None:
    """``quant-check`` on the demo model: int8 and NF4 (bitsandbytes) and, on a GPU that has it, fp8
    (torchao), each against the reference on the demo eval split."""
    import torch

    from steadytune.config import load_config
    from steadytune.quant.measure import check_config
    from steadytune.quant.report import plot, render_text, to_json

    a = ctx.assets()
    on_gpu = torch.cuda.is_available()
    cfg_path = write_yaml(
        ctx.work / "quant" / "quant.yaml",
        {
            # bf16 is the training dtype on a GPU; a CPU scores the reference in float32 either way.
            "model": {"name_or_path": a["demo_model"], "dtype": "bfloat16" if on_gpu else "float32"},
            "method": "qlora",
            "quantization": {"bnb_4bit_compute_dtype": "bfloat16" if on_gpu else "float32"},
            "data": {
                "train_file": a["train"],
                "eval_file": str(Path(a["demo"]) / "eval.jsonl"),
                "max_seq_length": 128,
            },
            "quant": {"candidates": ["int8", "nf4", "fp8"], "max_positions": 512},
        },
    )
    report = check_config(load_config(cfg_path))
    doc = to_json(report)
    (ctx.work / "quant" / "quant.json").write_text(json.dumps(doc, indent=1))
    print(render_text(report), flush=True)
    measured = {c["name"]: c for c in doc["candidates"]}
    skipped = {s["name"]: s["reason"] for s in doc["skipped"]}
    check.figures.update(
        {
            "device": doc["device"],
            "tokens": doc["tokens"],
            "reference_perplexity": round(doc["reference"]["perplexity"], 4),
            "candidates": {
                n: {k: c[k] for k in ("perplexity", "ppl_change", "mean_kl", "p99_kl", "top1",
                                      "weights_bytes", "peak_bytes", "tokens_per_s", "passed")}
                for n, c in measured.items()
            },
            "skipped": skipped,
            "verdict": doc["verdict"],
        }
    )  # fmt: skip
    check.expect("the reference was scored", doc["reference"]["tokens"] >= 16, f"{doc['tokens']} tokens")
    bnb = version_of("bitsandbytes")
    for kind in ("int8", "nf4"):
        if bnb is None:
            check.skip(
                f"{kind} (bitsandbytes) measured",
                "bitsandbytes is not installed here (gpu_wheels.sh WITH_BNB=1)",
            )
            continue
        c = measured.get(kind)
        check.expect(
            f"{kind} (bitsandbytes {bnb}) measured, every figure finite",
            c is not None
            and all(c[k] is not None and math.isfinite(c[k]) for k in ("perplexity", "mean_kl", "p99_kl")),
            skipped.get(kind, "") if c is None else f"ppl {c['ppl_change']:+.3%}, mean KL {c['mean_kl']:.2e}",
        )
    if "int8" in measured and "nf4" in measured:
        check.expect(
            "int8 stays closer to the reference than NF4 (mean KL)",
            measured["int8"]["mean_kl"] < measured["nf4"]["mean_kl"],
            f"{measured['int8']['mean_kl']:.2e} < {measured['nf4']['mean_kl']:.2e}",
        )
    check.cuda(
        ctx,
        "fp8 (torchao) measured on the GPU",
        lambda: ("fp8" in measured, skipped.get("fp8", f"mean KL {measured.get('fp8', {}).get('mean_kl')}")),
    )
    check.cuda(
        ctx,
        "peak memory read from the CUDA allocator for every measured candidate",
        lambda: (bool(measured) and all((c["peak_bytes"] or 0) > 0 for c in measured.values()), ""),
    )
    if ctx.dry:
        check.expect(
            "fp8 skipped with its reason",
            "compute capability" in skipped.get("fp8", ""),
            skipped.get("fp8", ""),
        )
    png = plot(report, ctx.work / "quant" / "quant.png")
    check.expect("the plot was drawn", png.is_file() and png.stat().st_size > 0, str(png))


def check_later(quant: dict[str, Any] | None = None, ledger: dict[str, Any] | None = None) -> Check:
    """Check 6: the results of the quant and ledger steps, each when it ran."""
    check = Check("later")
    for name, result in (("quant", quant), ("ledger", ledger)):
        if result is not None:
            check.assertions += result["assertions"]
            check.figures[name] = result["figures"]
            check.wall_s += result.get("wall_s", 0.0)
    return check


# A stand-in job: holds ``sys.argv[1]`` bytes on the first CUDA device (none on CPU) until stdin closes.
HOLDER = """
import sys
n = int(sys.argv[1])
try:
    import torch
    held = torch.empty(n, dtype=torch.uint8, device="cuda") if torch.cuda.is_available() else None
    if held is not None:
        torch.cuda.synchronize()
except Exception as exc:
    print(f"holder: {exc}", flush=True)
print("ready", flush=True)
sys.stdin.read()
"""


def step_ledger(ctx: Ctx, check: Check) -> None:
    """The server's GPU ledger on real NVML: two processes share the GPU as two jobs would; each is
    matched to its job by pid, charged what it holds, and a third process counts as foreign."""
    from steadytune.server.gpus import NvmlSource
    from steadytune.server.ledger import GIB, Reservation, build_ledger

    source = NvmlSource()
    before = {g.index: g for g in source()}
    check.figures["devices"] = len(before)
    sizes = {"job-a": 1 * GIB, "job-b": 2 * GIB, "foreign": GIB // 2}
    procs: dict[str, subprocess.Popen] = {}
    try:
        for name, n in sizes.items():
            procs[name] = subprocess.Popen(
                [sys.executable, "-c", HOLDER, str(n)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            )  # fmt: skip
        for name, proc in procs.items():
            line = proc.stdout.readline().strip() if proc.stdout else ""
            check.expect(f"{name} holds its memory", line == "ready", line or f"exit {proc.poll()}")
        time.sleep(1.0)  # NVML's process list trails an allocation by a moment
        readings = {g.index: g for g in source()}
        pids = {name: proc.pid for name, proc in procs.items()}
        # Each job promised a little more than it holds: its reservation shrinks by what it holds.
        promise = {"job-a": int(1.5 * GIB), "job-b": int(2.5 * GIB)}
        ledger = build_ledger(
            readings.values(),
            [Reservation(job, 0, need) for job, need in promise.items()],
            {job: [pids[job]] for job in promise},
        )
        gpu0 = ledger[0] if ledger else None

        def seen() -> tuple[bool, str]:
            listed = {p.pid for p in readings[0].processes} if 0 in readings else set()
            missing = {n: pid for n, pid in pids.items() if pid not in listed}
            return not missing, f"listed {sorted(listed)}; missing {missing}" if missing else "all three"

        def charged() -> tuple[bool, str]:
            assert gpu0 is not None
            use = {j: gpu0.job_used.get(j) for j in promise}
            # What a process holds is its allocation plus its CUDA context (a few hundred MiB).
            ok = all(u is not None and sizes[j] <= u <= sizes[j] + GIB for j, u in use.items())
            return ok, f"{ {j: (u or 0) / GIB for j, u in use.items()} } GiB held"

        def outstanding() -> tuple[bool, str]:
            assert gpu0 is not None
            want = sum(max(0, promise[j] - (gpu0.job_used.get(j) or 0)) for j in promise)
            return gpu0.reserved_bytes == want, f"reserved {gpu0.reserved_bytes}, expected {want}"

        def foreign() -> tuple[bool, str]:
            assert gpu0 is not None
            them = {p.pid for p in gpu0.foreign}
            ok = pids["foreign"] in them and not {pids["job-a"], pids["job-b"]} & them
            return ok, f"foreign pids {sorted(them)}"

        def used_rose() -> tuple[bool, str]:
            rise = readings[0].used_bytes - before[0].used_bytes
            return rise >= sum(sizes.values()), f"used rose by {rise / GIB:.2f} GiB"

        check.cuda(ctx, "NVML lists the three processes on GPU 0 by their pids", seen)
        check.cuda(ctx, "each job is charged what its process holds (allocation + context)", charged)
        check.cuda(ctx, "a reservation counts only what its job has not allocated yet", outstanding)
        check.cuda(ctx, "the process in no job is foreign, the two jobs' are not", foreign)
        check.cuda(ctx, "NVML's used memory rose by at least what the three hold", used_rose)
        if gpu0 is not None:
            check.figures.update(
                {
                    "free_gib": round(gpu0.free_bytes / GIB, 2),
                    "reserved_gib": round(gpu0.reserved_bytes / GIB, 2),
                    "available_gib_1g_headroom": round(gpu0.available(GIB) / GIB, 2),
                    "job_used_gib": {j: round((u or 0) / GIB, 3) for j, u in gpu0.job_used.items()},
                }
            )
    finally:
        for proc in procs.values():
            if proc.stdin:
                proc.stdin.close()
        for proc in procs.values():
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


STEP_FUNCS: dict[str, Callable[[Ctx, Check], None]] = {
    "probe": step_probe,
    "assets": step_assets,
    "telemetry": step_telemetry,
    "oom": step_oom,
    "estimator": step_estimator,
    "leak": step_leak,
    "overhead": step_overhead,
    "quant": step_quant,
    "ledger": step_ledger,
}

"""The Ray driver: ``python -m steadytune.engines.ray_driver --run-dir runs/<id>``.

Started by the supervisor as its attempt's process (``supervise/ray_source.py``). It joins
an existing Ray cluster and fits one Ray Train V2 ``TorchTrainer`` whose workers each run
``engines/ray_worker.py train_loop``: placement, rendezvous, elastic resizing and restarts
after a lost node are Ray's; each worker writes its own ``telemetry/rank-N.jsonl`` and the
checkpoints land in the run directory with their manifest, as a native worker's do.

Exit 0: the training function returned on every worker (completed, or stopped/paused on
request: the streams say which); 1: Ray gave up (``ray.max_failures`` spent, or an error).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from steadytune.config.schema import RayConfig
from steadytune.records import PlanRevision, to_dict
from steadytune.rundir import RunDir
from steadytune.telemetry.stream import latest_plan

# What the workers need from the driver's environment (a Ray worker starts with its raylet's).
# RAY_TRAIN_ reaches Ray's controller too (e.g. RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S).
_PASSED = ("STEADYTUNE_", "HF_", "TRANSFORMERS_", "TOKENIZERS_", "PYTHONPATH", "RAY_TRAIN_")


def missing_ray() -> str:
    return "run.engine: ray needs Ray Train: pip install 'steadytune[ray]' (ray[train] 2.60 or newer)"


def cluster_address(cfg: RayConfig, environ: dict[str, str]) -> str:
    """``ray.address``, else ``$RAY_ADDRESS``, else ``auto`` (the cluster this host belongs to)."""
    return cfg.address or environ.get("RAY_ADDRESS") or "auto"


def passed_env(environ: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in environ.items() if k.startswith(_PASSED)}


def trainer_kwargs(cfg: RayConfig, run: RunDir, plan: PlanRevision) -> dict[str, Any]:
    """The TorchTrainer's arguments, as plain values (the unit tests read them without Ray)."""
    scaling: dict[str, Any] = {"num_workers": cfg.num_workers, "use_gpu": cfg.use_gpu}
    if cfg.resources_per_worker:
        scaling["resources_per_worker"] = dict(cfg.resources_per_worker)
    if not isinstance(cfg.num_workers, int):
        scaling["elastic_resize_monitor_interval_s"] = cfg.elastic_resize_monitor_interval_s
    return {
        "train_loop_config": {"run_dir": str(run.root.resolve()), "plan": to_dict(plan)},
        "scaling": scaling,
        "run": {
            "name": run.run_id,
            "storage_path": cfg.storage_path or str((run.root / "ray").resolve()),
            "max_failures": cfg.max_failures,
        },
    }


def forward_requests(run: RunDir, attempt: int, stop: threading.Event, every_s: float = 1.0) -> None:
    """Make each resource request the scale rules write for this driver (engines/requests.py) of Ray's
    autoscaler, until ``stop``; a thread of the driver, the one process of the job that is in Ray."""
    from ray.autoscaler.sdk import request_resources

    from steadytune.engines.requests import RequestInbox

    inbox = RequestInbox(run.root, attempt)
    while not stop.wait(every_s):
        req = inbox.new()
        if req is None:
            continue
        try:
            request_resources(bundles=[dict(b) for b in req.bundles])
        except Exception as exc:  # a request Ray refused is reported, and the training goes on
            print(f"Ray refused the resource request {req.seq}: {type(exc).__name__}: {exc}", flush=True)
            continue
        held = recorded_request()
        inbox.made(req, time.time(), recorded=held)
        print(
            f"asked Ray for {req.workers} worker(s)' resources: {list(req.bundles)}; Ray holds {held}",
            flush=True,
        )


def recorded_request() -> list[dict[str, float]] | None:
    """The autoscaler's resource request as Ray holds it now, read back where request_resources put it
    (Ray 2.60: the GCS's cluster constraints with autoscaler v2, else the internal KV); None if unreadable."""
    import json

    try:
        from ray.autoscaler.v2.utils import is_autoscaler_v2
        from ray.experimental.internal_kv import _internal_kv_get, internal_kv_get_gcs_client

        if is_autoscaler_v2():
            from ray.autoscaler.v2.sdk import get_cluster_status

            status = get_cluster_status(internal_kv_get_gcs_client().address)
            return [
                dict(r.bundle)
                for demand in status.resource_demands.cluster_constraint_demand
                for r in demand.bundles_by_count
                for _ in range(r.count)
            ]
        from ray._private.ray_constants import AUTOSCALER_RESOURCE_REQUEST_CHANNEL

        raw = _internal_kv_get(AUTOSCALER_RESOURCE_REQUEST_CHANNEL)
        return list(json.loads(raw)) if raw else []
    except Exception:  # a reading that is unavailable is a value, not a failed request
        return None


def clear_request(run: RunDir, attempt: int) -> None:
    """A job that ended asks for nothing more: the rules' request would otherwise hold the cluster's
    size (it persists in Ray until replaced)."""
    from steadytune.engines.requests import requested_path

    if not requested_path(run.root, attempt).exists():
        return
    from ray.autoscaler.sdk import request_resources

    try:
        request_resources(bundles=[])
    except Exception as exc:  # the driver is ending either way
        print(f"could not clear the resource request: {type(exc).__name__}: {exc}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="steadytune-ray-driver")
    parser.add_argument("--run-dir", required=True, type=Path)
    args = parser.parse_args(argv)
    run = RunDir(args.run_dir)
    from steadytune.config.load import load_config

    cfg = load_config(run.config, check_paths=False)
    plan = latest_plan(run)
    os.environ.setdefault("RAY_TRAIN_V2_ENABLED", "1")  # before ray.train is imported: V2 is the API we use
    try:
        import ray
        from ray.train import FailureConfig, RunConfig, ScalingConfig
        from ray.train.torch import TorchTrainer
    except ImportError:
        print(missing_ray(), file=sys.stderr)
        return 1

    from steadytune.engines.ray_callback import GroupFailures
    from steadytune.engines.ray_worker import train_loop

    kw = trainer_kwargs(cfg.ray, run, plan)
    address = cluster_address(cfg.ray, dict(os.environ))
    ray.init(address=address, runtime_env={"env_vars": passed_env(dict(os.environ))}, log_to_driver=True)
    print(f"joined the Ray cluster at {address}: {ray.cluster_resources()}", flush=True)
    # The supervisor's stop is a control request the workers take at a step boundary (they save, then
    # return); its SIGTERM to this driver must not end the job before they have.
    signal.signal(signal.SIGTERM, lambda *_: print("stop requested: the workers save and return", flush=True))
    trainer = TorchTrainer(
        train_loop,
        train_loop_config=kw["train_loop_config"],
        scaling_config=ScalingConfig(**kw["scaling"]),
        run_config=RunConfig(
            name=kw["run"]["name"],
            storage_path=kw["run"]["storage_path"],
            failure_config=FailureConfig(max_failures=kw["run"]["max_failures"]),
            # Ray types callbacks as its Tune Callback; a Train UserCallback is what Ray Train takes.
            callbacks=[GroupFailures(kw["train_loop_config"]["run_dir"], plan.attempt)],  # type: ignore[list-item]
        ),
    )
    stop = threading.Event()
    forwarder = threading.Thread(target=forward_requests, args=(run, plan.attempt, stop), daemon=True)
    if cfg.scale is not None:  # only the scale rules write requests
        forwarder.start()
    try:
        result = trainer.fit()
    except Exception as exc:  # Ray raises once max_failures is spent (TrainingFailedError)
        print(f"Ray Train gave up: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        return 1
    finally:
        stop.set()
        if forwarder.is_alive():
            forwarder.join(timeout=10)
        clear_request(run, plan.attempt)
        ray.shutdown()
    if result.error is not None:
        print(f"Ray Train gave up: {result.error}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

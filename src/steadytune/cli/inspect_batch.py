"""``steadytune inspect-batch RUN --step N``: which data made this step go wrong."""

from __future__ import annotations

import argparse
import json
import math
from typing import Any

from steadytune.cli._common import add_command, add_format, fail


def register(sub: Any) -> None:
    p = add_command(
        sub,
        "inspect-batch",
        "reload the samples of one step and check each of them",
        "steadytune inspect-batch runs/my-run --step 120 --format json",
        description="Reload exactly the samples of a step (by the recorded ids and content hashes) and check "
        "them: empty inputs, all labels masked, ids outside the vocabulary, NaN features, truncation, "
        "floods of "
        "special or repeated tokens, encoding errors, and samples that changed since the run. Sample text is "
        "shown only with --show-text.",
    )
    p.add_argument("run", help="the run directory (runs/<run-id>)")
    p.add_argument(
        "--step",
        type=int,
        default=None,
        help="the optimizer step; default: the last step where something went wrong",
    )
    p.add_argument(
        "--attempt",
        type=int,
        default=None,
        help="the worker attempt to read (default: the one running when the step went wrong, else the "
        "latest)",
    )
    p.add_argument(
        "--show-text", action="store_true", help="print the raw samples (off: hashes and token counts)"
    )
    p.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="let the model folder's own Python (auto_map) run to load its tokenizer; the run's "
        "config.yaml never turns this on",
    )
    add_format(p)
    p.set_defaults(func=main)


def _num(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:.4g}" if math.isfinite(x) else str(x)


def render(verdict: Any) -> str:
    lines = [
        f"run {verdict.run_id}  step {verdict.step} (attempt {verdict.attempt})  loss {_num(verdict.loss)}  "
        f"grad_norm {_num(verdict.grad_norm)}" + ("  update skipped" if verdict.skipped else ""),
        f"dataset {verdict.dataset}",
        "",
    ]
    if verdict.samples:
        lines.append(
            f"  {'sample':>8}  {'verdict':<8} {'tokens':>6} {'trained':>7} {'hash':<16} {'now':<4} findings"
        )
    for s in verdict.samples:
        st = s.stats
        same = (
            "-"
            if not (s.recorded_hash and s.current_hash)
            else ("same" if s.recorded_hash == s.current_hash else "DIFF")
        )
        lines.append(
            f"  {s.sample_id:>8}  {s.verdict.upper():<8} {st.tokens if st else '-':>6} "
            f"{st.trained if st else '-':>7} {s.recorded_hash or '-':<16} {same:<4} "
            + ("; ".join(f.check for f in s.findings) or "-")
        )
        for f in s.findings:
            lines.append(f"  {'':>8}    {f.level}: {f.check}: {f.message}")
        if s.text is not None:
            for key, value in s.text.items():
                lines.append(f"  {'':>8}    {key}: {json.dumps(value, ensure_ascii=False)}")
    for f in verdict.findings:
        lines.append(f"  batch: {f.level}: {f.check}: {f.message}")
    for note in verdict.notes:
        lines.append(f"  note: {note}")
    lines += ["", f"verdict: {verdict.summary}"]
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    from steadytune.forensics.inspect import inspect_step
    from steadytune.forensics.runview import ForensicsError, anomaly_attempt, anomaly_steps, resolve_run
    from steadytune.telemetry.events import read_events

    try:
        run = resolve_run(args.run)
        events = read_events(run.events)
        step = args.step
        if step is None:
            found = anomaly_steps(run, events)
            if not found:
                return fail(f"nothing went wrong in {run.root} that I can see; pass --step N", 2)
            step = found[-1]
        attempt = args.attempt if args.attempt is not None else anomaly_attempt(events, step)
        verdict = inspect_step(
            run,
            step,
            show_text=args.show_text,
            allow_transformers=True,
            attempt=attempt,
            trust_remote_code=args.trust_remote_code,
        )
    except ForensicsError as exc:
        return fail(str(exc))
    if args.format == "json":
        print(json.dumps(verdict.to_dict(), indent=1, ensure_ascii=False))
    else:
        print(render(verdict))
    return 1 if verdict.verdict == "unknown" else 0

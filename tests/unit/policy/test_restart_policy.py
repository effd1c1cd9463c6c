from __future__ import annotations

import signal

from steadytune.policy.restart import ExitInfo, backoff, classify, decide


def test_classification_table() -> None:
    assert classify(ExitInfo(0, status="completed")) == "completed"
    assert classify(ExitInfo(-signal.SIGKILL)) == "killed"
    assert classify(ExitInfo(137)) == "killed"  # torchrun / shells: 128 + 9
    assert classify(ExitInfo(247)) == "killed"  # `swift sft`: sys.exit(-9), its child's returncode
    assert classify(ExitInfo(245)) == "signal_SIGSEGV"  # sys.exit(-11)
    # A launcher (accelerate launch under axolotl, torch elastic) that outlived its SIGKILLed trainer.
    wrapped = (
        "subprocess.CalledProcessError: Command '['python', '-m', 'axolotl.cli.train', 'c.yml']' "
        "died with <Signals.SIGKILL: 9>."
    )
    assert classify(ExitInfo(1, error_type="CalledProcessError", stderr_tail=wrapped)) == "killed"
    elastic = "exitcode  : -9 (pid: 4242)\n  traceback : Signal 9 (SIGKILL) received by PID 4242"
    assert classify(ExitInfo(1, error_type="ChildFailedError", stderr_tail=elastic)) == "killed"
    assert classify(ExitInfo(1, stderr_tail="returned non-zero exit status -90")) == "exit_nonzero"
    assert (
        classify(
            ExitInfo(1, status="error", error_type="OutOfMemoryError", error_message="CUDA out of memory.")
        )
        == "oom"
    )
    assert (
        classify(
            ExitInfo(1, stderr_tail="RuntimeError: CUDA error: an illegal memory access was encountered")
        )
        == "cuda_error"
    )
    assert (
        classify(ExitInfo(1, stderr_tail="[Rank 0] Watchdog caught collective operation timeout"))
        == "collective_timeout"
    )
    assert classify(ExitInfo(1, status="error", error_type="RuntimeError")) == "python_error"
    assert classify(ExitInfo(-signal.SIGSEGV)) == "signal_SIGSEGV"
    assert classify(ExitInfo(-signal.SIGTERM, interrupted=True)) == "user_interrupt"


def test_backoff_doubles_and_caps() -> None:
    assert [backoff(i, 1.0, 10.0) for i in range(6)] == [1, 2, 4, 8, 10, 10]
    assert backoff(3, 0.0, 10.0) == 0.0


def test_restart_until_the_budget_is_spent() -> None:
    kill = ExitInfo(-signal.SIGKILL, step=10)
    d = decide(kill, [], restarts_used=0, max_restarts=3, backoff_s=2)
    assert (d.action, d.classification, d.delay_s) == ("restart", "killed", 2)
    d = decide(kill, [kill, kill, kill], restarts_used=3, max_restarts=3)
    assert d.action == "stop" and "budget (3)" in d.reason


def test_deterministic_errors_stop_at_once() -> None:
    setup = ExitInfo(
        1, status="error", error_type="DataError", error_message="bad column", deterministic=True
    )
    d = decide(setup, [], 0, 3)
    assert d.action == "stop" and d.classification == "deterministic" and "bad column" in d.reason


def test_same_error_at_same_step_twice_is_deterministic() -> None:
    a = ExitInfo(1, status="error", error_type="RuntimeError", step=12)
    assert decide(a, [], 0, 3).action == "restart"
    d = decide(a, [a], 1, 3)
    assert d.action == "stop" and "twice" in d.reason
    other_step = ExitInfo(1, status="error", error_type="RuntimeError", step=30)
    assert decide(other_step, [a], 1, 3).action == "restart"


def test_requested_stop_and_completion_are_done() -> None:
    assert decide(ExitInfo(0, status="stopped", step=7), [], 0, 3).action == "done"
    assert decide(ExitInfo(-signal.SIGKILL, interrupted=True), [], 0, 3).action == "stop"


def test_a_command_that_fails_before_its_first_step_is_told_by_its_exit_code_or_signal() -> None:
    # A supervised `sh -c '...; exit 3'` read "error before the first step": its code was nowhere.
    said = decide(ExitInfo(3, deterministic=True), [], 0, 3)
    assert said.action == "stop"
    assert said.reason.startswith("the worker exited with code 3 before the first step of the attempt")
    killed = decide(ExitInfo(-int(signal.SIGSEGV), deterministic=True), [], 0, 3)
    assert killed.reason.startswith("the worker was killed by SIGSEGV before the first step")
    python = decide(ExitInfo(1, error_type="ValueError", error_message="bad", deterministic=True), [], 0, 3)
    assert python.reason.startswith("ValueError before the first step of the attempt: bad")

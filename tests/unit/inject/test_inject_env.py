"""The injection's environment and startup hook, in fresh interpreters (no training here)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from steadytune.inject import RUN_ENV, STARTUP_DIR, inject_env
from steadytune.inject.env import PACKAGE_DIR, package_root
from tests.fresh import fresh_imports

SRC = PACKAGE_DIR.parent


def _python(code: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=cwd, timeout=120
    )


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("STEADYTUNE_INJECT")}


def test_ours_come_first_and_the_callers_path_is_kept(tmp_path: Path) -> None:
    theirs = os.pathsep.join(["/opt/tool/lib", str(SRC), "/opt/other"])
    env = inject_env(tmp_path / "run", 3, {"PYTHONPATH": theirs})
    assert env["PYTHONPATH"].split(os.pathsep) == [str(STARTUP_DIR), str(SRC), "/opt/tool/lib", "/opt/other"]
    assert env[RUN_ENV] == str((tmp_path / "run").resolve()) and env["STEADYTUNE_ATTEMPT"] == "3"
    assert inject_env(tmp_path / "run", 0, {})["PYTHONPATH"].split(os.pathsep) == [str(STARTUP_DIR), str(SRC)]


def test_an_installed_package_is_linked_alone_not_its_site_packages(tmp_path: Path) -> None:
    site = tmp_path / "site-packages"
    (site / "steadytune").mkdir(parents=True)
    (site / "torch").mkdir()
    (site / "steadytune-0.1.0.dist-info").mkdir()
    root = package_root(site / "steadytune", tmp_path / "links")
    assert root.parent == tmp_path / "links"
    assert sorted(p.name for p in root.iterdir()) == ["steadytune"]
    assert (root / "steadytune").resolve() == (site / "steadytune").resolve()
    assert package_root(site / "steadytune", tmp_path / "links") == root  # again: the link is reused
    (site / "torch").rmdir()
    assert package_root(site / "steadytune", tmp_path / "links") == site  # a src/ layout is used as it is


def test_the_supervisor_side_of_injection_is_torch_free() -> None:
    assert fresh_imports("import steadytune.inject\n") == []


PROBE = (
    "import sys\n"
    "print('transformers' in sys.modules, 'steadytune' in sys.modules,"
    " any(type(f).__name__ == 'PostImportHook' for f in sys.meta_path))\n"
)


def test_inert_without_a_run_directory(tmp_path: Path) -> None:
    env = {**_clean_env(), **inject_env(tmp_path / "run", 0, {})}
    del env[RUN_ENV]
    out = _python(PROBE, env, tmp_path)
    assert out.returncode == 0 and out.stdout.split() == ["False", "False", "False"] and out.stderr == ""


def test_armed_but_lazy_when_the_program_never_imports_transformers(tmp_path: Path) -> None:
    env = {**_clean_env(), **inject_env(tmp_path / "run", 0, {})}
    out = _python(PROBE, env, tmp_path)
    assert out.returncode == 0 and out.stdout.split() == ["False", "True", "True"], out.stderr
    assert out.stderr == "" and not (tmp_path / "run").exists()  # nothing written until a Trainer exists
    off = _python(PROBE, {**env, "STEADYTUNE_INJECT": "off"}, tmp_path)
    assert off.stdout.split() == ["False", "False", "False"]


def test_the_shadowed_sitecustomize_still_runs(tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "sitecustomize.py").write_text("import os\nos.environ['THEIRS_RAN'] = __file__\n")
    env = {**_clean_env(), **inject_env(tmp_path / "run", 0, {"PYTHONPATH": str(theirs)})}
    code = PROBE + "import os, sitecustomize\nprint(os.environ.get('THEIRS_RAN'), sitecustomize.__file__)\n"
    out = _python(code, env, tmp_path)
    lines = out.stdout.splitlines()
    assert out.returncode == 0 and lines[0].split() == ["False", "True", "True"], out.stderr
    assert lines[1].split() == [str(theirs / "sitecustomize.py")] * 2
    where = _python("import sys; print(sys.path[1])", env, tmp_path)  # [0] is the -c program's ''
    assert where.stdout.strip() == str(STARTUP_DIR)  # back on the path where it was


def test_a_failure_is_one_line_and_the_program_runs(tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    (broken / "steadytune" / "inject").mkdir(parents=True)
    (broken / "steadytune" / "__init__.py").write_text("")
    (broken / "steadytune" / "inject" / "__init__.py").write_text("raise ImportError('no such thing')\n")
    env = {**_clean_env(), RUN_ENV: str(tmp_path / "run"), "PYTHONPATH": f"{STARTUP_DIR}{os.pathsep}{broken}"}
    out = _python("print('ran')", env, tmp_path)
    assert out.returncode == 0 and out.stdout == "ran\n"
    assert out.stderr == "steadytune: guard not injected: ImportError: no such thing\n"


def test_the_shim_is_a_private_folder_outside_the_run_holding_only_the_link(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run folder's ``inject/lib`` came first on the trainer's path: whoever could write the
    run folder ran code in the trainer (a planted ``json.py``)."""
    import stat

    monkeypatch.setenv("STEADYTUNE_CACHE", str(tmp_path / "cache"))
    site = tmp_path / "site-packages"
    (site / "steadytune").mkdir(parents=True)
    (site / "torch").mkdir()
    run = tmp_path / "run"
    (run / "inject" / "lib").mkdir(parents=True)
    (run / "inject" / "lib" / "json.py").write_text("raise SystemExit('planted')\n")
    paths = [
        Path(p)
        for p in inject_env(run, 0, {}, package_dir=site / "steadytune")["PYTHONPATH"].split(os.pathsep)
    ]
    assert not any(p.resolve().is_relative_to(run.resolve()) for p in paths), paths
    shim = paths[1]
    assert stat.S_IMODE(shim.lstat().st_mode) == 0o700 and not shim.is_symlink()
    assert [p.name for p in shim.iterdir()] == ["steadytune"]
    (shim / "json.py").write_text("raise SystemExit('planted')\n")  # planted later: not kept
    again = inject_env(run, 1, {}, package_dir=site / "steadytune")["PYTHONPATH"].split(os.pathsep)[1]
    assert [p.name for p in Path(again).iterdir()] == ["steadytune"]

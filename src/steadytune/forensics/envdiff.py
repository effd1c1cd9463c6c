"""Reading ``env.json``: show it, compare two, export pinned requirements. Torch-free, pure.

The environment that trained is the command's for a ``supervise`` run whose
interpreter could be read (``env["command"]``), and the top-level one otherwise
(:func:`trained_env`). Package names compare in their normalized form (PEP 503:
``Foo_Bar`` is ``foo-bar``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from steadytune.telemetry.envsnap import KEY_PACKAGES

# What `env diff` compares besides packages, and how each is labelled.
RUNTIME_FIELDS: tuple[tuple[str, str, str], ...] = (
    ("python", "version", "python"),
    ("torch", "torch", "torch"),
    ("torch", "cuda_build", "CUDA (torch build)"),
    ("torch", "cudnn", "cuDNN"),
    ("torch", "nccl", "NCCL"),
    ("nvml", "driver", "driver"),
    ("nvml", "gpus", "GPUs"),
    ("torch", "devices", "devices torch sees"),
    ("os", "platform", "OS"),
)
GIT_FIELDS = ("commit", "branch", "dirty", "diff_sha256")
NA = "n/a"


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def trained_env(env: dict[str, Any]) -> dict[str, Any]:
    """The part of ``env`` that describes the training process's interpreter."""
    cmd = env.get("command")
    if isinstance(cmd, dict) and isinstance(cmd.get("packages"), list):  # read (a bare venv has none)
        return cmd
    return env


def package_map(env: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """``normalized name -> (name as installed, version)`` of the training interpreter."""
    out: dict[str, tuple[str, str]] = {}
    for item in trained_env(env).get("packages") or []:
        name, sep, version = str(item).partition("==")
        if sep and name:
            out[normalize(name)] = (name, version)
    return out


@dataclass(frozen=True)
class EnvDiff:
    """What changed from environment A to B."""

    added: dict[str, str] = field(default_factory=dict)  # name -> version in B
    removed: dict[str, str] = field(default_factory=dict)  # name -> version in A
    changed: dict[str, tuple[str, str]] = field(default_factory=dict)  # name -> (A, B)
    runtime: dict[str, tuple[Any, Any]] = field(default_factory=dict)  # label -> (A, B)
    git: dict[str, tuple[Any, Any]] = field(default_factory=dict)  # field -> (A, B)

    @property
    def same(self) -> bool:
        return not (self.added or self.removed or self.changed or self.runtime or self.git)

    def package_names(self) -> list[str]:
        """Every package that was added, removed or changed, sorted."""
        return sorted({*self.added, *self.removed, *self.changed})

    def to_dict(self) -> dict[str, Any]:
        return {
            "same": self.same,
            "packages": {
                "added": self.added,
                "removed": self.removed,
                "changed": {k: {"a": a, "b": b} for k, (a, b) in self.changed.items()},
            },
            "runtime": {k: {"a": a, "b": b} for k, (a, b) in self.runtime.items()},
            "git": {k: {"a": a, "b": b} for k, (a, b) in self.git.items()},
        }


def _get(env: dict[str, Any], section: str, key: str) -> Any:
    part = trained_env(env).get(section)
    return part.get(key) if isinstance(part, dict) else None


def key_first(names: dict[str, Any]) -> list[str]:
    """``names`` with the packages that change numerics (torch, transformers, ...) first."""
    key = {normalize(k) for k in KEY_PACKAGES}
    return sorted(names, key=lambda n: (normalize(n) not in key, normalize(n)))


def diff_packages(
    a: dict[str, Any], b: dict[str, Any]
) -> tuple[dict[str, str], dict[str, str], dict[str, tuple[str, str]]]:
    pa, pb = package_map(a), package_map(b)
    added = {pb[k][0]: pb[k][1] for k in sorted(pb.keys() - pa.keys())}
    removed = {pa[k][0]: pa[k][1] for k in sorted(pa.keys() - pb.keys())}
    changed = {pb[k][0]: (pa[k][1], pb[k][1]) for k in sorted(pa.keys() & pb.keys()) if pa[k][1] != pb[k][1]}
    return (
        {n: added[n] for n in key_first(added)},
        {n: removed[n] for n in key_first(removed)},
        {n: changed[n] for n in key_first(changed)},
    )


def diff_envs(a: dict[str, Any], b: dict[str, Any]) -> EnvDiff:
    """What changed from ``a`` to ``b`` (two ``env.json`` documents)."""
    added, removed, changed = diff_packages(a, b)
    runtime = {}
    for section, key, label in RUNTIME_FIELDS:
        va, vb = _get(a, section, key), _get(b, section, key)
        if va != vb:
            runtime[label] = (va, vb)
    ga, gb = a.get("git") or {}, b.get("git") or {}
    git = {k: (ga.get(k), gb.get(k)) for k in GIT_FIELDS if ga.get(k) != gb.get(k)}
    return EnvDiff(added, removed, changed, runtime, git)


def show(value: Any) -> str:
    if value is None or value == "" or value == []:
        return NA
    if isinstance(value, list):
        return ", ".join(str(v) for v in value)
    return str(value)


def render_diff(d: EnvDiff, name_a: str, name_b: str) -> str:
    """``env diff`` as text: packages, then torch/CUDA/driver, then git."""
    if d.same:
        return f"{name_a} and {name_b} ran in the same environment (packages, torch/CUDA, driver, git).\n"
    lines = [f"environment {name_a} → {name_b}"]
    if d.added or d.removed or d.changed:
        lines.append(f"packages: {len(d.added)} added, {len(d.removed)} removed, {len(d.changed)} changed")
        lines += [f"  ~ {n} {va} → {vb}" for n, (va, vb) in d.changed.items()]
        lines += [f"  + {n}=={v}" for n, v in d.added.items()]
        lines += [f"  - {n}=={v}" for n, v in d.removed.items()]
    else:
        lines.append("packages: the same")
    if d.runtime:
        lines.append("runtime:")
        lines += [f"  {label}: {show(va)} → {show(vb)}" for label, (va, vb) in d.runtime.items()]
    if d.git:
        lines.append("git:")
        for k, (va, vb) in d.git.items():
            if k == "diff_sha256":
                lines.append("  uncommitted changes differ (see each run's env.json git.diff)")
            elif k == "commit":
                lines.append(f"  commit: {show(va)[:12]} → {show(vb)[:12]}")
            else:
                lines.append(f"  {k}: {show(va)} → {show(vb)}")
    return "\n".join(lines) + "\n"


def render_env(env: dict[str, Any], name: str, all_packages: bool = False) -> str:
    """``env RUN`` as text: the readings that matter first, then the packages."""
    t = trained_env(env)
    py, osd = t.get("python") or {}, t.get("os") or {}
    torch, nvml = t.get("torch") or {}, t.get("nvml") or {}
    lines = [f"environment of {name}" + (" (the supervised command's interpreter)" if t is not env else "")]
    rows = [
        ("python", f"{show(py.get('version'))} ({show(py.get('executable'))})"),
        ("os", show(osd.get("platform"))),
        ("torch", show(torch.get("torch"))),
        ("CUDA (torch build)", show(torch.get("cuda_build"))),
        ("cuDNN", show(torch.get("cudnn"))),
        ("NCCL", show(torch.get("nccl"))),
        ("driver", show(nvml.get("driver"))),
        ("GPUs", show(nvml.get("gpus") or torch.get("devices"))),
    ]
    if torch.get("error"):
        rows.append(("torch reading", f"failed: {torch['error']}"))
    if t is not env and t.get("error"):
        rows.append(("command", f"not read: {t['error']}"))
    git = env.get("git")
    if git:
        state = "dirty" if git.get("dirty") else "clean"
        size = f", {git.get('diff_bytes', 0)} B of uncommitted diff" if git.get("diff_bytes") else ""
        trunc = " (cut to fit)" if git.get("diff_truncated") else ""
        rows.append(
            ("git", f"{show(git.get('commit'))[:12]} on {show(git.get('branch'))}, {state}{size}{trunc}")
        )
        rows.append(("repository", show(git.get("root"))))
    else:
        rows.append(("git", "not in a git working tree"))
    key = {k: v for k, v in (t.get("key_packages") or {}).items() if v}
    rows.append(("key packages", ", ".join(f"{k} {v}" for k, v in key.items()) or NA))
    width = max(len(k) for k, _ in rows)
    lines += [f"  {k:<{width}}  {v}" for k, v in rows]
    pkgs = t.get("packages") or []
    if all_packages:
        lines.append(f"packages ({len(pkgs)}):")
        lines += [f"  {p}" for p in pkgs]
    else:
        lines.append(f"packages: {len(pkgs)} installed (--all lists them; `steadytune env export` pins them)")
    return "\n".join(lines) + "\n"


def requirements(env: dict[str, Any], source: str) -> str:
    """A ``requirements.txt`` pinning every package of the training interpreter.

    A package installed from a folder or a VCS is written as a comment, since
    ``name==version`` of it is on no index; so is anything pip cannot parse.
    """
    t = trained_env(env)
    local = {normalize(k): v for k, v in (t.get("local_packages") or {}).items()}
    torch = (t.get("torch") or {}).get("torch") or ""
    py = (t.get("python") or {}).get("version") or NA
    lines = [
        f"# pinned from {source} (python {py})",
        "# pip install -r requirements.txt",
    ]
    if "+" in torch:
        # A local version label (+cu124, +cpu) lives on the PyTorch index, not on PyPI.
        tag = torch.split("+", 1)[1]
        lines.append(f"--extra-index-url https://download.pytorch.org/whl/{tag}")
    skipped = []
    for key, (name, version) in sorted(package_map(env).items()):
        if key in local:
            skipped.append(f"# {name}=={version}  (installed from {local[key]}; install it from there)")
        else:
            lines.append(f"{name}=={version}")
    return "\n".join([*lines, *skipped]) + "\n"

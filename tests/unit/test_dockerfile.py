"""The Dockerfile: every path it copies exists, and it runs steadytune as a non-root user with a
healthcheck."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = (REPO / "Dockerfile").read_text()
    text = re.sub(
        r"\\\n", " ", "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    )
    out = []
    for line in text.splitlines():
        if line.strip():
            word, _, rest = line.strip().partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_every_copied_path_exists_and_is_not_docker_ignored() -> None:
    copies = [args for word, args in instructions() if word in ("COPY", "ADD")]
    assert copies
    ignore = (REPO / ".dockerignore").read_text().splitlines()
    for args in copies:
        *sources, _dest = [w for w in shlex.split(args) if not w.startswith("--")]
        for src in sources:
            assert (REPO / src).exists(), f"COPY {src}: no such path in the repository"
            assert f"!{src.rstrip('/')}/" in ignore or f"!{src}" in ignore, (
                f"{src} is excluded by .dockerignore"
            )
            tracked = subprocess.run(
                ["git", "ls-files", src], cwd=REPO, capture_output=True, text=True
            ).stdout
            assert tracked.strip(), f"{src} is not tracked by git: a fresh clone could not build the image"


def test_entrypoint_user_healthcheck_and_pinned_torch() -> None:
    ins = instructions()
    words = [w for w, _ in ins]
    assert words[0] in ("ARG", "FROM") and "FROM" in words
    base = next(a for w, a in ins if w == "ARG" and a.startswith("BASE_IMAGE="))
    assert "nvidia/cuda:" in base and "runtime" in base
    entry = next(a for w, a in ins if w == "ENTRYPOINT")
    assert "steadytune" in entry
    health = next(a for w, a in ins if w == "HEALTHCHECK")
    assert "/healthz" in health and "CMD" in health
    user = [a for w, a in ins if w == "USER"]
    assert user and user[-1] not in ("root", "0")
    assert words.index("USER") > max(
        i for i, w in enumerate(words) if w == "RUN" and "pip install" in ins[i][1]
    )
    torch = next(a for w, a in ins if w == "ARG" and a.startswith("TORCH_VERSION="))
    assert re.fullmatch(r"TORCH_VERSION=\d+\.\d+\.\d+", torch)
    pyproject = (REPO / "pyproject.toml").read_text()
    assert f'"torch=={torch.split("=")[1]}"' in pyproject  # the image pins the torch the train extra pins
    assert "7860" in next(a for w, a in ins if w == "EXPOSE")

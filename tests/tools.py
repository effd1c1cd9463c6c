"""Real third-party training CLIs, each in a virtualenv of its own, built once and reused.

The tests install the tools the way a user does, from the package index, so a clean
machine proves them from nothing. torch is pinned first (and by a constraints file
for every later install): an unpinned torch, or a package that depends on
torchvision/torchaudio, would pull a multi-GB CUDA build. A venv is reused while its
requirements are unchanged (``.cache/tool-venvs/<name>-<hash>`` in the repository, or
``$STEADYTUNE_TOOL_VENVS``); ``.ready`` is written last, so a half-built venv is rebuilt.
Parallel test workers (and separate test runs sharing ``$STEADYTUNE_TOOL_VENVS``) build a venv
under a lock file beside it: the second one waits and then finds it ready.

A test session starts building the venvs its tests will need at its start (:func:`needed_tools`,
:func:`start_building`), one after another in a background process, so that the installs overlap
the tests that need none instead of holding up a worker when the first test asks for its venv: that
test then finds the venv ready, or waits on the lock for the build under way.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

import pytest
from filelock import FileLock

from tests.pip_install import pip_install

REPO = Path(__file__).resolve().parents[1]
TORCH = "torch==2.13.0"

TOOLS: dict[str, dict[str, list[str]]] = {
    "trl": {"install": ["trl==1.16.0", "datasets", "peft"], "no_deps": [], "stubs": []},
    # LLaMA-Factory pins torchvision/torchaudio/av/gradio for its web UI and vision models; the CLI's
    # text training path needs none of them, so it goes in without its deps and these are added.
    "llamafactory": {
        "no_deps": ["llamafactory==0.9.5"],
        "install": [
            "transformers>=4.55,<=5.6.0",
            "trl>=0.18,<=0.24",
            "peft>=0.18,<=0.18.1",
            "datasets>=2.16,<=4.0.0",
            "accelerate>=1.3,<=1.11.0",
            "einops",
            "fire",
            "omegaconf",
            "pandas",
            "protobuf",
            "pydantic",
            "pyyaml",
            "safetensors",
            "scipy",
            "sentencepiece",
            "tiktoken",
            "tyro<0.9.0",
            "packaging",
            "numpy",
            "matplotlib",
        ],
        # llamafactory.data.mm_plugin imports torchaudio at module level for audio inputs; text SFT
        # never calls it. An empty package stands in, instead of a multi-GB torch/torchaudio pair.
        "stubs": ["torchaudio"],
    },
    # ms-swift's own requirements pull no CUDA build (no torchvision, torchaudio, deepspeed or flash-attn):
    # it goes in as its users install it.
    "swift": {"install": ["ms-swift==4.6.0"], "no_deps": [], "stubs": []},
    # axolotl 0.19.0 is the newest release for Python 3.11 (0.20 and later need Python 3.12). It pins
    # a web UI, cloud file systems, an eval harness and GPU kernels (gradio, modal, s3fs/gcsfs/adlfs/ocifs,
    # lm_eval, xformers, liger-kernel, flash-linear-attention, torchao, kernels) that `axolotl train` of a
    # text model never imports; it goes in without its deps, and what its training path imports at module
    # level is added, at its own pins where it pins them. triton and bitsandbytes are among those imports:
    # their wheels carry no torch of their own and import on a machine without a GPU.
    "axolotl": {
        "no_deps": ["axolotl==0.19.0"],
        "install": [
            "transformers==5.16.1",
            "peft==0.20.0",
            "accelerate==1.13.0",
            "datasets==4.8.4",
            "trl==1.9.0",
            "huggingface_hub==1.17.0",
            "tokenizers==0.23.1",
            "pydantic==2.12.5",
            "PyYAML==6.0.3",
            "packaging==26.0",
            "typer==0.25.1",
            "posthog==6.7.11",
            "python-dotenv==1.0.1",
            "evaluate==0.4.1",
            "bitsandbytes==0.50.2",
            "numba>=0.63.1,<1.0",
            "numpy>=2.1,<3.0",
            "triton>=3.4.0",
            "wandb",
            "addict",
            "art",
            "colorama",
            "einops",
            "fastcore",
            "fire",
            "pillow",
            "requests",
            "scipy",
            "sentencepiece",
            "axolotl-contribs-lgpl==0.0.7",
            "axolotl-contribs-mit==0.0.6",
        ],
        "stubs": [],
    },
}
_STUB = '''"""Not installed: this venv trains text only (see tests/tools.py)."""\n'''


def needed_tools(items: Iterable[pytest.Item]) -> list[str]:
    """The tools of :data:`TOOLS` that ``items`` run, first those of the xdist groups (which
    ``--dist loadgroup`` hands out first), each in the order of its first test.

    A test names its tools by a ``tools`` marker, by a ``tool`` parameter, or by a ``tool-<name>``
    xdist group.
    """
    grouped: list[str] = []
    single: list[str] = []
    for item in items:
        names = [n for m in item.iter_markers("tools") for n in m.args]
        callspec = getattr(item, "callspec", None)
        if callspec is not None and isinstance(callspec.params.get("tool"), str):
            names.append(callspec.params["tool"])
        groups = [
            str(m.args[0] if m.args else m.kwargs.get("name")) for m in item.iter_markers("xdist_group")
        ]
        names += [g.removeprefix("tool-") for g in groups if g.startswith("tool-")]
        (grouped if groups else single).extend(n for n in names if n in TOOLS)
    return list(dict.fromkeys(grouped + single))


def start_building(names: list[str]) -> subprocess.Popen[bytes] | None:
    """Build the venvs of ``names`` that are not ready yet, one after another, in a background
    process (a session of its own: :func:`stop_building`) whose output goes to ``build.log``
    beside them; ``None`` when every one is ready."""
    todo = [n for n in names if not (_venv(n) / ".ready").exists()]
    if not todo:
        return None
    _root().mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p),
    }
    with (_root() / "build.log").open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "tests.tools", *todo],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def stop_building(builder: subprocess.Popen[bytes]) -> None:
    """End a build still under way (its installer too): the half-built venv has no ``.ready``, so
    the next session builds it again."""
    if builder.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(builder.pid, signal.SIGKILL)
    builder.wait()


def _root() -> Path:
    return Path(os.environ.get("STEADYTUNE_TOOL_VENVS") or REPO / ".cache" / "tool-venvs")


def _venv(name: str) -> Path:
    key = hashlib.sha256(repr((sys.version_info[:2], TORCH, TOOLS[name])).encode()).hexdigest()[:12]
    return _root() / f"{name}-{key}"


def tool_venv(name: str) -> Path:
    """The bin/ folder of a venv with tool ``name`` installed (built on first use)."""
    venv = _venv(name)
    built_once(venv, lambda: _build(venv, TOOLS[name]))
    return venv / "bin"


def built_once(target: Path, build: Callable[[], None]) -> None:
    """Run ``build`` unless ``target/.ready`` exists; it must write that file last.

    Processes racing for the same ``target`` (parallel test workers) build it one at a time
    under ``<target>.lock``: whoever gets the lock second finds ``.ready`` and builds nothing.
    """
    if (target / ".ready").exists():
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    # A build takes minutes (pip from the index): the lock has no timeout of its own, the test's does.
    with FileLock(str(target) + ".lock"):
        if not (target / ".ready").exists():
            build()


def _build(venv: Path, spec: dict[str, list[str]]) -> None:
    bin_dir = venv / "bin"
    if venv.exists():
        shutil.rmtree(venv)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = str(bin_dir / "python")
    constraints = venv / "constraints.txt"
    constraints.write_text(TORCH + "\n")
    pip_install(python, [TORCH])
    if spec["no_deps"]:
        pip_install(python, ["--no-deps", *spec["no_deps"]])
    pip_install(python, ["-c", str(constraints), *spec["install"]])
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    for stub in spec["stubs"]:
        (Path(site) / stub).mkdir(exist_ok=True)
        (Path(site) / stub / "__init__.py").write_text(_STUB)
    (venv / ".ready").write_text("ok\n")


if __name__ == "__main__":  # start_building's process: python -m tests.tools NAME...
    for tool in sys.argv[1:]:
        print(f"building the {tool} venv", flush=True)
        tool_venv(tool)
        print(f"the {tool} venv is ready: {_venv(tool)}", flush=True)

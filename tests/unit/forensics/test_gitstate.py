"""The git state env.json records, on real repositories: commit, branch, dirty diff, no secrets, bounded."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from steadytune.redact import MASK, redact_text
from steadytune.telemetry.gitstate import bounded, git_state

HF = "hf_" + "A1b2C3d4E5f6G7h8I9j0K1l2"  # a token of Hugging Face's shape, built so no scanner trips on it


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-c", "user.email=t@example.com", "-c", "user.name=t", *args],
        cwd=repo, check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "proj"
    root.mkdir()
    git(root, "init", "-q", "-b", "main")
    (root / "train.py").write_text("lr = 1e-4\n")
    (root / "config.yaml").write_text("model: m\n")
    (root / ".env").write_text("A=1\n")
    git(root, "add", ".")
    git(root, "commit", "-qm", "first")
    return root


def test_a_clean_tree_names_its_commit_and_branch(repo: Path) -> None:
    state = git_state([repo / "config.yaml"])
    assert state is not None
    assert state["commit"] == git(repo, "rev-parse", "HEAD").strip()
    assert state["branch"] == "main"
    assert state["dirty"] is False and state["diff"] == "" and state["diff_sha256"] is None
    assert Path(state["root"]).resolve() == repo.resolve()


def test_the_dirty_diff_is_kept_with_its_secrets_masked(repo: Path) -> None:
    (repo / "train.py").write_text(f'lr = 3e-4\nHF_TOKEN = "{HF}"\nheaders = {{"api_key": "abcd1234efgh"}}\n')
    (repo / ".env").write_text("WANDB_API_KEY=0123456789abcdef\n")
    (repo / "notes.txt").write_text("untracked\n")
    state = git_state([repo])
    assert state is not None and state["dirty"] is True
    diff = state["diff"]
    assert "+lr = 3e-4" in diff  # the change itself is there
    assert HF not in diff and "abcd1234efgh" not in diff and f"HF_TOKEN = {MASK}" in diff
    assert "0123456789abcdef" not in diff and "a/.env" in diff and "not recorded" in diff
    assert state["untracked"] == 1 and state["diff_truncated"] is False


def test_a_large_diff_is_cut_but_still_told_apart(repo: Path) -> None:
    (repo / "train.py").write_text("".join(f"x{i} = {i}\n" for i in range(5000)))
    small = git_state([repo], limit=1000)
    assert small is not None and small["diff_truncated"] is True
    assert len(small["diff"].encode()) <= 1000 and small["diff"].endswith("\n")
    assert small["diff_bytes"] > 1000
    (repo / "train.py").write_text("".join(f"x{i} = {i + 1}\n" for i in range(5000)))
    other = git_state([repo], limit=1000)
    assert other is not None and other["diff_sha256"] != small["diff_sha256"]


def test_outside_a_repository_there_is_no_git_state(tmp_path: Path) -> None:
    assert git_state([tmp_path]) is None
    assert git_state([tmp_path / "missing" / "config.yaml"]) is None


def test_credentials_in_urls_and_known_token_shapes_are_masked() -> None:
    text = (
        f"remote https://user:pw123@github.com/o/r.git and {HF} and Authorization: Bearer "
        f"abcdefghijklmnop1234"
    )
    out = redact_text(text)
    assert "pw123" not in out and "user:" not in out and HF not in out and "abcdefghijklmnop1234" not in out
    assert "github.com/o/r.git" in out


def test_bounded_keeps_whole_lines() -> None:
    assert bounded("a\nbb\nccc\n", 6) == ("a\nbb\n", True)
    assert bounded("short\n", 100) == ("short\n", False)

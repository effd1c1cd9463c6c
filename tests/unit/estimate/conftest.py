"""Fixtures for the estimator's unit tests: published architectures and a tiny one."""

from __future__ import annotations

from pathlib import Path

import pytest

from steadytune.estimate import Architecture, load_architecture

MODELS = Path(__file__).resolve().parents[3] / "examples" / "models"


@pytest.fixture(scope="session")
def llama8b() -> Architecture:
    return load_architecture(MODELS / "llama-3.1-8b")


@pytest.fixture(scope="session")
def llama3b() -> Architecture:
    return load_architecture(MODELS / "llama-3.2-3b")


@pytest.fixture(scope="session")
def tiny() -> Architecture:
    return Architecture(
        "llama",
        hidden_size=256,
        num_layers=4,
        num_heads=8,
        num_kv_heads=4,
        head_dim=32,
        intermediate_size=688,
        vocab_size=32000,
    )

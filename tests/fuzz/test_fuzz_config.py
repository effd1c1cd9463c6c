"""The config loader (``load_config``, ``load_supervise_config``, ``key=value`` overrides): any YAML.

Documented clean error: :class:`~steadytune.config.load.ConfigError`, every issue with its key.
"""

from __future__ import annotations

import typing

import pytest
import yaml
from hypothesis import event, given
from hypothesis import strategies as st
from pydantic import BaseModel

from steadytune.config.load import ConfigError, apply_overrides, load_config, load_supervise_config
from steadytune.config.schema import SteadytuneConfig
from tests.fuzz.conftest import cases
from tests.fuzz.strategies import json_values, number_text

SECTIONS = [
    "model",
    "data",
    "train",
    "method",
    "detect",
    "policy",
    "alerts",
    "dashboard",
    "run",
    "scale",
    "quant",
    "name_or_path",
    "train_file",
    "max_steps",
    "learning_rate",
    "sinks",
    "loss",
    "spike_z",
    "type",
]
BASE = "model: {name_or_path: m}\ndata: {train_file: t.jsonl}\ntrain: {max_steps: 5}\n"
YAML_BITS = [
    "&a",
    "*a",
    "!!python/object:os.system",
    "!!binary",
    "!!set",
    "<<: *a",
    "? ",
    "- ",
    "{",
    "[",
    "]",
    "}",
    ": ",
    "---",
    "...",
    "|",
    ">",
    "%YAML 1.1",
    "\t",
    "#",
    "'",
    '"',
    "\\u0000",
    "~",
    "0o777",
    ".inf",
]

config_trees = st.recursive(
    st.dictionaries(st.sampled_from(SECTIONS) | st.text(max_size=8), json_values, max_size=5),
    lambda kids: st.dictionaries(st.sampled_from(SECTIONS), kids | json_values, max_size=5),
    max_leaves=12,
)


def _dump(tree: object) -> str:
    try:
        return yaml.safe_dump(tree, allow_unicode=True)
    except (yaml.YAMLError, ValueError):
        return str(tree)


mutated = st.builds(
    lambda text, at, bit: text[:at] + bit + text[at:],
    st.sampled_from([BASE, BASE + "detect: {loss: {spike_z: 6}}\n", "a: &a [1, 2]\nb: *a\n"]),
    st.integers(0, 80),
    st.sampled_from(YAML_BITS) | st.text(max_size=5),
)


def _schema_paths(model: type[BaseModel], prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every key path of the run schema (``("detect", "loss", "spike_z")``), for configs that get far."""
    out: list[tuple[str, ...]] = []
    for name, field in model.model_fields.items():
        nested = [t for t in (field.annotation, *typing.get_args(field.annotation)) if _is_model(t)]
        out += _schema_paths(nested[0], (*prefix, name)) if nested else [(*prefix, name)]
    return out


def _is_model(t: object) -> bool:
    return isinstance(t, type) and issubclass(t, BaseModel)


def _with(paths_values: list[tuple[tuple[str, ...], object]]) -> str:
    tree: dict = yaml.safe_load(BASE)
    for path, value in paths_values:
        node = tree
        for part in path[:-1]:
            node = node.setdefault(part, {}) if isinstance(node.get(part, {}), dict) else {}
        node[path[-1]] = value
    return _dump(tree)


# A valid config with a few of its real keys set to anything: these get through YAML to validation.
schema_configs = st.lists(
    st.tuples(st.sampled_from(_schema_paths(SteadytuneConfig)), json_values), max_size=4
).map(_with)
texts = st.one_of(
    config_trees.map(_dump),
    schema_configs,
    mutated,
    st.text(max_size=300),
    st.lists(st.sampled_from(YAML_BITS)).map("".join),
)


def _judge(err: ConfigError) -> None:
    assert err.issues and all(i.key for i in err.issues), err
    assert len(str(err)) < 20_000  # values are shortened before they are shown


@cases(200)
@given(texts, st.booleans())
def test_any_yaml_is_a_config_or_a_config_error(
    tmp_path_factory: pytest.TempPathFactory, text: str, supervise: bool
) -> None:
    path = tmp_path_factory.mktemp("cfg") / "config.yaml"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    try:
        load_supervise_config(path) if supervise else load_config(path, check_paths=False)
    except ConfigError as err:
        _judge(err)
        event("refused: ConfigError")
    else:
        event("accepted")


@cases(200)
@given(
    st.lists(
        st.builds(
            lambda k, v: f"{k}={v}",
            st.lists(st.sampled_from(SECTIONS) | st.text(max_size=6), min_size=1, max_size=3).map(".".join),
            number_text | st.sampled_from(YAML_BITS) | st.text(max_size=10),
        ),
        max_size=4,
    )
)
def test_any_override_is_applied_or_a_config_error(overrides: list[str]) -> None:
    try:
        apply_overrides(yaml.safe_load(BASE), overrides)
    except ConfigError as err:
        _judge(err)

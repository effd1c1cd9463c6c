"""Config validation: every error at once, each naming the key, the value and the fix."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from steadytune.config import ConfigError, dump_config, load_config
from steadytune.config.load import apply_overrides
from steadytune.redact import redact

STEADYTUNE = str(Path(sys.executable).parent / "steadytune")


@pytest.fixture
def files(tmp_path: Path) -> Path:
    (tmp_path / "model").mkdir()
    (tmp_path / "train.jsonl").write_text('{"text": "hello"}\n')
    return tmp_path


def base() -> dict:
    return {"model": {"name_or_path": "./model"}, "data": {"train_file": "train.jsonl"}}


def write(tmp: Path, data: object, name: str = "c.yaml") -> Path:
    p = tmp / name
    p.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return p


def issues(path: Path, overrides: list[str] | None = None) -> dict[str, str]:
    with pytest.raises(ConfigError) as info:
        load_config(path, overrides)
    return {i.key: i.render() for i in info.value.issues}


def test_valid_config_resolves_paths_relative_to_the_file(files: Path) -> None:
    cfg = load_config(write(files, base()))
    assert cfg.data.train_file == str(files / "train.jsonl")
    assert cfg.model.name_or_path == str(files / "model")
    assert cfg.method == "lora" and cfg.train.learning_rate == 2e-4


BROKEN = [
    ({"train": {"learning_rate": "fast"}}, "train.learning_rate", ["'fast'", "positive number"]),
    ({"train": {"learning_rate": -1}}, "train.learning_rate", ["-1", "greater than 0"]),
    ({"train": {"per_device_train_batch_size": 0}}, "train.per_device_train_batch_size", ["0", '"auto"']),
    (
        {"train": {"per_device_train_batch_size": "big"}},
        "train.per_device_train_batch_size",
        ["'big'", '"auto"'],
    ),
    ({"train": {"lerning_rate": 1e-4}}, "train.lerning_rate", ["did you mean 'train.learning_rate'"]),
    ({"metod": "lora"}, "metod", ["did you mean 'method'"]),
    ({"method": "qlora4"}, "method", ["'qlora4'", "full, lora or qlora"]),
    ({"max_steps": 10}, "max_steps", ["belongs under 'train.max_steps'"]),
    ({"lora": {"r": 0}}, "lora.r", ["LoRA rank"]),
    ({"lora": {"lora_dropout": 1.5}}, "lora.lora_dropout", ["1.5", "[0, 1)"]),
    ({"data": {"train_file": "nope.jsonl"}}, "data.train_file", ["file not found", "'nope.jsonl'"]),
    ({"model": {"name_or_path": "./missing-model"}}, "model.name_or_path", ["folder not found"]),
    ({"train": {"max_steps": 10, "save_steps": 50}}, "train.save_steps", ["no checkpoint would be saved"]),
    ({"train": {"bf16": True, "fp16": True}}, "train.fp16", ["choose one"]),
    ({"run": {"name": "a/../b"}}, "run.name", ["letters, digits"]),
]


@pytest.mark.parametrize(("patch", "key", "texts"), BROKEN, ids=[b[1] for b in BROKEN])
def test_each_broken_config_is_named_precisely(files: Path, patch: dict, key: str, texts: list[str]) -> None:
    data = base()
    for k, v in patch.items():
        data[k] = {**data[k], **v} if isinstance(v, dict) and isinstance(data.get(k), dict) else v
    found = issues(write(files, data))
    assert key in found, found
    for text in texts:
        assert text in found[key], found[key]


def test_all_errors_are_reported_at_once(files: Path) -> None:
    data = {
        "model": {"name_or_path": "./x-missing"},
        "metod": "lora",
        "data": {"train_file": "missing.jsonl"},
        "train": {"learning_rate": "abc", "max_step": 3},
    }
    found = issues(write(files, data))
    assert set(found) == {
        "model.name_or_path",
        "metod",
        "data.train_file",
        "train.learning_rate",
        "train.max_step",
    }


def test_missing_sections_and_bad_yaml(files: Path) -> None:
    found = issues(write(files, {"method": "full"}))
    assert "model" in found and "data" in found and "required" in found["model"]
    found = issues(write(files, "model: [unclosed\n"))
    assert "(yaml)" in found and "line" in found["(yaml)"]
    found = issues(files / "does-not-exist.yaml")
    assert "config file not found" in found["(file)"]


def test_overrides_short_and_long_keys(files: Path) -> None:
    cfg = load_config(
        write(files, base()),
        ["max_steps=7", "train.learning_rate=1e-3", "lora.target_modules=[q_proj,v_proj]"],
    )
    assert cfg.train.max_steps == 7 and cfg.train.learning_rate == 1e-3
    assert cfg.lora.target_modules == ["q_proj", "v_proj"]
    assert apply_overrides({"a": {"b": 1}}, ["a.c=2"]) == {"a": {"b": 1, "c": 2}}
    found = issues(write(files, base()), ["train.max_steps=ten"])
    assert "'ten'" in found["train.max_steps"]


def test_secrets_are_redacted_in_dumps() -> None:
    data = {
        "alerts": {
            "webhook_url": "https://hooks.example/secret",
            "smtp": {"password": "hunter2", "password_env": "SMTP_PASS"},
        }
    }
    red = redact(data)
    assert red["alerts"]["webhook_url"] == "***" and red["alerts"]["smtp"]["password"] == "***"
    assert red["alerts"]["smtp"]["password_env"] == "SMTP_PASS"


def test_dump_round_trips(files: Path) -> None:
    cfg = load_config(write(files, base()))
    again = load_config(write(files, dump_config(cfg), "dumped.yaml"), check_paths=False)
    assert again == cfg


def test_validate_cli_names_everything_without_a_traceback(files: Path) -> None:
    path = write(
        files,
        {
            "model": {"name_or_path": "./model"},
            "data": {"train_file": "train.jsonl"},
            "train": {"learning_rate": "abc", "max_stp": 10},
        },
    )
    proc = subprocess.run([STEADYTUNE, "validate", str(path)], capture_output=True, text=True)
    assert proc.returncode == 2  # a config error, as check, run and estimate say it
    assert "Traceback" not in proc.stderr + proc.stdout
    assert "train.learning_rate" in proc.stderr and "'abc'" in proc.stderr
    assert "did you mean 'train.max_steps'" in proc.stderr
    assert "2 problems" in proc.stderr
    ok = subprocess.run(
        [STEADYTUNE, "validate", str(write(files, base(), "ok.yaml"))], capture_output=True, text=True
    )
    assert ok.returncode == 0 and "OK" in ok.stdout


def test_a_config_with_path_fields_dumps_and_reloads(tmp_path) -> None:
    """An e-mail sink's ca_file is a Path: dumping the resolved config (which every run does) crashed."""
    from steadytune.config.load import dump_config, load_config, validate_dict

    sink = {"type": "email", "host": "127.0.0.1", "port": 25, "security": "none", "sender": "a@b",
            "to": ["c@d"], "ca_file": str(tmp_path / "ca.pem")}  # fmt: skip
    data = {"model": {"name_or_path": "m"}, "data": {"train_file": "t.jsonl"}, "alerts": {"sinks": [sink]}}
    cfg = validate_dict(data, base=tmp_path, check_paths=False)
    (tmp_path / "c.yaml").write_text(dump_config(cfg))
    again = load_config(tmp_path / "c.yaml", check_paths=False)
    assert str(again.alerts.sinks[0].ca_file) == sink["ca_file"]


def _laughs(levels: int = 9, width: int = 9) -> str:
    """A "billion laughs": each level's list names the one below ``width`` times (9**9 strings)."""
    lines = [f"x0: &x0 [{', '.join(['lol'] * width)}]"]
    lines += [f"x{i}: &x{i} [{', '.join([f'*x{i - 1}'] * width)}]" for i in range(1, levels + 1)]
    return "\n".join(
        [
            *lines,
            "model: {name_or_path: m}",
            "data: {train_file: t.jsonl}",
            f"train: {{max_steps: *x{levels}}}",
        ]
    )


def test_a_billion_laughs_config_is_refused_at_once_in_little_memory(tmp_path: Path) -> None:
    """It took `validate` past 3 GB and ~50 s to a MemoryError (repr of the expanded value)."""
    import resource

    (tmp_path / "laughs.yaml").write_text(_laughs())

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (1536 << 20, 1536 << 20))

    proc = subprocess.run(
        [str(Path(sys.executable).parent / "steadytune"), "validate", str(tmp_path / "laughs.yaml")],
        capture_output=True, text=True, timeout=60, preexec_fn=cap,
    )  # fmt: skip
    assert proc.returncode == 2 and "alias" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[
        -2000:
    ]
    assert len(proc.stderr) < 4000


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "folder"])
def test_a_config_that_is_no_regular_file_is_refused_at_once(tmp_path: Path, kind: str) -> None:
    """A link to /dev/zero has a size of 0 and no end: read whole, `validate` reached 10 GB and an
    OOM kill; a FIFO waited for a writer for good."""
    import os
    import resource

    config = tmp_path / "config.yaml"
    if kind == "fifo":
        os.mkfifo(config)
    elif kind == "dev-zero":
        config.symlink_to("/dev/zero")
    else:
        config.mkdir()

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (1536 << 20, 1536 << 20))

    proc = subprocess.run(
        [str(Path(sys.executable).parent / "steadytune"), "validate", str(config)],
        capture_output=True, text=True, timeout=60, preexec_fn=cap,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "not a regular file" in proc.stderr and str(config) in proc.stderr, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr


def test_a_run_whose_config_is_a_fifo_is_still_replayed(tmp_path: Path) -> None:
    """`replay` and `goodput` read a run's config.yaml for its detector settings and process count:
    a FIFO there hung both for good (each falls back to the defaults now)."""
    import os

    from steadytune.forensics.timeline import settings
    from steadytune.goodput.load import _config_processes
    from steadytune.rundir import RunDir

    os.mkfifo(tmp_path / "config.yaml")
    detect, policy, notes = settings(RunDir(tmp_path))
    assert (detect, policy) == (None, None) and "unreadable" in notes[0]
    assert _config_processes(tmp_path / "config.yaml") == 1


def test_a_config_file_too_large_says_what_to_pass(tmp_path: Path) -> None:
    from steadytune.config.yamlsafe import YamlLimits, YamlTooLarge, read_yaml

    (tmp_path / "big.yaml").write_text("model: {name_or_path: m}\n#" + "x" * 500)
    with pytest.raises(YamlTooLarge) as e:
        read_yaml(tmp_path / "big.yaml", YamlLimits(max_bytes=200))
    assert "200" in e.value.problem and e.value.fix and "not a data or model file" in e.value.fix
    assert read_yaml(tmp_path / "big.yaml", YamlLimits(max_bytes=600)) == {"model": {"name_or_path": "m"}}


@pytest.mark.parametrize("text", ["a: " + "[" * 100_000, "model: " + "{a: " * 100_000, "- " * 50_000 + "x"])
def test_a_config_nested_too_deep_is_a_config_error(tmp_path: Path, text: str) -> None:
    (tmp_path / "deep.yaml").write_text(text)
    with pytest.raises(ConfigError, match="deep"):
        load_config(tmp_path / "deep.yaml")


def test_an_error_shortens_the_value_it_shows(tmp_path: Path) -> None:
    (tmp_path / "long.yaml").write_text(
        f"model: {{name_or_path: m}}\ndata: {{train_file: t}}\ntrain: {{max_steps: {'x' * 100_000}}}\n"
    )
    with pytest.raises(ConfigError) as e:
        load_config(tmp_path / "long.yaml", check_paths=False)
    assert "max_steps" in str(e.value) and len(str(e.value)) < 2000


def test_the_bounded_loader_reads_ordinary_yaml_and_names_each_limit() -> None:
    from steadytune.config.yamlsafe import YamlLimits, YamlTooLarge, load_yaml

    assert load_yaml("a: &x {lr: 0.0001, steps: [1, 2]}\nb: *x\nc: !!str 5") == {
        "a": {"lr": 1e-4, "steps": [1, 2]},
        "b": {"lr": 1e-4, "steps": [1, 2]},
        "c": "5",
    }
    tiny = YamlLimits(max_depth=3, max_aliases=2, max_nodes=20, max_bytes=200)
    for text, says in (
        ("a: {b: {c: {d: 1}}}", "nested more than 3 levels"),
        ("a: &x 1\nb: *x\nc: *x\nd: *x", "more than 2 aliases"),
        ("a: &x [1, 2, 3, 4, 5, 6, 7, 8]\nb: [*x, *x]", "more than 20 values once its aliases are expanded"),
        ("a: " + "x" * 300, "more than the 200"),
    ):
        with pytest.raises(YamlTooLarge, match=says):
            load_yaml(text, tiny)
    with pytest.raises(yaml.YAMLError):
        load_yaml("x: !!python/object/apply:os.system [ls]")


def test_a_bundles_billion_laughs_config_is_refused_by_repro_check(tmp_path: Path) -> None:
    from steadytune.forensics.bundlerun import prepare
    from tests.unit.forensics.test_bundle_security import hostile_bundle

    hostile_bundle(tmp_path, tmp_path / "PWNED", trust=False, model=str(tmp_path / "elsewhere"))
    top = tmp_path / "build" / "repro-x-step1"
    (top / "config.yaml").write_text(_laughs())
    with pytest.raises(ConfigError, match="aliases are expanded"):
        prepare(top)


@pytest.mark.parametrize("text", ["A", "1", "[a, b]", "null-ish"])
def test_a_config_file_of_one_value_is_a_config_error(tmp_path: Path, text: str) -> None:
    """Found by the fuzzing harness: a YAML scalar or list raised ValueError/TypeError in apply_overrides."""
    (tmp_path / "c.yaml").write_text(text)
    holds = "a list" if text.startswith("[") else "a single value"
    with pytest.raises(ConfigError, match=f"holds {holds}, not a mapping"):
        load_config(tmp_path / "c.yaml", check_paths=False)


def test_a_path_naming_an_unknown_users_home_is_a_path_error_not_a_crash(tmp_path: Path) -> None:
    """Found by the fuzzing harness: name_or_path: ~m raised RuntimeError in expanduser."""
    (tmp_path / "c.yaml").write_text("model: {name_or_path: ~nosuchuser1/m}\ndata: {train_file: t}\n")
    with pytest.raises(ConfigError, match="name_or_path"):
        load_config(tmp_path / "c.yaml")
    assert load_config(tmp_path / "c.yaml", check_paths=False).model.name_or_path.endswith("m")


def test_a_value_that_fits_no_form_of_a_two_form_key_is_one_problem(files: Path) -> None:
    data = {**base(), "train": {"per_device_train_batch_size": "big"}}
    with pytest.raises(ConfigError) as info:
        load_config(write(files, data))
    said = [i.render() for i in info.value.issues if i.key == "train.per_device_train_batch_size"]
    assert len(said) == 1 and '"auto"' in said[0], said


def test_a_fix_says_the_value_to_write_not_the_keys_meaning_after_use(files: Path) -> None:
    found = issues(write(files, {**base(), "detect": {"pace": {"hang_floor_s": -1}}}))
    fix = found["detect.pace.hang_floor_s"].split("Fix: ")[1]
    assert fix.startswith("use a value greater than 0 ") and "use never" not in fix
    assert "(hang_floor_s: never call a hang below" in fix  # what the key means, named as such


def test_a_chat_sink_written_as_its_own_type_is_told_the_webhook_form(files: Path) -> None:
    sink = {"type": "slack", "url": "https://hooks.example/x"}
    found = issues(write(files, {**base(), "alerts": {"sinks": [sink]}}))
    fix = found["alerts.sinks.0"].split("Fix: ")[1]
    assert "type: webhook, format: slack" in fix and "url_env" in fix and "correct the value" not in fix


def test_a_trainingarguments_name_the_run_does_not_take_says_what_to_use(files: Path) -> None:
    found = issues(write(files, {**base(), "train": {"warmup_ratio": 0.1}}))
    said = found["train.warmup_ratio"]
    assert "unknown key" in said and "does not take 'warmup_ratio'" in said and "use warmup_steps" in said


def test_a_secret_in_clear_is_told_at_its_own_key_without_its_value(tmp_path: Path) -> None:
    """It was told at the union's tag, `alerts.sinks.0.webhook`, `(got (missing)). Fix: correct the value`."""
    (tmp_path / "c.yaml").write_text(
        "model: {name_or_path: m}\ndata: {train_file: t.jsonl}\n"
        "alerts: {sinks: [{type: console}, {type: webhook, url: 'https://hooks.example/SECRET1'},\n"
        "  {type: email, host: h, sender: a@b, to: [c@d], password: SECRET2}]}\n"
        "dashboard: {token: SECRET3}\n"
    )
    with pytest.raises(ConfigError) as e:
        load_config(tmp_path / "c.yaml", check_paths=False)
    by_key = {i.key: i for i in e.value.issues}
    assert set(by_key) == {"alerts.sinks.1.url", "alerts.sinks.2.password", "dashboard.token"}, by_key
    for key, issue in by_key.items():
        ref = key.rsplit(".", 1)[1]
        assert issue.problem == "holds a secret in clear in the YAML"
        assert f"{ref}_env:" in issue.fix and f"{ref}_file:" in issue.fix
    assert "SECRET" not in e.value.render() and "(missing)" not in e.value.render()

"""Load a run config: YAML file + ``key=value`` overrides, every error reported at once.

Each error names the key, the offending value and the fix; an unknown key gets a
"did you mean". Nothing here raises a traceback at the user: :class:`ConfigError`
carries the list of :class:`ConfigIssue` and renders them.
"""

from __future__ import annotations

import difflib
import reprlib
import typing
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from steadytune.config.alerts import CLEAR_SECRET_KEYS
from steadytune.config.keyed import KeyedValueError
from steadytune.config.paths import resolve_path
from steadytune.config.schema import SteadytuneConfig
from steadytune.config.yamlsafe import YamlTooLarge, YamlUnreadable, load_yaml, read_yaml
from steadytune.redact import MASK, is_secret_key, redact, redact_url

_Section = TypeVar("_Section", bound=BaseModel)


@dataclass(frozen=True)
class ConfigIssue:
    key: str
    value: Any
    problem: str
    fix: str

    def render(self) -> str:
        shown = "(missing)" if self.value is _MISSING else _SHORT.repr(shown_value(self.key, self.value))
        return f"{self.key}: {self.problem} (got {shown}). Fix: {self.fix}"


def shown_value(key: str, value: Any) -> Any:
    """``value`` (at config ``key``) as an error may print it: secrets masked.

    A value under a secret-looking key, or a key that holds a secret in clear in an alert sink
    (``url``, ``password``), is ``***``; in ``alerts``, where any URL may be a webhook's, a URL
    keeps its scheme and host only. A sink whose ``type`` was misspelled is shown whole, and
    showed its webhook URL and its password as written.
    """
    in_alerts = key.split(".", 1)[0] == "alerts"
    return _masked(value, key.rsplit(".", 1)[-1], in_alerts, 0)


def _masked(value: Any, key: str, in_alerts: bool, depth: int) -> Any:
    # No deeper or wider than the error shows (_SHORT): a YAML alias may share a value many times.
    if depth > _SHORT.maxlevel:
        return ...
    if isinstance(value, Mapping):
        items = list(value.items())[: _SHORT.maxdict + 1]
        return {k: _masked(v, str(k), in_alerts, depth + 1) for k, v in items}
    if isinstance(value, (list, tuple)):
        return [_masked(v, key, in_alerts, depth + 1) for v in value[: _SHORT.maxlist + 1]]
    if value is None or value == "":
        return value
    if is_secret_key(key) or (in_alerts and key in CLEAR_SECRET_KEYS):
        return MASK
    if isinstance(value, str):
        if len(value) > 2 * _SHORT.maxstring:  # only its ends are shown; the redactor is slow on 100 kB
            value = f"{value[: _SHORT.maxstring]} ... {value[-_SHORT.maxstring :]}"
        return redact_url(value) if in_alerts and "://" in value else redact(value)
    return value


# The value an error shows is shortened before it is written out: a value can be megabytes long,
# or (with YAML aliases) share itself many times over.
_SHORT = reprlib.Repr()
_SHORT.maxstring = _SHORT.maxother = 120
_SHORT.maxlevel, _SHORT.maxlist, _SHORT.maxdict = 3, 8, 8


class _Missing:
    def __repr__(self) -> str:
        return "(missing)"


_MISSING = _Missing()


class ConfigError(Exception):
    """All the problems of one config, to be shown together."""

    def __init__(self, issues: list[ConfigIssue], source: str = "config") -> None:
        self.issues = issues
        self.source = source
        super().__init__(self.render())

    def render(self) -> str:
        head = f"{self.source}: {len(self.issues)} problem{'s' if len(self.issues) != 1 else ''}"
        return "\n".join([head, *(f"  - {i.render()}" for i in self.issues)])


def _literal_tags(annotation: Any, tag: str) -> list[str]:
    """The values of ``tag`` (a Literal field) across the models of a (list of a) union annotation."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        field = annotation.model_fields.get(tag)
        return [str(v) for v in typing.get_args(field.annotation)] if field is not None else []
    return [t for arg in typing.get_args(annotation) for t in _literal_tags(arg, tag)]


def _model_at(loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The pydantic model that owns the field at ``loc`` (for suggestions and fix texts)."""
    model: type[BaseModel] = SteadytuneConfig
    parts = list(loc[:-1])
    while parts:
        field = model.model_fields.get(str(parts.pop(0)))
        if field is None:
            return None
        ann = field.annotation
        # A list of sections (train.lr_groups): the index names an item, whose fields own the fix texts.
        item = typing.get_args(ann)[0] if typing.get_origin(ann) is list else None
        # An optional section (scale: ScaleConfig | None): its model owns the fix texts.
        inner = [a for a in typing.get_args(ann) if isinstance(a, type) and issubclass(a, BaseModel)]
        if len(inner) == 1 and type(None) in typing.get_args(ann):
            ann = inner[0]
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            model = ann
        elif isinstance(item, type) and issubclass(item, BaseModel) and parts and isinstance(parts[0], int):
            parts.pop(0)
            model = item
        else:
            return None
    return model


def _lookup(data: Any, loc: tuple[Any, ...]) -> Any:
    for part in loc:
        if (isinstance(data, dict) and part in data) or (
            isinstance(data, list) and isinstance(part, int) and part < len(data)
        ):
            data = data[part]
        else:
            return _MISSING
    return data


def _without_tags(loc: tuple[Any, ...], raw: Any) -> tuple[Any, ...]:
    """``loc`` less the tags pydantic puts in it for a union told apart by a key's value
    (``alerts.sinks.0.webhook`` for the sink whose ``type`` is ``webhook``): a key as written."""
    kept: list[Any] = []
    node = raw
    for part in loc:
        if isinstance(node, dict) and part not in node and part in node.values():
            continue
        kept.append(part)
        node = _lookup(node, (part,))
    return tuple(kept)


def _is_branch(part: Any) -> bool:
    """A part of an error's loc that names a union's member (``int``, ``literal['auto']``), not a key."""
    return isinstance(part, str) and (
        "[" in part or part in {"int", "str", "float", "bool", "list", "literal"}
    )


def _issues_from_errors(errors: list[Any], raw: dict[str, Any]) -> list[ConfigIssue]:
    """One issue per error, but one per key for a union's members: each member fails on the same value
    (``per_device_train_batch_size: big`` is no integer and not "auto"), and that is one mistake."""
    issues: list[ConfigIssue] = []
    union_at: dict[str, int] = {}
    for err in errors:
        issue = _issue_from_error(err, raw)
        if any(_is_branch(p) for p in err["loc"]):
            if issue.key in union_at:
                at = union_at[issue.key]
                issues[at] = replace(issues[at], problem="not a value this key takes")
                continue
            union_at[issue.key] = len(issues)
        issues.append(issue)
    return issues


def _issue_from_error(err: Mapping[str, Any], raw: dict[str, Any]) -> ConfigIssue:
    # Union and literal branches append their type to loc (e.g. ('int',)); keep real keys only.
    loc = tuple(p for p in err["loc"] if not _is_branch(p))
    key = ".".join(str(p) for p in loc) or "(top level)"
    value = _lookup(raw, loc)
    owner = _model_at(loc) if loc else SteadytuneConfig
    field_name = str(loc[-1]) if loc else ""
    etype = err["type"]
    if etype == "extra_forbidden":
        options = list(owner.model_fields) if owner else []
        close = difflib.get_close_matches(field_name, options, n=1, cutoff=0.6)
        # A key that belongs to another section is a common slip (max_steps at top level).
        elsewhere = [
            f"{sec}.{field_name}"
            for sec, f in SteadytuneConfig.model_fields.items()
            if isinstance(f.annotation, type)
            and issubclass(f.annotation, BaseModel)
            and field_name in f.annotation.model_fields
        ]
        instead = _instead(owner, field_name)
        if instead:
            fix = f"steadytune does not take '{field_name}' here; use {instead}"
        elif close:
            fix = f"did you mean '{'.'.join([*map(str, loc[:-1]), close[0]])}'?"
        elif elsewhere:
            fix = f"this key belongs under '{elsewhere[0]}'"
        else:
            fix = f"remove it; known keys here: {', '.join(options)}" if options else "remove it"
        return ConfigIssue(key, value, "unknown key", fix)
    if etype == "missing":
        desc = _field_description(owner, field_name)
        return ConfigIssue(
            key, _MISSING, "required key is missing", f"add '{key}': {desc}" if desc else f"add '{key}'"
        )
    problem = err["msg"].removeprefix("Value error, ")
    ctx = err.get("ctx") or {}
    keyed = ctx.get("error")
    if isinstance(keyed, KeyedValueError):  # a section's validator, about one of its keys
        where = ".".join(str(p) for p in (*_without_tags(loc, raw), keyed.key))
        return ConfigIssue(where, keyed.shown, keyed.problem, keyed.fix)
    if etype == "union_tag_not_found":
        # No ``type:`` at all: the tags are the list's members' (alerts.sinks: console, ... command).
        owner = _model_at(loc[:-1]) if len(loc) > 1 else None
        field = owner.model_fields.get(str(loc[-2])) if owner is not None else None
        tags = _literal_tags(field.annotation, "type") if field is not None else []
        where = f": one of {', '.join(tags)}" if tags else ""
        return ConfigIssue(key, value, problem, f"add {ctx.get('discriminator', 'the tag')}{where}")
    if etype == "union_tag_invalid":
        # A list of sections told apart by one key (alerts.sinks by type): its owner is the list's.
        tag, owner = str(ctx.get("tag", "")), _model_at(loc[:-1]) if loc else None
        instead = _instead(owner, tag)
        fix = (
            f"use {instead}"
            if instead
            else f"set {ctx.get('discriminator', 'it')} to one of {ctx.get('expected_tags')}"
        )
        return ConfigIssue(key, value, problem, fix)
    return ConfigIssue(key, value, problem, _value_fix(owner, field_name, etype, ctx))


# Pydantic's bound errors, in the words a fix says them with.
_BOUNDS = {
    "greater_than": ("greater than", "gt"),
    "greater_than_equal": ("at least", "ge"),
    "less_than": ("less than", "lt"),
    "less_than_equal": ("at most", "le"),
}


def _value_fix(owner: type[BaseModel] | None, name: str, etype: str, ctx: Mapping[str, Any]) -> str:
    """What to write instead of a value the key does not take.

    A field's description is either the form of its value ("a positive integer") or what the key
    means ("never call a hang below this many seconds of silence"): only the first reads after "use".
    """
    desc = _field_description(owner, name)
    if etype in _BOUNDS:
        words, bound = _BOUNDS[etype]
        limit = ctx.get(bound)
        want = f"a value {words} {limit:g}" if isinstance(limit, (int, float)) else f"a value {words} {limit}"
        if not desc:
            return f"use {want}"
        return f"use {want}: {desc}" if _is_value_form(desc) else f"use {want} ({name}: {desc})"
    if not desc and etype == "literal_error" and ctx.get("expected"):
        return f"use {ctx['expected']}"  # pydantic's own list of the values it takes
    if not desc:
        return "correct the value"
    # A key of a few names (method: full, lora or qlora) describes itself by listing them.
    listed = etype == "literal_error" or _is_value_form(desc)
    return f"use {desc}" if listed else f"give a value of the key's type ({name}: {desc})"


# How a description that gives the form of a value begins.
_VALUE_FORMS = ("a ", "an ", "one of ", "true", "false", "path ", "{")


def _is_value_form(desc: str) -> bool:
    return desc.startswith(_VALUE_FORMS)


def _field_description(owner: type[BaseModel] | None, name: str) -> str:
    if owner is None or name not in owner.model_fields:
        return ""
    return owner.model_fields[name].description or ""


def _instead(owner: type[BaseModel] | None, name: str) -> str:
    """What a section says to write instead of ``name`` (a key or a tag it does not take), if it says."""
    table: Mapping[str, str] = getattr(owner, "instead", None) or {}
    return table.get(name, "")


def parse_override(text: str) -> tuple[list[str], Any]:
    """``train.max_steps=50`` -> (['train', 'max_steps'], 50). Values are YAML scalars/lists."""
    key, eq, value = text.partition("=")
    parts = key.strip().split(".")
    if not eq or not all(part.strip() for part in parts):
        raise ConfigError(
            [
                ConfigIssue(
                    key.strip() or "(override)",
                    text,
                    "an override must look like key=value, with a dotted key such as train.max_steps",
                    "write e.g. train.max_steps=50",
                )
            ],
            "overrides",
        )
    if not value.strip():
        return parts, None
    try:
        return parts, load_yaml(value)
    except yaml.YAMLError as e:
        # A value YAML cannot read (``x=@``, ``x=[``, a python tag) is the user's typo: name it.
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(
            [
                ConfigIssue(
                    key.strip(),
                    value,
                    f"the value is not valid YAML ({problem})",
                    f"quote it as a string, e.g. {key.strip()}='{value}', or write a number, true/false "
                    f"or [a, b]",
                )
            ],
            "overrides",
        ) from None


def _resolve_short_key(path: list[str]) -> list[str]:
    """Let ``max_steps=50`` stand for ``train.max_steps=50`` when the name is unique."""
    if len(path) != 1 or path[0] in SteadytuneConfig.model_fields:
        return path
    owners = [
        sec
        for sec, f in SteadytuneConfig.model_fields.items()
        if isinstance(f.annotation, type)
        and issubclass(f.annotation, BaseModel)
        and path[0] in f.annotation.model_fields
    ]
    return [owners[0], path[0]] if len(owners) == 1 else path


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    out = dict(data)
    for text in overrides:
        path, value = parse_override(text)
        path = _resolve_short_key(path)
        node = out
        for part in path[:-1]:
            child = node.get(part)
            child = dict(child) if isinstance(child, dict) else {}
            node[part] = child
            node = child
        node[path[-1]] = value
    return out


def _cross_issues(data: dict[str, Any], base: Path) -> list[ConfigIssue]:
    """Checks that span keys or touch the disk, run on the raw dict so they add to field errors."""

    def get(*keys: str) -> Any:
        v = _lookup(data, keys)
        return None if v is _MISSING else v

    issues = []
    for key in ("train_file", "eval_file"):
        value = get("data", key)
        if isinstance(value, str) and value and not resolve_path(value, base).exists():
            issues.append(
                ConfigIssue(
                    f"data.{key}",
                    value,
                    "file not found",
                    f"point it at an existing file (relative paths start at {base})",
                )
            )
    model_path = get("model", "name_or_path")
    if isinstance(model_path, str):
        looks_local = model_path.startswith((".", "/", "~")) or model_path.count("/") > 1
        if looks_local and not resolve_path(model_path, base).exists():
            issues.append(
                ConfigIssue(
                    "model.name_or_path",
                    model_path,
                    "folder not found",
                    "point it at a folder with config.json, or use a hub id",
                )
            )
    save_steps, max_steps = get("train", "save_steps"), get("train", "max_steps")
    if type(save_steps) is int and type(max_steps) is int and 0 < max_steps < save_steps:  # not a bool
        issues.append(
            ConfigIssue(
                "train.save_steps",
                save_steps,
                f"no checkpoint would be saved before the end (max_steps={max_steps})",
                "set save_steps at or below max_steps so a crash can resume",
            )
        )
    if get("train", "loraplus_lr_ratio") is not None and get("method") == "full":
        issues.append(
            ConfigIssue(
                "train.loraplus_lr_ratio",
                get("train", "loraplus_lr_ratio"),
                "LoRA+ scales the LoRA B matrices, and a full fine-tune has none",
                "use method: lora or qlora, or remove train.loraplus_lr_ratio",
            )
        )
    if get("train", "bf16") is True and get("train", "fp16") is True:
        issues.append(ConfigIssue("train.fp16", True, "bf16 and fp16 are both true", "choose one of them"))
    return issues


def validate_dict(
    data: Any, base: Path, source: str = "config", check_paths: bool = True
) -> SteadytuneConfig:
    """Validate a raw dict; raise :class:`ConfigError` with every problem found."""
    if not isinstance(data, dict):
        raise ConfigError(
            [
                ConfigIssue(
                    "(top level)",
                    data,
                    "the config must be a mapping of keys",
                    "start from examples/lora.yaml",
                )
            ],
            source,
        )
    issues: list[ConfigIssue] = []
    cfg = None
    try:
        cfg = SteadytuneConfig.model_validate(data)
    except ValidationError as exc:
        issues = _issues_from_errors(exc.errors(), data)
    if check_paths:
        seen = {i.key for i in issues}
        issues += [i for i in _cross_issues(data, base) if i.key not in seen]
    if issues or cfg is None:
        raise ConfigError(issues, source)
    return cfg


def validate_section(model: type[_Section], section: str, data: Any, source: str) -> _Section:
    """One section of a run config given on its own (``analyze --set`` gives ``detect:`` only).

    Its errors name the key as in a whole config (``detect.loss.spike_z``), with the value and
    the fix, through the same rules as :func:`validate_dict`.

    Raises:
        ConfigError: every problem of the section, at once.
    """
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        errors = [{**err, "loc": (section, *err["loc"])} for err in exc.errors()]
        raise ConfigError(_issues_from_errors(errors, {section: data}), source) from None


def _too_large(path: Path, exc: YamlTooLarge) -> ConfigIssue:
    return ConfigIssue(
        "(yaml)",
        str(path),
        f"refused: {exc.problem}",
        exc.fix
        or "write the values out: a config needs no nested aliases, and a few levels of nesting at most",
    )


def _read_mapping(path: Path, sections: str) -> dict[str, Any]:
    """The YAML mapping a config file holds; a missing file, bad YAML (with its line and column), a
    file past the reader's caps or one that is not a mapping is a ConfigError naming the fix."""
    if not path.exists():
        raise ConfigError(
            [
                ConfigIssue(
                    "(file)",
                    str(path),
                    "config file not found",
                    "pass the path of a YAML config, e.g. examples/lora.yaml",
                )
            ],
            str(path),
        )
    try:
        data = read_yaml(path) or {}
    except YamlTooLarge as exc:
        raise ConfigError([_too_large(path, exc)], str(path)) from None
    except OSError as exc:  # a FIFO, a device, a folder, no permission
        problem = f"cannot be read: {exc.strerror or exc}"
        issue = ConfigIssue("(file)", str(path), problem, "pass a YAML config file")
        raise ConfigError([issue], str(path)) from None
    except YamlUnreadable as exc:  # valid YAML syntax, but a value or the encoding cannot be read
        mark = exc.problem_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        issue = ConfigIssue(exc.key or "(yaml)", exc.value or str(path), exc.problem + where, exc.fix)
        raise ConfigError([issue], str(path)) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "unknown place"
        problem = f"not valid YAML: {getattr(exc, 'problem', None) or exc}"
        raise ConfigError(
            [ConfigIssue("(yaml)", where, problem, "fix the YAML syntax at that place")], str(path)
        ) from None
    if not isinstance(data, dict):
        raise ConfigError(
            [
                ConfigIssue(
                    "(file)",
                    data,
                    f"the file holds {'a list' if isinstance(data, list) else 'a single value'}, "
                    "not a mapping of sections",
                    f"write sections such as {sections}",
                )
            ],
            str(path),
        )
    return data


def load_config(
    path: Path | str, overrides: list[str] | None = None, check_paths: bool = True
) -> SteadytuneConfig:
    """Read, override and validate a config file. Relative data/model paths resolve against its folder."""
    path = Path(path)
    data = _read_mapping(path, "model:, data:, train: (see examples/lora.yaml)")
    data = apply_overrides(data, overrides or [])
    cfg = validate_dict(data, base=path.resolve().parent, source=str(path), check_paths=check_paths)
    return absolutize(cfg, path.resolve().parent)


# `supervise --config` takes the same file as `run`; a file made only for supervising may leave
# out what steadytune would need to train by itself.
_SUPERVISE_PLACEHOLDERS = {
    "model": {"name_or_path": "(the supervised command's)"},
    "data": {"train_file": "(the supervised command's)"},
}


def load_supervise_config(path: Path | str | None, overrides: list[str] | None = None) -> SteadytuneConfig:
    """A config for ``supervise``: its detect, policy, alerts, run and dashboard sections apply.

    ``model`` and ``data`` may be left out (the command brings its own); when present they
    are validated as for ``run``, so one file serves both. Without a file, the defaults
    (with ``overrides``) apply.
    """
    if path is None:
        data = apply_overrides({}, overrides or [])
        for key, value in _SUPERVISE_PLACEHOLDERS.items():
            data.setdefault(key, value)
        return validate_dict(data, base=Path.cwd(), source="supervise flags", check_paths=False)
    path = Path(path)
    data = _read_mapping(path, "detect:, alerts:")
    data = apply_overrides(data, overrides or [])
    for key, value in _SUPERVISE_PLACEHOLDERS.items():
        data.setdefault(key, value)
    return validate_dict(data, base=path.resolve().parent, source=str(path), check_paths=False)


def absolutize(cfg: SteadytuneConfig, base: Path) -> SteadytuneConfig:
    """Make the config's file paths absolute, so the worker can run from any folder.

    Done with model copies, not a re-validation, so each section still knows which
    keys the user set (``--safe-mode`` fills in only the others).
    """
    data_upd = {"train_file": str(resolve_path(cfg.data.train_file, base).resolve())}
    if cfg.data.eval_file:
        data_upd["eval_file"] = str(resolve_path(cfg.data.eval_file, base).resolve())
    local = resolve_path(cfg.model.name_or_path, base)
    model_upd = {"name_or_path": str(local.resolve())} if local.exists() else {}
    run_upd = (
        {} if Path(cfg.run.runs_dir).is_absolute() else {"runs_dir": str(Path(cfg.run.runs_dir).resolve())}
    )
    return cfg.model_copy(
        update={
            "data": cfg.data.model_copy(update=data_upd),
            "model": cfg.model.model_copy(update=model_upd),
            "run": cfg.run.model_copy(update=run_upd),
        }
    )


def dump_config(cfg: SteadytuneConfig) -> str:
    """The resolved config as YAML, secrets redacted (:func:`steadytune.redact.redact`)."""
    return yaml.safe_dump(redact(_plain(cfg.model_dump())), sort_keys=False)


def _plain(obj: Any) -> Any:
    """What YAML's safe dumper can write: paths as strings, tuples as lists (e.g. an e-mail sink's
    ca_file)."""
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    return obj

"""YAML in, resolved YAML out: defaults, then a file, then `section.key=value` overrides, each
value type-checked against the schema, then rules.validate. Unknown keys and wrong types are
errors that name the key and the file, because a typo silently falling back to a default costs
a whole paid run."""
from __future__ import annotations

import dataclasses
import os
import types
import typing
from pathlib import Path

import yaml

from transientvod.config.rules import validate
from transientvod.config.schema import Config, ConfigError


def load_config(path: str | os.PathLike | None = None, overrides: typing.Sequence[str] = ()) -> Config:
    """Defaults, then the YAML file at `path` (if any), then `key.sub=value` overrides."""
    raw: dict = {}
    source = "defaults"
    if path is not None:
        source = str(path)
        try:
            text = Path(path).read_text()
        except FileNotFoundError:
            raise ConfigError(f"config file {source} does not exist; check the path.") from None
        except OSError as e:
            raise ConfigError(f"config file {source} cannot be read ({e.strerror}).") from None
        raw = _parse_yaml(text, source)
    config = _build(Config, raw, source, prefix="")
    if path is not None:
        config.task = _task_beside(config.task, Path(path).parent)
    for item in overrides:
        _apply_override(config, item)
    validate(config, f"{source} with overrides" if overrides else source)
    return config


def is_task_file(task: str) -> bool:
    """A task given as a file (my_task.py, tasks/my_task.py), not as a module name."""
    return task.endswith(".py") or "/" in task or os.sep in task


def _task_beside(task: str, directory: Path) -> str:
    """A relative task file is relative to the config file that names it; the resolved config
    holds its absolute path, so that workers started anywhere find it."""
    if is_task_file(task) and not os.path.isabs(task):
        return str((directory / task).resolve())
    return task


def config_from_yaml(text: str, source: str) -> Config:
    """A config from YAML text (for example the copy stored inside a checkpoint)."""
    config = _build(Config, _parse_yaml(text, source), source, prefix="")
    validate(config, source)
    return config


def to_dict(config: Config) -> dict:
    return dataclasses.asdict(config)


def to_yaml(config: Config) -> str:
    return yaml.safe_dump(to_dict(config), sort_keys=False)


def write_resolved(config: Config, directory: str | os.PathLike) -> Path:
    """Write the resolved config as <directory>/config.yaml and return its path."""
    out = Path(directory) / "config.yaml"
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".yaml.tmp")
    tmp.write_text(to_yaml(config))
    os.replace(tmp, out)
    return out


# ---------------------------------------------------------------------------------------------
# Building the dataclass tree from plain YAML data, with errors that name the key.

def _parse_yaml(text: str, source: str) -> dict:
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{source} is not valid YAML{where}; fix the syntax there.") from None
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{source} must hold a mapping of sections (run:, data:, train:, ...), not a {type(raw).__name__}.")
    return raw


def _build(cls, raw: dict, source: str, prefix: str):
    hints = typing.get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}
    for key in raw:
        if key not in known:
            where = f"under '{prefix[:-1]}'" if prefix else "at the top level"
            raise ConfigError(f"{source}: unknown key '{prefix}{key}' {where}; known keys are {', '.join(sorted(known))}.")
    values = {}
    for f in dataclasses.fields(cls):
        if f.name not in raw:
            continue
        key = prefix + f.name
        typ = hints[f.name]
        value = raw[f.name]
        if dataclasses.is_dataclass(typ):
            if value is None:
                value = {}
            if not isinstance(value, dict):
                raise ConfigError(f"{source}: '{key}' must be a mapping of keys, not {value!r}.")
            values[f.name] = _build(typ, value, source, prefix=key + ".")
        else:
            values[f.name] = _check_type(value, typ, key, source)
    return cls(**values)


def _check_type(value, typ, key: str, source: str):
    allowed = typing.get_args(typ) if isinstance(typ, types.UnionType) else (typ,)
    for t in allowed:
        if t is type(None) and value is None:
            return None
        if t is bool and isinstance(value, bool):
            return value
        if t is int and isinstance(value, int) and not isinstance(value, bool):
            return value
        if t is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if t is str and isinstance(value, str):
            return value
        if t is dict and isinstance(value, dict):
            return value
        if t is list and isinstance(value, list):
            return value
    names = " or ".join("null" if t is type(None) else "a mapping" if t is dict else "a list" if t is list
                        else t.__name__ for t in allowed)
    raise ConfigError(f"{source}: '{key}' must be {names}, not {value!r} ({type(value).__name__}).")


def _apply_override(config: Config, item: str) -> None:
    """Apply one `section.key=value` override; the value is parsed as YAML (so 3 is an int)."""
    source = f"override '{item}'"
    if "=" not in item:
        raise ConfigError(f"{source} must look like section.key=value, for example train.steps=200.")
    dotted, text = item.split("=", 1)
    parts = dotted.strip().split(".")
    value = yaml.safe_load(text) if text.strip() else ""
    if parts == ["task"]:
        # On the command line, a relative task file is relative to where the command runs.
        config.task = _task_beside(_check_type(value, str, "task", source), Path.cwd())
        return
    if len(parts) == 2 and parts[0] == "task_settings":
        config.task_settings = {**config.task_settings, parts[1]: value}
        return
    if len(parts) != 2:
        raise ConfigError(f"{source} must name a section and a key, for example train.steps=200.")
    section_name, key = parts
    section = getattr(config, section_name, None)
    if section is None or not dataclasses.is_dataclass(section):
        raise ConfigError(f"{source}: unknown section '{section_name}'; known sections are "
                          f"{', '.join(f.name for f in dataclasses.fields(Config))}.")
    rebuilt = _build(type(section), {**dataclasses.asdict(section), key: value}, source, prefix=section_name + ".")
    setattr(config, section_name, rebuilt)

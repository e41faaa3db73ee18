"""The job file: one TOML document parsed once into a frozen, validated ``JobConfig``.

The master validates the user's file when the job is submitted and stores ``to_json()`` at
``/streamtrain/<job>/config``; every other process reads it back with ``from_json``, which runs
the same checks, so no process ever runs on a value the master would have refused. The stored
document is fully resolved (every default filled in), so processes of different versions agree
on the values even if a default changes later. Keys, defaults and meanings: docs/job-config.md.

This module is the public face: `JobConfig`, parsing and the stored JSON, and the hints for
unknown keys. The sections, one dataclass per table, are in config_sections.py; the value
rules and `JobConfigError` in config_rules.py; both are re-exported here.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import tomllib
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any

from streamtrain.schemas.config_rules import _JSON_VERSION, CsvColumn, JobConfigError, _fix, _show
from streamtrain.schemas.config_sections import (
    _KEYS,
    _SECTIONS,
    InputSection,
    JobSection,
    KafkaSection,
    MasterSection,
    ModelSection,
    PserversSection,
    SgdMode,
    TasksSection,
    TrainSection,
)
from streamtrain.schemas.fields import DeclaredFields

__all__ = [
    "CsvColumn",
    "InputSection",
    "JobConfig",
    "JobConfigError",
    "JobSection",
    "KafkaSection",
    "MasterSection",
    "ModelSection",
    "PserversSection",
    "SgdMode",
    "TasksSection",
    "TrainSection",
]

# ------------------------------------------------------------------------------ the config


@dataclass(frozen=True)
class JobConfig:
    """A whole job file, validated: one frozen section object per ``[table]``.

    Build it with ``load``, ``from_toml`` or ``from_json``; constructing it (or a section)
    directly runs the same checks. Every check raises ``JobConfigError``.
    """

    job: JobSection
    input: InputSection
    tasks: TasksSection = field(default_factory=TasksSection)
    model: ModelSection = field(default_factory=ModelSection)
    train: TrainSection = field(default_factory=TrainSection)
    pservers: PserversSection = field(default_factory=PserversSection)
    master: MasterSection = field(default_factory=MasterSection)
    kafka: KafkaSection = field(default_factory=KafkaSection)

    def __post_init__(self) -> None:
        for name, cls in _SECTIONS.items():
            section = getattr(self, name)
            if not isinstance(section, cls):
                raise JobConfigError(name, f"must be a {cls.__name__}, got {type(section).__name__}")
        job = self.job.name
        # Training on the job's own gradients, dead letters or metrics is always a mistake,
        # and a feedback loop that never ends on an online job.
        for i, topic in enumerate(self.input.topics):
            if topic in (f"{job}.dlq", f"{job}.metrics") or topic.startswith(f"{job}.grad."):
                reason = f"{topic!r} is one of the job's own topics, not input"
                raise JobConfigError(f"input.topics[{i}]", reason)
        if self.pservers.checkpoint_uri is None:
            default_uri = f"file:///var/lib/streamtrain/{job}/ckpt"
            _fix(self, pservers=dataclasses.replace(self.pservers, checkpoint_uri=default_uri))

    @property
    def name(self) -> str:
        """The job name (``job.name``)."""
        return self.job.name

    @property
    def bounded(self) -> bool:
        """True when the input is bounded (``input.passes >= 1``), False for online input."""
        return self.input.passes >= 1

    def with_shards(self, count: int) -> JobConfig:
        """This config with ``pservers.count = count`` (a resized job's: streamtrain/operations/resizing.py)."""
        return dataclasses.replace(self, pservers=dataclasses.replace(self.pservers, count=count))

    @classmethod
    def from_toml(cls, text: str, source: str = "<job>") -> JobConfig:
        """Parse and validate a job file's text; ``source`` names it in error messages.

        Raises:
            JobConfigError: invalid TOML (with line and column), an unknown section or key, a
                missing required key, or a value out of its rules.
        """
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise JobConfigError(None, f"invalid TOML: {exc}", source) from exc
        return _build(data, source)

    @classmethod
    def load(cls, path: str | Path) -> JobConfig:
        """Read, parse and validate the job file at ``path``: TOML, or the JSON of ``to_json``
        if its name ends in ``.json`` (what `LocalJob` hands its master).

        Raises:
            JobConfigError: the file cannot be read or is not UTF-8 (naming the path), or
                anything ``from_toml`` refuses.
        """
        source = str(path)
        try:
            raw = Path(path).read_bytes()
        except OSError as exc:
            raise JobConfigError(None, f"cannot read the job file: {exc.strerror or exc}", source) from exc
        try:
            # utf-8-sig: editors that write a byte-order mark should not break the parse.
            text = raw.decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            raise JobConfigError(None, f"not UTF-8 text (bad byte at offset {exc.start})", source) from exc
        if Path(path).suffix == ".json":
            return cls.from_json(text, source)
        return cls.from_toml(text, source)

    def to_dict(self) -> dict[str, dict[str, Any]]:
        """The resolved config as plain data: ``{section: {key: value}}`` with lists, not tuples.

        Every key is present (defaults filled in) but an optional table not given; feeding it
        back as TOML or JSON gives an equal config.
        """
        return {name: _section_dict(getattr(self, name)) for name in _SECTIONS}

    def to_json(self) -> bytes:
        """The canonical JSON stored in etcd: ASCII, sorted keys, with a ``version`` field.

        ``JobConfig.from_json(c.to_json()) == c`` and the bytes are stable for equal configs.
        """
        document = {"version": _JSON_VERSION, **self.to_dict()}
        return json.dumps(document, sort_keys=True, separators=(",", ":"), allow_nan=False).encode("ascii")

    @classmethod
    def from_json(cls, data: bytes | str, source: str = "<config json>") -> JobConfig:
        """Parse and validate a config stored by ``to_json``, with exactly the TOML checks.

        Raises:
            JobConfigError: invalid JSON, a duplicate key, an unknown ``version``, or anything
                ``from_toml`` refuses.
        """
        try:
            document = json.loads(data, object_pairs_hook=_no_duplicate_keys)
        except JobConfigError as exc:
            raise JobConfigError(exc.key, exc.reason, source) from None
        except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError
            raise JobConfigError(None, f"invalid JSON: {exc}", source) from exc
        if not isinstance(document, dict):
            raise JobConfigError(None, f"must be a JSON object, got {_show(document)}", source)
        version = document.pop("version", None)
        if isinstance(version, bool) or version != _JSON_VERSION:
            reason = f"must be {_JSON_VERSION} (the config format this code reads), got {_show(version)}"
            raise JobConfigError("version", reason, source)
        return _build(document, source)


# ------------------------------------------------------------------------------- plumbing


def _section_dict(section: object) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in fields(section):  # type: ignore[arg-type]
        value = getattr(section, f.name)
        if value is None:  # an optional table not given (input.fields): JSON has no "unset"
            continue
        if isinstance(value, DeclaredFields):
            out[f.name] = value.to_dict()
        elif isinstance(value, SgdMode):  # plain data: the string the job file holds
            out[f.name] = value.value
        else:
            out[f.name] = [str(item) for item in value] if isinstance(value, tuple) else value
    return out


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # json.loads keeps the last of duplicate keys; TOML refuses them, and so do we.
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise JobConfigError(key, "duplicate key in JSON object")
        out[key] = value
    return out


def _build(data: dict[str, Any], source: str) -> JobConfig:
    try:
        _reject_unknown(data)
        sections: dict[str, object] = {}
        for name, cls in _SECTIONS.items():
            raw = data.get(name, {})
            if not isinstance(raw, dict):
                raise JobConfigError(name, f"must be a table ([{name}]), got {_show(raw)}")
            for f in fields(cls):
                if f.default is MISSING and f.default_factory is MISSING and f.name not in raw:
                    raise JobConfigError(f"{name}.{f.name}", "is required")
            for key, value in raw.items():
                # Only JSON has null; None means "use the default" to the constructors.
                if value is None:
                    raise JobConfigError(f"{name}.{key}", "must not be null")
            sections[name] = cls(**raw)
        return JobConfig(**sections)  # type: ignore[arg-type]
    except JobConfigError as exc:
        if exc.source is not None:
            raise
        raise JobConfigError(exc.key, exc.reason, source) from None


# Keys that meant something once: a job file that still sets one is told what became of it.
_REMOVED = {
    "input.json_fields": "renamed: [input.fields] (the same table; it also maps Avro records)",
    "train.commit_every": "removed: deltas are no longer committed in Kafka transactions; each is produced "
                          "as it is made and applied once by the pservers' ledger (docs/job-config.md, "
                          "train.delivery); remove the key",
}


def _reject_unknown(data: dict[str, Any]) -> None:
    """Name every unknown section and key at once, each with the closest known key, if any."""
    problems: list[tuple[str, str]] = []
    for name in data:
        if name not in _SECTIONS:
            what = "unknown section" if isinstance(data[name], dict) else "unknown key outside any [section]"
            problems.append((name, what + _suggest_section(name)))
        elif isinstance(data[name], dict):
            for key in data[name]:
                if f"{name}.{key}" in _REMOVED:
                    problems.append((f"{name}.{key}", _REMOVED[f"{name}.{key}"]))
                elif key not in _KEYS[name]:
                    problems.append((f"{name}.{key}", "unknown key" + _suggest_key(name, key)))
    if problems:
        (key, reason), rest = problems[0], problems[1:]
        if rest:
            reason += " (also " + "; ".join(f"{k}: {r}" for k, r in rest) + ")"
        raise JobConfigError(key, reason)


def _suggest_key(section: str, key: str) -> str:
    close = difflib.get_close_matches(key, _KEYS[section], n=1)
    if close:
        return f", did you mean '{section}.{close[0]}'?"
    # A right key in the wrong section: `[train] optimizer = ...` belongs to [pservers].
    return _suggest_elsewhere(key) or f" (known keys in [{section}]: {', '.join(_KEYS[section])})"


def _suggest_section(name: str) -> str:
    close = difflib.get_close_matches(name, list(_SECTIONS), n=1)
    if close:
        return f", did you mean '{close[0]}'?"
    # A key written above every table header lands at the top level.
    return _suggest_elsewhere(name) or f" (known sections: {', '.join(_SECTIONS)})"


def _suggest_elsewhere(word: str) -> str:
    dotted = {key: f"{section}.{key}" for section, keys in _KEYS.items() for key in keys}
    close = difflib.get_close_matches(word, list(dotted), n=1)
    return f", did you mean '{dotted[close[0]]}'?" if close else ""

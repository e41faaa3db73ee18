"""JSON documents shared by the etcd- and Kafka-side formats: {"v": <version>, ...}.

Readers ignore keys they do not know, so adding an optional key is not a version bump;
removing a key or changing its meaning is.
"""

from __future__ import annotations

import json
from typing import Any

from ._check import Check

_MISSING = object()


def dumps(doc: dict[str, Any], indent: int | None = None) -> bytes:
    """Compact, but still one line that etcdctl and kcat print legibly; non-ASCII stays readable.
    `indent`: for a file people open in an editor (services.json) rather than a value."""
    separators = (",", ":") if indent is None else (",", ": ")
    return json.dumps(doc, separators=separators, indent=indent, ensure_ascii=False, allow_nan=False).encode("utf-8")


def loads(check: Check, data: object, unversioned: bool = False) -> dict[str, Any]:
    """Parse one document and check its version; the caller pulls fields with ``field``.
    `unversioned`: a document without "v" is read as version 1 (one written before the format
    had a version)."""
    doc = parse_object(check, data)
    version(check, doc, unversioned)
    return doc


def parse_object(check: Check, data: object) -> dict[str, Any]:
    """Parse one JSON object, whatever its keys: `loads` without the version check, for a
    document kept whole (a job record's) or one whose version is checked where it is nested."""
    if isinstance(data, (bytes, bytearray, memoryview)):
        try:
            data = bytes(data).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise check.error("$", f"invalid UTF-8: {exc.reason} at byte {exc.start}") from exc
    if not isinstance(data, str):
        raise check.error("$", f"expected bytes or str, got {type(data).__name__}")
    try:
        # NaN and Infinity parse to floats here on purpose: field validation then rejects them
        # with the field's name, which a parse_constant hook could not know.
        doc = json.loads(data)
    except json.JSONDecodeError as exc:
        raise check.error("$", f"invalid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from exc
    except ValueError as exc:  # an integer beyond int()'s digit limit
        raise check.error("$", f"invalid JSON: {exc}") from exc
    except RecursionError as exc:
        raise check.error("$", "invalid JSON: nested too deeply") from exc
    if not isinstance(doc, dict):
        raise check.error("$", f"expected a JSON object, got {type(doc).__name__}")
    return doc


def version(check: Check, doc: dict[str, Any], unversioned: bool = False) -> None:
    """Refuse a document of a version other than `check.version` (field "v")."""
    found = doc.get("v", 1) if unversioned else field(check, doc, "v")
    if type(found) is not int or found != check.version:
        raise check.error("v", f"unknown version {found!r}; this reader understands {check.version}")


def field(check: Check, doc: dict[str, Any], key: str, default: Any = _MISSING, path: str | None = None) -> Any:
    value = doc.get(key, default)
    if value is _MISSING:
        raise check.error(path or key, "missing")
    return value


def required(check: Check, doc: dict[str, Any], *keys: str) -> list[Any]:
    """The values of `keys`, each of which must be present."""
    return [field(check, doc, key) for key in keys]


def array(check: Check, value: Any, path: str) -> list[Any]:
    if not isinstance(value, list):
        raise check.error(path, f"expected a JSON array, got {_kind(value)}")
    return value


def obj(check: Check, value: Any, path: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise check.error(path, f"expected a JSON object, got {_kind(value)}")
    return value


def _kind(value: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}.get(
        type(value), "number"
    )

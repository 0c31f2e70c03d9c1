"""Typed parsing of JSON-like data into frozen dataclasses, and back.

The engine behind `api.py`: field metadata (`fld(...)`) carries what both the
parser and the CRD generator (`crd.py`) need — the JSON name, minimum/maximum,
pattern, description — so the Python model, the parser's messages and the
OpenAPI schema cannot disagree. Standard library only (the trainer image and
`disttrain validate` import it without kopf).

Parsing never stops at the first problem: every error is collected with its
field path, and a field whose value is wrong is replaced by its default, so
that cross-field rules (`validation.py`) can still run on the rest.
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from dataclasses import MISSING, dataclass, field
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

# Kubernetes resource quantity (the API server's own grammar, simplified).
QUANTITY_PATTERN = r"^[0-9]+(\.[0-9]+)?(m|k|Ki|M|Mi|G|Gi|T|Ti|P|Pi|E|Ei)?$"
# RFC 3339 as Kubernetes writes it (metav1.Time): 2024-01-02T03:04:05Z.
TIME_PATTERN = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]+)?(Z|[+-][0-9]{2}:[0-9]{2})$"


class Quantity(str):
    """A Kubernetes quantity: YAML may give it as an integer or a string."""


class Time(str):
    """An RFC 3339 timestamp (metav1.Time); `format: date-time` in the schema."""


class Object(dict):  # type: ignore[type-arg]
    """A free-form object passed through to Kubernetes (pod template, volume)."""


def fld(
    default: Any = MISSING,
    *,
    factory: Any = MISSING,
    json: str | None = None,
    minimum: float | None = None,
    maximum: float | None = None,
    exclusive_minimum: bool = False,
    pattern: str | None = None,
    desc: str = "",
) -> Any:
    meta = {
        "json": json,
        "minimum": minimum,
        "maximum": maximum,
        "exclusive_minimum": exclusive_minimum,
        "pattern": pattern,
        "description": desc,
    }
    if factory is not MISSING:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


def json_name(f: dataclasses.Field[Any]) -> str:
    explicit = f.metadata.get("json")
    if explicit:
        return str(explicit)
    head, *rest = f.name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def has_default(f: dataclasses.Field[Any]) -> bool:
    return f.default is not MISSING or f.default_factory is not MISSING


def default_of(f: dataclasses.Field[Any]) -> Any:
    if f.default_factory is not MISSING:
        return f.default_factory()
    return f.default


def is_optional(tp: Any) -> bool:
    return get_origin(tp) in (Union, types.UnionType) and type(None) in get_args(tp)


def is_bool_or_enum(tp: Any) -> bool:
    """`bool | Literal[...]`: a field that takes true, false or one of the literal's strings."""
    args = get_args(tp) if get_origin(tp) in (Union, types.UnionType) else ()
    return len(args) == 2 and args[0] is bool and get_origin(args[1]) is Literal


def bool_or_enum_names(tp: Any) -> tuple[str, ...]:
    return tuple(get_args(get_args(tp)[1]))


def strip_optional(tp: Any) -> Any:
    if is_bool_or_enum(tp):
        return tp
    if get_origin(tp) in (Union, types.UnionType):
        inner = [a for a in get_args(tp) if a is not type(None)]
        if len(inner) != 1:
            raise TypeError(f"only X | None unions are supported, got {tp!r}")
        return inner[0]
    return tp


@dataclass(frozen=True)
class FieldError:
    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


class SpecError(ValueError):
    """Every problem found in one manifest, each with its field path."""

    def __init__(self, errors: list[FieldError]):
        self.errors = list(errors)
        super().__init__("\n".join(str(e) for e in self.errors))


def describe(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def _fmt(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def _check_range(value: float, meta: typing.Mapping[str, Any], path: str, errors: list[FieldError]) -> None:
    lo, hi = meta.get("minimum"), meta.get("maximum")
    if lo is not None:
        if meta.get("exclusive_minimum") and not value > lo:
            errors.append(FieldError(path, f"{value} must be greater than {_fmt(lo)}"))
        elif value < lo:
            errors.append(FieldError(path, f"{value} must be >= {_fmt(lo)}"))
    if hi is not None and value > hi:
        errors.append(FieldError(path, f"{value} must be <= {_fmt(hi)}"))


def _parse_value(tp: Any, value: Any, meta: typing.Mapping[str, Any], path: str, errors: list[FieldError]) -> Any:
    if is_optional(tp):
        return None if value is None else _parse_value(strip_optional(tp), value, meta, path, errors)
    origin = get_origin(tp)
    if is_bool_or_enum(tp):  # a switch that is also a choice: true, false, or one of the named modes
        names = bool_or_enum_names(tp)
        if isinstance(value, bool) or value in names:
            return value
        errors.append(FieldError(path, f"{value!r} is not true, false or one of {', '.join(names)}"))
        return False
    if origin is Literal:
        allowed = get_args(tp)
        if value not in allowed:
            errors.append(FieldError(path, f"{value!r} is not one of {', '.join(map(str, allowed))}"))
            return allowed[0]
        return value
    if origin is tuple:
        item_tp = get_args(tp)[0]
        if not isinstance(value, list):
            errors.append(FieldError(path, f"expected a list, got {describe(value)}"))
            return ()
        item_meta = {"pattern": meta.get("pattern")} if item_tp is str else {}
        return tuple(_parse_value(item_tp, v, item_meta, f"{path}[{i}]", errors) for i, v in enumerate(value))
    if dataclasses.is_dataclass(tp):
        return parse_dataclass(tp, value, path, errors)
    if tp is Object:
        if not isinstance(value, dict):
            errors.append(FieldError(path, f"expected an object, got {describe(value)}"))
            return Object()
        return Object(value)
    if tp is bool:
        if not isinstance(value, bool):
            errors.append(FieldError(path, f"expected a boolean (true or false), got {describe(value)}"))
            return False
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            errors.append(FieldError(path, f"expected an integer, got {describe(value)} {value!r}"))
            return 0
        _check_range(value, meta, path, errors)
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            errors.append(FieldError(path, f"expected a number, got {describe(value)} {value!r}"))
            return 0.0
        if value != value or value in (float("inf"), float("-inf")):
            errors.append(FieldError(path, f"{value} is not a finite number"))
            return 0.0
        _check_range(float(value), meta, path, errors)
        return float(value)
    if tp is Quantity:
        # The API server's int-or-string accepts integers and strings only: a YAML
        # float such as 0.5 would be rejected there, so it is rejected here too.
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            hint = f"; quote it: '{value}'" if isinstance(value, float) else ""
            errors.append(
                FieldError(path, f"expected a quantity such as 2, '500m' or '4Gi', got {describe(value)}{hint}")
            )
            return Quantity("0")
        text = str(value)
        if not re.match(QUANTITY_PATTERN, text):
            errors.append(FieldError(path, f"{text!r} is not a Kubernetes quantity (e.g. 2, 500m, 4Gi)"))
        return Quantity(text)
    if tp is Time:
        if not isinstance(value, str) or not re.match(TIME_PATTERN, value):
            errors.append(FieldError(path, f"expected an RFC 3339 time such as 2024-01-02T03:04:05Z, got {value!r}"))
            return None
        return Time(value)
    if tp is str:
        if not isinstance(value, str):
            errors.append(FieldError(path, f"expected a string, got {describe(value)}"))
            return ""
        pattern = meta.get("pattern")
        if pattern and not re.match(pattern, value):
            errors.append(FieldError(path, f"{value!r} does not match {pattern}"))
        return value
    raise TypeError(f"unsupported field type {tp!r} at {path}")  # a bug in the model, not in input


def parse_dataclass(cls: Any, data: Any, path: str, errors: list[FieldError]) -> Any:
    """Parse `data` into `cls`, appending every problem to `errors`.

    Never raises for bad input: a wrong leaf value is reported and replaced by the
    field's default, so the result is always a well-formed (if not the intended)
    object on which cross-field rules can still be evaluated.
    """
    if data is None:
        data = {}
    if not isinstance(data, dict):
        errors.append(FieldError(path, f"expected an object, got {describe(data)}"))
        data = {}
    hints = get_type_hints(cls)
    by_json = {json_name(f): f for f in dataclasses.fields(cls)}
    for key in data:
        if key not in by_json:
            known = ", ".join(sorted(by_json))
            errors.append(FieldError(f"{path}.{key}", f"unknown field (known fields: {known})"))
    kwargs: dict[str, Any] = {}
    for name, f in by_json.items():
        sub = f"{path}.{name}"
        tp = hints[f.name]
        if name in data:
            value = data[name]
            if value is None and not is_optional(tp) and has_default(f):
                # An explicit null means "use the default", as the API server does
                # (it prunes nulls of non-nullable fields before defaulting).
                continue
            before = len(errors)
            parsed = _parse_value(tp, value, f.metadata, sub, errors)
            leaf = not dataclasses.is_dataclass(strip_optional(tp))
            if leaf and any(e.path == sub for e in errors[before:]) and has_default(f):
                parsed = default_of(f)
            kwargs[f.name] = parsed
        elif not has_default(f):
            errors.append(FieldError(sub, "required field is missing"))
            kwargs[f.name] = None
    return cls(**kwargs)


def to_json(obj: Any) -> Any:
    """Dataclass -> plain JSON-able dict with API (camelCase) names; defaults included."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {json_name(f): to_json(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, str):
        return str(obj)  # Quantity, Time -> plain str (yaml/json dumpers want exact types)
    if isinstance(obj, dict):
        return {k: to_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_json(v) for v in obj]
    return obj

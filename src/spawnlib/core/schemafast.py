from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

# ------------------------------------------------ schemas without jsonschema --

# Importing jsonschema costs about 0.1 s of CPU (referencing, attrs, rpds and
# every draft's meta-schema read from disk): at `--schema`, it came before the
# root's CLI could start, and every nested level checked its schema again.
# The schemas agents are given are mostly plain: objects of typed properties,
# required names, enums, arrays of the same. For those, the two checks below
# answer here. Each answers only "certainly yes": a schema or an output they
# can't vouch for goes to jsonschema, which then gives the verdict and its
# own messages, so what users see is jsonschema's in every case. Soundness is
# what matters: "yes" here must never be "no" there (test_schemafast holds
# both sides to it over the shipped schemas and edge cases).

# The drafts whose meaning this module knows for the keywords it takes (the
# same for all four); draft 4 and 3 differ (exclusiveMinimum, integer), and an
# unknown $schema makes jsonschema warn: those go to it.
FAST_DRAFTS = frozenset(
    f"{uri}{tail}"
    for uri in (
        "https://json-schema.org/draft/2020-12/schema",
        "https://json-schema.org/draft/2019-09/schema",
        "http://json-schema.org/draft-07/schema",
        "http://json-schema.org/draft-06/schema",
    )
    for tail in ("", "#")
)
FAST_TYPES = frozenset(("object", "array", "string", "number", "integer", "boolean", "null"))
FAST_ANNOTATIONS = frozenset(("title", "description", "$comment", "format"))  # strings; format is not asserted
FAST_FLAGS = frozenset(("readOnly", "writeOnly", "deprecated", "uniqueItems"))  # booleans
FAST_COUNTS = frozenset(("minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties"))
FAST_BOUNDS = frozenset(("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"))
# An $id the meta-schemas' uri-reference format and "no fragment" pattern
# surely accept: an absolute http(s) URL or a relative path with no colon.
FAST_ID = re.compile(r"(?:https?://[A-Za-z0-9._~-]+(?:/[A-Za-z0-9._~-]*)*|[A-Za-z0-9._~-]+(?:/[A-Za-z0-9._~-]*)*)#?")


def schema_surely_valid(schema: Mapping[str, Any]) -> bool:
    """True only if jsonschema's check_schema surely accepts schema (False: ask it)."""
    draft = schema.get("$schema")
    if draft is not None and draft not in FAST_DRAFTS:
        return False
    schema_id = schema.get("$id")
    if schema_id is not None and not (isinstance(schema_id, str) and FAST_ID.fullmatch(schema_id)):
        return False
    return _subschema_ok({k: v for k, v in schema.items() if k not in ("$schema", "$id")})


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _scalars_ok(values: object) -> bool:
    """An enum this module can compare: a non-empty list of distinct strings, integers, booleans or nulls."""
    if not isinstance(values, list) or not values:
        return False
    if not all(v is None or isinstance(v, (str, bool)) or _is_int(v) for v in values):
        return False
    return len({(type(v), v) for v in values}) == len(values)


def _subschema_ok(schema: object) -> bool:
    if isinstance(schema, bool):
        return True
    if not isinstance(schema, dict):
        return False
    for key, value in schema.items():
        if key in FAST_ANNOTATIONS:
            ok = isinstance(value, str)
        elif key in FAST_FLAGS:
            ok = isinstance(value, bool)
        elif key in FAST_COUNTS:
            ok = _is_int(value) and value >= 0
        elif key in FAST_BOUNDS:
            ok = _is_number(value)
        elif key == "default":
            ok = True
        elif key == "examples":
            ok = isinstance(value, list)
        elif key == "type":
            names = value if isinstance(value, list) else [value]
            ok = bool(names) and all(isinstance(n, str) and n in FAST_TYPES for n in names) and len(set(names)) == len(names)
        elif key == "properties":
            ok = isinstance(value, dict) and all(_subschema_ok(sub) for sub in value.values())
        elif key == "required":
            ok = isinstance(value, list) and all(isinstance(n, str) for n in value) and len(set(value)) == len(value)
        elif key in ("additionalProperties", "items"):
            ok = _subschema_ok(value)
        elif key in ("allOf", "anyOf"):
            ok = isinstance(value, list) and bool(value) and all(_subschema_ok(sub) for sub in value)
        elif key == "enum":
            ok = _scalars_ok(value)
        elif key == "const":
            ok = _scalars_ok([value])
        elif key == "pattern":
            ok = isinstance(value, str) and _compiles(value)
        else:
            return False  # $ref, oneOf, if/then, patternProperties...: jsonschema's
        if not ok:
            return False
    return True


def _compiles(pattern: str) -> bool:
    """jsonschema's "regex" format: what re compiles."""
    try:
        re.compile(pattern)
    except (re.error, RecursionError, OverflowError):
        return False
    return True


def output_surely_valid(schema: Mapping[str, Any], value: Any) -> bool:
    """True only if jsonschema finds no error in value under schema (False: ask it).

    For a schema schema_surely_valid accepted; any other answers False.
    """
    return schema_surely_valid(schema) and _matches({k: v for k, v in schema.items() if k not in ("$schema", "$id")}, value)


def _type_is(name: str, value: object) -> bool:
    """A JSON value's type; an integral float counts as no integer here (jsonschema's call)."""
    if name == "object":
        return isinstance(value, dict)
    if name == "array":
        return isinstance(value, list)
    if name == "string":
        return isinstance(value, str)
    if name == "number":
        return _is_number(value)
    if name == "integer":
        return _is_int(value)
    if name == "boolean":
        return isinstance(value, bool)
    return value is None  # "null"


def _same_scalar(a: object, b: object) -> bool:
    return type(a) is type(b) and a == b


def _matches(schema: object, value: Any) -> bool:
    """Whether value surely satisfies schema (a subschema _subschema_ok accepted)."""
    if isinstance(schema, bool):
        return schema
    assert isinstance(schema, dict)
    for key, rule in schema.items():
        if key == "type":
            if not any(_type_is(n, value) for n in (rule if isinstance(rule, list) else [rule])):
                return False
        elif key == "enum":
            if not any(_same_scalar(value, option) for option in rule):
                return False
        elif key == "const":
            if not _same_scalar(value, rule):
                return False
        elif key in ("allOf", "anyOf"):
            hits = [_matches(sub, value) for sub in rule]
            if not (all(hits) if key == "allOf" else any(hits)):
                return False
        elif isinstance(value, dict):
            if not _object_matches(key, rule, schema, value):
                return False
        elif isinstance(value, list):
            if not _array_matches(key, rule, value):
                return False
        elif isinstance(value, str):
            if not _string_matches(key, rule, value):
                return False
        elif _is_number(value) and not _number_matches(key, rule, value):
            return False
    return True


def _object_matches(key: str, rule: Any, schema: Mapping[str, Any], value: dict[str, Any]) -> bool:
    if key == "properties":
        return all(_matches(sub, value[name]) for name, sub in rule.items() if name in value)
    if key == "required":
        return all(name in value for name in rule)
    if key == "additionalProperties":
        known = schema.get("properties", {})
        return all(_matches(rule, item) for name, item in value.items() if name not in known)
    if key == "minProperties":
        return bool(len(value) >= rule)
    if key == "maxProperties":
        return bool(len(value) <= rule)
    return True  # a keyword for other types


def _array_matches(key: str, rule: Any, value: list[Any]) -> bool:
    if key == "items":
        return all(_matches(rule, item) for item in value)
    if key == "minItems":
        return bool(len(value) >= rule)
    if key == "maxItems":
        return bool(len(value) <= rule)
    if key == "uniqueItems":
        # Distinct by this module's own equality only for strings and integers;
        # anything else (1 against true, 1 against 1.0, nested values) is jsonschema's.
        if not rule:
            return True
        if not all(isinstance(item, str) or _is_int(item) for item in value):
            return False
        return len({(type(item), item) for item in value}) == len(value)
    return True


def _string_matches(key: str, rule: Any, value: str) -> bool:
    if key == "minLength":
        return bool(len(value) >= rule)
    if key == "maxLength":
        return bool(len(value) <= rule)
    if key == "pattern":
        return re.search(rule, value) is not None
    return True


def _number_matches(key: str, rule: Any, value: float) -> bool:
    if key == "minimum":
        return bool(value >= rule)
    if key == "maximum":
        return bool(value <= rule)
    if key == "exclusiveMinimum":
        return bool(value > rule)
    if key == "exclusiveMaximum":
        return bool(value < rule)
    return True

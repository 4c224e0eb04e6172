"""spawn.py's own schema checks: only ever "certainly valid", never a verdict jsonschema would not give.

schema_surely_valid and output_surely_valid answer for plain schemas without
importing jsonschema; everything else goes to jsonschema, whose verdict and
messages users see. Each test holds the fast answer against jsonschema's.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest

import spawn

ROOT = Path(__file__).resolve().parent.parent
# The schemas agents answer with (not the records'): plain enough to skip jsonschema.
OUTPUT_SCHEMAS = ("build", "design", "diagnosis", "docs", "findings", "plan", "review", "summary", "test-report")


def jsonschema_accepts(schema: dict[str, Any]) -> bool:
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError:
        return False
    return True


def jsonschema_errors(schema: dict[str, Any], value: Any) -> list[str]:
    return [e.message for e in jsonschema.validators.validator_for(schema)(schema).iter_errors(value)]


def shipped(name: str) -> dict[str, Any]:
    data = json.loads((ROOT / "schemas" / f"{name}.json").read_text())
    assert isinstance(data, dict)
    return data


def test_every_shipped_schema_it_vouches_for_jsonschema_accepts_and_the_output_schemas_are_among_them() -> None:
    for path in sorted((ROOT / "schemas").glob("*.json")):
        schema = json.loads(path.read_text())
        if spawn.schema_surely_valid(schema):
            assert jsonschema_accepts(schema), path.name
    for name in OUTPUT_SCHEMAS:
        assert spawn.schema_surely_valid(shipped(name)), name


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "strng"},
        {"type": []},
        {"type": ["string", "string"]},
        {"required": ["a", "a"]},
        {"required": "a"},
        {"minLength": -1},
        {"minItems": 1.5},
        {"maxLength": True},
        {"minimum": "0"},
        {"pattern": "("},
        {"allOf": []},
        {"anyOf": [{"type": "nope"}]},
        {"properties": {"a": {"type": 3}}},
        {"properties": []},
        {"items": {"minItems": -2}},
        {"additionalProperties": {"type": "nope"}},
        {"title": 3},
        {"description": None},
        {"format": 1},
        {"examples": {}},
        {"uniqueItems": "yes"},
        {"$id": "spawn.py/x.json#frag"},
        {"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "strng"},
        {"$schema": "http://json-schema.org/draft-07/schema#", "minLength": -1},
    ],
)
def test_it_never_vouches_for_a_schema_jsonschema_refuses(schema: dict[str, Any]) -> None:
    assert not jsonschema_accepts(schema)
    assert not spawn.schema_surely_valid(schema)


@pytest.mark.parametrize(
    "schema",
    [
        {"$ref": "#/$defs/x", "$defs": {"x": {"type": "string"}}},
        {"oneOf": [{"type": "string"}]},
        {"if": {"type": "string"}, "then": {"minLength": 1}},
        {"patternProperties": {"^a": {"type": "string"}}},
        {"items": [{"type": "string"}]},
        {"$schema": "http://json-schema.org/draft-04/schema#", "type": "integer"},
        {"$schema": "https://example.com/my-meta", "type": "string"},
        {"const": {"a": 1}},
        {"enum": [1, 1.0]},
        {"enum": []},
        {"x-vendor": True},
    ],
)
def test_what_it_does_not_know_goes_to_jsonschema(schema: dict[str, Any]) -> None:
    assert not spawn.schema_surely_valid(schema)
    assert not spawn.output_surely_valid(schema, "anything")


def test_the_drafts_it_knows_are_the_ones_jsonschema_reads_alike() -> None:
    """Draft 6 onwards mean the same by every keyword it takes; each URI it accepts is one of them to jsonschema."""
    same = {"Draft6Validator", "Draft7Validator", "Draft201909Validator", "Draft202012Validator"}
    for uri in spawn.FAST_DRAFTS:
        assert jsonschema.validators.validator_for({"$schema": uri}).__name__ in same, uri


FINDINGS_VALUES: list[Any] = [
    {"summary": "s", "findings": []},
    {"summary": "s", "findings": [{"claim": "c", "confidence": "high"}]},
    {"summary": "s", "findings": [{"claim": "c", "confidence": "sure"}]},
    {"summary": "s", "findings": [{"claim": 3}]},
    {"summary": "s", "findings": [{}]},
    {"summary": "s", "findings": [], "extra": 1},
    {"summary": "s", "findings": [], "open_questions": ["q", 2]},
    {"findings": []},
    {"summary": None, "findings": []},
    [],
    "text",
    None,
    {"summary": "s", "findings": {}},
]


@pytest.mark.parametrize("value", FINDINGS_VALUES)
def test_findings_outputs_agree_with_jsonschema(value: Any) -> None:
    schema = shipped("findings")
    errors = jsonschema_errors(schema, value)
    assert spawn.output_surely_valid(schema, value) == (not errors)


# Values whose JSON types jsonschema and Python see differently: the fast
# path must not vouch for any of them unless jsonschema does too.
TRICKY: list[Any] = [0, 1, -1, 1.0, 1.5, True, False, None, "", "a", "ab", "1", [], [1], [1, 1], [1, True], [1, 1.0], ["a", "a"],
                     [[1], [1]], {}, {"a": 1}, {"a": None}, {"b": "x"}, float("nan"), 10**20, "\u00e9\u00e9"]  # fmt: skip
TRICKY_SCHEMAS: list[dict[str, Any]] = [
    {"type": "integer"},
    {"type": "number", "minimum": 0, "exclusiveMaximum": 2},
    {"type": ["string", "null"], "minLength": 1, "maxLength": 1},
    {"type": "boolean"},
    {"enum": [1, "a", None, True]},
    {"const": 1},
    {"const": False},
    {"type": "array", "uniqueItems": True},
    {"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 2},
    {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"], "additionalProperties": False},
    {"type": "object", "additionalProperties": {"type": "string"}, "minProperties": 1, "maxProperties": 1},
    {"pattern": "^[a-z]+$"},
    {"anyOf": [{"type": "string"}, {"type": "integer"}]},
    {"allOf": [{"minimum": 1}, {"maximum": 1}]},
    {"items": False},
    {"additionalProperties": True, "properties": {"a": False}},
    {"minimum": 1e20},
]


@pytest.mark.parametrize("schema", TRICKY_SCHEMAS)
def test_it_never_vouches_for_a_value_jsonschema_refuses(schema: dict[str, Any]) -> None:
    assert spawn.schema_surely_valid(schema) and jsonschema_accepts(schema)
    for value in TRICKY:
        if spawn.output_surely_valid(schema, value):
            assert not jsonschema_errors(schema, value), (schema, value)


def random_value(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randrange(9 if depth < 3 else 6)
    if kind == 0:
        return rng.choice([None, True, False])
    if kind == 1:
        return rng.choice([0, 1, -3, 7, 1.0, 2.5, -0.5])
    if kind in (2, 3, 4, 5):
        return rng.choice(["", "a", "low", "high", "medium", "x1", "claim", "summary"])
    if kind in (6, 7):
        return {
            rng.choice(["summary", "findings", "claim", "confidence", "a", "b"]): random_value(rng, depth + 1)
            for _ in range(rng.randrange(4))
        }
    return [random_value(rng, depth + 1) for _ in range(rng.randrange(4))]


def test_random_values_under_the_shipped_schemas_never_pass_where_jsonschema_fails() -> None:
    rng = random.Random(35)
    for name in OUTPUT_SCHEMAS:
        schema = shipped(name)
        for _ in range(300):
            value = random_value(rng)
            if spawn.output_surely_valid(schema, value):
                assert not jsonschema_errors(schema, value), (name, value)


def test_a_plain_schema_is_checked_without_importing_jsonschema() -> None:
    """`--schema findings` no longer imports jsonschema before the CLI starts (~0.1 s of CPU at every root)."""
    code = (
        "import sys, spawn\n"
        "schema, _ = spawn.load_schema('findings')\n"
        "assert spawn.validate_output(schema, {'summary': 's', 'findings': []}) == []\n"
        "print('jsonschema' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
    # What it can't vouch for still gets jsonschema's messages, as before.
    errors = spawn.validate_output(shipped("findings"), {"findings": []})
    assert errors == ["(root): 'summary' is a required property"]
    with pytest.raises(spawn.UsageError, match="is not a valid JSON Schema"):
        spawn.check_schema({"type": "strng"}, "inline")

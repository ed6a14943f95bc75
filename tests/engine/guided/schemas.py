"""Twenty JSON schemas for the guided-decoding tests: nested objects, arrays, enums, bounded numbers, required fields,
strings bounded by maxLength and arrays by maxItems. Each is closed (no additional properties) and bounded, so a
grammar-following output is finite and fits the tests' max_tokens; every name is the prompt's topic. A `number`
has a `multipleOf` (a power-of-two fraction, which jsonschema checks exactly): without one its fraction digits are
unbounded, and the demo model, sampled, wrote digits until max_tokens (docs/structured-outputs.md)."""

from __future__ import annotations


def closed(properties: dict, required: list[str] | None = None) -> dict:
    """An object schema with exactly these properties, all required unless `required` says otherwise."""
    return {"type": "object", "properties": properties, "required": list(properties) if required is None else required,
            "additionalProperties": False}


def text(max_length: int) -> dict:
    return {"type": "string", "maxLength": max_length}


SCHEMAS: dict[str, dict] = {
    "person": closed({"name": text(16), "age": {"type": "integer", "minimum": 0, "maximum": 120}}),
    "module": closed({"module": text(12), "stdlib": {"type": "boolean"}}),
    "colour": closed({"colour": {"enum": ["red", "green", "blue"]}}),
    "point": closed({"x": {"type": "integer", "minimum": -100, "maximum": 100},
                     "y": {"type": "integer", "minimum": -100, "maximum": 100}}),
    "tags": closed({"tags": {"type": "array", "items": text(8), "maxItems": 3}}),
    "scores": closed({"scores": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 10},
                                 "maxItems": 4}}),
    "address": closed({"city": text(12), "geo": closed({"lat": {"type": "integer", "minimum": -90, "maximum": 90},
                                                        "lon": {"type": "integer", "minimum": -180,
                                                                "maximum": 180}})}),
    "book": closed({"title": text(20), "year": {"type": "integer", "minimum": 1450, "maximum": 2030},
                    "genre": {"enum": ["fiction", "poetry", "science"]}}),
    "optional": closed({"id": {"type": "integer", "minimum": 1, "maximum": 999}, "note": text(10)}, required=["id"]),
    "matrix": closed({"rows": {"type": "array", "maxItems": 2,
                               "items": {"type": "array", "maxItems": 2,
                                         "items": {"type": "integer", "minimum": 0, "maximum": 9}}}}),
    "status": closed({"ok": {"type": "boolean"}, "code": {"enum": [200, 404, 500]}}),
    "ratio": closed({"ratio": {"type": "number", "minimum": 0, "maximum": 1, "multipleOf": 0.25}}),
    "team": closed({"team": text(10), "members": {"type": "array", "maxItems": 2,
                                                  "items": closed({"name": text(8),
                                                                   "role": {"enum": ["lead", "dev"]}})}}),
    "version": closed({"major": {"type": "integer", "minimum": 0, "maximum": 9},
                       "minor": {"type": "integer", "minimum": 0, "maximum": 99}, "tag": {"enum": ["a", "b", "rc"]}}),
    "nullable": closed({"value": {"type": ["integer", "null"], "minimum": 0, "maximum": 5}}),
    "config": closed({"debug": {"type": "boolean"},
                      "level": {"enum": ["low", "high"]},
                      "limits": closed({"cpu": {"type": "integer", "minimum": 1, "maximum": 64},
                                        "memory": {"type": "integer", "minimum": 1, "maximum": 512}})}),
    "choice": closed({"answer": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 9}, {"enum": ["none"]}]}}),
    "words": closed({"words": {"type": "array", "items": {"enum": ["alpha", "beta", "gamma"]}, "minItems": 1,
                               "maxItems": 3}}),
    "temperature": closed({"celsius": {"type": "number", "minimum": -50, "maximum": 50, "multipleOf": 0.5},
                           "unit": {"const": "C"}}),
    "event": closed({"name": text(12), "day": {"type": "integer", "minimum": 1, "maximum": 31},
                     "month": {"enum": ["jan", "feb", "mar"]}, "guests": {"type": "array", "items": text(6),
                                                                         "maxItems": 2}}),
}

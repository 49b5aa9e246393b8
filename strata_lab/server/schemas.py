"""Client JSON schemas (`response_format`), checked without ever fetching or reading anything.

jsonschema's default registry retrieves a `$ref` it does not hold (`http://...` through urllib, and
`file:///...` too), which turns a client's schema into a request the server makes for it (SSRF) or a local
file it reads. Here every schema gets a `referencing.Registry` holding only the schema itself (and the
subschemas it names with `$id`) and no retrieve function: a reference that points outside the schema is
a 400 naming the subschema that holds it, raised before any generation.

>>> check_schema({"$defs": {"n": {"type": "integer"}}, "properties": {"x": {"$ref": "#/$defs/n"}}}, "schema")
>>> check_schema({"properties": {"x": {"$ref": "http://127.0.0.1/s.json"}}}, "schema")
Traceback (most recent call last):
...
strata_lab.server.errors.RequestError: schema.properties.x: $ref 'http://127.0.0.1/s.json' does not resolve inside the schema (references are never fetched)
>>> schema_validator({"type": "integer"}).is_valid(3)
True
"""
from __future__ import annotations

from typing import Any

from strata_lab.server.errors import RequestError

__all__ = ["check_schema", "schema_validator"]

_REF_KEYS = ("$ref", "$dynamicRef", "$recursiveRef")
_DATA_KEYS = ("const", "enum", "default", "examples")  # values, not subschemas: a "$ref" there is data
_PROBES = (None, {}, [], "", 0)  # trial instances that reveal endless self-reference


def _resource(schema: dict):
    from referencing.jsonschema import DRAFT202012, specification_with

    dialect = schema.get("$schema")
    spec = specification_with(dialect, default=DRAFT202012) if isinstance(dialect, str) else DRAFT202012
    return spec.create_resource(schema), spec


def _registry(schema: dict):
    from referencing import Registry

    resource, _ = _resource(schema)
    base = resource.id() or ""
    # no `retrieve=`: a URI the registry does not hold raises Unresolvable instead of being fetched
    return Registry().with_resource(base, resource).crawl(), base


def schema_validator(schema: dict):
    """A jsonschema validator for `schema` whose references resolve only inside `schema`."""
    import jsonschema

    registry, _ = _registry(schema)
    return jsonschema.validators.validator_for(schema)(schema, registry=registry)


def check_schema(schema: Any, name: str) -> None:
    """Raise RequestError(`name`...) unless `schema` is a valid schema whose references all resolve inside it."""
    import jsonschema

    if not isinstance(schema, (dict, bool)):
        raise RequestError(name, "must be a JSON schema (an object)")
    if isinstance(schema, bool):
        return
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise RequestError(name, f"is not a valid JSON schema: {exc.message}") from None
    except Exception as exc:  # odd $schema values, recursion in the meta-schema check, and the like
        raise RequestError(name, f"is not a valid JSON schema: {type(exc).__name__}") from None
    try:
        registry, base = _registry(schema)
    except Exception as exc:  # a malformed $id and the like
        raise RequestError(name, f"is not a usable JSON schema: {exc}") from None
    _check_refs(schema, name, registry.resolver(base_uri=base))
    validator = schema_validator(schema)
    for probe in _PROBES:
        try:
            validator.is_valid(probe)
        except RecursionError:
            raise RequestError(name, "refers to itself without end") from None
        except Exception as exc:  # e.g. a `pattern` that is not a regular expression
            raise RequestError(name, f"cannot be applied: {type(exc).__name__}: {exc}"[:300]) from None


def _check_refs(schema: dict, name: str, resolver) -> None:
    _, spec = _resource(schema)
    stack = [(schema, name, resolver)]
    while stack:  # iterative: a deeply nested schema must not hit the recursion limit here
        node, path, res = stack.pop()
        if isinstance(node, dict):
            if isinstance(node.get("$id"), str) and node is not schema:
                try:
                    res = res.in_subresource(spec.create_resource(node))
                except Exception as exc:
                    raise RequestError(path, f"$id {node['$id']!r} is not usable: {exc}") from None
            for key in _REF_KEYS:
                ref = node.get(key)
                if isinstance(ref, str):
                    try:
                        res.lookup(ref)
                    except Exception:
                        raise RequestError(path, f"{key} {ref!r} does not resolve inside the schema "
                                           "(references are never fetched)") from None
            children = [(v, f"{path}.{k}", res) for k, v in node.items()
                        if k not in _DATA_KEYS and isinstance(v, (dict, list))]
        elif isinstance(node, list):
            children = [(v, f"{path}[{i}]", res) for i, v in enumerate(node) if isinstance(v, (dict, list))]
        else:
            children = []
        stack.extend(reversed(children))  # popped in document order: the first bad $ref is reported

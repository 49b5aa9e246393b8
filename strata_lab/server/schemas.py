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
strata_lab.server.errors.RequestError: schema.properties.x: $ref 'http://127.0.0.1/s.json' does not resolve inside the schema (only '#' and '#/...' references are supported; references are never fetched)
>>> schema_validator({"type": "integer"}).is_valid(3)
True
"""
from __future__ import annotations

from typing import Any

from strata_lab.server.errors import RequestError

__all__ = ["check_schema", "schema_validator", "SchemaBudget", "SCHEMA_LIMITS", "MAX_TOOLS"]

# What one request's schemas (response_format, json_schema, every tool's parameters together) may hold.
# Checked by one iterative walk before anything else looks at a schema: grammar compile time grows with
# these (xgrammar: 400 optional properties ~0.5 s, 1,000 ~20 s on a busy 2-core box), so they are what
# keeps a compile short. docs/SECURITY.md lists them.
SCHEMA_LIMITS = {
    "depth": 64,               # nesting of objects and arrays inside one schema
    "nodes": 20_000,           # objects and arrays, all schemas of a request together
    "properties": 1024,        # `properties` entries, all schemas together
    "object_properties": 256,  # `properties` entries of one object
    "enum": 4096,              # `enum` values, all schemas together
    "branches": 256,           # anyOf / oneOf / allOf / prefixItems entries, all schemas together
}
MAX_TOOLS = 128                # tools one request may declare
_BRANCH_KEYS = ("anyOf", "oneOf", "allOf", "prefixItems")


class SchemaBudget:
    """Counts against SCHEMA_LIMITS across the schemas of one request; a RequestError when one runs out."""

    def __init__(self, limits: dict | None = None):
        self.limits = dict(SCHEMA_LIMITS if limits is None else limits)
        self.used = {"nodes": 0, "properties": 0, "enum": 0, "branches": 0}

    def _spend(self, what: str, n: int, path: str) -> None:
        self.used[what] += n
        if self.used[what] > self.limits[what]:
            raise RequestError(path, f"the request's schemas hold more than {self.limits[what]} {_WHAT[what]} "
                               "(a limit that keeps grammar compilation short)", code="schema_too_large")

    def walk(self, schema, name: str) -> None:
        """Count `schema`'s parts (iteratively: nesting depth is the client's choice)."""
        stack = [(schema, name, 0)]
        while stack:
            node, path, depth = stack.pop()
            if depth > self.limits["depth"]:
                raise RequestError(path, f"nests deeper than {self.limits['depth']} levels", code="schema_too_large")
            if isinstance(node, dict):
                self._spend("nodes", 1, path)
                props = node.get("properties")
                if isinstance(props, dict):
                    if len(props) > self.limits["object_properties"]:
                        raise RequestError(path + ".properties", f"has {len(props)} properties, more than the limit "
                                           f"of {self.limits['object_properties']} for one object",
                                           code="schema_too_large")
                    self._spend("properties", len(props), path + ".properties")
                if isinstance(node.get("enum"), list):
                    self._spend("enum", len(node["enum"]), path + ".enum")
                for key in _BRANCH_KEYS:
                    if isinstance(node.get(key), list):
                        self._spend("branches", len(node[key]), f"{path}.{key}")
                stack.extend((v, f"{path}.{k}", depth + 1) for k, v in node.items() if isinstance(v, (dict, list)))
            elif isinstance(node, list):
                self._spend("nodes", 1, path)
                stack.extend((v, f"{path}[{i}]", depth + 1) for i, v in enumerate(node) if isinstance(v, (dict, list)))


_WHAT = {"nodes": "objects and arrays", "properties": "properties", "enum": "enum values",
         "branches": "anyOf/oneOf/allOf/prefixItems entries"}

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


def check_schema(schema: Any, name: str, budget: SchemaBudget | None = None) -> None:
    """Raise RequestError(`name`...) unless `schema` is a valid schema within the size limits (`budget`: shared
    by the schemas of one request) whose references are all local (`#...`) and resolve inside it.

    The one check for response_format, llama.cpp json_schema, tool parameters and Anthropic input_schema.
    """
    import jsonschema

    if not isinstance(schema, (dict, bool)):
        raise RequestError(name, "must be a JSON schema (an object)")
    if isinstance(schema, bool):
        return
    (budget or SchemaBudget()).walk(schema, name)  # cheap limits first: nothing below runs on a huge schema
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise RequestError(name, f"is not a valid JSON schema: {exc.message}") from None
    except RecursionError:
        raise RequestError(name, "nests too deeply") from None
    except Exception as exc:  # odd $schema values and the like
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
                    if not ref.startswith("#"):
                        # the grammar compiler reads only references inside the schema: anything else would
                        # leave that part unconstrained
                        raise RequestError(path, f"{key} {ref!r} does not resolve inside the schema (only "
                                           "'#' and '#/...' references are supported; references are never "
                                           "fetched)")
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

"""The client libraries' OpenAPI document: the one an API serves, less what a client's types
should not be built on, written with sorted keys so that the same document is the same bytes.

The served document is exact enough to generate invalid requests from (scripts/fuzz does); a
client needs the shapes, and the server checks the rest. So this removes:
- what a deployment decides: the configured model names (an enum) become a free string;
- refinements that only validate: `not`, `propertyNames`, `if`/`then` (an agent's `plan`
  only with its mode), an `allOf` of a schema and a constraint on properties it already has
  (the tool kinds' required fields, a batch item's `if_busy`, a resume's `minProperties`, a
  plan's executor in `react` mode);
- the recursive description of a JSON value (no NUL, numbers within ±1e300): any JSON value,
  and a JSON object of any values.

    python3 scripts/lib/sdk_document.py SERVED.json OUT.json
"""

import json
import sys

REF = "#/components/schemas/"


def _refined(node: dict, schemas: dict) -> bool:
    """`allOf: [{$ref: X}, R]` where R only constrains what X already declares."""
    parts = node.get("allOf")
    if not (isinstance(parts, list) and len(parts) == 2 and "$ref" in parts[0]):
        return False
    target = schemas.get(parts[0]["$ref"].removeprefix(REF), {})
    known = set(target.get("properties", {}))
    return set(parts[1].get("properties", {})) <= known and set(parts[1].get("required", [])) <= known


def _simplify(node, schemas):
    if isinstance(node, list):
        return [_simplify(v, schemas) for v in node]
    if not isinstance(node, dict):
        return node
    if _refined(node, schemas):
        rest = {k: v for k, v in node.items() if k != "allOf"}
        node = {**rest, "$ref": node["allOf"][0]["$ref"]}
    return {
        k: _simplify(v, schemas)
        for k, v in node.items()
        if k not in ("not", "propertyNames", "if", "then")
    }


def normalize(doc: dict) -> dict:
    schemas = doc["components"]["schemas"]
    model = schemas["AgentSpec"]["properties"]["model"]
    model.pop("enum", None)
    model["description"] = "The name of a model this deployment configures (`models.<name>`)"
    schemas["JsonValue"] = {"description": schemas["JsonValue"].get("description", "Any JSON value")}
    schemas["JsonObject"] = {"type": "object", "additionalProperties": True}
    return _simplify(doc, schemas)


def main() -> None:
    served, out = sys.argv[1], sys.argv[2]
    with open(served, encoding="utf-8") as f:
        doc = normalize(json.load(f))
    with open(out, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=2, sort_keys=True, ensure_ascii=False)
        f.write("\n")


if __name__ == "__main__":
    main()

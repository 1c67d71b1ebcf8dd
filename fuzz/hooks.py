"""Checks of scripts/fuzz beyond schemathesis' own: no answer carries internal detail.

`--checks all` runs every registered check, these included.
"""

import json
import os
import re

import schemathesis

# What would betray the internals: a panic or stack trace, SQL or driver text, the address of a
# backing service, a source location. Matched in error answers, and in a run's `error` field
# of successful ones (other fields of a run echo what the client sent).
INTERNAL_DETAIL = re.compile(
    r"panicked at|stack backtrace|RUST_BACKTRACE|Traceback \(most recent call|"
    r"\bSQLSTATE\b|syntax error at or near|violates [a-z ]*constraint|duplicate key value|"
    r"relation \"|column \"|error returned from database|error occurred while|"
    r"\bsqlx\b|\blapin\b|\bdeadpool\b|\bredis\b.*error|pool timed out|connection refused|"
    r"\b(SELECT|INSERT INTO|UPDATE|DELETE FROM)\s[\w*\"]|"
    r"postgres(ql)?://|rediss?://|amqps?://|\bsrc/[\w/]+\.rs\b"
)


@schemathesis.check
def no_internal_detail(ctx, response, case):
    """Error answers and failed runs say what went wrong in stable terms, never how."""
    texts = []
    if response.status_code >= 400:
        texts.append(response.text)
    else:
        try:
            body = json.loads(response.text)
        except ValueError:
            body = None
        runs = []
        if isinstance(body, dict):
            runs = [body] + [r for key in ("data", "runs") for r in body.get(key) or [] if isinstance(r, dict)]
        texts.extend(json.dumps(r.get("error")) for r in runs if r.get("error"))
    for text in texts:
        found = INTERNAL_DETAIL.search(text)
        if found:
            raise AssertionError(f"The answer carries internal detail ({found.group(0)!r}): {text[:500]}")


def map_case(ctx, case):
    """Makes a request generated as valid valid as meant, where the document can only say so in
    words: JSON Schema has no "distinct by this property" (`uniqueItems` compares whole items),
    so an agent's tools with one name, a batch's items with one `custom_id` and an MCP server's
    headers named alike in another case are renamed; and an MCP server with headers is given an
    https URL (the allowlist that would open plain http is the operator's). Invalid requests are left as generated,
    and each refusal is tested end to end. Everything else a schema can say, the document says
    (what a tool's `kind` implies, `if_busy` of `POST /v1/runs/batch`, https webhook URLs,
    secrets, reserved header names, and, with `egress.allow` empty, public literal IPv4 hosts).
    """
    meta = case.meta
    if meta is None or not meta.generation.mode.is_positive or not isinstance(case.body, dict):
        return case
    body = case.body
    runs = body.get("runs")
    if case.operation.path == "/v1/batches" and isinstance(runs, list):
        distinct([run for run in runs if isinstance(run, dict)], "custom_id", "item-{}")
    agents = [body.get("agent")]
    agents += [run.get("agent") for run in runs or [] if isinstance(run, dict)]
    for agent in agents:
        tools = agent.get("tools") if isinstance(agent, dict) else None
        if isinstance(tools, list):
            distinct([tool for tool in tools if isinstance(tool, dict)], "name", "tool_{}")
    headers = body.get("headers") if case.operation.path == "/v1/mcp-servers" else None
    if isinstance(headers, list):
        distinct([h for h in headers if isinstance(h, dict)], "name", "X-Header-{}", str.lower)
        # Headers go to an MCP server only over https unless `egress.allow` lists its address,
        # which the fuzz's empty allowlist never does.
        url = body.get("url")
        if headers and isinstance(url, str) and url[:7].lower() == "http://":
            body["url"] = "https://" + url[7:]
    return case


def distinct(items, key, spare, fold=lambda v: v):
    """Renames `items[i][key]` to `spare.format(i)` where an earlier item has it already."""
    seen = set()
    for i, item in enumerate(items):
        value = item.get(key)
        if not isinstance(value, str):
            continue
        if fold(value) in seen:
            n = i
            while fold(spare.format(n)) in seen or any(fold(spare.format(n)) == fold(str(o.get(key))) for o in items):
                n += 1
            item[key] = value = spare.format(n)
        seen.add(fold(value))


# `AGENTFLEET_FUZZ_UNFILTERED=1 scripts/fuzz` sends every request as generated: what fails then is
# what the document cannot say (scripts/fuzz's header lists it).
if not os.environ.get("AGENTFLEET_FUZZ_UNFILTERED"):
    schemathesis.hook(map_case)

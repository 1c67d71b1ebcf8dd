"""Checks of scripts/fuzz beyond schemathesis' own: no answer carries internal detail.

`--checks all` runs every registered check, these included.
"""

import json
import base64
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


# A literal IP host in a URL (the egress policy judges it at submission).
LITERAL_HOST = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://)(\[[^\]]*\]|[0-9.]+)(?=[:/?#]|$)")


def public_host(url):
    """The URL with a literal IP host replaced by a public name.

    Which literal addresses a tool may name depends on the deployment's egress policy
    (`egress.allow`): private, loopback, reserved and multicast ones are answered 422 naming
    the field, which no schema can express. A request generated as valid gets a name instead,
    so that it is valid as meant; the refusal itself is tested end to end.
    """
    return LITERAL_HOST.sub(lambda m: m.group(1) + "tools.example.com", url, count=1)


@schemathesis.hook
def map_case(ctx, case):
    """Distinct tool names and public tool hosts in valid requests.

    JSON Schema cannot say that an agent's tools have distinct names (the document says it in
    words, and the API answers 422 naming the duplicate). A request generated as valid with two
    tools of one name is given distinct names, so that it is valid as meant; invalid requests
    are left as generated.
    """
    meta = case.meta
    if meta is None or not meta.generation.mode.is_positive or not isinstance(case.body, dict):
        return case
    valid_as_meant(case.operation.path, case.body)
    agents = [case.body.get("agent")]
    agents += [run.get("agent") for run in case.body.get("runs") or [] if isinstance(run, dict)]
    for agent in agents:
        tools = agent.get("tools") if isinstance(agent, dict) else None
        if not isinstance(tools, list):
            continue
        for tool in tools:
            if isinstance(tool, dict) and isinstance(tool.get("url"), str):
                tool["url"] = public_host(tool["url"])
            if isinstance(tool, dict):
                tool_kind_as_meant(tool)
        names = {tool.get("name") for tool in tools if isinstance(tool, dict)}
        seen = set()
        for i, tool in enumerate(tools):
            if not isinstance(tool, dict):
                continue
            if tool.get("name") in seen:
                n = i
                while f"tool_{n}" in names:
                    n += 1
                tool["name"] = f"tool_{n}"
                names.add(tool["name"])
            seen.add(tool.get("name"))
    return case


def tool_kind_as_meant(tool):
    """What a tool's `kind` implies, which the schema leaves to words.

    - `http`: `url` is required; `server` and `tools` belong to `mcp` (422 naming `kind`).
    - `mcp`: exactly one of `server` and `url` (422 naming `server` or `url`); its name prefixes
      its tools' names, so at most 32 characters (422 naming `name`).
    """
    if tool.get("kind") == "http":
        tool.pop("server", None)
        tool.pop("tools", None)
        if not tool.get("url"):
            tool["url"] = "https://tools.example.com/t"
    elif tool.get("kind") == "mcp":
        if tool.get("server"):
            tool.pop("url", None)
        elif not tool.get("url"):
            tool.pop("server", None)
            tool["url"] = "https://tools.example.com/mcp"
        else:
            tool.pop("server", None)
        if isinstance(tool.get("name"), str) and len(tool["name"]) > 32:
            tool["name"] = tool["name"][:32]


# Headers the MCP transport sets itself (`mcp_servers::RESERVED_HEADERS`), refused in a
# registration whatever their case.
RESERVED_HEADERS = {
    "accept", "content-type", "content-length", "host", "mcp-session-id",
    "mcp-protocol-version", "last-event-id", "transfer-encoding",
}


def mcp_server_as_meant(body):
    """A registration's URL host is public, and its header names distinct (case-insensitive)
    and not reserved in any case."""
    if isinstance(body.get("url"), str):
        body["url"] = public_host(body["url"])
    headers = body.get("headers")
    if not isinstance(headers, list):
        return
    seen = set()
    for i, header in enumerate(headers):
        if not isinstance(header, dict) or not isinstance(header.get("name"), str):
            continue
        name = header["name"]
        if name.lower() in seen or name.lower() in RESERVED_HEADERS:
            name = f"X-Header-{i}"
            header["name"] = name
        seen.add(name.lower())


# A valid webhook secret: `whsec_` and the base64 of 32 bytes.
VALID_SECRET = "whsec_" + base64.b64encode(bytes(range(32))).decode()


def valid_as_meant(path, body):
    """Rules the document states in words, which JSON Schema cannot express.

    - A batch's `custom_id`s are distinct (422 naming the duplicate).
    - `POST /v1/runs/batch` takes `if_busy` = `reject` only (422 naming `runs[i].if_busy`).
    - A webhook URL is `https://` unless `egress.allow` lists its address, and a literal IP
      host must be one the egress policy allows (422 naming `url`).
    - A webhook secret is `whsec_` and the base64 of 24 to 64 bytes (422 naming `secret`).
    - An MCP server's URL host is public and its header names distinct and not reserved.

    A request generated as valid is made valid as meant; invalid requests are left as
    generated, and each refusal is tested end to end.
    """
    runs = body.get("runs")
    if isinstance(runs, list):
        seen = set()
        for i, run in enumerate(runs):
            if not isinstance(run, dict):
                continue
            if path == "/v1/batches" and isinstance(run.get("custom_id"), str):
                if run["custom_id"] in seen:
                    run["custom_id"] = f"item-{i}"
                seen.add(run["custom_id"])
            if path == "/v1/runs/batch" and "if_busy" in run:
                run["if_busy"] = "reject"
    if path == "/v1/mcp-servers":
        mcp_server_as_meant(body)
    if path.startswith("/v1/webhooks"):
        url = body.get("url")
        if isinstance(url, str):
            url = body["url"] = public_host(url)
        if isinstance(url, str) and url[:7].lower() == "http://":
            url = "https://" + url[7:]
            # One byte longer now: keep it within `webhooks.max_url_bytes` (2048).
            while len(url.encode()) > 2048:
                url = url[:-1]
            body["url"] = url
        if isinstance(body.get("secret"), str):
            body["secret"] = VALID_SECRET

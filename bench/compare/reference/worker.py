"""The agent loop as a Dramatiq actor: claim the run, alternate streamed model turns and HTTP
tool calls, record every step in Postgres (fenced by the claim's attempt number) and announce
it on Redis. A run that asks the user (the built-in `ask`) or calls a `risk: high` tool pauses:
its state is committed, the thread is released, and an answer (`producer.resume`) queues it
again for any worker.

    dramatiq reference.worker --processes 2 --threads 16 --queues "$COMPARE_QUEUE"

A run's events go to the Redis list `<prefix>:run:<id>:events` and, in the same MULTI/EXEC,
to the channel `<prefix>:run:<id>:live`, so a client can read the list and follow the channel.
"""

import json
import logging
import os
import socket
import threading
import time
import uuid
from datetime import datetime, timezone

import dramatiq
import httpx
import psycopg
import redis
from dramatiq.brokers.rabbitmq import RabbitmqBroker
from psycopg.types.json import Jsonb
from psycopg_pool import ConnectionPool

from . import config

log = logging.getLogger("reference.worker")

# Confirmed, persistent publishes: a run whose row is committed must not lose its message.
broker = RabbitmqBroker(url=config.AMQP_URL, confirm_delivery=True)
dramatiq.set_broker(broker)


class Fenced(Exception):
    """Another claim of the run (a higher attempt) holds it now: this holder must stop writing."""


class LeaseHeld(Exception):
    """The run is running under a live lease elsewhere: try again later (Dramatiq retries)."""


class ModelError(Exception):
    pass


# --- per-process resources, created after Dramatiq forks its worker processes ---------------

_resources = None
_resources_lock = threading.Lock()


class Resources:
    def __init__(self):
        self.worker_id = f"{socket.gethostname()}:{os.getpid()}"
        self.pool = ConnectionPool(
            config.DATABASE_URL,
            min_size=config.POOL_SIZE,
            max_size=config.POOL_SIZE,
            open=True,
            name="reference",
        )
        self.redis = redis.Redis(
            connection_pool=redis.BlockingConnectionPool.from_url(
                config.REDIS_URL, max_connections=config.POOL_SIZE, timeout=10
            )
        )
        # Small streamed writes must not wait for delayed ACKs (Nagle), as on agentfleet's client.
        transport = httpx.HTTPTransport(
            socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)],
            limits=httpx.Limits(max_connections=config.HTTP_CONNECTIONS,
                                max_keepalive_connections=config.HTTP_CONNECTIONS),
        )
        self.http = httpx.Client(transport=transport, timeout=httpx.Timeout(config.MODEL_TIMEOUT_SECS, connect=5))
        headers = {"Authorization": f"Bearer {config.LLM_API_KEY}"} if config.LLM_API_KEY else {}
        self.llm_headers = headers


def resources() -> Resources:
    global _resources
    if _resources is None:
        with _resources_lock:
            if _resources is None:
                _resources = Resources()
    return _resources


# --- events --------------------------------------------------------------------------------

def events_key(run_id: str) -> str:
    return f"{config.REDIS_PREFIX}:run:{run_id}:events"


def live_channel(run_id: str) -> str:
    return f"{config.REDIS_PREFIX}:run:{run_id}:live"


def event_json(event_id: int, run_id: str, thread_id: str, kind: str, data: dict) -> str:
    at = datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    return json.dumps({"id": event_id, "run_id": run_id, "thread_id": thread_id, "type": kind,
                       "at": at, "data": data}, separators=(",", ":"))


class Emitter:
    """Numbers a run's events (the holder is the only writer) and appends each with one round
    trip: RPUSH + PUBLISH (+ EXPIRE at the end) in one MULTI/EXEC."""

    def __init__(self, r: redis.Redis, run_id: str, thread_id: str, last_id: int):
        self.r, self.run_id, self.thread_id, self.last_id = r, run_id, thread_id, last_id

    def emit(self, kind: str, data: dict, final: bool = False) -> None:
        self.last_id += 1
        append_event(self.r, self.last_id, self.run_id, self.thread_id, kind, data,
                     expire=final)


def append_event(r: redis.Redis, event_id: int, run_id: str, thread_id: str, kind: str, data: dict,
                 expire: bool = False, persist: bool = False) -> None:
    """One event: RPUSH + PUBLISH in one MULTI/EXEC; `expire` starts the list's retention (a
    pause or an end), `persist` ends it (a resume)."""
    body = event_json(event_id, run_id, thread_id, kind, data)
    pipe = r.pipeline(transaction=True)
    pipe.rpush(events_key(run_id), body)
    pipe.publish(live_channel(run_id), body)
    if expire:
        pipe.expire(events_key(run_id), config.EVENT_RETENTION_SECS)
    if persist:
        pipe.persist(events_key(run_id))
    pipe.execute()


# --- Postgres --------------------------------------------------------------------------------

CLAIM = """
UPDATE runs SET status = 'running', attempt = attempt + 1, lease_owner = %(owner)s,
       lease_expires_at = now() + make_interval(secs => %(lease)s),
       started_at = coalesce(started_at, now()), updated_at = now()
 WHERE id = %(id)s
   AND (status = 'queued' OR (status = 'running' AND lease_expires_at < now()))
RETURNING thread_id, attempt, iteration, max_iterations, agent, resumed_attempt, last_event_id
"""

# The first statement of every write transaction: proves this holder still owns the run (and
# locks its row until commit, so no claim can slip in between), and extends the lease.
FENCE = """
UPDATE runs SET lease_expires_at = now() + make_interval(secs => %(lease)s), updated_at = now()
 WHERE id = %(id)s AND attempt = %(attempt)s AND status = 'running'
"""


class Run:
    def __init__(self, run_id, thread_id, attempt, iteration, max_iterations, agent, resumed_attempt, last_event_id):
        self.id = run_id
        self.thread_id = str(thread_id)
        self.attempt = attempt
        self.iteration = iteration
        self.max_iterations = max_iterations
        self.agent = agent
        self.resumed_attempt = resumed_attempt
        self.last_event_id = last_event_id

    def tries(self) -> int:
        """Claims since the last resume: 1 for a first holding, more after recoveries."""
        return self.attempt - self.resumed_attempt

    def params(self, **extra):
        return {"id": self.id, "attempt": self.attempt, "lease": config.LEASE_SECS, **extra}


def fence(cur: psycopg.Cursor, run: Run, sql: str = FENCE, **extra) -> None:
    cur.execute(sql, run.params(**extra))
    if cur.rowcount != 1:
        raise Fenced(f"run {run.id}: attempt {run.attempt} no longer holds it")


def claim(res: Resources, run_id: str):
    with res.pool.connection() as conn:
        row = conn.execute(CLAIM, {"id": run_id, "owner": res.worker_id, "lease": config.LEASE_SECS}).fetchone()
        if row is None:
            status = conn.execute("SELECT status FROM runs WHERE id = %s", (run_id,)).fetchone()
            if status and status[0] == "running":
                raise LeaseHeld(f"run {run_id} is held by a live lease")
            return None  # finished, paused, or unknown: nothing to do
    return Run(run_id, *row)


def load_history(res: Resources, run: Run) -> list:
    with res.pool.connection() as conn:
        rows = conn.execute("SELECT body FROM messages WHERE thread_id = %s ORDER BY id", (run.thread_id,)).fetchall()
    return [r[0] for r in rows]


# --- the model -------------------------------------------------------------------------------

# The built-in the model calls to ask the user (offered when the agent says `"ask": true`).
ASK = {"name": "ask", "description": "Ask the user a question and wait for the answer.",
       "parameters": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}}


def tool_definitions(agent: dict) -> list:
    tools = agent.get("tools", []) + ([ASK] if agent.get("ask") else [])
    return [{"type": "function", "function": {"name": t["name"], "description": t.get("description", ""),
                                               "parameters": t.get("parameters", {"type": "object"})}}
            for t in tools]


def risky(run: Run, name: str) -> bool:
    spec = next((t for t in run.agent.get("tools", []) if t["name"] == name), None)
    return bool(spec) and spec.get("risk") == "high"


def call_model(res: Resources, run: Run, history: list, emitter: Emitter) -> dict:
    """One streamed chat completion; text is coalesced into `message_delta` events."""
    body = {"model": run.agent.get("model", config.LLM_MODEL), "messages": history,
            "stream": True, "stream_options": {"include_usage": True}}
    tools = tool_definitions(run.agent)
    if tools:
        body["tools"] = tools
    content, pending, since = [], [], None
    calls = {}  # index -> {"id", "name", "arguments"}
    usage, finish, done = {}, None, False

    def flush():
        nonlocal pending, since
        if pending:
            emitter.emit("message_delta", {"text": "".join(pending)})
            pending, since = [], None

    url = config.LLM_BASE_URL.rstrip("/") + "/chat/completions"
    with res.http.stream("POST", url, json=body, headers=res.llm_headers) as response:
        if response.status_code != 200:
            response.read()
            raise ModelError(f"model answered {response.status_code}: {response.text[:500]}")
        for line in response.iter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                done = True
                break
            chunk = json.loads(data)
            if chunk.get("usage"):
                usage = chunk["usage"]
            for choice in chunk.get("choices") or []:
                delta = choice.get("delta") or {}
                text = delta.get("content")
                if text:
                    content.append(text)
                    pending.append(text)
                    since = since or time.monotonic()
                for tc in delta.get("tool_calls") or []:
                    entry = calls.setdefault(tc["index"], {"id": "", "name": "", "arguments": ""})
                    if tc.get("id"):
                        entry["id"] = tc["id"]
                    fn = tc.get("function") or {}
                    if fn.get("name"):
                        entry["name"] = fn["name"]
                    entry["arguments"] += fn.get("arguments") or ""
                if choice.get("finish_reason"):
                    finish = choice["finish_reason"]
            if pending and (time.monotonic() - since >= config.DELTA_FLUSH_SECS
                            or sum(map(len, pending)) >= config.DELTA_FLUSH_BYTES):
                flush()
    if not done or finish is None:
        raise ModelError("the model's stream ended early")
    flush()
    tool_calls = [calls[i] for i in sorted(calls)]
    for call in tool_calls:
        call["id"] = call["id"] or f"call_{uuid.uuid4().hex}"
    return {"content": "".join(content), "tool_calls": tool_calls, "finish_reason": finish, "usage": usage}


def record_turn(res: Resources, run: Run, reply: dict) -> None:
    """The assistant message, its tool calls, the iteration and the usage: one transaction."""
    message = {"role": "assistant", "content": reply["content"] or None}
    if reply["tool_calls"]:
        message["tool_calls"] = [{"id": c["id"], "type": "function",
                                  "function": {"name": c["name"], "arguments": c["arguments"]}}
                                 for c in reply["tool_calls"]]
    usage = reply["usage"]
    with res.pool.connection() as conn, conn.cursor() as cur:
        fence(cur, run, """
            UPDATE runs SET iteration = %(iteration)s, prompt_tokens = prompt_tokens + %(pt)s,
                   completion_tokens = completion_tokens + %(ct)s,
                   lease_expires_at = now() + make_interval(secs => %(lease)s), updated_at = now()
             WHERE id = %(id)s AND attempt = %(attempt)s AND status = 'running'""",
              iteration=run.iteration, pt=usage.get("prompt_tokens", 0), ct=usage.get("completion_tokens", 0))
        cur.execute("INSERT INTO messages (thread_id, run_id, role, body, iteration) VALUES (%s, %s, 'assistant', %s, %s)",
                    (run.thread_id, run.id, Jsonb(message), run.iteration))
        if reply["tool_calls"]:
            cur.executemany(
                """INSERT INTO tool_calls (id, run_id, tool_call_id, iteration, position, name, raw_arguments, status)
                   VALUES (%s, %s, %s, %s, %s, %s, %s, 'pending')""",
                [(uuid.uuid4(), run.id, c["id"], run.iteration, i, c["name"], c["arguments"])
                 for i, c in enumerate(reply["tool_calls"])])


# --- tools -----------------------------------------------------------------------------------

def run_tool(res: Resources, run: Run, call: dict, emitter: Emitter) -> None:
    spec = next((t for t in run.agent.get("tools", []) if t["name"] == call["name"]), None)
    try:
        arguments = json.loads(call["arguments"] or "{}")
    except ValueError as e:
        arguments, error = None, f"arguments are not valid JSON: {e}"
    else:
        error = None if spec else f"unknown tool `{call['name']}`"
    with res.pool.connection() as conn, conn.cursor() as cur:
        fence(cur, run)
        cur.execute("""UPDATE tool_calls SET status = 'running', dispatch_count = dispatch_count + 1,
                              started_at = now()
                        WHERE run_id = %s AND tool_call_id = %s RETURNING dispatch_count""",
                    (run.id, call["id"]))
        dispatch = cur.fetchone()[0]
    emitter.emit("tool_started", {"tool_call_id": call["id"], "name": call["name"],
                                  "arguments": arguments, "dispatch": dispatch})
    if error is None:
        try:
            response = res.http.post(
                spec["url"], json={"run_id": run.id, "tool_call_id": call["id"], "arguments": arguments},
                headers={"Idempotency-Key": f"{run.id}:{call['id']}"}, timeout=config.TOOL_TIMEOUT_SECS)
            ok = response.is_success
            try:
                result = response.json()
            except ValueError:
                result = response.text
            if not ok:
                result = {"error": f"the tool answered {response.status_code}", "body": result}
        except httpx.HTTPError as e:
            ok, result = False, {"error": f"the tool could not be reached: {type(e).__name__}"}
    else:
        ok, result = False, {"error": error}
    content = result if isinstance(result, str) else json.dumps(result, separators=(",", ":"))
    with res.pool.connection() as conn, conn.cursor() as cur:
        fence(cur, run)
        cur.execute("""UPDATE tool_calls SET status = %s, result = %s, finished_at = now()
                        WHERE run_id = %s AND tool_call_id = %s""",
                    ("succeeded" if ok else "failed", Jsonb(result), run.id, call["id"]))
        cur.execute("INSERT INTO messages (thread_id, run_id, role, body, iteration) VALUES (%s, %s, 'tool', %s, %s)",
                    (run.thread_id, run.id, Jsonb({"role": "tool", "tool_call_id": call["id"], "content": content}),
                     run.iteration))
    emitter.emit("tool_completed", {"tool_call_id": call["id"], "name": call["name"], "ok": ok, "result": result})


def unsettled_calls(res: Resources, run: Run) -> list:
    """After a recovery or a confirmation: the calls of the last turn that never recorded a
    result (approved ones included)."""
    with res.pool.connection() as conn:
        rows = conn.execute("""SELECT tool_call_id, name, raw_arguments, status FROM tool_calls
                                WHERE run_id = %s AND iteration = %s
                                  AND status IN ('pending', 'running', 'approved')
                                ORDER BY position""", (run.id, run.iteration)).fetchall()
    return [{"id": r[0], "name": r[1], "arguments": r[2], "status": r[3]} for r in rows]


def skip(res: Resources, run: Run, call: dict) -> None:
    """A call after `ask` in the same answer: not run; the model is told so."""
    result = {"error": "skipped: the turn ended at an earlier call"}
    with res.pool.connection() as conn, conn.cursor() as cur:
        fence(cur, run)
        cur.execute("""UPDATE tool_calls SET status = 'skipped', result = %s, finished_at = now()
                        WHERE run_id = %s AND tool_call_id = %s""", (Jsonb(result), run.id, call["id"]))
        cur.execute("INSERT INTO messages (thread_id, run_id, role, body, iteration) VALUES (%s, %s, 'tool', %s, %s)",
                    (run.thread_id, run.id, Jsonb({"role": "tool", "tool_call_id": call["id"],
                                                   "content": json.dumps(result)}), run.iteration))


# --- pauses ----------------------------------------------------------------------------------

def pause(res: Resources, run: Run, emitter: Emitter, status: str, call_status: str, call_ids: list,
          pending: dict) -> None:
    """Commits the pause (fenced: the run's status and what it waits for, its calls' status, the
    lease released, the pausing event's id), then announces it. Nothing of the run stays in
    this worker: the thread goes back to Dramatiq."""
    event_id = emitter.last_id + 1
    with res.pool.connection() as conn, conn.cursor() as cur:
        fence(cur, run, """
            UPDATE runs SET status = %(status)s, pending = %(pending)s, last_event_id = %(event_id)s,
                   lease_owner = NULL, lease_expires_at = NULL, updated_at = now()
             WHERE id = %(id)s AND attempt = %(attempt)s AND status = 'running'""",
              status=status, pending=Jsonb(pending), event_id=event_id)
        cur.execute("UPDATE tool_calls SET status = %s WHERE run_id = %s AND tool_call_id = ANY(%s)",
                    (call_status, run.id, call_ids))
    data = {k: v for k, v in pending.items() if k != "kind"}
    kind = "input_required" if status == "waiting_for_input" else "confirmation_required"
    emitter.emit(kind, data, final=True)


def run_calls(res: Resources, run: Run, calls: list, emitter: Emitter) -> bool:
    """The calls of one model answer, in order; False if the run paused. Calls to `risk: high`
    tools not yet approved pause the run before any call runs; `ask` pauses it after the calls
    before it ran, and the calls after it are skipped."""
    waiting = [c for c in calls if c.get("status") != "approved" and risky(run, c["name"])]
    if waiting:
        listed = []
        for c in waiting:
            try:
                arguments = json.loads(c["arguments"] or "{}")
            except ValueError:
                arguments = c["arguments"]
            listed.append({"tool_call_id": c["id"], "name": c["name"], "arguments": arguments, "risk": "high"})
        pause(res, run, emitter, "waiting_for_confirmation", "awaiting_confirmation",
              [c["id"] for c in waiting], {"kind": "confirmation", "tool_calls": listed})
        return False
    for i, call in enumerate(calls):
        if call["name"] == "ask":
            for later in calls[i + 1:]:
                skip(res, run, later)
            try:
                question = json.loads(call["arguments"] or "{}").get("text")
            except (ValueError, AttributeError):
                question = None
            pause(res, run, emitter, "waiting_for_input", "awaiting_input", [call["id"]],
                  {"kind": "input", "tool_call_id": call["id"], "question": question, "attachments": []})
            return False
        run_tool(res, run, call, emitter)
    return True


# --- the run ---------------------------------------------------------------------------------

def finish(res: Resources, run: Run, emitter: Emitter, status: str, error: dict = None) -> None:
    with res.pool.connection() as conn, conn.cursor() as cur:
        fence(cur, run, """
            UPDATE runs SET status = %(status)s, error = %(error)s, finished_at = now(), updated_at = now(),
                   lease_owner = NULL, lease_expires_at = NULL
             WHERE id = %(id)s AND attempt = %(attempt)s AND status = 'running'""",
              status=status, error=Jsonb(error) if error else None)
    if status == "completed":
        emitter.emit("run_completed", {"iteration": run.iteration}, final=True)
    else:
        emitter.emit("run_failed", error, final=True)


def drive(res: Resources, run: Run, emitter: Emitter) -> None:
    if run.tries() > 1:
        emitter.emit("run_recovered", {"attempt": run.attempt, "worker": res.worker_id, "iteration": run.iteration})
    else:
        emitter.emit("run_started", {"attempt": run.attempt, "worker": res.worker_id})
    calls = unsettled_calls(res, run) if run.iteration > 0 else []
    if run.iteration > 0 and not calls:
        last = load_history(res, run)[-1]
        if last.get("role") == "assistant" and not last.get("tool_calls"):
            return finish(res, run, emitter, "completed")
    while True:
        if calls and not run_calls(res, run, calls, emitter):
            return  # paused
        if run.iteration >= run.max_iterations:
            return finish(res, run, emitter, "failed", {"code": "max_iterations_reached"})
        run.iteration += 1
        emitter.emit("iteration_started", {"iteration": run.iteration})
        history = load_history(res, run)
        reply = call_model(res, run, history, emitter)
        record_turn(res, run, reply)
        emitter.emit("message_completed", {
            "iteration": run.iteration, "content": reply["content"],
            "tool_calls": [{"id": c["id"], "name": c["name"], "arguments": c["arguments"]} for c in reply["tool_calls"]],
            "finish_reason": reply["finish_reason"], "usage": reply["usage"]})
        if not reply["tool_calls"]:
            return finish(res, run, emitter, "completed")
        calls = reply["tool_calls"]


def hand_back(res: Resources, run: Run, emitter: Emitter, error: Exception) -> bool:
    """After a failure: give the run back to the queue (True: Dramatiq should retry), or fail it
    once it has been claimed MAX_ATTEMPTS times since its last resume."""
    if run.tries() >= config.MAX_ATTEMPTS:
        finish(res, run, emitter, "failed", {"code": "attempts_exhausted", "message": str(error)[:500]})
        return False
    with res.pool.connection() as conn, conn.cursor() as cur:
        fence(cur, run, """
            UPDATE runs SET status = 'queued', lease_owner = NULL, lease_expires_at = NULL, updated_at = now()
             WHERE id = %(id)s AND attempt = %(attempt)s AND status = 'running'""")
    return True


# Retries back off 0.5 s doubling to 30 s: ten of them outlast a lapsed holder's lease.
@dramatiq.actor(queue_name=config.QUEUE, max_retries=10, min_backoff=500, max_backoff=30_000,
                time_limit=(config.LEASE_SECS + 30) * 1000)
def run_agent(run_id: str) -> None:
    res = resources()
    run = claim(res, run_id)
    if run is None:
        return
    # Ids continue the list, or after the newest event numbered outside a holding (a pause's,
    # a resume's) should its append still be on the way.
    emitter = Emitter(res.redis, run.id, run.thread_id, max(res.redis.llen(events_key(run.id)), run.last_event_id))
    try:
        drive(res, run, emitter)
    except Fenced as e:
        log.info("stopped: %s", e)
    except Exception as e:
        log.warning("run %s attempt %s failed: %r", run.id, run.attempt, e)
        try:
            retry = hand_back(res, run, emitter, e)
        except Fenced:
            return
        if retry:
            raise

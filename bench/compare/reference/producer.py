"""Creating runs: the thread, the run and the user message in one transaction per batch, then each
run's `run_queued` event, then one confirmed Dramatiq message per run. Batches go out from a
few threads at once (each has its own Postgres connection and RabbitMQ channel).

Answering a paused run (`resume`) is the other half of what an API would do for a user."""

import uuid
from concurrent.futures import ThreadPoolExecutor

from psycopg.types.json import Jsonb
from psycopg_pool import ConnectionPool
import redis

from . import config
from .worker import append_event, event_json, events_key, live_channel, run_agent


def agent_spec(tool_url: str) -> dict:
    return {"model": config.LLM_MODEL, "max_iterations": 10,
            "tools": [{"name": "echo", "url": tool_url, "description": "", "parameters": {"type": "object"}}]}


def load_agent_spec(slow_url: str, max_iterations: int) -> dict:
    """The load workload's agent: the `slow` tool, the same tool as `slow_confirmed` needing a
    confirmation (`risk: high`), and the built-in `ask`."""
    tool = {"url": slow_url, "description": "", "parameters": {"type": "object"}}
    return {"model": config.LLM_MODEL, "max_iterations": max_iterations, "ask": True,
            "tools": [{"name": "slow", **tool}, {"name": "slow_confirmed", "risk": "high", **tool}]}


def create_batch(pool: ConnectionPool, r: redis.Redis, agent: dict, user_text: str, n: int) -> list:
    runs = [(str(uuid.uuid4()), str(uuid.uuid4())) for _ in range(n)]  # (thread, run)
    message = Jsonb({"role": "user", "content": user_text})
    with pool.connection() as conn, conn.cursor() as cur:
        cur.executemany("INSERT INTO threads (id) VALUES (%s)", [(t,) for t, _ in runs])
        cur.executemany(
            "INSERT INTO runs (id, thread_id, status, agent, max_iterations) VALUES (%s, %s, 'queued', %s, %s)",
            [(run, t, Jsonb(agent), agent["max_iterations"]) for t, run in runs])
        cur.executemany(
            "INSERT INTO messages (thread_id, run_id, role, body) VALUES (%s, %s, 'user', %s)",
            [(t, run, message) for t, run in runs])
    # After the commit (a worker that gets the message finds the run): first each run's
    # `run_queued`, event 1 (one pipelined round trip for the batch), then the messages.
    pipe = r.pipeline(transaction=False)
    for thread, run in runs:
        ev = event_json(1, run, thread, "run_queued", {"status": "queued"})
        pipe.rpush(events_key(run), ev)
        pipe.publish(live_channel(run), ev)
    pipe.execute()
    for _, run in runs:
        run_agent.send(run)
    return [run for _, run in runs]


def submit(n: int, tool_url: str, user_text: str, batch: int = 250, threads: int = 4) -> list:
    """Creates and enqueues `n` runs as fast as it can; returns their ids."""
    agent = agent_spec(tool_url)
    sizes = [min(batch, n - i) for i in range(0, n, batch)]
    pool = ConnectionPool(config.DATABASE_URL, min_size=threads, max_size=threads, open=True, name="producer")
    r = redis.Redis.from_url(config.REDIS_URL)
    try:
        with ThreadPoolExecutor(threads) as ex:
            ids = [run for part in ex.map(lambda k: create_batch(pool, r, agent, user_text, k), sizes) for run in part]
    finally:
        pool.close()
        r.close()
    return ids


def resume(pool: ConnectionPool, r: redis.Redis, run_id: str, answer: str) -> bool:
    """Answers a paused run as agentfleet's `POST /v1/runs/{id}/resume` does: a question's
    answer becomes the `ask` call's result (its `tool` message) and the next user message; a
    confirmation approves every call awaiting one. The run is `queued` again (one transaction
    under its row lock), `run_resumed` is appended, and a new message queues it for any
    worker. False if the run was not waiting."""
    with pool.connection() as conn, conn.cursor() as cur:
        row = cur.execute("SELECT thread_id, status, pending, last_event_id FROM runs WHERE id = %s FOR UPDATE",
                          (run_id,)).fetchone()
        if row is None or row[1] not in ("waiting_for_input", "waiting_for_confirmation"):
            return False
        thread_id, status, pending, last_event_id = row
        if status == "waiting_for_input":
            call_id = pending["tool_call_id"]
            cur.execute("""UPDATE tool_calls SET status = 'succeeded', result = %s, finished_at = now()
                            WHERE run_id = %s AND tool_call_id = %s""",
                        (Jsonb({"answer": answer}), run_id, call_id))
            cur.execute("""INSERT INTO messages (thread_id, run_id, role, body, iteration)
                           SELECT %s, %s, 'tool', %s, iteration FROM runs WHERE id = %s""",
                        (thread_id, run_id, Jsonb({"role": "tool", "tool_call_id": call_id, "content": config.ANSWERED}),
                         run_id))
            cur.execute("INSERT INTO messages (thread_id, run_id, role, body) VALUES (%s, %s, 'user', %s)",
                        (thread_id, run_id, Jsonb({"role": "user", "content": answer})))
        else:
            cur.execute("""UPDATE tool_calls SET status = 'approved'
                            WHERE run_id = %s AND status = 'awaiting_confirmation'""", (run_id,))
        event_id = last_event_id + 1
        cur.execute("""UPDATE runs SET status = 'queued', pending = NULL, resumed_attempt = attempt,
                              last_event_id = %s, updated_at = now() WHERE id = %s""", (event_id, run_id))
    append_event(r, event_id, run_id, str(thread_id), "run_resumed", {"kind": pending["kind"]}, persist=True)
    run_agent.send(run_id)
    return True

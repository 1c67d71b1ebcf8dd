"""Settings of the reference implementation, from the environment (as a container would get them)."""

import os

DATABASE_URL = os.environ.get("COMPARE_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/af_compare")
REDIS_URL = os.environ.get("COMPARE_REDIS_URL", "redis://127.0.0.1:6379/0")
AMQP_URL = os.environ.get("COMPARE_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2F")
# The Dramatiq queue; Dramatiq also declares `<queue>.DQ` (delays) and `<queue>.XQ` (dead).
QUEUE = os.environ.get("COMPARE_QUEUE", "af_compare_runs")
# Redis keys: `<prefix>:run:<id>:events` (list) and `<prefix>:run:<id>:live` (pub/sub channel).
REDIS_PREFIX = os.environ.get("COMPARE_REDIS_PREFIX", "af_compare")
# An OpenAI-compatible base URL (`.../v1`); the model name sent in requests.
LLM_BASE_URL = os.environ.get("COMPARE_LLM_BASE_URL", "http://127.0.0.1:8090/v1")
LLM_MODEL = os.environ.get("COMPARE_LLM_MODEL", "mock-1")
LLM_API_KEY = os.environ.get("COMPARE_LLM_API_KEY", "")
# Connections per worker process (Postgres pool, Redis pool, HTTP pool): one per thread, so a
# thread never waits for another's connection.
POOL_SIZE = int(os.environ.get("COMPARE_POOL_SIZE", "16"))
# HTTP connections per worker process (the model and the tools). A thread holds one for the
# whole of a streamed model answer, so with more threads than POOL_SIZE (the load workload's
# slow model) this must cover every thread.
HTTP_CONNECTIONS = int(os.environ.get("COMPARE_HTTP_CONNECTIONS", str(2 * POOL_SIZE)))

# A claim holds the run this long; every fenced write extends it. A run whose holder died is
# claimed again once it lapses (on a Dramatiq redelivery or retry).
LEASE_SECS = 30
# Claims of one run before it is failed instead of handed back (poison runs).
MAX_ATTEMPTS = 3
# Streamed text is sent to clients at most this often (one `message_delta` per flush).
DELTA_FLUSH_SECS = 0.05
DELTA_FLUSH_BYTES = 512
# A finished run's event list is kept this long for late readers.
EVENT_RETENTION_SECS = 86400
MODEL_TIMEOUT_SECS = 60
# What a `tool` message of an answered `ask` says (the answer itself follows as a user message).
ANSWERED = "The user answered; the answer is the next message."
TOOL_TIMEOUT_SECS = 30

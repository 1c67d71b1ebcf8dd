# A whole stack on this machine for scripts that need one (scripts/fuzz, scripts/sdk-generate,
# scripts/sdk-test): a database of its own on the shared PostgreSQL, Redis keys and RabbitMQ
# queues under a prefix of the same name, and the binaries (scripted model, worker, API) on free
# loopback ports. Sourced, not run:
#
#   source scripts/lib/stack.sh
#   stack_init af_name        # work dir, cleanup on exit (processes, database, keys, queues)
#   stack_build [BIN...]      # cargo build --workspace --bins (AGENTFLEET_SKIP_BUILD=1: only checks
#                             # that BIN..., default the API, the worker and mock-llm, are built)
#   stack_database            # a fresh database $STACK_NAME, and the AGENTFLEET__ variables naming it
#   stack_spawn llm "$STACK_BIN/mock-llm" --listen 127.0.0.1:$(free_port)
#   stack_wait_ready URL...   # polls each URL until it answers 2xx (60 s)
#
# The caller exports the rest of the configuration (AGENTFLEET__…) before spawning.

STACK_ADMIN_URL="${AGENTFLEET_TEST_DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres}"
STACK_REDIS_URL="${AGENTFLEET_TEST_REDIS_URL:-redis://127.0.0.1:6379}"
STACK_AMQP_URL="${AGENTFLEET_TEST_AMQP_URL:-amqp://guest:guest@127.0.0.1:5672/%2f}"
STACK_BIN="${CARGO_TARGET_DIR:-target}/debug"
STACK_PIDS=()
# The log whose tail is printed when the script fails (a path under $STACK_WORK).
STACK_FAILURE_LOG=""

free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# GET a URL and print the body (bounded by a 2 s time-out); fails on a non-2xx answer.
http_get() { python3 -c 'import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=2).read().decode())' "$1"; }

stack_init() {
  STACK_NAME="$1"
  STACK_WORK=$(mktemp -d -t "agentfleet-$STACK_NAME.XXXXXX")
  trap stack_cleanup EXIT
}

stack_build() {
  if [[ "${AGENTFLEET_SKIP_BUILD:-0}" == 1 ]]; then
    local b bins=("$@")
    (( ${#bins[@]} )) || bins=(agentfleet-api agentfleet-worker mock-llm)
    for b in "${bins[@]}"; do
      [[ -x "$STACK_BIN/$b" ]] || { echo "AGENTFLEET_SKIP_BUILD=1 but $STACK_BIN/$b is missing" >&2; exit 1; }
    done
    return
  fi
  cargo build --workspace --bins
}

stack_database() {
  PGOPTIONS='--client-min-messages=warning' psql -q "$STACK_ADMIN_URL" \
    -c "DROP DATABASE IF EXISTS $STACK_NAME WITH (FORCE)" -c "CREATE DATABASE $STACK_NAME" >/dev/null
  export AGENTFLEET__DATABASE__URL="${STACK_ADMIN_URL%/*}/$STACK_NAME"
  export AGENTFLEET__REDIS__URL="$STACK_REDIS_URL" AGENTFLEET__REDIS__PREFIX="$STACK_NAME"
  export AGENTFLEET__AMQP__URL="$STACK_AMQP_URL" AGENTFLEET__AMQP__PREFIX="$STACK_NAME"
}

# stack_spawn NAME COMMAND...: runs COMMAND in the background, its output in $STACK_WORK/NAME.log.
stack_spawn() {
  local name="$1"; shift
  "$@" >"$STACK_WORK/$name.log" 2>&1 &
  STACK_PIDS+=($!)
}

stack_wait_ready() {
  local deadline=$((SECONDS + 60)) url
  for url in "$@"; do
    until http_get "$url" >/dev/null 2>&1; do
      if (( SECONDS >= deadline )); then echo "$url did not answer within 60s" >&2; return 1; fi
      sleep 0.2
    done
  done
}

# Stops what stack_spawn started (SIGTERM, then waits), most recent first.
stack_stop_all() {
  local pid
  for pid in "${STACK_PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${STACK_PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  STACK_PIDS=()
}

stack_cleanup() {
  local status=$?
  stack_stop_all
  psql -q "$STACK_ADMIN_URL" -c "DROP DATABASE IF EXISTS $STACK_NAME WITH (FORCE)" >/dev/null 2>&1 || true
  if command -v redis-cli >/dev/null; then
    redis-cli -u "$STACK_REDIS_URL" --scan --pattern "$STACK_NAME:*" 2>/dev/null \
      | xargs -r -n 500 redis-cli -u "$STACK_REDIS_URL" del >/dev/null 2>&1 || true
  fi
  if command -v rabbitmqctl >/dev/null; then
    rabbitmqctl -q list_queues name 2>/dev/null | grep -E "^$STACK_NAME\." \
      | xargs -r -n1 rabbitmqctl -q delete_queue >/dev/null 2>&1 || true
  fi
  if (( status != 0 )) && [[ -n "$STACK_FAILURE_LOG" && -s "$STACK_FAILURE_LOG" ]]; then
    echo "-- last lines of $(basename "$STACK_FAILURE_LOG"):"; tail -n 40 "$STACK_FAILURE_LOG"
  fi
  rm -rf "$STACK_WORK"
  exit $status
}

"""Runs the reference implementation once and measures it (called by `run`, in the venv).

Creates its own database, queue and Redis prefix (`af_compare_<random>`), starts mock-llm, the
tool server and the Dramatiq workers, plays a workload, and removes everything again, also on
failure. Writes its figures as JSON to --json-out.

Workloads: `e2e` (the default) submits N no-op runs at once and waits until all are completed;
`load` offers runs at a steady rate with agentfleet's load script (reference_load.py)."""

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import machine  # noqa: E402

# The scripted conversation of agentfleet's e2e benchmark: one echo tool call, then "done".
SCRIPT = [{"tool_calls": [{"name": "echo", "arguments": {"x": 1}}]}, {"content": "done"}]
# What a run's event list holds at the end: run_queued, run_started, then per iteration
# iteration_started (+ message_delta for text) + message_completed, tool_started +
# tool_completed for the call, and run_completed.
EVENTS_PER_RUN = 10


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(what, timeout, probe):
    """Polls `probe` until it returns a true value (5 ms doubling to 100 ms, as agentfleet's
    harness does); raises after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    pause = 0.005
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(pause)
        pause = min(pause * 2, 0.1)


def http_ok(url: str) -> bool:
    import httpx
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def stop(proc: subprocess.Popen, name: str, grace: float = 20) -> None:
    """SIGTERM to the process group we started (Dramatiq forwards it to its workers), then
    SIGKILL after `grace` seconds."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        print(f"  {name} ignored SIGTERM for {grace} s: killing it", file=sys.stderr)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        pass


class Stack:
    """The reference's world for one measurement: its own database, queue and Redis prefix
    (`af_compare_<random>`), mock-llm, the tool server and the Dramatiq workers. Used as a
    context manager: everything is removed again on exit, also on failure.

    Settings reach the reference through the environment, so they are set here, before the
    `reference` package is first imported."""

    def __init__(self, bin_dir: str, log_dir: str, processes: int, threads: int, pool_size: int,
                 http_connections: int):
        self.bin_dir, self.log_dir = bin_dir, log_dir
        self.processes, self.threads = processes, threads
        self.name = f"af_compare_{uuid.uuid4().hex[:10]}"
        self.admin_url = os.environ.get("AGENTFLEET_TEST_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
        self.db_url = self.admin_url.rsplit("/", 1)[0] + "/" + self.name
        self.amqp_url = os.environ.get("AGENTFLEET_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2F")
        self.redis_url = os.environ.get("AGENTFLEET_TEST_REDIS_URL", "redis://127.0.0.1:6379")
        self.llm_port, self.tool_port = free_port(), free_port()
        os.environ.update({
            "COMPARE_DATABASE_URL": self.db_url,
            "COMPARE_AMQP_URL": self.amqp_url,
            "COMPARE_REDIS_URL": self.redis_url,
            "COMPARE_QUEUE": self.name,
            "COMPARE_REDIS_PREFIX": self.name,
            "COMPARE_LLM_BASE_URL": f"http://127.0.0.1:{self.llm_port}/v1",
            "COMPARE_POOL_SIZE": str(pool_size),
            "COMPARE_HTTP_CONNECTIONS": str(http_connections),
        })
        self.procs = []  # (label, Popen, log path), stopped in reverse order
        self.created_db = False
        self.dramatiq = None

    def spawn(self, label, cmd, **kw) -> subprocess.Popen:
        log_path = os.path.join(self.log_dir, f"{self.name}-{label}.log")
        log = open(log_path, "w")
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, **kw)
        self.procs.append((label, proc, log_path))
        return proc

    def alive(self) -> None:
        for label, proc, log_path in self.procs:
            if proc.poll() is not None:
                raise RuntimeError(f"{label} exited with {proc.returncode}; see {log_path}")

    def pid(self, label: str) -> int:
        return next(proc.pid for name, proc, _ in self.procs if name == label)

    def __enter__(self) -> "Stack":
        import pika
        import psycopg
        try:
            os.makedirs(self.log_dir, exist_ok=True)
            print(f"reference: database, queue and Redis prefix {self.name}", flush=True)
            with psycopg.connect(self.admin_url, autocommit=True) as conn:
                conn.execute(f"CREATE DATABASE {self.name}")
                self.created_db = True
            with psycopg.connect(self.db_url, autocommit=True) as conn, \
                    open(os.path.join(HERE, "reference", "schema.sql")) as f:
                conn.execute(f.read())

            self.spawn("mock-llm", [os.path.join(self.bin_dir, "mock-llm"), "--listen", f"127.0.0.1:{self.llm_port}"])
            self.spawn("tool-server", [os.path.join(self.bin_dir, "tool-server"),
                                       "--listen", f"127.0.0.1:{self.tool_port}"])
            for port in (self.llm_port, self.tool_port):
                wait_for(f"127.0.0.1:{port}/health", 30,
                         lambda port=port: (self.alive(), http_ok(f"http://127.0.0.1:{port}/health"))[1])

            self.dramatiq = self.spawn("dramatiq", [sys.executable, "-m", "dramatiq", "reference.worker",
                                                    "--processes", str(self.processes), "--threads", str(self.threads),
                                                    "--queues", self.name], cwd=HERE)

            def consumers():
                self.alive()
                try:
                    conn = pika.BlockingConnection(pika.URLParameters(self.amqp_url))
                except pika.exceptions.AMQPError:
                    return 0
                try:
                    return conn.channel().queue_declare(self.name, passive=True).method.consumer_count
                except pika.exceptions.AMQPError:
                    return 0  # not declared yet
                finally:
                    if conn.is_open:
                        conn.close()

            wait_for(f"{self.processes} Dramatiq consumers", 60, lambda: consumers() >= self.processes)
            return self
        except BaseException:
            self.__exit__(None, None, None)
            raise

    def __exit__(self, *_exc) -> None:
        import pika
        import psycopg
        import redis
        print("reference: cleaning up", flush=True)
        for label, proc, _ in reversed(self.procs):
            stop(proc, label)
        try:
            from reference import worker
            worker.broker.close()
        except Exception as e:  # noqa: BLE001 - cleanup goes on
            print(f"  closing the broker: {e!r}", file=sys.stderr)
        try:
            conn = pika.BlockingConnection(pika.URLParameters(self.amqp_url))
            ch = conn.channel()
            for q in (self.name, f"{self.name}.DQ", f"{self.name}.XQ"):
                ch.queue_delete(q)
            conn.close()
        except Exception as e:  # noqa: BLE001
            print(f"  deleting queues {self.name}*: {e!r}", file=sys.stderr)
        try:
            r = redis.Redis.from_url(self.redis_url)
            keys = list(r.scan_iter(match=f"{self.name}:*", count=1000))
            for i in range(0, len(keys), 1000):
                r.delete(*keys[i:i + 1000])
            r.close()
        except Exception as e:  # noqa: BLE001
            print(f"  deleting Redis keys {self.name}:*: {e!r}", file=sys.stderr)
        if self.created_db:
            try:
                with psycopg.connect(self.admin_url, autocommit=True) as conn:
                    conn.execute(f"DROP DATABASE IF EXISTS {self.name} WITH (FORCE)")
            except Exception as e:  # noqa: BLE001
                print(f"  dropping database {self.name}: {e!r}", file=sys.stderr)


def e2e(args) -> dict:
    """N no-op runs submitted at once (250 a batch from 4 threads), timed until all completed."""
    import psycopg
    import redis
    with Stack(args.bin_dir, args.log_dir, args.processes, args.threads, pool_size=args.threads,
               http_connections=2 * args.threads) as stack:
        from reference import producer, worker
        load = machine.background_load(1.0)
        print(f"reference: machine busy before the start: {load:.2f} cores", flush=True)
        user_text = json.dumps({"mock_script": SCRIPT}, separators=(",", ":"))
        tool_url = f"http://127.0.0.1:{stack.tool_port}/echo"

        with psycopg.connect(stack.db_url, autocommit=True) as poll:
            def counts():
                return poll.execute("SELECT count(*) FILTER (WHERE status = 'completed'),"
                                    " count(*) FILTER (WHERE status = 'failed') FROM runs").fetchone()

            cpu0, t0 = machine.busy_jiffies(), time.monotonic()
            producer.submit(args.runs, tool_url, user_text)
            submitted = time.monotonic() - t0

            def all_done():
                stack.alive()
                completed, failed = counts()
                if failed:
                    raise RuntimeError(f"{failed} runs failed; see {args.log_dir}/{stack.name}-dramatiq.log")
                return completed >= args.runs

            wait_for(f"{args.runs} runs to complete", args.deadline, all_done)
            elapsed = time.monotonic() - t0
            cpu_ms = machine.busy_ms(cpu0, machine.busy_jiffies())

            # Outside the measured window: check every run did the whole loop.
            roles = dict(poll.execute("SELECT role, count(*) FROM messages GROUP BY role").fetchall())
            tools_ok = poll.execute("SELECT count(*) FROM tool_calls WHERE status = 'succeeded'").fetchone()[0]
            reclaimed = poll.execute("SELECT count(*) FROM runs WHERE attempt > 1").fetchone()[0]
            lat = [r[0] for r in poll.execute(
                "SELECT extract(epoch FROM finished_at - created_at) * 1000 FROM runs ORDER BY 1").fetchall()]
            sample = [r[0] for r in poll.execute("SELECT id::text FROM runs ORDER BY random() LIMIT 20").fetchall()]
        expected = {"user": args.runs, "assistant": 2 * args.runs, "tool": args.runs}
        if roles != expected or tools_ok != args.runs:
            raise RuntimeError(f"runs incomplete: messages {roles}, expected {expected}; tool calls {tools_ok}")
        r = redis.Redis.from_url(stack.redis_url)
        lengths = {r.llen(worker.events_key(run)) for run in sample}
        r.close()
        if lengths != {EVENTS_PER_RUN}:
            raise RuntimeError(f"event lists of sampled runs hold {lengths} events, expected {EVENTS_PER_RUN}")

    def pct(p):
        return float(lat[min(len(lat) - 1, round((len(lat) - 1) * p))])

    result = {
        "runs": args.runs, "processes": args.processes, "threads": args.threads,
        "seconds": elapsed, "submit_seconds": submitted,
        "runs_per_s": args.runs / elapsed,
        "machine_cpu_ms": cpu_ms, "machine_cpu_ms_per_run": cpu_ms / args.runs,
        "background_cores_before": load,
        "latency_ms_p50": pct(0.5), "latency_ms_p99": pct(0.99),
        "runs_claimed_more_than_once": reclaimed,
        "events_per_run": EVENTS_PER_RUN,
    }
    print(f"reference: {args.runs} runs in {elapsed:.2f} s (submitted in {submitted:.2f} s): "
          f"{result['runs_per_s']:.1f} runs/s, machine CPU {result['machine_cpu_ms_per_run']:.2f} ms/run, "
          f"latency p50 {result['latency_ms_p50']:.0f} ms p99 {result['latency_ms_p99']:.0f} ms", flush=True)
    return result


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workload", choices=["e2e", "load"], default="e2e")
    p.add_argument("--runs", type=int, default=3000, help="e2e: runs to submit")
    p.add_argument("--processes", type=int, default=2)
    p.add_argument("--threads", type=int, default=None,
                   help="Dramatiq threads per process (e2e: 16; load: sized from --in-flight, see reference_load.py)")
    p.add_argument("--bin-dir", required=True, help="where mock-llm and tool-server are")
    p.add_argument("--deadline", type=float, default=900, help="e2e: seconds to wait for all runs")
    p.add_argument("--json-out", required=True)
    p.add_argument("--log-dir", required=True)
    import reference_load
    reference_load.add_arguments(p)
    args = p.parse_args()

    # SIGTERM (from `run`, or anyone) unwinds through the finally blocks and Stack.__exit__.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.workload == "e2e":
        args.threads = args.threads or 16
        result = e2e(args)
    else:
        result = reference_load.load(args, Stack)
    with open(args.json_out, "w") as f:
        json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The reference's `load` workload: agentfleet's load section (`bench --only load`) played on the
Dramatiq stack.

Runs are offered open-loop at a steady rate chosen to keep about --in-flight runs in flight
(Little's law from the scripted duration, corrected twice from the measured in-flight count,
as agentfleet's plan), for --duration-s after the ramp; then the tail drains. Every run plays
the same script as agentfleet's: per model call 80 stamped tokens at 40 tokens/s after an
800 ms first byte, 2 `slow` tool calls of 300 ms per run; 10 % of runs ask the user a question
(the built-in `ask`) and 5 % call `slow_confirmed` (a `risk: high` tool); either pauses the
run until this driver answers, 2 s after the pause, as agentfleet's clients do.

There is no HTTP API and no SSE client on this side: runs are created straight in Postgres and
RabbitMQ (one transaction and one confirmed publish per run, as `POST /v1/runs` would), the
driver learns that runs ended and paused by polling Postgres, and answers as the API's resume
would (`producer.resume`).

Dramatiq holds one run per thread, so the worker processes get as many threads as the run
needs slots (see `size_threads`)."""

import heapq
import json
import math
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import machine

# As agentfleet's plan (tests/src/bin/bench/load/plan.rs).
CALL_CHUNKS = 3
QUESTION = "Which region do you mean?"
ANSWER = "The northern one."
# Worker RSS a thread-held run costs on this stack: ~230 KiB more per held run between 48 and
# 247 held (2 processes of 32 and of 125 threads), plus ~18 KiB an idle thread; rounded up.
# What the memory rule divides by (README, "How many threads").
RSS_PER_THREAD_KIB = 250
# Postgres connections per worker process: agentfleet's load section gives each worker 20
# (`database.max_connections`); a thread borrows one per transaction.
POOL_PER_PROCESS = 20

PLAIN, QUESTION_KIND, CONFIRM = "plain", "question", "confirm"


def add_arguments(p) -> None:
    """The load section's knobs, with agentfleet's defaults."""
    g = p.add_argument_group("load workload (agentfleet's `bench --only load` knobs and defaults)")
    g.add_argument("--in-flight", type=int, default=1000)
    g.add_argument("--duration-s", type=float, default=120.0)
    g.add_argument("--offered-rate", type=float, default=None)
    g.add_argument("--first-byte-ms", type=int, default=800)
    g.add_argument("--model-turns", type=int, default=3)
    g.add_argument("--tokens-per-turn", type=int, default=80)
    g.add_argument("--tokens-per-s", type=float, default=40.0)
    g.add_argument("--tool-calls", type=int, default=2)
    g.add_argument("--tool-ms", type=int, default=300)
    g.add_argument("--question-share", type=float, default=0.10)
    g.add_argument("--confirm-share", type=float, default=0.05)
    g.add_argument("--answer-after-ms", type=int, default=2000)
    g.add_argument("--rss-per-thread-kib", type=float, default=RSS_PER_THREAD_KIB,
                   help="worker memory a held run takes, for sizing the threads")


def unit(index: int, salt: int) -> float:
    """agentfleet's fixed sequence in 0..1 per run index (splitmix64): the same mix of kinds."""
    mask = (1 << 64) - 1
    z = (index * 0x9E3779B97F4A7C15 + salt) & mask
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
    z ^= z >> 31
    return (z >> 11) / float(1 << 53)


class Plan:
    """The script of a run and its scripted duration, as agentfleet's plan.rs computes them."""

    def __init__(self, a):
        if a.question_share + a.confirm_share > 1:
            raise SystemExit("--question-share and --confirm-share together must not pass 1")
        if a.tool_calls > 8 * (a.model_turns - 1):
            raise SystemExit("--tool-calls go to the model calls before the last, at most 8 each")
        self.in_flight, self.duration = a.in_flight, a.duration_s
        self.turns, self.tokens, self.tool_calls = a.model_turns, a.tokens_per_turn, a.tool_calls
        self.first_byte_ms, self.tool_ms = a.first_byte_ms, a.tool_ms
        self.chunk_gap_ms = round(1000.0 / a.tokens_per_s)
        self.question_share, self.confirm_share = a.question_share, a.confirm_share
        self.answer_after = a.answer_after_ms / 1000.0
        self.offered_rate = a.offered_rate

    def calls_in(self, turn: int) -> int:
        tool_turns = self.turns - 1
        if turn >= tool_turns:
            return 0
        return self.tool_calls // tool_turns + (1 if turn < self.tool_calls % tool_turns else 0)

    def pausing_turn(self) -> int:
        return next((t for t in reversed(range(self.turns - 1)) if self.calls_in(t) > 0), 0)

    def script(self, kind: str) -> list:
        turns = []
        for t in range(self.turns):
            calls = [{"name": "slow", "arguments": {"ms": self.tool_ms}} for _ in range(self.calls_in(t))]
            if t == self.pausing_turn():
                if kind == CONFIRM and calls:
                    calls[-1]["name"] = "slow_confirmed"
                if kind == QUESTION_KIND:
                    calls.append({"name": "ask", "arguments": {"text": QUESTION}})
            turns.append({"content": "tokn" * self.tokens, "chunks": self.tokens, "stamp": True,
                          "delay_ms": self.first_byte_ms, "chunk_delay_ms": self.chunk_gap_ms,
                          "call_chunks": CALL_CHUNKS, "tool_calls": calls})
        return turns

    def scripted_secs(self, kind: str) -> float:
        ms = 0.0
        for t in range(self.turns):
            calls = self.calls_in(t) + (1 if t == self.pausing_turn() and kind == QUESTION_KIND else 0)
            frames = 1 + self.tokens + calls * (1 + CALL_CHUNKS) + 2
            ms += self.first_byte_ms + self.chunk_gap_ms * (frames - 1)
            if self.calls_in(t) > 0:
                ms += self.tool_ms
        if kind != PLAIN:
            ms += self.answer_after * 1000.0
        return ms / 1000.0

    def mean_scripted_secs(self) -> float:
        plain = 1.0 - self.question_share - self.confirm_share
        return (plain * self.scripted_secs(PLAIN) + self.question_share * self.scripted_secs(QUESTION_KIND)
                + self.confirm_share * self.scripted_secs(CONFIRM))

    def longest_scripted_secs(self) -> float:
        longest = self.scripted_secs(PLAIN)
        if self.question_share > 0:
            longest = max(longest, self.scripted_secs(QUESTION_KIND))
        if self.confirm_share > 0:
            longest = max(longest, self.scripted_secs(CONFIRM))
        return longest

    def kind(self, index: int) -> str:
        u = unit(index, 1)
        if u < self.question_share:
            return QUESTION_KIND
        if u < self.question_share + self.confirm_share:
            return CONFIRM
        return PLAIN


def mem_available_kib() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1])
    raise RuntimeError("/proc/meminfo has no MemAvailable")


def size_threads(in_flight: int, processes: int, rss_per_thread_kib: float):
    """Threads per worker process: as many as the runs need slots — agentfleet's rule, a quarter
    more than the in-flight target (paused and queued runs hold none; the rest absorbs the
    count's swings), at least 16 a process — unless memory allows fewer: half of the memory
    available now, at `rss_per_thread_kib` a held run. Returns (threads, how it was decided)."""
    wanted = max(math.ceil(in_flight * 5 / 4 / processes), 16)
    by_memory = int(mem_available_kib() / 2 / rss_per_thread_kib / processes)
    if by_memory < wanted:
        return by_memory, f"memory: half of MemAvailable at {rss_per_thread_kib:.0f} KiB a held run"
    return wanted, (f"1.25 x in-flight target over {processes} processes (memory would allow "
                    f"{by_memory} a process at {rss_per_thread_kib:.0f} KiB a held run)")


class Counts:
    """What the watcher last read from Postgres, and what the driver submitted."""

    def __init__(self):
        self.lock = threading.Lock()
        self.submitted = self.submit_failed = 0
        self.completed = self.failed = self.running = 0
        self.answers = self.answers_failed = 0
        self.first_error = None
        self.late = 0.0  # the latest submission's delay behind its moment, seconds

    def in_flight(self) -> int:
        with self.lock:
            return self.submitted - self.submit_failed - self.completed - self.failed


def watch(db_url: str, redis_url: str, counts: Counts, answer_after: float, stop: threading.Event,
          every: float = 0.1) -> None:
    """Reads the runs' counts every `every` seconds and answers paused runs `answer_after` after
    they paused (by the pause's commit time), as agentfleet's clients do."""
    import psycopg
    import redis
    from psycopg_pool import ConnectionPool
    from reference import producer
    pool = ConnectionPool(db_url, min_size=1, max_size=1, open=True, name="answers")
    r = redis.Redis.from_url(redis_url)
    scheduled, due = set(), []  # run ids; heap of (when, run id)
    try:
        with psycopg.connect(db_url, autocommit=True) as conn:
            while not stop.is_set():
                completed, failed, running = conn.execute(
                    "SELECT count(*) FILTER (WHERE status = 'completed'), count(*) FILTER (WHERE status = 'failed'),"
                    " count(*) FILTER (WHERE status = 'running') FROM runs").fetchone()
                with counts.lock:
                    counts.completed, counts.failed, counts.running = completed, failed, running
                waiting = conn.execute(
                    "SELECT id::text, extract(epoch FROM updated_at)::float8 FROM runs"
                    " WHERE status IN ('waiting_for_input', 'waiting_for_confirmation')").fetchall()
                for run_id, paused_at in waiting:
                    if run_id not in scheduled:
                        scheduled.add(run_id)
                        heapq.heappush(due, (paused_at + answer_after, run_id))
                while due and due[0][0] <= time.time():
                    _, run_id = heapq.heappop(due)
                    scheduled.discard(run_id)
                    try:
                        ok = producer.resume(pool, r, run_id, ANSWER)
                    except Exception as e:  # noqa: BLE001 - counted, the run shows as not completed
                        ok = False
                        with counts.lock:
                            counts.first_error = counts.first_error or f"resume {run_id}: {e!r}"
                    with counts.lock:
                        if ok:
                            counts.answers += 1
                        else:
                            counts.answers_failed += 1
                wake = every if not due else min(every, max(0.0, due[0][0] - time.time()))
                stop.wait(wake)
    finally:
        pool.close()
        r.close()


def load(args, Stack) -> dict:
    """Plays the load workload on a fresh Stack; returns its figures."""
    import psycopg
    import redis
    from psycopg_pool import ConnectionPool

    plan = Plan(args)
    processes = args.processes
    if args.threads:
        threads, sized = args.threads, "given (--threads)"
    else:
        threads, sized = size_threads(plan.in_flight, processes, args.rss_per_thread_kib)
    pool_size = min(threads, POOL_PER_PROCESS)
    print(f"reference: {processes} processes x {threads} threads ({sized}); "
          f"{pool_size} Postgres connections a process", flush=True)

    with Stack(args.bin_dir, args.log_dir, processes, threads, pool_size=pool_size,
               http_connections=threads + 8) as stack:
        from reference import producer
        agent = producer.load_agent_spec(f"http://127.0.0.1:{stack.tool_port}/slow", plan.turns + 2)
        texts = {kind: json.dumps({"mock_script": plan.script(kind)}, separators=(",", ":"))
                 for kind in (PLAIN, QUESTION_KIND, CONFIRM)}

        root = stack.pid("dramatiq")
        wait_workers = time.monotonic() + 30
        while len(machine.tree(machine.process_table(), root)) < processes + 1:
            if time.monotonic() > wait_workers:
                raise RuntimeError("Dramatiq's worker processes did not show up")
            time.sleep(0.05)
        workers = machine.tree(machine.process_table(), root)
        rss_idle = machine.rss_kib(workers)
        groups = machine.CpuGroups({"workers": root, "model": stack.pid("mock-llm"),
                                    "tools": stack.pid("tool-server")}, own="driver")
        busy_before = machine.background_load(1.0)
        print(f"reference: machine busy before the start: {busy_before:.2f} cores; "
              f"worker RSS idle {rss_idle / 1024:.1f} MiB ({len(workers)} processes)", flush=True)

        counts = Counts()
        stop = threading.Event()
        watcher = threading.Thread(target=watch, name="watcher", daemon=True,
                                   args=(stack.db_url, stack.redis_url, counts, plan.answer_after, stop))
        watcher.start()
        samples = []  # (at, in flight, running, worker RSS KiB, model connections)
        t0 = time.monotonic()

        def sampler():
            while not stop.wait(1.0):
                tree = machine.tree(machine.process_table(), root)
                with counts.lock:
                    running = counts.running
                samples.append((time.monotonic() - t0, counts.in_flight(), running, machine.rss_kib(tree),
                                machine.established_on(stack.llm_port)))

        sampling = threading.Thread(target=sampler, name="sampler", daemon=True)
        sampling.start()

        submit_pool = ConnectionPool(stack.db_url, min_size=4, max_size=4, open=True, name="submit")
        r = redis.Redis.from_url(stack.redis_url)
        executor = ThreadPoolExecutor(4, thread_name_prefix="submit")

        def submit(kind: str, at: float) -> None:
            with counts.lock:
                counts.late = max(counts.late, time.monotonic() - at)
            try:
                producer.create_batch(submit_pool, r, agent, texts[kind], 1)
            except Exception as e:  # noqa: BLE001 - counted as not completed
                with counts.lock:
                    counts.submit_failed += 1
                    counts.first_error = counts.first_error or f"submission: {e!r}"

        poll = psycopg.connect(stack.db_url, autocommit=True)

        def completed_now() -> int:
            return poll.execute("SELECT count(*) FROM runs WHERE status = 'completed'").fetchone()[0]

        # Little's law, as agentfleet's plan: the first rate from the scripted duration, then two
        # corrections from the in-flight count measured once the longest run could have ended.
        mean_secs, longest, n = plan.mean_scripted_secs(), plan.longest_scripted_secs(), float(plan.in_flight)
        rate = plan.offered_rate or n / mean_secs
        rates = [rate]
        corrections = [] if plan.offered_rate else [(1.1 * longest, 1.6 * longest), (2.6 * longest, 3.1 * longest)]
        measured = [0.0, 0]
        sustain_from = (3.6 if corrections else 1.5) * longest
        sustain_to = sustain_from + plan.duration
        cap = plan.in_flight * 3 + 100
        window = None
        due, index = 0.0, 0
        try:
            while True:
                now = time.monotonic() - t0
                if window is None and now >= sustain_from:
                    window = (time.monotonic(), machine.busy_jiffies(), groups.snapshot(), completed_now())
                if now >= sustain_to:
                    break
                if corrections:
                    start, end = corrections[0]
                    if start <= now < end:
                        measured = [measured[0] + counts.in_flight(), measured[1] + 1]
                    elif now >= end:
                        corrections.pop(0)
                        if measured[1]:
                            held = measured[0] / measured[1]
                            rate = min(max(rate * n / max(held, 1.0), rate / 4), rate * 4)
                            rates.append(rate)
                        measured = [0.0, 0]
                at = t0 + due
                pause = at - time.monotonic()
                if pause > 0:
                    time.sleep(pause)  # the next submission's moment (open loop), not a wait for a state
                while counts.in_flight() >= cap:
                    stack.alive()
                    time.sleep(0.01)
                with counts.lock:
                    counts.submitted += 1
                executor.submit(submit, plan.kind(index), at)
                index += 1
                due += 1.0 / rate
            end_at, end_jiffies, end_groups, end_completed = (time.monotonic(), machine.busy_jiffies(),
                                                              groups.snapshot(), completed_now())
            in_flight_at_end = counts.in_flight()
            print(f"reference: runs/s offered {' -> '.join(f'{x:.1f}' for x in rates)}; "
                  f"{counts.submitted} submitted, draining {in_flight_at_end} in flight", flush=True)

            # Drain: every run still in flight gets to its end, or counts as not completed.
            executor.shutdown(wait=True)
            deadline = time.monotonic() + 3 * longest + 60
            while counts.in_flight() > 0 and time.monotonic() < deadline:
                stack.alive()
                time.sleep(0.1)
        finally:
            stop.set()
            executor.shutdown(wait=False, cancel_futures=True)
            watcher.join(10)
            sampling.join(10)
            submit_pool.close()
            r.close()

        # Outside the measured window: check that every completed run did the whole loop.
        incomplete = poll.execute(
            """SELECT count(*) FROM runs r WHERE r.status = 'completed' AND (
                 (SELECT count(*) FROM messages m WHERE m.run_id = r.id AND m.role = 'assistant') <> %s
                 OR EXISTS (SELECT 1 FROM tool_calls t WHERE t.run_id = r.id AND t.status <> 'succeeded'))""",
            (plan.turns,)).fetchone()[0]
        paused = dict(poll.execute(
            "SELECT name, count(*) FROM tool_calls WHERE name IN ('ask', 'slow_confirmed') AND status = 'succeeded'"
            " GROUP BY name").fetchall())
        final = dict(poll.execute("SELECT status, count(*) FROM runs GROUP BY status").fetchall())
        durations = [row[0] for row in poll.execute(
            "SELECT extract(epoch FROM finished_at - created_at)::float8 * 1000 FROM runs"
            " WHERE status = 'completed' ORDER BY 1").fetchall()]
        recovered = poll.execute("SELECT count(*) FROM runs WHERE attempt > resumed_attempt + 1").fetchone()[0]
        poll.close()
    if counts.first_error:
        print(f"reference: first error: {counts.first_error}", flush=True)
    if incomplete:
        raise RuntimeError(f"{incomplete} completed runs lack a model turn or a settled tool call")

    start_at, start_jiffies, start_groups, start_completed = window
    secs = end_at - start_at
    completed = end_completed - start_completed
    cpu_ms = machine.busy_ms(start_jiffies, end_jiffies)
    split = machine.CpuGroups.ms(start_groups, end_groups)
    split["other"] = cpu_ms - sum(split.values())
    lo, hi = start_at - t0, end_at - t0
    inside = [s for s in samples if lo <= s[0] <= hi] or samples[-1:]

    def mean(f):
        return sum(f(s) for s in inside) / max(len(inside), 1)

    def pct(values, p):
        return float(values[min(len(values) - 1, round((len(values) - 1) * p))]) if values else float("nan")

    in_flight_mean = mean(lambda s: s[1])
    running_mean = mean(lambda s: s[2])
    rss_per_run = mean(lambda s: max(s[3] - rss_idle, 0) / max(s[1], 1))
    rss_per_held = mean(lambda s: max(s[3] - rss_idle, 0) / max(s[2], 1))
    rss_max = max((s[3] for s in inside), default=0)
    not_completed = counts.submitted - final.get("completed", 0)
    result = {
        "workload": "load", "processes": processes, "threads": threads, "threads_sized_by": sized,
        "postgres_connections_per_process": pool_size,
        "config": {"in_flight": plan.in_flight, "duration_s": plan.duration, "offered_rate": rate, "rates": rates,
                   "first_byte_ms": plan.first_byte_ms, "model_turns": plan.turns, "tokens_per_turn": plan.tokens,
                   "chunk_gap_ms": plan.chunk_gap_ms, "tool_calls": plan.tool_calls, "tool_ms": plan.tool_ms,
                   "question_share": plan.question_share, "confirm_share": plan.confirm_share,
                   "answer_after_ms": round(plan.answer_after * 1000), "mean_scripted_s": mean_secs},
        "window_s": secs,
        "offered_runs_per_s": rate,
        "completed_runs_per_s": completed / secs,
        "in_flight_mean": in_flight_mean,
        "in_flight_min": min((s[1] for s in inside), default=0),
        "running_mean": running_mean,
        "submitted": counts.submitted,
        "not_completed": not_completed,
        "final_statuses": final,
        "submit_failed": counts.submit_failed,
        "answers": counts.answers, "answers_failed": counts.answers_failed,
        "paused_and_answered": {"question": paused.get("ask", 0), "confirmation": paused.get("slow_confirmed", 0)},
        "runs_recovered": recovered,
        "latest_submission_behind_ms": counts.late * 1000,
        "duration_ms_p50": pct(durations, 0.5), "duration_ms_p99": pct(durations, 0.99),
        "machine_cores_busy": cpu_ms / 1000 / secs,
        "machine_cpu_ms_per_run": cpu_ms / max(completed, 1),
        "cpu_ms_per_run": {name: ms / max(completed, 1) for name, ms in split.items()},
        "cpu_cores": {name: ms / 1000 / secs for name, ms in split.items()},
        "worker_rss_idle_mib": rss_idle / 1024,
        "worker_rss_max_mib": rss_max / 1024,
        "worker_rss_kib_per_in_flight_run": rss_per_run,
        "worker_rss_kib_per_held_run": rss_per_held,
        "model_connections_mean": mean(lambda s: s[4]),
        "background_cores_before": busy_before,
        "samples": samples,
    }
    print(f"reference: {completed / secs:.1f} completed runs/s over {secs:.0f} s, {in_flight_mean:.0f} in flight "
          f"({running_mean:.0f} held), machine {result['machine_cores_busy']:.2f} cores, "
          f"worker RSS {rss_per_run:.0f} KiB per in-flight run above idle ({rss_per_held:.0f} per held run), "
          f"{not_completed} not completed", flush=True)
    print("reference: cores busy: " + " · ".join(f"{k} {v:.2f}" for k, v in result["cpu_cores"].items()), flush=True)
    return result

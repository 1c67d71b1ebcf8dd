//! Faults in combination: Redis loses a run's list and then its worker dies, a run is failed
//! as poison after its list is gone, a model answers 503 with `Retry-After` forever, a lock
//! held elsewhere stalls one run's writes while others share its worker (or one request of
//! the API). A client
//! that holds a `Last-Event-ID` from before the fault sees ids strictly increase and its
//! stream end with the run's terminal event. Redis losing a list is simulated by deleting this
//! test's keys, which is what a Redis restart does to them, without disturbing other tests.

use std::time::Duration;

use serde_json::{Value, json};

use agentfleet_tests::harness::*;
use agentfleet_tests::stall_proxy::StallProxy;

const T: Duration = Duration::from_secs(60);

/// Ids of `events` strictly increase, all above `after`, and the last event is terminal.
fn assert_continues(events: &[Value], after: u64, terminal: &str) {
    let ids: Vec<u64> = events.iter().map(|e| e["id"].as_u64().unwrap()).collect();
    assert!(!ids.is_empty(), "the stream ended without an event");
    assert!(ids[0] > after, "ids restarted: {ids:?} after {after}");
    assert!(ids.windows(2).all(|w| w[1] > w[0]), "{ids:?}");
    assert_eq!(
        events.last().unwrap()["type"],
        terminal,
        "{:?}",
        types(events)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_losing_the_list_then_a_kill_9_of_the_worker_never_reuses_an_id() {
    let env = TestEnv::new().await;
    let app = env.spawn_api().await;
    let mut worker = env.spawn_worker_process(&[]);
    let body = scripted_run(
        json!([{"content": "working on it", "tool_calls": [{"name": "slow", "arguments": {"ms": 1500}}]},
               {"content": "done after everything"}]),
        json!([http_tool(&env, "slow", "/slow")]),
    );
    let run = app.start_run(&body).await;
    let id = run["id"].as_str().unwrap().to_string();
    let watch = app.watch(&id);
    watch.wait_type("tool_started", T).await;
    let seen = watch.snapshot().last().unwrap()["id"].as_u64().unwrap();
    env.flush_redis_keys().await;
    worker.kill();
    let _rescuer = env.spawn_worker_process(&[]);
    let done = app.wait_status(&id, &["completed", "failed"], T).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert!(done["attempt"].as_i64().unwrap() >= 2, "{done}");
    // The client that saw `seen` reconnects: new events only, ending with the end.
    let rest = app.events(&id, seen, T).await;
    assert_continues(&rest, seen, "run_completed");
    assert_eq!(rest[0]["type"], "stream_rebuilt", "{:?}", types(&rest));
    // A client from the start sees the same ids.
    let all = app.events(&id, 0, T).await;
    assert_continues(&all, 0, "run_completed");
    assert_eq!(all.last(), rest.last());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_failed_as_poison_after_its_list_is_gone_still_ends_its_stream() {
    let env = TestEnv::with(&[("worker.max_recoveries", "0")]).await;
    let app = env.spawn_api().await;
    let body = scripted_run(
        json!([{"content": "about to crash", "tool_calls": [{"name": "crash", "arguments": {}}]}]),
        json!([http_tool(&env, "crash", "/echo")]),
    );
    let run = app.start_run(&body).await;
    let id = run["id"].as_str().unwrap().to_string();
    let watch = app.watch(&id);
    let mut crashing = env.spawn_worker_process_with_failpoints(&[], "tool:crash");
    watch.wait_type("message_completed", T).await;
    wait_for("the worker to crash at the tool", T, || {
        let exited = crashing.has_exited();
        async move { exited.then_some(()) }
    })
    .await;
    // Taken over once, past the limit: the next attempt runs alone, and crashes its worker too.
    let mut alone = env.spawn_worker_process_with_failpoints(&[], "tool:crash");
    wait_for("the quarantined attempt to crash its worker", T, || {
        let exited = alone.has_exited();
        async move { exited.then_some(()) }
    })
    .await;
    let (quarantined,): (Option<i32>,) =
        sqlx::query_as("SELECT quarantine_attempt FROM runs WHERE id = $1::uuid")
            .bind(&id)
            .fetch_one(&env.pool)
            .await
            .unwrap();
    assert_eq!(quarantined, Some(2), "the second attempt ran alone");
    let seen = watch.snapshot().last().unwrap()["id"].as_u64().unwrap();
    env.flush_redis_keys().await;
    // The next holder finds the run crashed a worker it had to itself.
    let _next = env.spawn_worker_process(&[]);
    let done = app.wait_status(&id, &["failed"], T).await;
    assert_eq!(done["error"]["code"], "poison_run", "{done}");
    let rest = app.events(&id, seen, T).await;
    assert_continues(&rest, seen, "run_failed");
    let failed = rest.last().unwrap();
    assert_eq!(
        failed["data"]["message"], done["error"]["message"],
        "Redis and Postgres say the same"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finished_run_whose_list_is_gone_ends_every_reconnecting_stream() {
    let env = TestEnv::new().await;
    let app = env.spawn_api().await;
    let _worker = env.spawn_worker().await;
    let run = app
        .start_run(&scripted_run(json!([{"content": "quick"}]), json!([])))
        .await;
    let id = run["id"].as_str().unwrap().to_string();
    app.wait_status(&id, &["completed"], T).await;
    let before = app.events(&id, 0, T).await;
    let last = before.last().unwrap()["id"].as_u64().unwrap();
    env.flush_redis_keys().await;
    // A client that holds the end gets nothing more; whatever else a client holds (nothing, a
    // middle id, an id never handed out), its stream ends with run_completed, never silence.
    assert!(app.events(&id, last, T).await.is_empty());
    for after in [0, 2, last + 1_000_000_000] {
        let events = app.events(&id, after, T).await;
        assert_eq!(
            events.last().map(|e| e["type"].clone()),
            Some(json!("run_completed")),
            "after {after}: {events:?}"
        );
    }
    // Later clients agree on the ids of what was restored (a coarse `stream_rebuilt` is
    // made at read time: its `at` differs).
    let shape = |events: Vec<Value>| -> Vec<(Value, Value)> {
        events
            .into_iter()
            .map(|e| (e["id"].clone(), e["type"].clone()))
            .collect()
    };
    let a = shape(app.events(&id, 0, T).await);
    let b = shape(app.events(&id, 0, T).await);
    assert_eq!(a, b);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_answering_503_with_retry_after_forever_is_retried_a_bounded_number_of_times() {
    let env = TestEnv::with(&[
        ("worker.model_max_retries", "3"),
        ("worker.model_retry_after_max_ms", "50"),
    ])
    .await;
    let app = env.spawn_api().await;
    let _worker = env.spawn_worker().await;
    let run = app
        .start_run(&scripted_run(
            json!([{"status": 503, "retry_after": 1}]),
            json!([]),
        ))
        .await;
    let id = run["id"].as_str().unwrap();
    let done = app.wait_status(id, &["completed", "failed"], T).await;
    assert_eq!(done["status"], "failed", "{done}");
    assert_eq!(done["error"]["code"], "model_http_error");
    assert_eq!(
        env.llm.request_count(),
        4,
        "one call and worker.model_max_retries retries, whatever Retry-After says"
    );
    let events = app.events(id, 0, T).await;
    assert_eq!(events.last().unwrap()["type"], "run_failed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_loss_and_a_kill_before_anything_was_recorded_still_never_reuses_an_id() {
    let env = TestEnv::new().await;
    let app = env.spawn_api().await;
    let mut worker = env.spawn_worker_process(&[]);
    // Killed during the first model call: Postgres has recorded no event id yet.
    let body = scripted_run(
        json!([{"content": "slow first answer", "delay_ms": 1500}]),
        json!([]),
    );
    let run = app.start_run(&body).await;
    let id = run["id"].as_str().unwrap().to_string();
    let watch = app.watch(&id);
    watch.wait_type("iteration_started", T).await;
    let seen = watch.snapshot().last().unwrap()["id"].as_u64().unwrap();
    env.flush_redis_keys().await;
    worker.kill();
    let _rescuer = env.spawn_worker_process(&[]);
    let done = app.wait_status(&id, &["completed", "failed"], T).await;
    assert_eq!(done["status"], "completed", "{done}");
    let rest = app.events(&id, seen, T).await;
    assert_continues(&rest, seen, "run_completed");
}

/// A lock held elsewhere on one run's row (an operator's open transaction, a migration taking
/// the table) while its worker records that run's turn. The grouped write is cancelled by
/// `database.statement_timeout_ms` instead of holding the worker's turn writer, and every run
/// behind it, for as long as the lock lasts: another run of the same worker completes while
/// the lock is still held. Once it is released, the locked run is taken over and completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_held_on_one_run_does_not_hold_the_other_runs_of_its_worker() {
    let env = TestEnv::new().await;
    let app = env.spawn_api().await;
    let _worker = env
        .spawn_worker_with(&[
            ("database.statement_timeout_ms", "500"),
            // The statement's time-out is what this test is about.
            ("database.lock_timeout_ms", "0"),
        ])
        .await;
    let late = scripted_run(
        json!([{"content": "done late", "delay_ms": 1000}]),
        json!([]),
    );
    let locked = app.start_run(&late).await["id"]
        .as_str()
        .unwrap()
        .to_string();
    app.watch(&locked).wait_type("iteration_started", T).await;
    let locker = env.lock_run_row(&locked).await;
    // The model answers after a second: the turn's grouped write then waits on the lock (a
    // lease renewal may wait on it too: not what this waits for).
    env.wait_for_lock_waiter("the turn's write waiting on the lock", TURN_WRITE_SQL, T)
        .await;
    let other = app
        .start_run(&scripted_run(json!([{"content": "done"}]), json!([])))
        .await;
    let other = other["id"].as_str().unwrap();
    let done = app
        .wait_status(other, &["completed", "failed"], Duration::from_secs(20))
        .await;
    assert_eq!(done["status"], "completed", "{done}");
    // The lock was held all along: its transaction still answers.
    let mut locker = locker;
    sqlx::query("SELECT 1")
        .execute(&mut *locker)
        .await
        .expect("the lock's transaction is still open");
    locker.rollback().await.unwrap();
    let done = app.wait_status(&locked, &["completed", "failed"], T).await;
    assert_eq!(done["status"], "completed", "{done}");
    let messages = app.messages(done["thread_id"].as_str().unwrap()).await;
    let answers = messages.iter().filter(|m| m["role"] == "assistant").count();
    assert_eq!(
        answers, 1,
        "the cancelled turn left nothing behind: {messages:?}"
    );
}

/// A request of the API waiting on a run's row locked elsewhere gives up after
/// `database.lock_timeout_ms` with 503 `unavailable` and a retry hint, changing nothing, and
/// goes through once the lock is released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_waiting_on_a_locked_run_answers_503_and_changes_nothing() {
    let env = TestEnv::new().await;
    let app = env
        .spawn_api_with(&[("database.lock_timeout_ms", "300")])
        .await;
    // No worker: the run stays queued.
    let run = app
        .start_run(&scripted_run(json!([{"content": "done"}]), json!([])))
        .await;
    let id = run["id"].as_str().unwrap().to_string();
    let locker = env.lock_run_row(&id).await;
    let started = std::time::Instant::now();
    let refused = app.post(&format!("/v1/runs/{id}/cancel"), &json!({})).await;
    assert_eq!(refused.status(), 503);
    assert!(
        refused.headers().contains_key("retry-after"),
        "a retry hint: {:?}",
        refused.headers()
    );
    let body: Value = refused.json().await.unwrap();
    assert_eq!(body["error"]["code"], "unavailable", "{body}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "the lock's time-out answered, not the statement's (10 s)"
    );
    locker.rollback().await.unwrap();
    assert_eq!(app.run(&id).await["status"], "queued", "nothing changed");
    let cancelled = app.post(&format!("/v1/runs/{id}/cancel"), &json!({})).await;
    assert_eq!(cancelled.status(), 200);
    assert_eq!(app.run(&id).await["status"], "cancelled");
}

/// A broker that stops answering without closing anything (RabbitMQ holds publishers during a
/// memory or disk alarm) while a run ends, its end promoting the next run of its thread, and
/// then the worker is asked to drain. The promoted run's publish gives up after
/// `amqp.timeout_ms` instead of holding the finished run's task, and the drain neither waits
/// for the broker to answer the consumer's cancel nor for its grace period: the worker stops
/// in a few seconds. Once the broker answers again, the promoted run is published by a
/// sweeper and completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_that_stops_answering_holds_neither_a_finished_run_nor_the_drain() {
    let env = TestEnv::new().await;
    let app = env.spawn_api().await;
    let (proxy, worker) = worker_behind_a_stall_proxy(&env, &[]).await;
    let first = app
        .start_run(&scripted_run(
            json!([{"content": "first", "delay_ms": 1500}]),
            json!([]),
        ))
        .await;
    let (first_id, thread) = (
        first["id"].as_str().unwrap().to_owned(),
        first["thread_id"].as_str().unwrap().to_owned(),
    );
    app.watch(&first_id).wait_type("iteration_started", T).await;
    let mut body = scripted_run(json!([{"content": "second"}]), json!([]));
    body["thread_id"] = json!(thread);
    body["if_busy"] = json!("enqueue");
    let second = app.start_run(&body).await;
    assert_eq!(second["status"], "waiting_for_thread", "{second}");
    let second_id = second["id"].as_str().unwrap().to_owned();
    proxy.hold();
    let done = app
        .wait_status(&first_id, &["completed", "failed"], T)
        .await;
    assert_eq!(done["status"], "completed", "{done}");
    drains_without_the_broker(worker).await;
    proxy.release();
    let _rescuer = env.spawn_worker().await;
    let done = app
        .wait_status(&second_id, &["completed", "failed"], T)
        .await;
    assert_eq!(done["status"], "completed", "{done}");
}

/// A worker whose only slot frees while the broker has stopped answering: its consumer was
/// paused (a delivery acknowledged early let the broker push one more than the free slots),
/// and starting it again (`basic.qos`, `basic.consume`) waits for answers that do not come.
/// That start is bounded by `amqp.timeout_ms` and given up on a stop, so the drain asked for
/// meanwhile ends in seconds, not when the connection's heartbeat finally fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_freed_while_the_broker_stalls_does_not_hold_the_drain() {
    let env = TestEnv::new().await;
    let app = env.spawn_api().await;
    let (proxy, worker) = worker_behind_a_stall_proxy(
        &env,
        &[
            ("worker.concurrency", "1"),
            ("worker.max_delivery_hold_ms", "1000"),
        ],
    )
    .await;
    let slow = app
        .start_run(&scripted_run(
            json!([{"content": "done", "delay_ms": 6000}]),
            json!([]),
        ))
        .await;
    let slow = slow["id"].as_str().unwrap().to_owned();
    app.watch(&slow).wait_type("iteration_started", T).await;
    let next = app
        .start_run(&scripted_run(json!([{"content": "next"}]), json!([])))
        .await;
    // The slow run's delivery is acknowledged after a second; the broker then pushes the next
    // run's, which finds no free slot: it goes back, and the consumer is cancelled.
    let queue = format!("{}.runs", env.prefix);
    wait_for(
        "the consumer paused, the next run back in the queue",
        T,
        || async { (env.queue_stats(&queue).await == (1, 0)).then_some(()) },
    )
    .await;
    proxy.hold();
    let done = app.wait_status(&slow, &["completed", "failed"], T).await;
    assert_eq!(done["status"], "completed", "{done}");
    // The slot is free: the consumer's start, beginning with `basic.qos` (an AMQP method
    // frame of class 60, method 10, on the intake's channel 1), goes into the held connection,
    // and the intake waits for its answer.
    const BASIC_QOS: [u8; 7] = [1, 0, 1, 0, 0, 0, 11];
    wait_for("the consumer's start sent", T, || async {
        proxy
            .sent_while_held(&[&BASIC_QOS[..], &[0, 60, 0, 10]].concat())
            .then_some(())
    })
    .await;
    drains_without_the_broker(worker).await;
    proxy.release();
    let _rescuer = env.spawn_worker().await;
    let next = next["id"].as_str().unwrap();
    let done = app.wait_status(next, &["completed", "failed"], T).await;
    assert_eq!(done["status"], "completed", "{done}");
}

/// A worker whose broker connection goes through a stall proxy: publishes and AMQP waits
/// give up after a second, its drain grace is 30 s (so a drain that ends sooner did not wait
/// for it).
async fn worker_behind_a_stall_proxy(
    env: &TestEnv,
    extra: &[(&str, &str)],
) -> (StallProxy, InProcessWorker) {
    let (proxy, through) = StallProxy::in_front_of_amqp(&amqp_url()).await;
    let mut settings = vec![
        ("amqp.url", through.as_str()),
        ("amqp.timeout_ms", "1000"),
        ("worker.drain_grace_ms", "30000"),
    ];
    settings.extend_from_slice(extra);
    (proxy, env.spawn_worker_with(&settings).await)
}

/// Drains `worker` and asserts it ended well within its 30 s grace, the broker not answering.
async fn drains_without_the_broker(worker: InProcessWorker) {
    let started = std::time::Instant::now();
    tokio::time::timeout(Duration::from_secs(15), worker.shutdown())
        .await
        .expect("the drain ends without the broker (its grace is 30 s)");
    assert!(started.elapsed() < Duration::from_secs(15));
}

/// An AMQP method frame on channel 0 (the connection's) of class 10 (`connection`).
fn connection_frame(method: u16, args: &[u8]) -> Vec<u8> {
    let mut payload = vec![0, 10];
    payload.extend_from_slice(&method.to_be_bytes());
    payload.extend_from_slice(args);
    let mut frame = vec![1, 0, 0];
    frame.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    frame.extend_from_slice(&payload);
    frame.push(0xCE);
    frame
}

/// A broker that blocks its publishers (a memory or disk alarm: it sends `connection.blocked`
/// and stops reading) while a publisher publishes on: each publish fails at once, naming the
/// alarm, on the same connection, instead of waiting for `amqp.timeout_ms` and then opening
/// one more connection per time-out (which the broker would block at once, and the old one
/// would stay, kept alive by the broker's heartbeats). Once the broker unblocks it, the same
/// connection publishes again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publisher_the_broker_blocks_neither_waits_nor_piles_up_connections() {
    use agentfleet_shared::queue::{PublishError, Publisher, Topology};
    let env = TestEnv::new().await;
    let (proxy, through) = StallProxy::in_front_of_amqp(&amqp_url()).await;
    let publisher = Publisher::new(&through, "test-blocked", Topology::new(&env.prefix))
        .await
        .expect("publisher")
        .with_timeout(Duration::from_millis(300));
    publisher
        .publish_run(uuid::Uuid::now_v7())
        .await
        .expect("published");
    assert_eq!(proxy.accepted(), 1);
    let reason = b"low on memory";
    let mut blocked = vec![reason.len() as u8];
    blocked.extend_from_slice(reason);
    proxy.inject(&connection_frame(60, &blocked));
    wait_for("the connection blocked", T, || async {
        publisher.is_blocked().then_some(())
    })
    .await;
    // And the broker reads nothing more from it, as in an alarm.
    proxy.hold();
    for _ in 0..3 {
        let started = std::time::Instant::now();
        let refused = publisher.publish_run(uuid::Uuid::now_v7()).await;
        assert!(matches!(refused, Err(PublishError::Blocked)), "{refused:?}");
        assert!(
            started.elapsed() < Duration::from_millis(300),
            "refused at once, not after amqp.timeout_ms"
        );
    }
    let many = publisher
        .publish_runs(&[uuid::Uuid::now_v7(), uuid::Uuid::now_v7()])
        .await
        .expect_err("a burst is refused too");
    assert!(
        matches!(many.first, PublishError::Blocked) && many.failed.len() == 2,
        "{many:?}"
    );
    assert_eq!(proxy.accepted(), 1, "no connection was opened meanwhile");
    proxy.release();
    proxy.inject(&connection_frame(61, &[]));
    wait_for("publishing again once unblocked", T, || async {
        publisher.publish_run(uuid::Uuid::now_v7()).await.ok()
    })
    .await;
    assert_eq!(proxy.accepted(), 1, "on the same connection");
}

/// A run whose row is locked elsewhere before any worker claims it (an operator's open
/// transaction): each claim fails at `database.lock_timeout_ms` and the message goes back to
/// the queue after a wait that doubles per earlier delivery (the quorum queue's
/// `x-delivery-count`), at most `worker.claim_retry_max_ms`, each failure counted. Nothing of
/// the run is written meanwhile; once the lock is released it is claimed and completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_locked_before_its_claim_is_retried_ever_slower_and_counted() {
    let env = TestEnv::new().await;
    let app = env.spawn_api().await;
    let run = app
        .start_run(&scripted_run(json!([{"content": "done"}]), json!([])))
        .await;
    let id = run["id"].as_str().unwrap().to_string();
    let locker = env.lock_run_row(&id).await;
    let listen = free_address();
    let _worker = env.spawn_worker_process(&[
        ("worker.metrics_listen", &listen),
        ("database.lock_timeout_ms", "100"),
        ("worker.claim_retry_max_ms", "1000"),
    ]);
    let failures = || async {
        scrape_metrics(&listen)
            .await?
            .lines()
            .find_map(|l| l.strip_prefix("agentfleet_claim_failures_total "))
            .and_then(|v| v.trim().parse::<f64>().ok())
    };
    wait_for("a failed claim on /metrics", T, || async {
        (failures().await? >= 1.0).then_some(())
    })
    .await;
    let first = std::time::Instant::now();
    wait_for("six failed claims on /metrics", T, || async {
        (failures().await? >= 6.0).then_some(())
    })
    .await;
    // The sixth claim fails at least 0.5 + 1 + 1 + 1 + 1 s (the waits) and five lock time-outs
    // (0.1 s) after the first, 5 s; a flat 500 ms retry makes it 3 s. The bound leaves a second
    // either way for seeing the first failure late on a busy machine. The message is the only
    // one: the sweeper skips a locked row.
    let elapsed = first.elapsed();
    assert!(
        elapsed >= Duration::from_millis(4000),
        "six claims within {elapsed:?} of the first: the waits did not grow"
    );
    let (status, attempt, started): (String, i32, bool) = sqlx::query_as(
        "SELECT status, attempt, started_at IS NOT NULL FROM runs WHERE id = $1::uuid",
    )
    .bind(&id)
    .fetch_one(&env.pool)
    .await
    .unwrap();
    assert_eq!(
        (status.as_str(), attempt, started),
        ("queued", 0, false),
        "nothing of the run is written while its row is locked"
    );
    locker.rollback().await.unwrap();
    let done = app.wait_status(&id, &["completed", "failed"], T).await;
    assert_eq!(done["status"], "completed", "{done}");
}

use super::*;
use crate::store::{runs, tenants};

async fn new_run(pool: &PgPool) -> RunRow {
    let tenant = tenants::create(pool, "t").await.unwrap();
    new_run_of(pool, tenant.tenant_id).await
}

async fn new_run_of(pool: &PgPool, tenant_id: Uuid) -> RunRow {
    let mut tx = pool.begin().await.unwrap();
    let run = create(
        &mut tx,
        NewRun {
            max_iterations: 5,
            ..NewRun::for_test(tenant_id)
        },
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    run
}

const LEASE: Duration = Duration::from_secs(10);

#[sqlx::test(migrations = "../migrations")]
async fn a_queued_run_is_claimed_once(pool: PgPool) {
    let run = new_run(&pool).await;
    let claimed = claim(&pool, run.id, "w1", LEASE)
        .await
        .unwrap()
        .expect("claimed");
    assert_eq!((claimed.run.attempt, claimed.recovered), (1, false));
    assert_eq!(claimed.run.status, RunStatus::Running);
    assert!(
        claim(&pool, run.id, "w2", LEASE).await.unwrap().is_none(),
        "a duplicate message claims nothing"
    );
}

/// A group of claims answers each message on its own: a queued run is taken once (a
/// duplicate in the same group gets nothing), a run another worker holds is left alone.
#[sqlx::test(migrations = "../migrations")]
async fn a_claim_group_answers_each_message(pool: PgPool) {
    let (queued, held) = (new_run(&pool).await, new_run(&pool).await);
    claim(&pool, held.id, "w1", LEASE).await.unwrap().unwrap();
    let ids = [queued.id, held.id, queued.id, Uuid::now_v7()];
    let claims = claim_many(&pool, &ids, "w2", LEASE).await.unwrap();
    let taken: Vec<Option<(Uuid, i32)>> = claims
        .iter()
        .map(|c| c.as_ref().map(|c| (c.run.id, c.run.attempt)))
        .collect();
    assert_eq!(taken, [Some((queued.id, 1)), None, None, None]);
    let held_now = runs::get(&pool, held.id).await.unwrap();
    assert_eq!(
        (held_now.attempt, held_now.lease_owner.as_deref()),
        (1, Some("w1"))
    );
}

#[sqlx::test(migrations = "../migrations")]
async fn a_stale_attempt_is_fenced_out_after_a_take_over(pool: PgPool) {
    let run = new_run(&pool).await;
    let first = claim(&pool, run.id, "w1", LEASE).await.unwrap().unwrap();
    sqlx::query("UPDATE runs SET lease_expires_at = now() - interval '1 second'")
        .execute(&pool)
        .await
        .unwrap();
    let second = claim(&pool, run.id, "w2", LEASE)
        .await
        .unwrap()
        .expect("expired lease is taken over");
    assert_eq!(
        (second.run.attempt, second.recovered, second.run.recoveries),
        (2, true, 1)
    );
    assert!(matches!(
        complete(&pool, first.fence(), 3).await,
        Err(StoreError::LeaseLost { .. })
    ));
    let renewed = renew_leases(&pool, &[first.fence(), second.fence()], LEASE)
        .await
        .unwrap();
    assert!(matches!(renewed[0], Err(StoreError::LeaseLost { .. })));
    assert!(matches!(renewed[1], Ok(Some(Lease::Held))));
    complete(&pool, second.fence(), 3).await.unwrap();
    let done = runs::get(&pool, run.id).await.unwrap();
    assert_eq!(done.status, RunStatus::Completed);
    assert_eq!(done.last_event_id, 3);
    assert!(done.lease_owner.is_none());
}

fn timing(run: &RunRow, iteration: i32) -> IterationTiming {
    let now = chrono::Utc::now();
    IterationTiming {
        run_id: run.id,
        iteration,
        attempt: 1,
        started: now,
        finished: now,
        model_us: 1,
        tools_us: 2,
        total_us: 5,
    }
}

async fn count(pool: &PgPool, sql: &str, run: Uuid) -> i64 {
    let (n,): (i64,) = sqlx::query_as(sqlx::AssertSqlSafe(sql.to_owned()))
        .bind(run)
        .fetch_one(pool)
        .await
        .unwrap();
    n
}

/// Grouped writes (`store::group_commit`): each item is fenced on its own, so a stale holder's
/// item writes nothing while the others in its group commit.
#[sqlx::test(migrations = "../migrations")]
async fn a_group_writes_only_the_items_whose_fence_holds(pool: PgPool) {
    use crate::store::turns::{Committed, Turn, record_many};
    let (a, b) = (new_run(&pool).await, new_run(&pool).await);
    let held_a = claim(&pool, a.id, "w", LEASE).await.unwrap().unwrap().run;
    let held_b = claim(&pool, b.id, "w", LEASE).await.unwrap().unwrap().run;
    let stale_b = Fence {
        run_id: b.id,
        attempt: held_b.attempt + 1,
    };
    // Each turn also carries the final iteration's timing of another run: written with
    // the turn whose fence holds, dropped with the stale one.
    let (c, d) = (new_run(&pool).await, new_run(&pool).await);
    let turn = |run: &RunRow, fence: Fence, carried: &RunRow| Turn {
        fence,
        thread_id: run.thread_id,
        iteration: 1,
        message: serde_json::json!({"role": "assistant", "content": null}),
        tool_calls: vec![serde_json::json!({
                "id": Uuid::now_v7(), "tool_call_id": "call_1", "position": 0, "name": "t",
                "raw_arguments": "{}", "arguments": {}, "risk": "low", "status": "running",
                "dispatch_count": 1})],
        prompt_tokens: 3,
        completion_tokens: 4,
        estimated_tokens: 0,
        last_event_id: 7,
        timing: Some(timing(run, 1)),
        carried: vec![timing(carried, 2)],
        ends: false,
    };
    let fence_a = Fence {
        run_id: a.id,
        attempt: held_a.attempt,
    };
    let turns = vec![turn(&held_a, fence_a, &c), turn(&held_b, stale_b, &d)];
    let held = record_many(&pool, &turns).await.unwrap();
    let usage = Committed {
        run_tokens: 7,
        tenant_tokens_today: 7,
        tenant_tokens_per_day: None,
        promoted: None,
    };
    assert_eq!(held, [Some(usage), None]);
    for (run, expected) in [(a.id, 1), (b.id, 0)] {
        let q = "SELECT count(*) FROM messages WHERE run_id = $1 AND role = 'assistant'";
        assert_eq!(
            count(&pool, q, run).await,
            expected,
            "assistant message of {run}"
        );
        let q = "SELECT count(*) FROM tool_calls WHERE run_id = $1 AND dispatch_count = 1 AND started_at IS NOT NULL";
        assert_eq!(
            count(&pool, q, run).await,
            expected,
            "dispatched call of {run}"
        );
        let q = "SELECT count(*) FROM iterations WHERE run_id = $1";
        assert_eq!(count(&pool, q, run).await, expected, "timing of {run}");
    }
    let q = "SELECT count(*) FROM iterations WHERE run_id = $1 AND iteration = 2";
    assert_eq!(
        count(&pool, q, c.id).await,
        1,
        "carried by the turn that held"
    );
    assert_eq!(count(&pool, q, d.id).await, 0, "not by the stale one");
    let left = [timing(&d, 2), timing(&d, 2)];
    crate::store::turns::record_timings(&pool, &left)
        .await
        .unwrap();
    assert_eq!(count(&pool, q, d.id).await, 1, "left over, written once");
    let a_now = runs::get(&pool, a.id).await.unwrap();
    assert_eq!(
        (a_now.iteration, a_now.prompt_tokens, a_now.last_event_id),
        (1, 3, 7)
    );
    assert_eq!(runs::get(&pool, b.id).await.unwrap().iteration, 0);

    let endings = vec![
        Ending {
            fence: stale_b,
            status: RunStatus::Completed,
            last_event_id: 9,
            timing: None,
        },
        Ending {
            fence: fence_a,
            status: RunStatus::Completed,
            last_event_id: 9,
            timing: Some(timing(&held_a, 2)),
        },
    ];
    let ended = end_many(&pool, &endings).await.unwrap();
    let held: Vec<bool> = ended.iter().map(|e| e.held).collect();
    assert_eq!(held, [false, true]);
    assert_eq!(
        runs::get(&pool, a.id).await.unwrap().status,
        RunStatus::Completed
    );
    assert_eq!(
        runs::get(&pool, b.id).await.unwrap().status,
        RunStatus::Running
    );
    let q = "SELECT count(*) FROM iterations WHERE run_id = $1";
    assert_eq!(
        count(&pool, q, a.id).await,
        2,
        "the ending carried the last timing"
    );
}

#[sqlx::test(migrations = "../migrations")]
async fn release_hands_back_without_counting_a_recovery(pool: PgPool) {
    let run = new_run(&pool).await;
    let first = claim(&pool, run.id, "w1", LEASE).await.unwrap().unwrap();
    release(&pool, first.fence(), true, 4).await.unwrap();
    let again = claim(&pool, run.id, "w2", LEASE).await.unwrap().unwrap();
    assert_eq!(
        (again.run.attempt, again.run.recoveries, again.recovered),
        (2, 0, true)
    );
}

/// Only a take-over of the attempt that held the run alone in quarantine says the run
/// crashed its worker: not a take-over of an ordinary attempt, not a claim after the
/// quarantine attempt handed the run back (a drain), and a stale attempt cannot record a
/// quarantine.
#[sqlx::test(migrations = "../migrations")]
async fn only_a_take_over_of_the_quarantine_attempt_found_a_crash_alone(pool: PgPool) {
    let run = new_run(&pool).await;
    let expire = || async {
        sqlx::query("UPDATE runs SET lease_expires_at = now() - interval '1 second'")
            .execute(&pool)
            .await
            .unwrap();
    };
    let first = claim(&pool, run.id, "w1", LEASE).await.unwrap().unwrap();
    expire().await;
    let second = claim(&pool, run.id, "w2", LEASE).await.unwrap().unwrap();
    assert!(second.took_over && !second.crashed_alone);
    assert!(matches!(
        quarantine(&pool, first.fence()).await,
        Err(StoreError::LeaseLost { .. })
    ));
    quarantine(&pool, second.fence()).await.unwrap();
    let quarantined = runs::get(&pool, run.id).await.unwrap();
    assert_eq!(quarantined.quarantine_attempt, Some(second.run.attempt));
    let since = quarantined.quarantined_at.expect("quarantined");

    // Handed back cleanly: the next claim is not a crash, and the run is still quarantined.
    release(&pool, second.fence(), false, 1).await.unwrap();
    let third = claim(&pool, run.id, "w3", LEASE).await.unwrap().unwrap();
    assert!(!third.took_over && !third.crashed_alone);
    assert_eq!(third.run.recoveries, 1, "a hand-back spends no recovery");
    quarantine(&pool, third.fence()).await.unwrap();
    assert_eq!(
        runs::get(&pool, run.id).await.unwrap().quarantined_at,
        Some(since),
        "the first time is kept"
    );

    // Its worker vanished while it held the run alone.
    expire().await;
    let fourth = claim(&pool, run.id, "w4", LEASE).await.unwrap().unwrap();
    assert!(fourth.took_over && fourth.crashed_alone);
    fail_poisoned(&pool, fourth.fence(), fourth.run.recoveries, 2)
        .await
        .unwrap();
    let failed = runs::get(&pool, run.id).await.unwrap();
    assert_eq!(failed.status, RunStatus::Failed);
    assert_eq!(failed.error.unwrap().0["code"], "poison_run");
}

#[sqlx::test(migrations = "../migrations")]
async fn resume_needs_a_waiting_run_and_cancel_is_idempotent(pool: PgPool) {
    let run = new_run(&pool).await;
    let key: (Uuid,) = sqlx::query_as("SELECT id FROM api_keys")
        .fetch_one(&pool)
        .await
        .unwrap();
    let err = resume(
        &pool,
        run.tenant_id,
        run.id,
        ResumeInput::Answer("x".into()),
        key.0,
    )
    .await;
    assert!(matches!(
        err,
        Err(ResumeError::NotWaiting(RunStatus::Queued))
    ));
    let first = cancel(&pool, run.tenant_id, run.id).await.unwrap();
    assert!(matches!(
        first,
        Cancelled::Now {
            previous: RunStatus::Queued,
            ..
        }
    ));
    assert_eq!(
        cancel(&pool, run.tenant_id, run.id).await.unwrap(),
        Cancelled::Already
    );
    assert!(
        claim(&pool, run.id, "w", LEASE).await.unwrap().is_none(),
        "a cancelled run is never claimed"
    );
    assert!(matches!(
        cancel(&pool, Uuid::new_v4(), run.id).await,
        Err(StoreError::NotFound)
    ));
}

/// A budget pause has no tool call to answer: the resume records the input as a user
/// message only, and queues the run.
#[sqlx::test(migrations = "../migrations")]
async fn a_budget_pause_resumes_with_a_user_message_only(pool: PgPool) {
    let run = new_run(&pool).await;
    let key: (Uuid,) = sqlx::query_as("SELECT id FROM api_keys")
        .fetch_one(&pool)
        .await
        .unwrap();
    let claimed = claim(&pool, run.id, "w", LEASE).await.unwrap().unwrap();
    let pending = serde_json::json!({"kind": "budget", "budget": "tenant", "used": 5,
            "limit": 1, "question": "raise it"});
    let mut tx = pool.begin().await.unwrap();
    wait(
        &mut tx,
        claimed.fence(),
        RunStatus::WaitingForInput,
        &pending,
        3,
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    let resumed = resume(
        &pool,
        run.tenant_id,
        run.id,
        ResumeInput::Answer("go on".into()),
        key.0,
    )
    .await
    .unwrap();
    assert_eq!(resumed.run.status, RunStatus::Queued);
    assert_eq!(resumed.pending, pending);
    let users: Vec<(Value,)> =
        sqlx::query_as("SELECT body FROM messages WHERE run_id = $1 AND role = 'user' ORDER BY id")
            .bind(run.id)
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(users.len(), 2, "the run's input, then the resume's");
    assert!(users[1].0.to_string().contains("go on"), "{:?}", users[1]);
    let (calls,): (i64,) = sqlx::query_as("SELECT count(*) FROM tool_calls WHERE run_id = $1")
        .bind(run.id)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(calls, 0);
}

#[sqlx::test(migrations = "../migrations")]
async fn the_schema_refuses_impossible_states(pool: PgPool) {
    let run = new_run(&pool).await;
    // Running without a lease.
    let bad = sqlx::query("UPDATE runs SET status = 'running' WHERE id = $1")
        .bind(run.id)
        .execute(&pool)
        .await;
    assert!(bad.is_err());
    // Waiting without a pending item.
    let bad = sqlx::query("UPDATE runs SET status = 'waiting_for_input' WHERE id = $1")
        .bind(run.id)
        .execute(&pool)
        .await;
    assert!(bad.is_err());
    // A second active run on the same thread.
    let mut tx = pool.begin().await.unwrap();
    let second = create(
        &mut tx,
        NewRun {
            id: Uuid::now_v7(),
            tenant_id: run.tenant_id,
            thread_id: Some(run.thread_id),
            agent: AgentSpec::clone(&run.agent),
            max_iterations: 5,
            metadata: serde_json::json!({}),
            idempotency_key: None,
            request_hash: None,
            input: "again".into(),
            fair: false,
            share: None,
            traceparent: None,
        },
    )
    .await;
    assert!(matches!(second, Err(StoreError::ThreadBusy { run_id, .. }) if run_id == run.id));
}

/// An iteration-1 turn of `run` with these tokens (prompt, completion, estimated) and
/// `calls` pending tool calls.
fn turn(run: &RunRow, tokens: (i64, i64, i64), calls: usize) -> crate::store::turns::Turn {
    crate::store::turns::Turn {
        fence: Fence {
            run_id: run.id,
            attempt: run.attempt,
        },
        thread_id: run.thread_id,
        iteration: 1,
        message: serde_json::json!({"role": "assistant", "content": "x"}),
        tool_calls: (0..calls)
            .map(|i| {
                serde_json::json!({
                    "id": Uuid::now_v7(), "tool_call_id": format!("call_{i}"), "position": i,
                    "name": "t", "raw_arguments": "{}", "arguments": {}, "risk": "low",
                    "status": "pending", "dispatch_count": 0})
            })
            .collect(),
        prompt_tokens: tokens.0,
        completion_tokens: tokens.1,
        estimated_tokens: tokens.2,
        last_event_id: 1,
        timing: None,
        carried: vec![],
        ends: false,
    }
}

/// Usage rides along with the turn commit: the run's counters, one usage row per
/// tenant and day summed over the group, and in `RETURNING` what the budget check needs.
#[sqlx::test(migrations = "../migrations")]
async fn a_groups_usage_is_summed_per_tenant_and_read_back(pool: PgPool) {
    use crate::store::turns::{Committed, Turn, record_many};
    let t1 = tenants::create(&pool, "t1").await.unwrap().tenant_id;
    let t2 = tenants::create(&pool, "t2").await.unwrap().tenant_id;
    sqlx::query(r#"UPDATE tenants SET limits = '{"tokens_per_day": 99}' WHERE id = $1"#)
        .bind(t2)
        .execute(&pool)
        .await
        .unwrap();
    let mut held = vec![];
    for tenant in [t1, t1, t2] {
        let run = new_run_of(&pool, tenant).await;
        held.push(claim(&pool, run.id, "w", LEASE).await.unwrap().unwrap().run);
    }
    let turns = vec![
        turn(&held[0], (10, 1, 0), 2),
        turn(&held[1], (20, 2, 22), 0),
        turn(&held[2], (31, 2, 0), 1),
    ];
    let answers = record_many(&pool, &turns).await.unwrap();
    let committed = |run, today, own: Option<i64>| {
        Some(Committed {
            run_tokens: run,
            tenant_tokens_today: today,
            tenant_tokens_per_day: own.map(|n| Json(serde_json::json!(n))),
            promoted: None,
        })
    };
    assert_eq!(
        answers,
        [
            committed(11, 33, None),
            committed(22, 33, None),
            committed(33, 33, Some(99))
        ]
    );
    let rows: Vec<(Uuid, i64, i64, i64, i64, i64)> = sqlx::query_as(
        "SELECT tenant_id, prompt_tokens, completion_tokens, estimated_tokens, tool_calls, runs
             FROM usage_days ORDER BY prompt_tokens",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(rows, [(t1, 30, 3, 22, 2, 2), (t2, 31, 2, 0, 1, 1)]);
    let run = runs::get(&pool, held[0].id).await.unwrap();
    assert_eq!(
        (run.prompt_tokens, run.tool_calls, run.estimated_tokens),
        (10, 2, 0)
    );
    // A second turn adds to the same day's row and counts no new run.
    let again = turn(&held[1], (5, 5, 0), 0);
    let again = Turn {
        iteration: 2,
        ..again
    };
    let answers = record_many(&pool, &[again]).await.unwrap();
    assert_eq!(answers, [committed(32, 43, None)]);
    let claimed = {
        let run = new_run_of(&pool, t1).await;
        claim(&pool, run.id, "w", LEASE).await.unwrap().unwrap()
    };
    assert_eq!(
        claimed.tenant_tokens_today, 43,
        "the claim reads the day's figure"
    );
    let (runs,): (i64,) = sqlx::query_as("SELECT runs FROM usage_days WHERE tenant_id = $1")
        .bind(t1)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(runs, 2);
}

/// Two turn groups of one tenant on different connections do not wait for each other:
/// each adds to its own shard of the day (before migration 0017 the second waited for the
/// first's commit on the tenant's one row; `lock_timeout` turns that wait into a failure).
/// The day's figure sums every shard and the rows of `usage_daily`, as the claim, the
/// turn's `RETURNING` and `GET /v1/usage` read it.
#[sqlx::test(migrations = "../migrations")]
async fn turn_groups_on_two_connections_take_different_rows_and_the_day_sums_them(pool: PgPool) {
    use sqlx::Connection;

    use crate::store::turns::record_many;
    use crate::store::usage;
    let tenant = tenants::create(&pool, "t").await.unwrap().tenant_id;
    // What a worker of the previous release wrote today.
    sqlx::query(
        "INSERT INTO usage_daily (tenant_id, day, prompt_tokens, completion_tokens, runs)
             VALUES ($1, (now() AT TIME ZONE 'UTC')::date, 100, 0, 1)",
    )
    .bind(tenant)
    .execute(&pool)
    .await
    .unwrap();
    let mut held = vec![];
    for _ in 0..3 {
        let run = new_run_of(&pool, tenant).await;
        held.push(claim(&pool, run.id, "w", LEASE).await.unwrap().unwrap());
    }
    assert_eq!(
        held[0].tenant_tokens_today, 100,
        "the claim reads usage_daily too"
    );
    let turn = |run: &RunRow, prompt: i64| turn(run, (prompt, 0, 0), 0);
    // Two connections whose backends write different shards.
    async fn shard(conn: &mut sqlx::PgConnection) -> i32 {
        let (pid,): (i32,) = sqlx::query_as("SELECT pg_backend_pid()")
            .fetch_one(conn)
            .await
            .unwrap();
        pid % 32
    }
    let mut a = pool.acquire().await.unwrap().detach();
    let mut b = loop {
        let mut b = pool.acquire().await.unwrap().detach();
        if shard(&mut b).await != shard(&mut a).await {
            break b;
        }
    };
    sqlx::query("SET lock_timeout = '2s'")
        .execute(&mut b)
        .await
        .unwrap();
    let mut first = a.begin().await.unwrap();
    let in_a = record_many(&mut *first, &[turn(&held[0].run, 10)])
        .await
        .unwrap();
    assert_eq!(in_a[0].as_ref().unwrap().tenant_tokens_today, 110);
    // The first group holds its row until it commits; the second does not need it.
    let in_b = record_many(&mut b, &[turn(&held[1].run, 20)])
        .await
        .unwrap();
    assert_eq!(
        in_b[0].as_ref().unwrap().tenant_tokens_today,
        120,
        "the uncommitted group is not counted yet"
    );
    first.commit().await.unwrap();
    let third = record_many(&mut a, &[turn(&held[2].run, 30)])
        .await
        .unwrap();
    assert_eq!(third[0].as_ref().unwrap().tenant_tokens_today, 160);
    let (shards,): (i64,) =
        sqlx::query_as("SELECT count(*) FROM usage_shards WHERE tenant_id = $1")
            .bind(tenant)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(shards, 2, "one row per connection's shard");
    let today = chrono::Utc::now().date_naive();
    let days = usage::daily(&pool, tenant, today, today).await.unwrap();
    assert_eq!(
        days.iter()
            .map(|d| (d.prompt_tokens, d.runs))
            .collect::<Vec<_>>(),
        [(160, 4)],
        "usage_daily's row and both shards"
    );
    let next = new_run_of(&pool, tenant).await;
    let claimed = claim(&pool, next.id, "w", LEASE).await.unwrap().unwrap();
    assert_eq!(claimed.tenant_tokens_today, 160);
}

/// A worker's leases renew in one statement: each held run's lease is extended and a cancel or
/// an interrupt asked for is reported; a row another transaction holds locked is skipped (not
/// waited for) and reported as still held; an ended run's fence is lost.
#[sqlx::test(migrations = "../migrations")]
async fn leases_renew_together_skipping_a_busy_row(pool: PgPool) {
    let tenant = tenants::create(&pool, "t").await.unwrap();
    let mut fences = Vec::new();
    for _ in 0..5 {
        let run = new_run_of(&pool, tenant.tenant_id).await;
        let claimed = claim(&pool, run.id, "w1", LEASE).await.unwrap().unwrap();
        fences.push(claimed.fence());
    }
    let [held, cancelled, interrupted, busy, ended] = fences[..] else {
        unreachable!()
    };
    sqlx::query("UPDATE runs SET lease_expires_at = now() + interval '1 second'")
        .execute(&pool)
        .await
        .unwrap();
    sqlx::query("UPDATE runs SET cancel_requested_at = now() WHERE id = $1")
        .bind(cancelled.run_id)
        .execute(&pool)
        .await
        .unwrap();
    sqlx::query("UPDATE runs SET interrupt_requested_at = now() WHERE id = $1")
        .bind(interrupted.run_id)
        .execute(&pool)
        .await
        .unwrap();
    complete(&pool, ended, 3).await.unwrap();
    let mut locker = pool.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM runs WHERE id = $1 FOR UPDATE")
        .bind(busy.run_id)
        .execute(&mut *locker)
        .await
        .unwrap();

    let renewed = tokio::time::timeout(Duration::from_secs(5), renew_leases(&pool, &fences, LEASE))
        .await
        .expect("a locked row is not waited for")
        .unwrap();
    assert!(matches!(renewed[0], Ok(Some(Lease::Held))));
    assert!(matches!(renewed[1], Ok(Some(Lease::CancelRequested))));
    assert!(matches!(renewed[2], Ok(Some(Lease::InterruptRequested))));
    assert!(matches!(renewed[3], Ok(None)), "skipped, still held");
    assert!(matches!(renewed[4], Err(StoreError::LeaseLost { .. })));
    locker.rollback().await.unwrap();

    let left = |id: Uuid| {
        let pool = pool.clone();
        async move {
            let (secs,): (f64,) = sqlx::query_as(
                "SELECT extract(epoch FROM lease_expires_at - now())::float8 FROM runs WHERE id = $1",
            )
            .bind(id)
            .fetch_one(&pool)
            .await
            .unwrap();
            secs
        }
    };
    assert!(left(held.run_id).await > 5.0, "renewed for the lease");
    assert!(left(busy.run_id).await < 2.0, "the skipped one was not");
    assert!(
        renew_leases(&pool, &[], LEASE).await.unwrap().is_empty(),
        "nothing to renew, no statement"
    );
}

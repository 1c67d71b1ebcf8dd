//! `amqp.url` naming several RabbitMQ nodes.
//!
//! A cluster losing a node under load: the fleet is pointed at the three nodes of
//! `scripts/rabbitmq-cluster`, and the node leading the runs queue is killed while runs are
//! submitted and executed. Killing a node of the shared cluster would break any other test on
//! it, so this is `#[ignore]`d and runs in `scripts/test`'s second phase, which starts the
//! cluster and sets `AGENTFLEET_TEST_AMQP_CLUSTER_URLS`; run by hand without it, it fails
//! saying how to start the cluster. It needs root, as CI has.
//!
//! A dead address listed before the shared broker needs no cluster and runs in parallel.

use std::time::Instant;

use serde_json::json;

use agentfleet_tests::harness::servers::rabbitmq_cluster as cluster;
use agentfleet_tests::harness::*;

use crate::outages::{Load, SLOTS, T, all_complete, assert_full_capacity, run_body};

/// Runs submitted in all, and how many of them before the kill. The load submits one every
/// 20 ms or so: the runs after the kill must outlast it (finding and killing the node takes up
/// to a second), or on a quiet machine every run was in before the node died.
const RUNS: usize = 160;
const BEFORE_KILL: usize = 20;

/// Starts a killed node again when the test ends, passed or failed, so that the cluster is
/// whole for the next run.
struct Revive(u8);

impl Drop for Revive {
    fn drop(&mut self) {
        // Blocking in a drop: the test is over by then.
        if !cluster::start_blocking(self.0) {
            eprintln!(
                "node {} did not start again: scripts/rabbitmq-cluster start",
                self.0
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "kills a node of the shared RabbitMQ cluster: scripts/test runs it alone, after the parallel phase"]
async fn losing_the_queue_leader_node_loses_no_run_and_runs_none_twice() {
    let urls = amqp_cluster_urls();
    let env = TestEnv::with(&[("amqp.url", &urls)]).await;
    let queue = format!("{}.runs", env.prefix);
    let (_api, base) = env.spawn_api_process(&[]).await;
    let app = env.spawn_api().await;
    let w1 = env.spawn_worker_process(&[]);
    let w2 = env.spawn_worker_process(&[]);
    // Asked before the load: each `rabbitmqctl` takes about a second.
    let leader = wait_for("the runs queue's leader", T, || {
        let queue = queue.clone();
        async move {
            for ask in 1..=3 {
                if let Some(n) = cluster::leader(ask, &queue).await {
                    return Some(n);
                }
            }
            None
        }
    })
    .await;
    let load = Load::start(base.clone(), app.api_key.clone(), run_body(&env), RUNS);
    wait_for("load to start", T, || async {
        (load.count() >= BEFORE_KILL).then_some(())
    })
    .await;

    let others: Vec<u8> = (1..=3).filter(|&n| n != leader).collect();
    cluster::kill(leader).await;
    let _revive = Revive(leader);
    let killed = Instant::now();
    // Counted once the node is dead: what comes after was submitted without it.
    let accepted_at_kill = load.count();

    // The queue's leadership moves to a survivor: Raft elects one of the two followers.
    let new_leader = wait_for("a new leader of the runs queue", T, || {
        let queue = queue.clone();
        let others = others.clone();
        async move {
            for ask in others {
                if let Some(n) = cluster::leader(ask, &queue).await {
                    return (n != leader).then_some(n);
                }
            }
            None
        }
    })
    .await;
    let elected_ms = killed.elapsed().as_millis();
    let http = reqwest::Client::new();
    wait_for(
        "the API process to be ready through another node",
        T,
        || {
            let req = http.get(format!("{base}/readyz")).send();
            async move { req.await.ok().filter(|r| r.status() == 200) }
        },
    )
    .await;
    let ready_ms = killed.elapsed().as_millis();

    let ids = load.finish().await;
    assert_eq!(ids.len(), RUNS);
    assert!(
        accepted_at_kill < RUNS,
        "runs were submitted after the kill ({accepted_at_kill} before it)"
    );
    // 0 lost: every accepted run completed, with one `run_completed` and increasing ids.
    all_complete(&app, &ids).await;
    let done_ms = killed.elapsed().as_millis();
    // 0 run twice: each run's side effect was asked for once (one key per run, each seen once),
    // applied once, and the scripted model saw each run's two calls once.
    let per_key = env.tools.calls_per_key("/side-effect");
    assert_eq!(per_key.len(), RUNS, "one side-effect call per run");
    let repeated: Vec<_> = per_key.iter().filter(|(_, n)| **n != 1).collect();
    assert!(
        repeated.is_empty(),
        "side effects asked twice: {repeated:?}"
    );
    assert_eq!(env.tools.state().side_effect_count(), RUNS);
    assert_eq!(env.llm.request_count(), 2 * RUNS, "two model calls per run");
    // A message whose confirm the lost node never sent may have been published again: it is
    // a duplicate that a claim acknowledges, so the queue empties. (The consumers of the lost
    // node may still be counted until it is back: `assert_full_capacity` below checks that
    // both workers consume again.)
    wait_for("the queue to empty", T, || async {
        (env.queue_depth(&queue).await == 0).then_some(())
    })
    .await;

    // The API and both workers went on through the surviving nodes.
    let connections = cluster::connections(others[0]).await;
    let dead_port = cluster::amqp_port(leader);
    assert!(
        connections.iter().all(|(port, _)| *port != dead_port),
        "{connections:?}"
    );
    let on_survivors = |needle: &str| {
        connections
            .iter()
            .filter(|(_, props)| props.contains(needle))
            .count()
    };
    // A publisher reconnects at its next publish: the API process's has published since.
    assert!(
        on_survivors("\"agentfleet-api\"") >= 1,
        "the API process's publisher is connected: {connections:?}"
    );
    for w in [&w1, &w2] {
        // The worker's intake (its publisher, too, if it has published since).
        let id = format!("-{}-", w.pid());
        assert!(
            on_survivors(&id) >= 1,
            "worker {id} consumes through a survivor: {connections:?}"
        );
    }
    assert_full_capacity(&env, &app, SLOTS).await;
    eprintln!(
        "node {leader} killed: leader {new_leader} elected within {elected_ms} ms, API ready \
         within {ready_ms} ms, all {RUNS} runs completed within {done_ms} ms"
    );
}

/// A node that refuses connections, listed first, is passed over at start-up and at every
/// reconnection: the API and a worker run on the next address (the shared broker).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_node_listed_first_is_passed_over() {
    let dead = free_address();
    let urls = format!("amqp://guest:guest@{dead}/%2f,{}", amqp_url());
    let env = TestEnv::with(&[("amqp.url", &urls)]).await;
    let app = env.spawn_api().await;
    let _worker = env.spawn_worker_process(&[]);
    let body = scripted_run(json!([{"content": "through the second node"}]), json!([]));
    let mut ids = Vec::new();
    for _ in 0..3 {
        ids.push(
            app.start_run(&body).await["id"]
                .as_str()
                .unwrap()
                .to_string(),
        );
    }
    for id in &ids {
        let run = app.wait_status(id, &["completed", "failed"], T).await;
        assert_eq!(run["status"], "completed", "{run}");
    }
}

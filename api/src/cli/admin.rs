//! `agentfleet-api admin dead-letters list|replay|purge`, `agentfleet-api admin quarantine` and
//! `agentfleet-api admin stuck`: what an operator does about work that stopped moving
//! (docs/operations.md, "Dead letters").
//!
//! A dead letter is a run failed as `poison_run` (Postgres is the truth,
//! `store::dead_letters`); its message in `{prefix}.runs.dead` only names the run. `replay`
//! puts such runs back to `queued`, publishes them and takes their messages out of the
//! dead-letter queue; `purge` empties that queue and leaves the runs failed, as history.

use std::collections::HashSet;

use anyhow::Context;
use clap::Subcommand;
use futures_util::future::join_all;
use lapin::options::{BasicAckOptions, BasicGetOptions, BasicNackOptions, QueuePurgeOptions};
use sqlx::PgPool;
use uuid::Uuid;

use agentfleet_shared::config::Settings;
use agentfleet_shared::queue::{self, Publisher, RunMessage, Topology};
use agentfleet_shared::store::dead_letters::{self, DeadLetter, Quarantined, ReplayError, Stuck};
use agentfleet_shared::store::fair_dispatch;

use super::{parse_duration, print, when};

/// Most dead-lettered messages looked at by one `replay` to take out the replayed runs' own.
const MAX_DEAD_SCAN: u32 = 100_000;

#[derive(Subcommand)]
pub enum AdminCommand {
    /// Runs failed as poison (they crashed their workers too often, the last time one that ran
    /// nothing else), and their messages in the dead-letter queue.
    #[command(subcommand)]
    DeadLetters(DeadLettersCommand),
    /// Runs in quarantine, newest first: taken over more than `worker.max_recoveries` times,
    /// so each of their attempts runs alone in a worker (failed as poison if that worker dies).
    Quarantine {
        /// Also those finished since (completed, failed, cancelled).
        #[arg(long)]
        all: bool,
        #[arg(long, default_value_t = 100)]
        limit: u32,
    },
    /// Runs queued or waiting (for input, a confirmation or their thread) with no change for
    /// longer than `--older-than`, oldest first.
    Stuck {
        /// `90s`, `15m`, `6h`, `2d`, `1w`.
        #[arg(long)]
        older_than: String,
        #[arg(long, default_value_t = 100)]
        limit: u32,
    },
}

#[derive(Subcommand)]
pub enum DeadLettersCommand {
    /// List dead-lettered runs, newest first, with why each was failed.
    List {
        #[arg(long)]
        tenant: Option<Uuid>,
        #[arg(long, default_value_t = 100)]
        limit: u32,
    },
    /// Put dead-lettered runs back to `queued` for a new, counted attempt, and publish them.
    Replay {
        /// The runs to replay.
        #[arg(required_unless_present = "all", conflicts_with = "all")]
        run_ids: Vec<Uuid>,
        /// Every dead-lettered run (of `--tenant` if given).
        #[arg(long)]
        all: bool,
        #[arg(long, requires = "all")]
        tenant: Option<Uuid>,
    },
    /// Empty the dead-letter queue. The runs stay failed in Postgres (listed here until
    /// replayed); only their messages go.
    Purge {
        /// Required: purging drops every message of the queue.
        #[arg(long, required = true)]
        all: bool,
    },
}

pub async fn run(
    pool: &PgPool,
    settings: &Settings,
    command: AdminCommand,
    json: bool,
) -> anyhow::Result<()> {
    match command {
        AdminCommand::Stuck { older_than, limit } => {
            let older = parse_duration(&older_than).context("--older-than")?;
            let runs = dead_letters::stuck(pool, older, limit.into()).await?;
            print_stuck(json, &runs);
        }
        AdminCommand::Quarantine { all, limit } => {
            let runs = dead_letters::quarantined(pool, !all, limit.into()).await?;
            print_quarantined(json, &runs);
        }
        AdminCommand::DeadLetters(DeadLettersCommand::List { tenant, limit }) => {
            let runs = dead_letters::list(pool, tenant, limit.into()).await?;
            print_dead(json, &runs);
        }
        AdminCommand::DeadLetters(DeadLettersCommand::Replay {
            run_ids,
            all,
            tenant,
        }) => {
            let ids = if all {
                dead_letters::list(pool, tenant, i64::MAX)
                    .await?
                    .into_iter()
                    .map(|d| d.run_id)
                    .collect()
            } else {
                run_ids
            };
            replay(pool, settings, &ids, json).await?;
        }
        AdminCommand::DeadLetters(DeadLettersCommand::Purge { all: _ }) => {
            let topology = Topology::new(&settings.amqp.prefix);
            let conn = queue::connect(&settings.amqp.url, "agentfleet-admin")
                .await
                .context("amqp.url")?;
            let channel = conn.create_channel().await?;
            let purged = channel
                .queue_purge(
                    topology.dead_queue.as_str().into(),
                    QueuePurgeOptions::default(),
                )
                .await
                .context("purging the dead-letter queue")?;
            let _ = conn.close(200, "done".into()).await;
            if json {
                println!("{}", serde_json::json!({ "purged": purged }));
            } else {
                println!("purged {purged} messages from {}", topology.dead_queue);
            }
        }
    }
    Ok(())
}

/// Replays each run (each on its own: one that cannot be replayed is reported and the others
/// go on), publishes the replayed ones, then takes their messages out of the dead-letter queue.
async fn replay(
    pool: &PgPool,
    settings: &Settings,
    ids: &[Uuid],
    json: bool,
) -> anyhow::Result<()> {
    let mut back = Vec::new();
    let mut refused = Vec::new();
    for &id in ids {
        match dead_letters::replay(pool, id, settings.fair_share.share().is_some()).await {
            Ok(run) => back.push(run),
            Err(
                e @ (ReplayError::NotFound(_)
                | ReplayError::NotDeadLettered { .. }
                | ReplayError::ThreadBusy { .. }
                | ReplayError::BatchCancelled { .. }),
            ) => refused.push((id, e.to_string())),
            Err(ReplayError::Store(e)) => return Err(e.into()),
        }
    }
    let replayed: Vec<Uuid> = back.iter().map(|r| r.run_id).collect();
    // Replayed but waiting for a free slot of their tenant's running limit.
    let mut held: Vec<Uuid> = Vec::new();
    if !replayed.is_empty() {
        // A run counted against its tenant's running limit went back held: its tenant is
        // dispatched (that run, or older held ones, as the limit allows), the rest published.
        let mut publish: Vec<Uuid> = back.iter().filter(|r| !r.fair).map(|r| r.run_id).collect();
        let fair: Vec<Uuid> = back
            .iter()
            .filter(|r| r.fair)
            .map(|r| r.tenant_id)
            .collect();
        let dispatched = fair_dispatch::next(
            pool,
            &fair,
            settings.limits.max_running_runs,
            settings.fair_share.share(),
            fair_dispatch::MAX_PER_TENANT,
        )
        .await?;
        publish.extend(dispatched.ids());
        held = back
            .iter()
            .filter(|r| r.fair && !dispatched.runs.iter().any(|(_, id)| *id == r.run_id))
            .map(|r| r.run_id)
            .collect();
        let topology = Topology::new(&settings.amqp.prefix);
        let publisher = Publisher::new(&settings.amqp.url, "agentfleet-admin", topology.clone())
            .await
            .context("amqp.url")?
            .with_timeout(settings.amqp.timeout());
        // Committed already: a publish that fails is made good by the sweeper
        // (`worker.requeue_after_ms`), so it is reported, not fatal.
        if let Err(e) = publisher.publish_runs(&publish).await {
            eprintln!("note: {e}; the sweeper publishes them within worker.requeue_after_ms");
        }
        publisher.close().await;
        let removed = remove_dead_messages(settings, &topology, &replayed).await?;
        if !json {
            println!(
                "replayed {} runs; {removed} of their dead-lettered messages removed",
                replayed.len()
            );
            if !held.is_empty() {
                println!(
                    "{} of them wait for a free slot of their tenant's running limit",
                    held.len()
                );
            }
        }
    }
    if json {
        let refused: Vec<_> = refused
            .iter()
            .map(|(id, why)| serde_json::json!({"run_id": id, "error": why}))
            .collect();
        println!(
            "{}",
            serde_json::to_string_pretty(
                &serde_json::json!({"replayed": replayed, "held": held, "refused": refused})
            )?
        );
    } else {
        for (_, why) in &refused {
            eprintln!("not replayed: {why}");
        }
    }
    if !refused.is_empty() {
        anyhow::bail!("{} of {} runs were not replayed", refused.len(), ids.len());
    }
    Ok(())
}

/// Takes the messages of `runs` out of the dead-letter queue: every message is fetched and
/// held, those of `runs` acked, the others returned together at the end (returning each at
/// once would fetch it again). Bounded by the queue's depth and [`MAX_DEAD_SCAN`].
async fn remove_dead_messages(
    settings: &Settings,
    topology: &Topology,
    runs: &[Uuid],
) -> anyhow::Result<usize> {
    let wanted: HashSet<Uuid> = runs.iter().copied().collect();
    let conn = queue::connect(&settings.amqp.url, "agentfleet-admin")
        .await
        .context("amqp.url")?;
    let channel = conn.create_channel().await?;
    let mut kept = Vec::new();
    let mut removed = 0;
    for _ in 0..MAX_DEAD_SCAN {
        let Some(message) = channel
            .basic_get(
                topology.dead_queue.as_str().into(),
                BasicGetOptions::default(),
            )
            .await?
        else {
            break;
        };
        let delivery = message.delivery;
        let ours = serde_json::from_slice::<RunMessage>(&delivery.data)
            .is_ok_and(|m| wanted.contains(&m.run_id));
        if ours {
            delivery.acker.ack(BasicAckOptions::default()).await?;
            removed += 1;
        } else {
            kept.push(delivery.acker);
        }
    }
    let requeue = BasicNackOptions {
        requeue: true,
        ..Default::default()
    };
    for result in join_all(kept.iter().map(|acker| acker.nack(requeue))).await {
        result?;
    }
    let _ = conn.close(200, "done".into()).await;
    Ok(removed)
}

fn print_dead(json: bool, runs: &[DeadLetter]) {
    let rows = runs
        .iter()
        .map(|d| {
            vec![
                d.run_id.to_string(),
                d.tenant_id.to_string(),
                when(d.failed_at),
                d.attempt.to_string(),
                d.replays.to_string(),
                d.reason.clone(),
            ]
        })
        .collect();
    print(
        json,
        &runs,
        &["RUN", "TENANT", "FAILED", "ATTEMPTS", "REPLAYS", "REASON"],
        rows,
    );
}

fn print_quarantined(json: bool, runs: &[Quarantined]) {
    let rows = runs
        .iter()
        .map(|q| {
            let status = match (&q.error_code, q.running_alone) {
                (Some(code), _) => format!("{} ({code})", q.status),
                (None, true) => format!("{} (alone)", q.status),
                (None, false) => q.status.clone(),
            };
            vec![
                q.run_id.to_string(),
                q.tenant_id.to_string(),
                status,
                when(Some(q.quarantined_at)),
                q.attempt.to_string(),
                q.recoveries.to_string(),
            ]
        })
        .collect();
    print(
        json,
        &runs,
        &[
            "RUN",
            "TENANT",
            "STATUS",
            "QUARANTINED",
            "ATTEMPTS",
            "TAKE-OVERS",
        ],
        rows,
    );
}

fn print_stuck(json: bool, runs: &[Stuck]) {
    let rows = runs
        .iter()
        .map(|s| {
            vec![
                s.run_id.to_string(),
                s.tenant_id.to_string(),
                s.status.clone(),
                when(Some(s.since)),
            ]
        })
        .collect();
    print(json, &runs, &["RUN", "TENANT", "STATUS", "SINCE"], rows);
}

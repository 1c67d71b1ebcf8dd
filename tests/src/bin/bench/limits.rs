//! The `limits` section (`--only limits`): the machine's own limits, measured in the same run,
//! that other sections' figures are compared with.

use std::collections::HashMap;
use std::time::Instant;

use agentfleet_tests::harness::{amqp_url, redis_url};

use crate::Report;
use crate::common::Ctx;

/// Postgres single-row commits/s, RabbitMQ confirmed publishes/s, Redis RPUSH/s.
pub async fn machine_limits(
    ctx: &Ctx,
    report: &mut Report,
) -> anyhow::Result<HashMap<&'static str, f64>> {
    let n = if ctx.args.smoke { 300 } else { 5000 };
    let mut out = HashMap::new();
    // Postgres: one connection, autocommit single-row inserts.
    {
        use sqlx::Connection;
        let mut conn = sqlx::PgConnection::connect(&ctx.env.database_url).await?;
        sqlx::query("CREATE TABLE IF NOT EXISTS bench_scratch (id bigserial PRIMARY KEY, v text)")
            .execute(&mut conn)
            .await?;
        let t = Instant::now();
        for i in 0..n {
            sqlx::query("INSERT INTO bench_scratch (v) VALUES ($1)")
                .bind(i.to_string())
                .execute(&mut conn)
                .await?;
        }
        let rate = n as f64 / t.elapsed().as_secs_f64();
        report.add(
            "limits",
            "postgres single-row commits/s (1 conn)",
            rate,
            "/s",
            None,
        );
        out.insert("pg", rate);
    }
    // RabbitMQ: persistent publishes with confirms, pipelined 64 at a time.
    {
        use lapin::options::{
            BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions, QueueDeleteOptions,
        };
        let conn = agentfleet_shared::queue::connect(&amqp_url(), "bench-limits").await?;
        let ch = conn.create_channel().await?;
        ch.confirm_select(ConfirmSelectOptions::default()).await?;
        let q = format!("{}.scratch", ctx.env.prefix);
        let mut args = lapin::types::FieldTable::default();
        args.insert(
            "x-queue-type".into(),
            lapin::types::AMQPValue::LongString("quorum".into()),
        );
        ch.queue_declare(
            q.as_str().into(),
            QueueDeclareOptions {
                durable: true,
                ..Default::default()
            },
            args,
        )
        .await?;
        let t = Instant::now();
        let props = lapin::BasicProperties::default().with_delivery_mode(2);
        let mut pending = Vec::new();
        for _ in 0..n {
            let confirm = ch
                .basic_publish(
                    "".into(),
                    q.as_str().into(),
                    BasicPublishOptions::default(),
                    b"{}",
                    props.clone(),
                )
                .await?;
            pending.push(confirm);
            if pending.len() >= 64 {
                for c in pending.drain(..) {
                    c.await?;
                }
            }
        }
        for c in pending {
            c.await?;
        }
        let rate = n as f64 / t.elapsed().as_secs_f64();
        report.add(
            "limits",
            "rabbitmq confirmed publishes/s (64 in flight)",
            rate,
            "/s",
            None,
        );
        out.insert("amqp", rate);
        ch.queue_delete(q.as_str().into(), QueueDeleteOptions::default())
            .await?;
        let _ = conn.close(200, "done".into()).await;
    }
    // Redis: RPUSH from 16 concurrent connections (round trip each).
    {
        let client = redis::Client::open(redis_url())?;
        let key = format!("{}:scratch", ctx.env.prefix);
        let t = Instant::now();
        let per = n / 16;
        let mut tasks = Vec::new();
        for _ in 0..16 {
            let mut conn = client.get_multiplexed_async_connection().await?;
            let key = key.clone();
            tasks.push(tokio::spawn(async move {
                for _ in 0..per {
                    let _: i64 = redis::cmd("RPUSH")
                        .arg(&key)
                        .arg("x")
                        .query_async(&mut conn)
                        .await
                        .unwrap();
                }
            }));
        }
        for t in tasks {
            t.await?;
        }
        let rate = (per * 16) as f64 / t.elapsed().as_secs_f64();
        report.add(
            "limits",
            "redis RPUSH/s (16 conns, 1 round trip each)",
            rate,
            "/s",
            None,
        );
        out.insert("redis", rate);
        let mut conn = client.get_multiplexed_async_connection().await?;
        let _: i64 = redis::cmd("DEL").arg(&key).query_async(&mut conn).await?;
    }
    Ok(out)
}

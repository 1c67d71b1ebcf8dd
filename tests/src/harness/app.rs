//! `TestApp`: a running API with a tenant, and the HTTP calls the tests make to it (runs,
//! threads, and reading a run's event stream to its end).

use std::time::Duration;

use anyhow::Context;
use eventsource_stream::Eventsource;
use futures_util::StreamExt;
use serde_json::Value;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::wait::wait_for;
use super::watch::Watcher;

/// A running API with a tenant and its key.
pub struct TestApp {
    pub address: String,
    pub api_key: String,
    pub tenant_id: Uuid,
    pub http: reqwest::Client,
    pub(super) stop: CancellationToken,
}

impl Drop for TestApp {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl TestApp {
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.address)
    }

    pub async fn post(&self, path: &str, body: &Value) -> reqwest::Response {
        self.http
            .post(self.url(path))
            .bearer_auth(&self.api_key)
            .json(body)
            .send()
            .await
            .expect("request")
    }

    pub async fn get(&self, path: &str) -> reqwest::Response {
        self.get_as(path, &self.api_key).await
    }

    pub async fn get_as(&self, path: &str, key: &str) -> reqwest::Response {
        self.http
            .get(self.url(path))
            .bearer_auth(key)
            .send()
            .await
            .expect("request")
    }

    /// Starts a run; panics unless 202.
    pub async fn start_run(&self, body: &Value) -> Value {
        let resp = self.post("/v1/runs", body).await;
        let status = resp.status();
        let json: Value = resp.json().await.expect("json");
        assert_eq!(status, 202, "start run: {json}");
        json
    }

    pub async fn run(&self, id: &str) -> Value {
        self.get(&format!("/v1/runs/{id}"))
            .await
            .json()
            .await
            .expect("json")
    }

    /// Polls until the run's status is one of `statuses`.
    pub async fn wait_status(&self, id: &str, statuses: &[&str], timeout: Duration) -> Value {
        wait_for(
            &format!("run {id} to reach {statuses:?}"),
            timeout,
            || async {
                let run = self.run(id).await;
                statuses
                    .contains(&run["status"].as_str().unwrap_or_default())
                    .then_some(run)
            },
        )
        .await
    }

    pub async fn messages(&self, thread: &str) -> Vec<Value> {
        let v: Value = self
            .get(&format!("/v1/threads/{thread}/messages?limit=500"))
            .await
            .json()
            .await
            .expect("json");
        v["data"].as_array().cloned().unwrap_or_default()
    }

    /// Reads the SSE stream from `after` until the server ends it; returns the envelopes.
    pub async fn events(&self, run_id: &str, after: u64, timeout: Duration) -> Vec<Value> {
        self.events_as(run_id, after, timeout, &self.api_key)
            .await
            .expect("event stream")
    }

    pub async fn events_as(
        &self,
        run_id: &str,
        after: u64,
        timeout: Duration,
        key: &str,
    ) -> anyhow::Result<Vec<Value>> {
        let resp = self
            .http
            .get(self.url(&format!("/v1/runs/{run_id}/events")))
            .bearer_auth(key)
            .header("Last-Event-ID", after.to_string())
            .send()
            .await?;
        anyhow::ensure!(resp.status() == 200, "status {}", resp.status());
        let mut stream = resp.bytes_stream().eventsource();
        let mut out = Vec::new();
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let next = tokio::time::timeout_at(deadline, stream.next())
                .await
                .context("stream did not end in time")?;
            match next {
                None => break,
                Some(Err(e)) => anyhow::bail!("sse error: {e}"),
                Some(Ok(ev)) => {
                    if ev.data.is_empty() {
                        continue;
                    }
                    let v: Value = serde_json::from_str(&ev.data)?;
                    anyhow::ensure!(
                        v["id"].as_u64().map(|i| i.to_string()).as_deref() == Some(ev.id.as_str()),
                        "SSE id {} differs from envelope id {}",
                        ev.id,
                        v["id"]
                    );
                    anyhow::ensure!(
                        ev.event == v["type"].as_str().unwrap_or_default(),
                        "SSE event name differs"
                    );
                    out.push(v);
                }
            }
        }
        Ok(out)
    }

    /// Watches a run's events live, reconnecting with Last-Event-ID whenever the stream ends
    /// (e.g. at a pause), until the watcher is dropped.
    pub fn watch(&self, run_id: &str) -> Watcher {
        Watcher::start(self, run_id)
    }
}

//! `Watcher`: follows a run's SSE stream in the background, reconnecting with Last-Event-ID.

use std::time::Duration;

use eventsource_stream::Eventsource;
use futures_util::StreamExt;
use serde_json::Value;

use super::app::TestApp;
use super::wait::wait_for;

/// Follows a run's stream in the background, so a test can act when an event shows up.
pub struct Watcher {
    events: std::sync::Arc<std::sync::Mutex<Vec<Value>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Watcher {
    /// Starts following `run_id` on `app` (see `TestApp::watch`).
    pub(super) fn start(app: &TestApp, run_id: &str) -> Watcher {
        let events = std::sync::Arc::new(std::sync::Mutex::new(Vec::<Value>::new()));
        let sink = events.clone();
        let http = app.http.clone();
        let url = app.url(&format!("/v1/runs/{run_id}/events"));
        let key = app.api_key.clone();
        let task = tokio::spawn(async move {
            loop {
                let last = sink
                    .lock()
                    .expect("watcher lock")
                    .last()
                    .and_then(|e| e["id"].as_u64())
                    .unwrap_or(0);
                let Ok(resp) = http
                    .get(&url)
                    .bearer_auth(&key)
                    .header("Last-Event-ID", last.to_string())
                    .send()
                    .await
                else {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                };
                let mut stream = resp.bytes_stream().eventsource();
                while let Some(Ok(ev)) = stream.next().await {
                    if let Ok(v) = serde_json::from_str::<Value>(&ev.data) {
                        sink.lock().expect("watcher lock").push(v);
                    }
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        });
        Watcher { events, task }
    }

    pub fn snapshot(&self) -> Vec<Value> {
        self.events.lock().expect("watcher lock").clone()
    }

    /// Waits for the first event of type `kind`.
    pub async fn wait_type(&self, kind: &str, timeout: Duration) -> Value {
        wait_for(&format!("event {kind}"), timeout, || {
            let found = self.snapshot().into_iter().find(|e| e["type"] == kind);
            async move { found }
        })
        .await
    }
}

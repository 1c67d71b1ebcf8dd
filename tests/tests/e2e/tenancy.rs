//! Every resource belongs to the key's tenant; another tenant's resources answer 404.

use std::time::Duration;

use serde_json::json;

use agentfleet_tests::harness::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_tenants_key_gets_404_for_run_messages_and_events() {
    let env = TestEnv::new().await;
    let app = env.spawn_api().await;
    let _worker = env.spawn_worker().await;
    let run = app
        .start_run(&scripted_run(json!([{"content": "hi"}]), json!([])))
        .await;
    let run_id = run["id"].as_str().unwrap();
    let thread_id = run["thread_id"].as_str().unwrap();
    app.wait_status(run_id, &["completed"], Duration::from_secs(30))
        .await;

    let other = env.new_tenant_key().await;
    for path in [
        format!("/v1/runs/{run_id}"),
        format!("/v1/threads/{thread_id}/messages"),
        format!("/v1/runs/{run_id}/events"),
    ] {
        let resp = app.get_as(&path, &other).await;
        assert_eq!(resp.status(), 404, "{path}");
        let body: serde_json::Value = resp.json().await.unwrap();
        assert_eq!(body["error"]["code"], "not_found");
        // The owner still sees it.
        assert_eq!(app.get(&path).await.status(), 200, "{path}");
    }
    let cancel = app
        .http
        .post(app.url(&format!("/v1/runs/{run_id}/cancel")))
        .bearer_auth(&other)
        .send()
        .await
        .unwrap();
    assert_eq!(cancel.status(), 404);
    // Continuing another tenant's thread is refused as not found, and writes nothing.
    let resp = app
        .http
        .post(app.url("/v1/runs"))
        .bearer_auth(&other)
        .json(&json!({"input": "hijack", "thread_id": thread_id, "agent": {"model": "mock"}}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 404);
    let listed: serde_json::Value = app.get_as("/v1/runs", &other).await.json().await.unwrap();
    assert_eq!(listed["data"].as_array().unwrap().len(), 0);
}

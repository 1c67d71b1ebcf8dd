//! Running the API and workers for a test: in this process (`TestApp`, `InProcessWorker`) or
//! as separate OS processes (`ChildProcess`) from the workspace's built binaries.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use agentfleet_shared::store::tenants;

use super::app::TestApp;
use super::env::TestEnv;
use super::wait::wait_for;

// TestEnv's spawning methods live here, beside the worker and process handles they return.
impl TestEnv {
    pub async fn spawn_api(&self) -> TestApp {
        self.spawn_api_with(&[]).await
    }

    pub async fn spawn_api_with(&self, extra: &[(&str, &str)]) -> TestApp {
        let app = agentfleet_api::Application::build(self.settings_with(extra))
            .await
            .expect("api builds");
        let port = app.port();
        let stop = CancellationToken::new();
        let s = stop.clone();
        tokio::spawn(async move {
            app.run_until_stopped(async move { s.cancelled().await })
                .await
        });
        let tenant = tenants::create(&self.pool, "test tenant")
            .await
            .expect("tenant");
        TestApp {
            address: format!("http://127.0.0.1:{port}"),
            api_key: tenant.api_key,
            tenant_id: tenant.tenant_id,
            http: reqwest::Client::new(),
            stop,
        }
    }

    /// A worker inside this test process.
    pub async fn spawn_worker(&self) -> InProcessWorker {
        self.spawn_worker_with(&[]).await
    }

    pub async fn spawn_worker_with(&self, extra: &[(&str, &str)]) -> InProcessWorker {
        let worker = agentfleet_worker::Worker::build(self.settings_with(extra))
            .await
            .expect("worker builds");
        let id = worker.id().to_string();
        let stop = CancellationToken::new();
        let s = stop.clone();
        let handle = tokio::spawn(async move {
            worker
                .run_until_stopped(async move { s.cancelled().await })
                .await
        });
        InProcessWorker {
            id,
            stop,
            handle: Some(handle),
        }
    }

    /// A worker as a separate OS process (for kill -9 and multi-process tests).
    pub fn spawn_worker_process(&self, extra: &[(&str, &str)]) -> ChildProcess {
        self.spawn_worker_process_env(extra, &[])
    }

    /// [`TestEnv::spawn_worker_process`] with extra environment variables (`OTEL_BSP_*`, …).
    pub fn spawn_worker_process_env(
        &self,
        extra: &[(&str, &str)],
        extra_env: &[(&str, &str)],
    ) -> ChildProcess {
        let bin = binary("agentfleet-worker");
        let mut cmd = Command::new(&bin);
        cmd.envs(self.env_vars(extra))
            .envs(extra_env.iter().copied())
            .env(
                "RUST_LOG",
                std::env::var("AGENTFLEET_TEST_CHILD_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdin(Stdio::null());
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("spawning {}: {e}", bin.display()));
        ChildProcess { child: Some(child) }
    }

    /// The API as a separate OS process; returns it and its base URL.
    pub async fn spawn_api_process(&self, extra_env: &[(&str, &str)]) -> (ChildProcess, String) {
        let listen = free_address();
        let bin = binary("agentfleet-api");
        let child = Command::new(&bin)
            .arg("serve")
            .envs(self.env_vars(&[("api.listen", &listen)]))
            .envs(
                extra_env
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string())),
            )
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .spawn()
            .expect("spawn api");
        let base = format!("http://{listen}");
        let http = reqwest::Client::new();
        wait_for("api process ready", Duration::from_secs(30), || {
            let req = http.get(format!("{base}/readyz")).send();
            async move { req.await.ok().filter(|r| r.status().is_success()) }
        })
        .await;
        (ChildProcess { child: Some(child) }, base)
    }

    /// A `TestApp` for an API running elsewhere (a process from [`TestEnv::spawn_api_process`]),
    /// with a tenant of its own; `http` may carry default headers.
    pub async fn app_at(&self, base: &str, http: reqwest::Client) -> TestApp {
        let tenant = tenants::create(&self.pool, "test tenant")
            .await
            .expect("tenant");
        TestApp {
            address: base.to_owned(),
            api_key: tenant.api_key,
            tenant_id: tenant.tenant_id,
            http,
            stop: CancellationToken::new(),
        }
    }

    /// Spawns a worker process with failpoints enabled.
    pub fn spawn_worker_process_with_failpoints(
        &self,
        extra: &[(&str, &str)],
        failpoints: &str,
    ) -> ChildProcess {
        let bin = binary("agentfleet-worker");
        let child = Command::new(&bin)
            .envs(self.env_vars(extra))
            .env("AGENTFLEET_FAILPOINTS", failpoints)
            .env("RUST_LOG", "error")
            .stdin(Stdio::null())
            .spawn()
            .expect("spawn worker");
        ChildProcess { child: Some(child) }
    }
}

/// A loopback address with a port free right now, for a process to listen on.
pub fn free_address() -> String {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free loopback port")
        .port();
    format!("127.0.0.1:{port}")
}

/// The text of `/metrics` served at `listen` (`worker.metrics_listen`, `api.metrics_listen`);
/// `None` while nothing answers there.
pub async fn scrape_metrics(listen: &str) -> Option<String> {
    reqwest::get(format!("http://{listen}/metrics"))
        .await
        .ok()?
        .text()
        .await
        .ok()
}

/// Path of a workspace binary next to the test executable's directory.
pub fn binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    let dir = exe
        .parent()
        .and_then(|d| {
            if d.ends_with("deps") {
                d.parent()
            } else {
                Some(d)
            }
        })
        .expect("target dir");
    let path = dir.join(name);
    assert!(
        path.exists(),
        "{} is missing: build the binaries first (`cargo build --bins`; scripts/test does)",
        path.display()
    );
    path
}

pub struct InProcessWorker {
    pub id: String,
    stop: CancellationToken,
    handle: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
}

impl InProcessWorker {
    /// Drains and waits for it.
    pub async fn shutdown(mut self) {
        self.stop.cancel();
        if let Some(h) = self.handle.take() {
            h.await.expect("worker task").expect("worker ran cleanly");
        }
    }
}

impl Drop for InProcessWorker {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

pub struct ChildProcess {
    child: Option<Child>,
}

impl ChildProcess {
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }
    pub fn signal(&self, sig: &str) {
        let status = Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(self.pid().to_string())
            .status()
            .expect("kill");
        assert!(status.success(), "kill -{sig} failed");
    }
    /// kill -9, and reap.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
    /// Waits (polling) for the process to exit; returns its exit code.
    pub async fn wait_exit(&mut self, timeout: Duration) -> Option<i32> {
        let child = self.child.as_mut().expect("running");
        let status = wait_for("process exit", timeout, || {
            let s = child.try_wait().expect("try_wait");
            async move { s }
        })
        .await;
        self.child = None;
        status.code()
    }
    /// Whether the process has exited (reaping it if so).
    pub fn has_exited(&mut self) -> bool {
        match self.child.as_mut() {
            None => true,
            Some(c) => c.try_wait().ok().flatten().is_some(),
        }
    }
}

impl Drop for ChildProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Runs the built `agentfleet-api` with the test's configuration; its stdout, or a panic with
/// its stderr unless it failed as `expect_ok` says.
pub async fn api_cli(env: &TestEnv, args: &[&str], expect_ok: bool) -> String {
    let out = tokio::process::Command::new(binary("agentfleet-api"))
        .args(args)
        .envs(env.env_vars(&[]))
        .env("RUST_LOG", "warn")
        .output()
        .await
        .expect("runs agentfleet-api");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert_eq!(
        out.status.success(),
        expect_ok,
        "{args:?}\nstdout: {stdout}\nstderr: {stderr}"
    );
    if expect_ok { stdout } else { stderr }
}

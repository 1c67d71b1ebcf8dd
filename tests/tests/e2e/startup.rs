//! Start-up while a server is away: a worker waits for it (saying which, and where), starts
//! once it answers, and gives up after `startup.dependency_wait_ms` naming it. The shared
//! servers are never stopped here: the worker is pointed at a port that answers only when the
//! test says so (a proxy to the real Postgres) or never.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;

use agentfleet_tests::harness::*;

const T: Duration = Duration::from_secs(60);

/// A worker process whose output (stdout and stderr) is collected line by line.
struct Observed {
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
}

impl Observed {
    fn spawn(env: &TestEnv, extra: &[(&str, &str)]) -> Observed {
        Self::spawn_binary("agentfleet-worker", &[], env, extra)
    }

    fn spawn_binary(name: &str, args: &[&str], env: &TestEnv, extra: &[(&str, &str)]) -> Observed {
        let mut child = Command::new(binary(name))
            .args(args)
            .envs(env.env_vars(extra))
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn the binary");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let out = child.stdout.take().expect("stdout");
        let err = child.stderr.take().expect("stderr");
        for reader in [
            Box::new(out) as Box<dyn std::io::Read + Send>,
            Box::new(err) as Box<dyn std::io::Read + Send>,
        ] {
            let lines = lines.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(reader).lines().map_while(Result::ok) {
                    lines.lock().unwrap().push(line);
                }
            });
        }
        Observed { child, lines }
    }

    fn saw(&self, text: &str) -> bool {
        self.lines.lock().unwrap().iter().any(|l| l.contains(text))
    }

    async fn wait_line(&self, text: &str) {
        wait_for(&format!("the worker to print {text:?}"), T, || async {
            self.saw(text).then_some(())
        })
        .await;
    }

    fn output(&self) -> String {
        self.lines.lock().unwrap().join("\n")
    }
}

impl Drop for Observed {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A loopback port with nothing listening on it (yet).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// Forwards every connection on `port` to `target`, from now on.
async fn open_proxy(port: u16, target: &'static str) {
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .expect("the proxy binds the port the worker waits on");
    tokio::spawn(async move {
        while let Ok((mut client, _)) = listener.accept().await {
            tokio::spawn(async move {
                if let Ok(mut server) = tokio::net::TcpStream::connect(target).await {
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                }
            });
        }
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_started_while_postgres_is_away_waits_and_then_runs() {
    let env = TestEnv::new().await;
    let app = env.spawn_api().await;
    let port = free_port();
    let url = format!("postgres://postgres@127.0.0.1:{port}/{}", env.db_name);
    let worker = Observed::spawn(&env, &[("database.url", &url)]);
    let waiting = format!("waiting for Postgres at 127.0.0.1:{port}");
    worker.wait_line(&waiting).await;
    assert!(
        !worker.saw("worker started"),
        "nothing is announced while Postgres is away:\n{}",
        worker.output()
    );

    open_proxy(port, "127.0.0.1:5432").await;
    worker.wait_line("worker started").await;
    let run = app
        .start_run(&scripted_run(json!([{"content": "hello"}]), json!([])))
        .await;
    let done = app
        .wait_status(run["id"].as_str().unwrap(), &["completed", "failed"], T)
        .await;
    assert_eq!(done["status"], "completed", "{done}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_cannot_reach_redis_exits_naming_it_and_never_claims_to_start() {
    let env = TestEnv::new().await;
    let port = free_port();
    let url = format!("redis://127.0.0.1:{port}");
    let mut worker = Observed::spawn(
        &env,
        &[("redis.url", &url), ("startup.dependency_wait_ms", "1500")],
    );
    let code = wait_for("the worker to give up", T, || {
        let exited = worker.child.try_wait().expect("wait");
        async move { exited }
    })
    .await;
    assert!(!code.success(), "exits non-zero");
    let named = format!("could not reach Redis at 127.0.0.1:{port} within 1 s");
    worker.wait_line(&named).await;
    let out = worker.output();
    assert!(
        out.contains(&format!("waiting for Redis at 127.0.0.1:{port}")),
        "{out}"
    );
    assert!(!out.contains("worker started"), "{out}");
    // One line, the cause said once.
    let last = out.lines().find(|l| l.contains(&named)).unwrap();
    assert_eq!(last.matches("Connection refused").count(), 1, "{last}");
}

/// The upgrade's migration Job (`agentfleet-api migrate`) behind a long transaction on a table
/// it needs: each attempt gives up after `database.migration_lock_timeout_ms` (so the table's
/// traffic never queues behind it for longer), and once `database.migration_attempts` are used
/// up the Job fails saying why; when the transaction has ended, the same Job succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_migration_job_behind_a_long_transaction_fails_saying_why() {
    let env = TestEnv::new().await;
    // Every run of the migrations reads the table of applied migrations first.
    let mut holder = env.pool.begin().await.unwrap();
    sqlx::query("LOCK TABLE _sqlx_migrations IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *holder)
        .await
        .unwrap();
    let limits = [
        ("database.migration_lock_timeout_ms", "100"),
        ("database.migration_attempts", "2"),
    ];
    let mut job = Observed::spawn_binary("agentfleet-api", &["migrate"], &env, &limits);
    let code = wait_for("the migration Job to give up", T, || {
        let exited = job.child.try_wait().expect("wait");
        async move { exited }
    })
    .await;
    assert!(!code.success(), "exits non-zero");
    job.wait_line("applying migrations").await;
    let out = job.output();
    assert!(out.contains("lock timeout"), "says why: {out}");
    assert!(
        out.contains("2 attempts, each waiting at most 100 ms for a lock"),
        "and what it tried: {out}"
    );
    assert!(
        out.contains("a migration waited too long for a lock"),
        "the retry is in the Job's log: {out}"
    );
    assert!(!out.contains("migrations applied"), "{out}");

    holder.rollback().await.unwrap();
    let mut job = Observed::spawn_binary("agentfleet-api", &["migrate"], &env, &limits);
    let code = wait_for("the migration Job to end", T, || {
        let exited = job.child.try_wait().expect("wait");
        async move { exited }
    })
    .await;
    job.wait_line("migrations applied").await;
    assert!(code.success(), "{}", job.output());
}

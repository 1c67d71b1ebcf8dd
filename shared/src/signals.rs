//! Process signals shared by both binaries.

/// Resolves on SIGTERM (Kubernetes) or Ctrl-C: the start of a graceful shutdown.
pub async fn shutdown() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("installing the SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

//! A TCP proxy in front of the API whose open connections can all be cut at once: the browser
//! tests' network drop. `POST <control_url>` cuts them too (so a script driving a browser can
//! choose the moment), answering how many were open.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::routing::post;
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

pub struct CutProxy {
    /// `http://127.0.0.1:<port>`: use it as the API's base URL.
    pub address: String,
    /// POST here to cut every open connection.
    pub control_url: String,
    cutter: Cutter,
    stop: CancellationToken,
}

#[derive(Clone, Default)]
struct Cutter {
    current: Arc<std::sync::Mutex<CancellationToken>>,
    open: Arc<AtomicUsize>,
}

impl Cutter {
    /// Closes every connection open now; later ones are proxied as usual.
    fn cut(&self) -> usize {
        let old = std::mem::take(&mut *self.current.lock().unwrap());
        let open = self.open.load(Ordering::SeqCst);
        old.cancel();
        open
    }
}

impl CutProxy {
    /// Proxies to `upstream` (`http://host:port`).
    pub async fn start(upstream: &str) -> CutProxy {
        let upstream = upstream
            .trim_start_matches("http://")
            .trim_end_matches('/')
            .to_string();
        let stop = CancellationToken::new();
        let cutter = Cutter::default();
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let address = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(accept(listener, upstream, cutter.clone(), stop.clone()));

        let control = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind control");
        let control_url = format!("http://{}/cut", control.local_addr().unwrap());
        let c = cutter.clone();
        let app = axum::Router::new().route(
            "/cut",
            post(move || {
                let c = c.clone();
                async move { c.cut().to_string() }
            }),
        );
        let s = stop.clone();
        tokio::spawn(async move {
            let _ = axum::serve(control, app)
                .with_graceful_shutdown(s.cancelled_owned())
                .await;
        });
        CutProxy {
            address,
            control_url,
            cutter,
            stop,
        }
    }

    pub fn cut(&self) -> usize {
        self.cutter.cut()
    }
}

impl Drop for CutProxy {
    fn drop(&mut self) {
        self.stop.cancel();
        self.cutter.cut();
    }
}

async fn accept(listener: TcpListener, upstream: String, cutter: Cutter, stop: CancellationToken) {
    loop {
        let (mut client, _) = tokio::select! {
            () = stop.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok(c) => c,
                Err(_) => continue,
            },
        };
        let upstream = upstream.clone();
        let cut = cutter.current.lock().unwrap().clone();
        let open = cutter.open.clone();
        open.fetch_add(1, Ordering::SeqCst);
        tokio::spawn(async move {
            if let Ok(mut server) = TcpStream::connect(&upstream).await {
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                tokio::select! {
                    () = cut.cancelled() => {}
                    _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                }
            }
            open.fetch_sub(1, Ordering::SeqCst);
        });
    }
}

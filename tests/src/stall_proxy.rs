//! A TCP proxy whose traffic can be held: while held, nothing is forwarded either way and
//! every connection stays open, as with a RabbitMQ that stops answering its publishers during a
//! memory or disk alarm, or a network path that drops packets without resetting anything.

use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

pub struct StallProxy {
    /// `host:port` to connect to instead of the upstream.
    pub address: String,
    held: watch::Sender<bool>,
    stop: CancellationToken,
    /// What the clients sent while the traffic was held (not forwarded yet), its first MiB.
    sent_while_held: Arc<Mutex<Vec<u8>>>,
}

impl StallProxy {
    /// Proxies to `upstream` (`host:port`).
    pub async fn start(upstream: &str) -> StallProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let address = listener.local_addr().expect("address").to_string();
        let (held, watching) = watch::channel(false);
        let stop = CancellationToken::new();
        let sent_while_held: Arc<Mutex<Vec<u8>>> = Default::default();
        let counted = sent_while_held.clone();
        let (upstream, stopping) = (upstream.to_owned(), stop.clone());
        tokio::spawn(async move {
            loop {
                let accepted = tokio::select! {
                    a = listener.accept() => a,
                    () = stopping.cancelled() => return,
                };
                let Ok((client, _)) = accepted else { continue };
                let Ok(server) = TcpStream::connect(&upstream).await else {
                    continue;
                };
                let (cr, cw) = client.into_split();
                let (sr, sw) = server.into_split();
                for (from, to, count) in [
                    (
                        Box::new(cr) as Box<dyn tokio::io::AsyncRead + Send + Unpin>,
                        Box::new(sw) as Box<dyn tokio::io::AsyncWrite + Send + Unpin>,
                        Some(counted.clone()),
                    ),
                    (Box::new(sr), Box::new(cw), None),
                ] {
                    tokio::spawn(pump(from, to, watching.clone(), stopping.clone(), count));
                }
            }
        });
        StallProxy {
            address,
            held,
            stop,
            sent_while_held,
        }
    }

    /// Whether the clients sent `bytes` while the traffic was held (over all connections).
    pub fn sent_while_held(&self, bytes: &[u8]) -> bool {
        let sent = self.sent_while_held.lock().expect("sent lock");
        sent.windows(bytes.len()).any(|w| w == bytes)
    }

    /// From now on nothing is forwarded (what was read meanwhile waits for [`release`]).
    ///
    /// [`release`]: StallProxy::release
    pub fn hold(&self) {
        self.held.send_replace(true);
    }

    pub fn release(&self) {
        self.held.send_replace(false);
    }
}

impl Drop for StallProxy {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Copies `from` to `to`, each chunk only while the traffic is not held.
async fn pump(
    mut from: Box<dyn tokio::io::AsyncRead + Send + Unpin>,
    mut to: Box<dyn tokio::io::AsyncWrite + Send + Unpin>,
    mut held: watch::Receiver<bool>,
    stop: CancellationToken,
    record: Option<Arc<Mutex<Vec<u8>>>>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = tokio::select! {
            r = from.read(&mut buf) => match r {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            },
            () = stop.cancelled() => return,
        };
        if let Some(record) = record.as_ref().filter(|_| *held.borrow()) {
            let mut sent = record.lock().expect("sent lock");
            let room = (1usize << 20).saturating_sub(sent.len());
            sent.extend_from_slice(&buf[..n.min(room)]);
        }
        tokio::select! {
            r = held.wait_for(|held| !*held) => if r.is_err() { return },
            () = stop.cancelled() => return,
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

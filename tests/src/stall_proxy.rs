//! A TCP proxy whose traffic can be held: while held, nothing is forwarded either way and
//! every connection stays open, as with a RabbitMQ that stops answering its publishers during a
//! memory or disk alarm, or a network path that drops packets without resetting anything. It
//! can also slip bytes of its own to the clients (a broker's `connection.blocked`, say).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{broadcast, watch};
use tokio_util::sync::CancellationToken;

pub struct StallProxy {
    /// `host:port` to connect to instead of the upstream.
    pub address: String,
    held: watch::Sender<bool>,
    stop: CancellationToken,
    /// What the clients sent while the traffic was held (not forwarded yet), its first MiB.
    sent_while_held: Arc<Mutex<Vec<u8>>>,
    /// Connections accepted so far.
    accepted: Arc<AtomicUsize>,
    /// Bytes to write to every client, between two chunks of what the upstream sends.
    inject: broadcast::Sender<Vec<u8>>,
}

/// One direction of a proxied connection.
struct Pump {
    from: Box<dyn tokio::io::AsyncRead + Send + Unpin>,
    to: Box<dyn tokio::io::AsyncWrite + Send + Unpin>,
    held: watch::Receiver<bool>,
    stop: CancellationToken,
    /// Client to upstream: where to record what is read while held.
    record: Option<Arc<Mutex<Vec<u8>>>>,
    /// Upstream to client: bytes of the proxy's own to slip in.
    inject: Option<broadcast::Receiver<Vec<u8>>>,
}

impl StallProxy {
    /// Proxies to `upstream` (`host:port`).
    pub async fn start(upstream: &str) -> StallProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let address = listener.local_addr().expect("address").to_string();
        let (held, watching) = watch::channel(false);
        let stop = CancellationToken::new();
        let sent_while_held: Arc<Mutex<Vec<u8>>> = Default::default();
        let accepted = Arc::new(AtomicUsize::new(0));
        let (inject, _) = broadcast::channel(16);
        let (recorded, counted, injecting) =
            (sent_while_held.clone(), accepted.clone(), inject.clone());
        let (upstream, stopping) = (upstream.to_owned(), stop.clone());
        tokio::spawn(async move {
            loop {
                let accepted = tokio::select! {
                    a = listener.accept() => a,
                    () = stopping.cancelled() => return,
                };
                let Ok((client, _)) = accepted else { continue };
                counted.fetch_add(1, Ordering::SeqCst);
                let Ok(server) = TcpStream::connect(&upstream).await else {
                    continue;
                };
                let (cr, cw) = client.into_split();
                let (sr, sw) = server.into_split();
                let upward = Pump {
                    from: Box::new(cr),
                    to: Box::new(sw),
                    held: watching.clone(),
                    stop: stopping.clone(),
                    record: Some(recorded.clone()),
                    inject: None,
                };
                let downward = Pump {
                    from: Box::new(sr),
                    to: Box::new(cw),
                    held: watching.clone(),
                    stop: stopping.clone(),
                    record: None,
                    inject: Some(injecting.subscribe()),
                };
                tokio::spawn(upward.run());
                tokio::spawn(downward.run());
            }
        });
        StallProxy {
            address,
            held,
            stop,
            sent_while_held,
            accepted,
            inject,
        }
    }

    /// A proxy in front of the broker of `amqp_url` (`amqp://user:pass@host:port/vhost`), and
    /// the URL that reaches it through the proxy.
    pub async fn in_front_of_amqp(amqp_url: &str) -> (StallProxy, String) {
        let upstream = amqp_url
            .split('@')
            .nth(1)
            .and_then(|rest| rest.split('/').next())
            .expect("host:port in the AMQP URL")
            .to_owned();
        let proxy = StallProxy::start(&upstream).await;
        let through = amqp_url.replace(&upstream, &proxy.address);
        (proxy, through)
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

    /// Whether the clients sent `bytes` while the traffic was held (over all connections).
    pub fn sent_while_held(&self, bytes: &[u8]) -> bool {
        let sent = self.sent_while_held.lock().expect("sent lock");
        sent.windows(bytes.len()).any(|w| w == bytes)
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }

    /// Writes `bytes` to every open client connection, held or not, between two chunks of
    /// what the upstream sends (so at a frame boundary when the upstream is quiet).
    pub fn inject(&self, bytes: &[u8]) {
        let _ = self.inject.send(bytes.to_vec());
    }
}

impl Drop for StallProxy {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl Pump {
    /// Copies `from` to `to`, each chunk only while the traffic is not held.
    async fn run(mut self) {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let inject = &mut self.inject;
            let injected = async move {
                match inject.as_mut() {
                    Some(rx) => rx.recv().await.ok(),
                    None => std::future::pending().await,
                }
            };
            let n = tokio::select! {
                r = self.from.read(&mut buf) => match r {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                },
                Some(bytes) = injected => {
                    if self.to.write_all(&bytes).await.is_err() {
                        return;
                    }
                    continue;
                }
                () = self.stop.cancelled() => return,
            };
            if let Some(record) = self.record.as_ref().filter(|_| *self.held.borrow()) {
                let mut sent = record.lock().expect("sent lock");
                let room = (1usize << 20).saturating_sub(sent.len());
                sent.extend_from_slice(&buf[..n.min(room)]);
            }
            tokio::select! {
                r = self.held.wait_for(|held| !*held) => if r.is_err() { return },
                () = self.stop.cancelled() => return,
            }
            if self.to.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    }
}

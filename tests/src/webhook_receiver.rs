//! A webhook receiver on a free loopback port, for the tests and the demo: it checks each
//! delivery's Standard Webhooks signature with the endpoint's key independently of product
//! code, answers 500 to the first attempts of each delivery id when asked to, and keeps what
//! arrived.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use hmac::{Hmac, Mac};
use serde_json::Value;
use sha2::Sha256;

/// One request the receiver got.
#[derive(Debug, Clone)]
pub struct Received {
    pub id: String,
    pub body: Value,
    /// The signature checked out with the endpoint's key, independently of product code.
    pub signed: bool,
    /// `webhook-timestamp` within five minutes of the receiver's clock.
    pub fresh: bool,
    pub answered: u16,
}

#[derive(Default)]
struct ReceiverState {
    key: Mutex<Option<Vec<u8>>>,
    /// Attempts of each delivery id answered 500 before one is answered 200.
    fail_first: usize,
    got: Mutex<Vec<Received>>,
}

/// A webhook receiver on a free loopback port.
pub struct Receiver {
    pub addr: SocketAddr,
    state: Arc<ReceiverState>,
}

impl Receiver {
    /// `fail_first`: attempts of each delivery id answered 500 before one is answered 200.
    pub async fn start(fail_first: usize) -> Receiver {
        let state = Arc::new(ReceiverState {
            fail_first,
            ..Default::default()
        });
        let app = Router::new()
            .route("/hooks", post(receive))
            .with_state(state.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        Receiver { addr, state }
    }

    pub fn url(&self) -> String {
        format!("http://{}/hooks", self.addr)
    }

    /// Takes the endpoint's secret as shown at creation.
    pub fn trust(&self, secret: &str) {
        let key = STANDARD
            .decode(secret.strip_prefix("whsec_").expect("whsec_ prefix"))
            .expect("base64");
        *self.state.key.lock().unwrap() = Some(key);
    }

    pub fn got(&self) -> Vec<Received> {
        self.state.got.lock().unwrap().clone()
    }

    /// The ids answered 200.
    pub fn acknowledged(&self) -> Vec<Received> {
        self.got()
            .into_iter()
            .filter(|r| r.answered == 200)
            .collect()
    }
}

async fn receive(
    State(state): State<Arc<ReceiverState>>,
    headers: HeaderMap,
    body: Bytes,
) -> StatusCode {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned()
    };
    let (id, timestamp, signatures) = (
        header("webhook-id"),
        header("webhook-timestamp"),
        header("webhook-signature"),
    );
    let signed = state.key.lock().unwrap().as_ref().is_some_and(|key| {
        let mut mac = Hmac::<Sha256>::new_from_slice(key).unwrap();
        mac.update(format!("{id}.{timestamp}.").as_bytes());
        mac.update(&body);
        let expected = format!("v1,{}", STANDARD.encode(mac.finalize().into_bytes()));
        signatures.split(' ').any(|s| s == expected)
    });
    let fresh = timestamp
        .parse::<i64>()
        .is_ok_and(|t| (chrono::Utc::now().timestamp() - t).abs() < 300);
    let mut got = state.got.lock().unwrap();
    let earlier = got.iter().filter(|r| r.id == id).count();
    let answered = if earlier < state.fail_first { 500 } else { 200 };
    got.push(Received {
        id,
        body: serde_json::from_slice(&body).unwrap_or(Value::Null),
        signed,
        fresh,
        answered,
    });
    StatusCode::from_u16(answered).unwrap()
}

//! The HTTP client held to the egress policy (`crate::egress`), for tool calls (worker) and
//! webhook deliveries (API): host names resolve through a resolver that drops refused
//! addresses at connect time (DNS rebinding), every redirect hop's URL is judged again, and
//! redirects are off unless the operator allows some. Model calls use another client: the
//! model gateway is the operator's.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use reqwest::dns::{Addrs, Name, Resolve, Resolving};
use reqwest::redirect;

use crate::egress::{EgressDenied, EgressPolicy};

struct PolicyResolver {
    policy: Arc<EgressPolicy>,
}

impl Resolve for PolicyResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let policy = self.policy.clone();
        Box::pin(async move {
            let host = name.as_str().to_owned();
            let resolved = tokio::net::lookup_host((host.as_str(), 0)).await?;
            let trusted = policy.trusts_name(&host);
            let allowed: Vec<SocketAddr> = resolved
                .filter(|a| trusted || policy.allows_resolved(a.ip()))
                .collect();
            if allowed.is_empty() {
                metrics::counter!("agentfleet_egress_denied_total", "stage" => "resolve")
                    .increment(1);
                return Err(Box::new(EgressDenied) as Box<dyn std::error::Error + Send + Sync>);
            }
            Ok(Box::new(allowed.into_iter()) as Addrs)
        })
    }
}

/// A client held to `policy` (tool calls, webhook deliveries). `max_idle_per_host`: how many
/// idle connections it keeps per host, at least as many as the caller runs requests at once,
/// or each burst above it closes connections the next burst opens again.
pub fn client(
    policy: Arc<EgressPolicy>,
    max_redirects: usize,
    connect_timeout: Duration,
    max_idle_per_host: usize,
) -> reqwest::Result<reqwest::Client> {
    let hops = policy.clone();
    let redirects = if max_redirects == 0 {
        redirect::Policy::none()
    } else {
        redirect::Policy::custom(move |attempt| {
            if attempt.previous().len() > max_redirects {
                attempt.error(TooManyRedirects(max_redirects))
            } else if hops.check_url(attempt.url()).is_err() {
                metrics::counter!("agentfleet_egress_denied_total", "stage" => "redirect")
                    .increment(1);
                attempt.error(EgressDenied)
            } else {
                attempt.follow()
            }
        })
    };
    reqwest::Client::builder()
        // A proxy from the environment would resolve the tool's host itself, past the policy.
        .no_proxy()
        .dns_resolver(Arc::new(PolicyResolver { policy }))
        .redirect(redirects)
        .connect_timeout(connect_timeout)
        .pool_max_idle_per_host(max_idle_per_host)
        .tcp_nodelay(true)
        .build()
}

#[derive(Debug, thiserror::Error)]
#[error("more than {0} redirects")]
struct TooManyRedirects(usize);

/// Whether a request failed because the policy refused an address (at any stage).
pub fn is_denied(err: &reqwest::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = source {
        if e.is::<EgressDenied>() {
            return true;
        }
        source = e.source();
    }
    false
}

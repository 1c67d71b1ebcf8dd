//! `[amqp]`: the RabbitMQ broker that carries runs to workers.

use std::num::NonZeroU64;
use std::time::Duration;

use serde::Deserialize;

use super::{ConfigError, invalid, is_name};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AmqpSettings {
    /// The RabbitMQ broker that carries runs to workers (`%2f` is the default virtual host `/`).
    /// A cluster: each node's URL, comma-separated
    /// (`amqp://u:p@rabbit-0:5672/%2f,amqp://u:p@rabbit-1:5672/%2f`); a client connects to the
    /// node that answered last, else to the next in turn, and moves on when its node is lost. A
    /// comma in a password is written `%2C`.
    pub url: String,
    /// Prefix of the exchange and queues, e.g. `agentfleet.runs` and the dead letters'
    /// `agentfleet.runs.dead`: non-empty `[A-Za-z0-9._-]`.
    pub prefix: String,
    /// The longest a publish waits for RabbitMQ's confirm (reconnecting included), and a consumer's
    /// start, a cancel or a connection (opened or closed) for its answer: a broker that stops
    /// answering without closing anything (a memory or disk alarm holds publishers) fails the
    /// publish (the sweeper publishes the run again later) instead of holding the run that made it,
    /// and a drain goes on.
    pub timeout_ms: NonZeroU64,
}

impl AmqpSettings {
    pub fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms.get())
    }

    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if let Err(e) = crate::queue::Brokers::parse(&self.url) {
            return Err(invalid("amqp.url", e.to_string()));
        }
        if !is_name(&self.prefix) {
            return Err(invalid("amqp.prefix", "must be non-empty [A-Za-z0-9._-]"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::config::tests::load;

    #[test]
    fn one_url_or_a_cluster_s_nodes() {
        assert!(load(&[("amqp.url", "amqp://guest:guest@127.0.0.1:5672/%2f")]).is_ok());
        let cluster = "amqp://u:p@rabbit-0:5672/%2f,amqp://u:p@rabbit-1:5672/%2f";
        assert_eq!(load(&[("amqp.url", cluster)]).unwrap().amqp.url, cluster);
    }

    #[test]
    fn a_malformed_address_names_the_key_and_its_place() {
        let err = load(&[("amqp.url", "amqp://u:s3cret@a:5672/%2f,rabbit-1:5672")])
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with(
                "invalid configuration: `amqp.url`: address 2 of 2 is not an amqp:// or amqps:// URL"
            ),
            "{err}"
        );
        assert!(!err.contains("s3cret"), "{err}");
        let err = load(&[("amqp.url", "")]).unwrap_err().to_string();
        assert!(err.contains("`amqp.url`: address 1 of 1 is empty"), "{err}");
    }
}

//! Short-lived tokens that let a browser's `EventSource` (which cannot send an
//! `Authorization` header) read one run's events without putting an API key in a URL.
//! A token names its run, its tenant and its expiry, signed with HMAC-SHA256.

use hmac::{Hmac, Mac};
use sha2::Sha256;
use uuid::Uuid;

type HmacSha256 = Hmac<Sha256>;

#[derive(Clone)]
pub struct TokenSigner {
    secret: std::sync::Arc<Vec<u8>>,
}

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error("malformed stream token")]
    Malformed,
    #[error("invalid stream token signature")]
    BadSignature,
    #[error("the stream token has expired")]
    Expired,
    #[error("the stream token is for another run")]
    WrongRun,
}

impl TokenSigner {
    /// `secret` empty: a random one (tokens then verify only on this process).
    pub fn new(secret: &str) -> TokenSigner {
        let secret = if secret.is_empty() {
            tracing::warn!(
                "api.stream_token_secret is not set: stream tokens will only work on this API process"
            );
            let mut bytes = vec![0u8; 32];
            rand::RngCore::fill_bytes(&mut rand::rng(), &mut bytes);
            bytes
        } else {
            secret.as_bytes().to_vec()
        };
        TokenSigner {
            secret: std::sync::Arc::new(secret),
        }
    }

    fn mac(&self, payload: &str) -> HmacSha256 {
        let mut mac = HmacSha256::new_from_slice(&self.secret).expect("HMAC takes any key length");
        mac.update(payload.as_bytes());
        mac
    }

    /// `<run>.<tenant>.<expires unix secs>.<hex signature>`
    pub fn issue(&self, run: Uuid, tenant: Uuid, expires: i64) -> String {
        let payload = format!("{}.{}.{expires}", run.simple(), tenant.simple());
        let sig = hex::encode(self.mac(&payload).finalize().into_bytes());
        format!("{payload}.{sig}")
    }

    /// The tenant the token speaks for, if it is valid for `run` at `now`.
    pub fn verify(&self, token: &str, run: Uuid, now: i64) -> Result<Uuid, TokenError> {
        let mut parts = token.split('.');
        let (Some(r), Some(t), Some(exp), Some(sig), None) = (
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
        ) else {
            return Err(TokenError::Malformed);
        };
        let sig = hex::decode(sig).map_err(|_| TokenError::Malformed)?;
        self.mac(&format!("{r}.{t}.{exp}"))
            .verify_slice(&sig)
            .map_err(|_| TokenError::BadSignature)?;
        let exp: i64 = exp.parse().map_err(|_| TokenError::Malformed)?;
        if exp <= now {
            return Err(TokenError::Expired);
        }
        let token_run = Uuid::parse_str(r).map_err(|_| TokenError::Malformed)?;
        if token_run != run {
            return Err(TokenError::WrongRun);
        }
        Uuid::parse_str(t).map_err(|_| TokenError::Malformed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_works_for_its_run_only_and_expires() {
        let signer = TokenSigner::new("s3cret");
        let (run, tenant) = (Uuid::new_v4(), Uuid::new_v4());
        let token = signer.issue(run, tenant, 1_000);
        assert_eq!(signer.verify(&token, run, 999), Ok(tenant));
        assert_eq!(signer.verify(&token, run, 1_000), Err(TokenError::Expired));
        assert_eq!(
            signer.verify(&token, Uuid::new_v4(), 999),
            Err(TokenError::WrongRun)
        );
        let other = TokenSigner::new("other");
        assert_eq!(
            other.verify(&token, run, 999),
            Err(TokenError::BadSignature)
        );
        let tampered = token.replace(
            &tenant.simple().to_string(),
            &Uuid::new_v4().simple().to_string(),
        );
        assert_eq!(
            signer.verify(&tampered, run, 999),
            Err(TokenError::BadSignature)
        );
        assert_eq!(
            signer.verify("nonsense", run, 999),
            Err(TokenError::Malformed)
        );
    }
}

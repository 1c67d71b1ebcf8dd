//! Short-lived tokens that let a browser's `EventSource` (which cannot send an
//! `Authorization` header) read one run's events without putting an API key in a URL.
//! A token names its run, its tenant, the API key that asked for it and its expiry, signed
//! with HMAC-SHA256. The key is checked on every use (`crate::auth::caller`), so a token
//! stops working when its key is revoked or expires.

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

/// Who a valid token speaks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenClaims {
    pub tenant: Uuid,
    /// The API key that asked for the token.
    pub key: Uuid,
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

    /// `<run>.<tenant>.<key>.<expires unix secs>.<hex signature>`
    pub fn issue(&self, run: Uuid, claims: TokenClaims, expires: i64) -> String {
        let payload = format!(
            "{}.{}.{}.{expires}",
            run.simple(),
            claims.tenant.simple(),
            claims.key.simple()
        );
        let sig = hex::encode(self.mac(&payload).finalize().into_bytes());
        format!("{payload}.{sig}")
    }

    /// Who the token speaks for, if it is valid for `run` at `now` (its key is the caller's to
    /// check).
    pub fn verify(&self, token: &str, run: Uuid, now: i64) -> Result<TokenClaims, TokenError> {
        let mut parts = token.split('.');
        let (Some(r), Some(t), Some(k), Some(exp), Some(sig), None) = (
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
        ) else {
            return Err(TokenError::Malformed);
        };
        let sig = hex::decode(sig).map_err(|_| TokenError::Malformed)?;
        self.mac(&format!("{r}.{t}.{k}.{exp}"))
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
        Ok(TokenClaims {
            tenant: Uuid::parse_str(t).map_err(|_| TokenError::Malformed)?,
            key: Uuid::parse_str(k).map_err(|_| TokenError::Malformed)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_works_for_its_run_only_and_expires() {
        let signer = TokenSigner::new("s3cret");
        let (run, tenant) = (Uuid::new_v4(), Uuid::new_v4());
        let claims = TokenClaims {
            tenant,
            key: Uuid::new_v4(),
        };
        let token = signer.issue(run, claims, 1_000);
        assert_eq!(signer.verify(&token, run, 999), Ok(claims));
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
        let tampered = token.replace(
            &claims.key.simple().to_string(),
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

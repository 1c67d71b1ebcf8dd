//! Sealing small secrets at rest (registered MCP servers' header values): ChaCha20-Poly1305
//! with a random 96-bit nonce, stored as `nonce || ciphertext`. The associated data binds a
//! sealed value to its row.

use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{ChaCha20Poly1305, Key, Nonce};
use rand::RngCore;

const NONCE_BYTES: usize = 12;

#[derive(Debug, thiserror::Error)]
#[error("the sealed value could not be opened (wrong key or altered data)")]
pub struct OpenError;

pub fn seal(key: &[u8; 32], associated: &[u8], plaintext: &[u8]) -> Vec<u8> {
    let cipher = ChaCha20Poly1305::new(&Key::from(*key));
    let mut nonce = [0u8; NONCE_BYTES];
    rand::rng().fill_bytes(&mut nonce);
    let sealed = cipher
        .encrypt(
            &Nonce::from(nonce),
            Payload {
                msg: plaintext,
                aad: associated,
            },
        )
        .expect("ChaCha20-Poly1305 encryption of a small buffer cannot fail");
    let mut out = nonce.to_vec();
    out.extend(sealed);
    out
}

pub fn open(key: &[u8; 32], associated: &[u8], sealed: &[u8]) -> Result<Vec<u8>, OpenError> {
    if sealed.len() < NONCE_BYTES {
        return Err(OpenError);
    }
    let (nonce, body) = sealed.split_at(NONCE_BYTES);
    let nonce: [u8; NONCE_BYTES] = nonce.try_into().map_err(|_| OpenError)?;
    ChaCha20Poly1305::new(&Key::from(*key))
        .decrypt(
            &Nonce::from(nonce),
            Payload {
                msg: body,
                aad: associated,
            },
        )
        .map_err(|_| OpenError)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sealed_values_open_only_with_their_key_and_row() {
        let key = [7u8; 32];
        let sealed = seal(&key, b"row-1", b"Bearer s3cret");
        assert!(!sealed.windows(6).any(|w| w == b"s3cret"));
        assert_eq!(open(&key, b"row-1", &sealed).unwrap(), b"Bearer s3cret");
        assert!(open(&key, b"row-2", &sealed).is_err());
        assert!(open(&[8u8; 32], b"row-1", &sealed).is_err());
        assert!(open(&key, b"row-1", &sealed[..5]).is_err());
    }
}

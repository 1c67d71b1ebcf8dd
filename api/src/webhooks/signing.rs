//! Standard Webhooks signatures (<https://www.standardwebhooks.com/>): the receiver checks
//! `webhook-signature` = `v1,` + base64(HMAC-SHA256(key, "{webhook-id}.{webhook-timestamp}.{body}"))
//! where the key is the base64-decoded part of the endpoint's `whsec_…` secret.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use hmac::{Hmac, Mac};
use sha2::Sha256;

/// The `webhook-signature` header value of one attempt.
pub fn signature(key: &[u8], id: &str, timestamp: i64, body: &str) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes a key of any length");
    mac.update(id.as_bytes());
    mac.update(b".");
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body.as_bytes());
    format!("v1,{}", STANDARD.encode(mac.finalize().into_bytes()))
}

#[cfg(test)]
mod tests {
    use agentfleet_shared::store::webhooks::secret_key;

    /// The example of the Standard Webhooks reference libraries.
    #[test]
    fn the_reference_example_signs_alike() {
        let key = secret_key("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        assert_eq!(
            super::signature(
                &key,
                "msg_p5jXN8AQM9LWM0D4loKWxJek",
                1_614_265_330,
                r#"{"test": 2432232314}"#
            ),
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
        );
    }
}

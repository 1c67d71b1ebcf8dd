//! A key's expiry as `create` and `rotate` take it: `expires_at` or `expires_in_secs`, never both.

use chrono::{DateTime, Utc};

use agentfleet_shared::store::keys::{self, MAX_SECS};

use crate::error::ApiError;

/// The expiry asked for, as an instant after `now`; errors name the field.
pub fn expiry(
    expires_at: Option<DateTime<Utc>>,
    expires_in_secs: Option<u64>,
    now: DateTime<Utc>,
) -> Result<Option<DateTime<Utc>>, ApiError> {
    let at = match (expires_at, expires_in_secs) {
        (Some(_), Some(_)) => {
            return Err(ApiError::invalid(
                "expires_in_secs",
                "give either expires_at or expires_in_secs, not both",
            ));
        }
        (Some(at), None) => {
            keys::check_expiry(at, now).map_err(|m| ApiError::invalid("expires_at", m))?;
            at
        }
        (None, Some(secs)) => now + seconds("expires_in_secs", secs)?,
        (None, None) => return Ok(None),
    };
    Ok(Some(at))
}

/// 1..=[`MAX_SECS`] seconds as a duration; errors name the field.
pub fn seconds(field: &str, secs: u64) -> Result<chrono::Duration, ApiError> {
    if secs == 0 || secs > MAX_SECS {
        return Err(ApiError::invalid(
            field,
            format!("must be within 1..={MAX_SECS}"),
        ));
    }
    Ok(chrono::Duration::seconds(secs as i64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_expiry_is_one_of_two_forms_in_the_future() {
        let now = Utc::now();
        assert_eq!(expiry(None, None, now).unwrap(), None);
        assert_eq!(
            expiry(None, Some(60), now).unwrap(),
            Some(now + chrono::Duration::seconds(60))
        );
        let past = now - chrono::Duration::seconds(1);
        assert!(
            expiry(Some(past), None, now)
                .unwrap_err()
                .message
                .starts_with("expires_at:")
        );
        let both = expiry(Some(now), Some(1), now).unwrap_err();
        assert!(
            both.message.starts_with("expires_in_secs:"),
            "{}",
            both.message
        );
        assert!(expiry(None, Some(0), now).is_err());
        assert!(expiry(None, Some(MAX_SECS + 1), now).is_err());
    }
}

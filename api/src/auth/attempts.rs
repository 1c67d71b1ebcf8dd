//! Failed authentications, counted per source address: past a number of failures within a
//! window, the source is answered 429 (with `Retry-After`) until its window ends. One table for
//! the admin token (`api.admin_max_failures`: whatever token it sends, so the operator token
//! cannot be guessed at speed), one for `/v1` API keys (`api.auth_max_failures`: only keys that
//! would need a Postgres lookup are refused, so a flood of made-up keys costs Postgres at most
//! that many lookups per source and window).
//!
//! Sources are IPv4 addresses, or IPv6 /64 networks (one host usually holds a whole /64). At
//! most `api.admin_max_sources` are tracked: when full, expired windows are dropped, and if
//! none has expired every new source shares one window, so a flood of addresses cannot grow
//! the table nor escape the limit (it can only lock that shared window).

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The window new sources share once the table is full.
const OVERFLOW: IpAddr = IpAddr::V6(Ipv6Addr::UNSPECIFIED);

pub struct FailedAttempts {
    max_failures: u32,
    window: Duration,
    max_sources: usize,
    windows: Mutex<HashMap<IpAddr, (Instant, u32)>>,
}

impl FailedAttempts {
    pub fn new(max_failures: u32, window: Duration, max_sources: usize) -> FailedAttempts {
        FailedAttempts {
            max_failures,
            window,
            max_sources,
            windows: Mutex::new(HashMap::new()),
        }
    }

    /// How long `source` must wait before it may try again, if it is locked out.
    pub fn locked_out(&self, source: IpAddr, now: Instant) -> Option<Duration> {
        let windows = self.windows.lock().expect("attempts lock");
        let key = if windows.contains_key(&source_of(source)) {
            source_of(source)
        } else if windows.len() >= self.max_sources {
            OVERFLOW
        } else {
            return None;
        };
        let (started, failures) = *windows.get(&key)?;
        let ends = started + self.window;
        (failures >= self.max_failures && now < ends).then(|| ends - now)
    }

    /// Counts one failed attempt of `source`.
    pub fn fail(&self, source: IpAddr, now: Instant) {
        let mut windows = self.windows.lock().expect("attempts lock");
        let mut key = source_of(source);
        if !windows.contains_key(&key) && windows.len() >= self.max_sources {
            let window = self.window;
            windows.retain(|_, (started, _)| now.duration_since(*started) < window);
            if windows.len() >= self.max_sources {
                key = OVERFLOW;
            }
        }
        let entry = windows.entry(key).or_insert((now, 0));
        if now.duration_since(entry.0) >= self.window {
            *entry = (now, 0);
        }
        entry.1 = entry.1.saturating_add(1);
    }
}

/// The answer to a locked-out source: 429 `too_many_attempts`, `Retry-After` its wait.
pub fn locked_out(wait: Duration, message: &str) -> crate::error::ApiError {
    crate::error::ApiError {
        retry_after_secs: Some(wait.as_secs_f64().ceil().max(1.0) as u64),
        ..crate::error::ApiError::new(
            axum::http::StatusCode::TOO_MANY_REQUESTS,
            "too_many_attempts",
            message,
        )
    }
}

/// The address a source is counted under: IPv4 as it is (an IPv4-mapped IPv6 address too), an
/// IPv6 address by its /64.
fn source_of(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let s = v6.segments();
                IpAddr::V6(Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
            }
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_source_is_locked_out_past_the_limit_until_its_window_ends() {
        let attempts = FailedAttempts::new(3, Duration::from_secs(60), 100);
        let (a, b): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        let t0 = Instant::now();
        for _ in 0..2 {
            attempts.fail(a, t0);
        }
        assert_eq!(attempts.locked_out(a, t0), None);
        attempts.fail(a, t0);
        assert_eq!(
            attempts.locked_out(a, t0 + Duration::from_secs(10)),
            Some(Duration::from_secs(50))
        );
        assert_eq!(attempts.locked_out(b, t0), None, "another source is not");
        assert_eq!(attempts.locked_out(a, t0 + Duration::from_secs(60)), None);
        // A failure after the window starts a new one.
        attempts.fail(a, t0 + Duration::from_secs(61));
        assert_eq!(attempts.locked_out(a, t0 + Duration::from_secs(61)), None);
    }

    #[test]
    fn ipv6_sources_count_by_their_64_and_the_table_stays_bounded() {
        let attempts = FailedAttempts::new(2, Duration::from_secs(60), 4);
        let t0 = Instant::now();
        attempts.fail("2001:db8::1".parse().unwrap(), t0);
        attempts.fail("2001:db8::2".parse().unwrap(), t0);
        assert!(
            attempts
                .locked_out("2001:db8::3".parse().unwrap(), t0)
                .is_some()
        );
        // Thousands of sources: four windows at most, the rest sharing one.
        for i in 0..5000u32 {
            let ip = IpAddr::V4(std::net::Ipv4Addr::from(0x0b00_0000 + i));
            attempts.fail(ip, t0);
        }
        assert!(attempts.windows.lock().unwrap().len() <= 5);
        let fresh: IpAddr = "192.0.2.9".parse().unwrap();
        assert!(
            attempts.locked_out(fresh, t0).is_some(),
            "a new source shares the full table's window"
        );
        // Once the windows have expired, new sources get their own again.
        let later = t0 + Duration::from_secs(61);
        attempts.fail(fresh, later);
        assert_eq!(attempts.locked_out(fresh, later), None);
    }
}

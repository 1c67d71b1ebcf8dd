//! `agentfleet-api tenants …`, `keys …` and `admin …`: the operator's commands. They call
//! the same store functions as the admin API (`shared/src/store/{tenants,keys}.rs`), against
//! the configured database. Output is a table for people, or JSON with `--json`.

pub mod admin;
pub mod keys;
pub mod tenants;

use anyhow::Context;
use serde::Serialize;

/// Tells the API replicas about a change at once (`agentfleet_api::auth::invalidation`); the
/// connection is made on first use, so commands that change nothing never touch Redis.
pub fn announcer(
    settings: &agentfleet_shared::config::Settings,
) -> anyhow::Result<agentfleet_api::auth::invalidation::Announcer> {
    let conn = agentfleet_shared::events::redis_connection(&settings.redis).context("redis.url")?;
    Ok(agentfleet_api::auth::invalidation::Announcer::new(
        conn,
        &settings.redis.prefix,
        settings.redis.timeout(),
    ))
}

/// Announces `what`, or says on stderr how long the change may take without it.
pub async fn announce(
    announcer: &agentfleet_api::auth::invalidation::Announcer,
    what: agentfleet_api::auth::invalidation::Invalidation,
) {
    if !announcer.announce(what).await {
        eprintln!(
            "note: Redis was not reached; API replicas apply this within api.auth_cache_ttl_ms"
        );
    }
}

/// Prints `value` as JSON, or as the table `rows` gives.
pub fn print<T: Serialize>(json: bool, value: &T, header: &[&str], rows: Vec<Vec<String>>) {
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(value).expect("output serializes")
        );
    } else {
        print!("{}", table(header, &rows));
    }
}

/// Columns padded to their widest cell, two spaces apart.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let padded: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        format!("{}\n", padded.join("  ").trim_end())
    };
    let mut out = line(header.to_vec());
    for row in rows {
        out.push_str(&line(row.iter().map(String::as_str).collect()));
    }
    out
}

/// A time for the table: RFC 3339 to the second, `-` when absent.
pub fn when(at: Option<chrono::DateTime<chrono::Utc>>) -> String {
    at.map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
        .unwrap_or_else(|| "-".to_owned())
}

/// A duration such as `90s`, `15m`, `12h`, `30d` or `2w` (a bare number is seconds).
pub fn parse_duration(raw: &str) -> anyhow::Result<chrono::Duration> {
    let raw = raw.trim();
    let split = raw.find(|c: char| !c.is_ascii_digit()).unwrap_or(raw.len());
    let (number, unit) = raw.split_at(split);
    let n: i64 = number
        .parse()
        .with_context(|| format!("`{raw}`: expected a number and a unit (s, m, h, d, w)"))?;
    let secs_per = match unit {
        "" | "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        "w" => 7 * 86_400,
        other => anyhow::bail!("`{raw}`: unknown unit `{other}` (s, m, h, d, w)"),
    };
    let secs = n
        .checked_mul(secs_per)
        .filter(|s| *s > 0 && *s as u64 <= agentfleet_shared::store::keys::MAX_SECS)
        .with_context(|| format!("`{raw}`: must be positive and at most 100 years"))?;
    Ok(chrono::Duration::seconds(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_with_their_units() {
        assert_eq!(parse_duration("30d").unwrap().num_seconds(), 30 * 86_400);
        assert_eq!(parse_duration("90").unwrap().num_seconds(), 90);
        assert_eq!(parse_duration("15m").unwrap().num_seconds(), 900);
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("3y").is_err());
        assert!(parse_duration("d").is_err());
        assert!(parse_duration("999999999999w").is_err());
    }

    #[test]
    fn a_table_pads_columns_to_their_widest_cell() {
        let out = table(
            &["ID", "NAME"],
            &[
                vec!["1".into(), "long name".into()],
                vec!["22".into(), "x".into()],
            ],
        );
        assert_eq!(out, "ID  NAME\n1   long name\n22  x\n");
    }
}

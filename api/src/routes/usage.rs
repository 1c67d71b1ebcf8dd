//! `GET /v1/usage`: the caller's tenant's token and tool-call usage per UTC day.

use axum::Json;
use axum::extract::State;
use chrono::{Days, NaiveDate, Utc};
use serde::Deserialize;

use agentfleet_shared::store::usage;

use crate::auth::caller::Caller;
use crate::error::ApiError;
use crate::extract::QueryParams;
use crate::routes::view;
use crate::state::AppState;

/// Days `GET /v1/usage` covers when `from` is absent (today included).
pub const DEFAULT_DAYS: u64 = 30;

/// Read as text and checked here, so every error names its parameter.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UsageQuery {
    from: Option<String>,
    to: Option<String>,
}

/// `GET /v1/usage?from=YYYY-MM-DD&to=YYYY-MM-DD`: UTC days, both included; `to` defaults to
/// today, `from` to 29 days before `to`. Any two well-formed days are a valid question: a
/// `from` after `to` covers no day, and a range longer than `api.max_usage_days` is cut to
/// its last days (the answer's `from` and `to` say what it covers).
#[utoipa::path(get, path = "/v1/usage", tag = "usage", operation_id = "get_usage",
    params(("from" = Option<String>, Query, format = Date, pattern = "^[0-9]{4}-[0-9]{2}-[0-9]{2}$", description = "First UTC day (YYYY-MM-DD); 29 days before `to` when absent"),
           ("to" = Option<String>, Query, format = Date, pattern = "^[0-9]{4}-[0-9]{2}-[0-9]{2}$", description = "Last UTC day (YYYY-MM-DD), included; today when absent")),
    responses((status = 200, description = "The tenant's usage per day and in total", body = view::UsageReport),
              (status = 422, description = "A malformed day (not `YYYY-MM-DD`) or an unknown parameter", body = view::ErrorBody)))]
pub async fn get_usage(
    State(state): State<AppState>,
    Caller(caller): Caller,
    QueryParams(q): QueryParams<UsageQuery>,
) -> Result<Json<view::UsageReport>, ApiError> {
    let (from, to) = range(
        q.from.as_deref(),
        q.to.as_deref(),
        Utc::now().date_naive(),
        state.settings.api.max_usage_days.get(),
    )?;
    let rows = usage::daily(&state.pool, caller.tenant_id, from, to)
        .await
        .map_err(ApiError::unexpected)?;
    let mut total = view::UsageFigures::default();
    let days = rows
        .into_iter()
        .map(|d| {
            let figures = view::UsageFigures {
                prompt_tokens: d.prompt_tokens,
                completion_tokens: d.completion_tokens,
                total_tokens: d.prompt_tokens.saturating_add(d.completion_tokens),
                estimated_tokens: d.estimated_tokens,
                tool_calls: d.tool_calls,
                runs: d.runs,
            };
            total = add(&total, &figures);
            view::UsageDay {
                day: d.day,
                figures,
            }
        })
        .collect();
    Ok(Json(view::UsageReport {
        from,
        to,
        days,
        total,
    }))
}

fn add(a: &view::UsageFigures, b: &view::UsageFigures) -> view::UsageFigures {
    view::UsageFigures {
        prompt_tokens: a.prompt_tokens.saturating_add(b.prompt_tokens),
        completion_tokens: a.completion_tokens.saturating_add(b.completion_tokens),
        total_tokens: a.total_tokens.saturating_add(b.total_tokens),
        estimated_tokens: a.estimated_tokens.saturating_add(b.estimated_tokens),
        tool_calls: a.tool_calls.saturating_add(b.tool_calls),
        runs: a.runs.saturating_add(b.runs),
    }
}

/// The days to report: each a real `YYYY-MM-DD` day (else 422 naming it); `from` after `to` is
/// an empty range; more than `max_days` days are cut to the last `max_days` up to `to`.
fn range(
    from: Option<&str>,
    to: Option<&str>,
    today: NaiveDate,
    max_days: u32,
) -> Result<(NaiveDate, NaiveDate), ApiError> {
    let to = match to {
        Some(raw) => day("to", raw)?,
        None => today,
    };
    let from = match from {
        Some(raw) => day("from", raw)?,
        None => to
            .checked_sub_days(Days::new(DEFAULT_DAYS - 1))
            .unwrap_or(NaiveDate::MIN),
    };
    let days = (to - from).num_days() + 1;
    let from = if days > i64::from(max_days) {
        to.checked_sub_days(Days::new(u64::from(max_days.max(1)) - 1))
            .unwrap_or(NaiveDate::MIN)
    } else {
        from
    };
    Ok((from, to))
}

/// A day written exactly `YYYY-MM-DD`.
fn day(field: &str, raw: &str) -> Result<NaiveDate, ApiError> {
    let well_formed = raw.len() == 10
        && raw.bytes().enumerate().all(|(i, b)| {
            if i == 4 || i == 7 {
                b == b'-'
            } else {
                b.is_ascii_digit()
            }
        });
    well_formed
        .then(|| NaiveDate::parse_from_str(raw, "%Y-%m-%d").ok())
        .flatten()
        .ok_or_else(|| ApiError::invalid(field, "must be a day written YYYY-MM-DD"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(s: &str) -> NaiveDate {
        NaiveDate::parse_from_str(s, "%Y-%m-%d").unwrap()
    }

    #[test]
    fn the_range_defaults_to_thirty_days_and_is_checked() {
        let today = d("2026-03-10");
        assert_eq!(
            range(None, None, today, 366).unwrap(),
            (d("2026-02-09"), today)
        );
        assert_eq!(
            range(Some("2026-03-01"), Some("2026-03-01"), today, 366).unwrap(),
            (d("2026-03-01"), d("2026-03-01"))
        );
        let message = |r: Result<_, ApiError>| r.unwrap_err().message;
        for bad in [
            "2026-02-30",
            "2026-3-01",
            "20260301",
            "2026-03-01x",
            "",
            "２０２６-03-01",
        ] {
            assert!(
                message(range(Some(bad), None, today, 366)).starts_with("from: "),
                "{bad}"
            );
        }
        assert!(message(range(None, Some("2026-13-01"), today, 366)).starts_with("to: "));
        // `from` after `to`: no day (the query finds none).
        assert_eq!(
            range(Some("2026-03-02"), Some("2026-03-01"), today, 366).unwrap(),
            (d("2026-03-02"), d("2026-03-01"))
        );
        // Too long: the last 366 days up to `to`.
        assert_eq!(
            range(Some("2025-01-01"), Some("2026-03-01"), today, 366).unwrap(),
            (d("2025-03-01"), d("2026-03-01"))
        );
        assert_eq!(
            range(Some("0001-01-01"), Some("9999-12-31"), today, 366).unwrap(),
            (d("9998-12-31"), d("9999-12-31"))
        );
        assert_eq!(
            range(Some("2025-03-01"), Some("2026-03-01"), today, 366).unwrap(),
            (d("2025-03-01"), d("2026-03-01"))
        );
    }
}

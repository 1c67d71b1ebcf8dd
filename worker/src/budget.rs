//! Token budgets: a run's own (`agent.max_tokens_total`) and its tenant's per UTC day
//! (`tokens_per_day`, the tenant's `tenants.limits` over `[limits]`). Checked before every
//! model call against figures the worker already has — read by the claim, then by each turn
//! commit's own `RETURNING` — so the check costs no query.
//!
//! Neither budget can be known to hold before a call (its cost is known after), so a run stops
//! once a budget is reached: it may overshoot by one model call, never by more. It stops
//! between iterations: the calls of the turn that crossed the budget were recorded for
//! dispatch with it and are settled as usual (they finish, a confirmation or a question
//! still pauses the run, `complete` still completes it); only the next model call is refused.
//! Refused means failed with `budget_exceeded`, or, for the tenant's budget with
//! `worker.on_budget_exceeded = "pause"`, paused as waiting for input (`pause::for_budget`).

use std::sync::Mutex;

use chrono::NaiveDate;
use serde_json::Value;
use sqlx::types::Json;

/// What the run and its tenant have spent, as last read from Postgres.
#[derive(Debug, Clone, PartialEq)]
pub struct Spent {
    pub run_tokens: i64,
    pub tenant_tokens_today: i64,
    /// The UTC day `tenant_tokens_today` belongs to: a figure from an earlier day says nothing
    /// about today's.
    pub day: NaiveDate,
    /// The tenant's effective daily budget; 0: none.
    pub tenant_tokens_per_day: u64,
}

impl Spent {
    /// Figures read now; `stored` is the tenant's own `tokens_per_day` as the database holds
    /// it (`None`, or not a non-negative integer: the configured default).
    pub fn read(
        run_tokens: i64,
        tenant_tokens_today: i64,
        stored: Option<&Json<Value>>,
        default: u64,
    ) -> Spent {
        let own = stored.and_then(|Json(v)| {
            let n = v.as_u64();
            if n.is_none() {
                tracing::warn!(value = %v, "tenants.limits.tokens_per_day is not a non-negative integer; using the default");
            }
            n
        });
        Spent {
            run_tokens,
            tenant_tokens_today,
            day: chrono::Utc::now().date_naive(),
            tenant_tokens_per_day: own.unwrap_or(default),
        }
    }
}

/// Which budget a run reached.
#[derive(Debug, Clone, PartialEq)]
pub enum Exceeded {
    Run { used: i64, limit: i64 },
    Tenant { used: i64, limit: u64 },
}

impl Exceeded {
    /// The run's error message: which budget, how much was used.
    pub fn message(&self) -> String {
        match self {
            Exceeded::Run { used, limit } => format!(
                "the run used {used} tokens, reaching its budget agent.max_tokens_total ({limit})"
            ),
            Exceeded::Tenant { used, limit } => format!(
                "the tenant used {used} tokens today (UTC), reaching its daily budget tokens_per_day ({limit})"
            ),
        }
    }
}

/// The last figures of one holding of a run.
pub struct Budget {
    run_limit: Option<i64>,
    spent: Mutex<Spent>,
}

impl Budget {
    pub fn new(run_limit: Option<i64>, spent: Spent) -> Budget {
        Budget {
            run_limit,
            spent: Mutex::new(spent),
        }
    }

    pub fn update(&self, spent: Spent) {
        *self.spent.lock().expect("budget lock") = spent;
    }

    /// Whether another model call may start, judged on `today` (UTC).
    pub fn check(&self, today: NaiveDate) -> Result<(), Exceeded> {
        let spent = self.spent.lock().expect("budget lock").clone();
        if let Some(limit) = self.run_limit
            && spent.run_tokens >= limit
        {
            return Err(Exceeded::Run {
                used: spent.run_tokens,
                limit,
            });
        }
        let limit = spent.tenant_tokens_per_day;
        if limit > 0 && spent.day == today && spent.tenant_tokens_today as u64 >= limit {
            return Err(Exceeded::Tenant {
                used: spent.tenant_tokens_today,
                limit,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn day(d: u32) -> NaiveDate {
        NaiveDate::from_ymd_opt(2026, 1, d).unwrap()
    }

    fn spent(run: i64, tenant: i64, per_day: u64) -> Spent {
        Spent {
            run_tokens: run,
            tenant_tokens_today: tenant,
            day: day(1),
            tenant_tokens_per_day: per_day,
        }
    }

    #[test]
    fn a_budget_stops_the_run_once_reached_and_only_on_its_day() {
        let b = Budget::new(Some(100), spent(99, 500, 1000));
        assert_eq!(b.check(day(1)), Ok(()));
        b.update(spent(100, 500, 1000));
        assert_eq!(
            b.check(day(1)),
            Err(Exceeded::Run {
                used: 100,
                limit: 100
            })
        );
        let b = Budget::new(None, spent(5000, 1000, 1000));
        assert_eq!(
            b.check(day(1)),
            Err(Exceeded::Tenant {
                used: 1000,
                limit: 1000
            })
        );
        assert_eq!(b.check(day(2)), Ok(()), "yesterday's figure");
        let unlimited = Budget::new(None, spent(5000, 1_000_000, 0));
        assert_eq!(unlimited.check(day(1)), Ok(()));
    }

    #[test]
    fn the_tenants_own_budget_overrides_the_default_unless_unusable() {
        let own = Json(json!(50));
        assert_eq!(Spent::read(0, 0, Some(&own), 10).tenant_tokens_per_day, 50);
        assert_eq!(Spent::read(0, 0, None, 10).tenant_tokens_per_day, 10);
        let bad = Json(json!("lots"));
        assert_eq!(Spent::read(0, 0, Some(&bad), 10).tenant_tokens_per_day, 10);
        let zero = Json(json!(0));
        assert_eq!(Spent::read(0, 0, Some(&zero), 10).tenant_tokens_per_day, 0);
    }
}

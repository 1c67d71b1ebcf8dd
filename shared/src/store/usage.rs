//! Reading a tenant's usage per UTC day (`usage_days`: the shards of each day summed). Written
//! only by the turn commit (`turns::record_many`), in the statement it runs anyway.

use chrono::NaiveDate;
use sqlx::PgPool;
use uuid::Uuid;

use super::StoreError;

/// One tenant's usage on one UTC day.
#[derive(Debug, Clone, Default, PartialEq, sqlx::FromRow)]
pub struct UsageDay {
    pub day: NaiveDate,
    /// Prompt and completion tokens, estimated ones included.
    pub prompt_tokens: i64,
    pub completion_tokens: i64,
    /// The part of prompt + completion the worker estimated (no usage from the provider).
    pub estimated_tokens: i64,
    pub tool_calls: i64,
    /// Runs whose first model turn was that day.
    pub runs: i64,
}

/// The days of `from..=to` on which `tenant` used anything, oldest first.
pub async fn daily(
    pool: &PgPool,
    tenant: Uuid,
    from: NaiveDate,
    to: NaiveDate,
) -> Result<Vec<UsageDay>, StoreError> {
    Ok(sqlx::query_as::<_, UsageDay>(
        "SELECT day, prompt_tokens, completion_tokens, estimated_tokens, tool_calls, runs
         FROM usage_days WHERE tenant_id = $1 AND day BETWEEN $2 AND $3 ORDER BY day",
    )
    .bind(tenant)
    .bind(from)
    .bind(to)
    .fetch_all(pool)
    .await?)
}

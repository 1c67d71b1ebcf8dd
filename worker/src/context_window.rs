//! Fits a thread's history into the model's context budget.
//!
//! Tokens are estimated (4 bytes a token, plus a per-message overhead): exact counts differ per
//! model family and the budget keeps a safety margin. The newest messages are kept whole while
//! they fit; an assistant message and the tool results answering it are kept or dropped
//! together (the API rejects orphaned tool results); the kept history starts at a user turn.
//! If even the newest turn is too large, long tool results in it are cut in the middle.

use serde_json::Value;

const OVERHEAD_TOKENS: usize = 4;

pub fn estimate_tokens(message: &Value) -> usize {
    message.to_string().len() / 4 + OVERHEAD_TOKENS
}

/// Returns the messages to send, oldest first.
pub fn fit(history: Vec<Value>, budget_tokens: usize) -> Vec<Value> {
    // Group into units: an assistant message with its following tool results, or one message.
    let mut units: Vec<Vec<Value>> = Vec::new();
    for msg in history {
        let is_tool = msg.get("role").and_then(Value::as_str) == Some("tool");
        match units.last_mut() {
            Some(unit) if is_tool => unit.push(msg),
            _ => units.push(vec![msg]),
        }
    }
    let mut kept: Vec<Vec<Value>> = Vec::new();
    let mut used = 0usize;
    for unit in units.into_iter().rev() {
        let cost: usize = unit.iter().map(estimate_tokens).sum();
        if used + cost > budget_tokens {
            if kept.is_empty() {
                kept.push(shrink(unit, budget_tokens));
            }
            break;
        }
        used += cost;
        kept.push(unit);
    }
    kept.reverse();
    // Start at a user turn when one is kept, so the model never sees a dangling answer.
    if let Some(first_user) = kept
        .iter()
        .position(|u| u[0].get("role").and_then(Value::as_str) == Some("user"))
    {
        kept.drain(..first_user);
    }
    kept.into_iter().flatten().collect()
}

/// Cuts the middle of long string contents until the unit fits (or cannot shrink further).
fn shrink(mut unit: Vec<Value>, budget_tokens: usize) -> Vec<Value> {
    let budget_bytes = budget_tokens.saturating_mul(4);
    let per_message = (budget_bytes / unit.len().max(1)).max(256);
    for msg in &mut unit {
        if let Some(Value::String(s)) = msg.get_mut("content")
            && s.len() > per_message
        {
            *s = cut_middle(s, per_message);
        }
    }
    unit
}

fn cut_middle(s: &str, max: usize) -> String {
    let keep = max / 2;
    let mut head = keep.min(s.len());
    while !s.is_char_boundary(head) {
        head -= 1;
    }
    let mut tail = s.len().saturating_sub(keep);
    while !s.is_char_boundary(tail) {
        tail += 1;
    }
    format!(
        "{}\n[… {} bytes omitted …]\n{}",
        &s[..head],
        tail - head,
        &s[tail..]
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn user(t: &str) -> Value {
        json!({"role": "user", "content": t})
    }

    #[test]
    fn keeps_everything_that_fits() {
        let h = vec![
            user("a"),
            json!({"role": "assistant", "content": "b"}),
            user("c"),
        ];
        assert_eq!(fit(h.clone(), 10_000), h);
    }

    #[test]
    fn drops_oldest_and_starts_at_a_user_turn() {
        let big = "x".repeat(4000);
        let h = vec![
            user(&big),
            json!({"role": "assistant", "content": null, "tool_calls": [{"id": "1"}]}),
            json!({"role": "tool", "tool_call_id": "1", "content": big}),
            user("latest"),
        ];
        let out = fit(h, 1100);
        assert_eq!(out.len(), 1, "{out:?}");
        assert_eq!(out[0]["content"], "latest");
    }

    #[test]
    fn tool_results_stay_with_their_call() {
        let h = vec![
            user("q"),
            json!({"role": "assistant", "content": null, "tool_calls": [{"id": "1"}]}),
            json!({"role": "tool", "tool_call_id": "1", "content": "r"}),
        ];
        let out = fit(h.clone(), 10_000);
        assert_eq!(out, h);
    }

    #[test]
    fn shrinks_an_oversize_newest_turn() {
        let out = fit(vec![user(&"y".repeat(100_000))], 1000);
        assert_eq!(out.len(), 1);
        let content = out[0]["content"].as_str().unwrap();
        assert!(content.len() < 10_000 && content.contains("omitted"));
    }
}

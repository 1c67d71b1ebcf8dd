//! Errors as one line a person can act on: each cause once, in order, and without the noise
//! some libraries add (Postgres's C source line, a cause a wrapper already printed).

use std::error::Error;

/// `err` and its causes, each said once, joined by `: ` on one line.
pub fn one_line(err: &anyhow::Error) -> String {
    chain_line(err.chain())
}

/// As [`one_line`], for any error with a `source` chain.
pub fn error_line(err: &(dyn Error + 'static)) -> String {
    let mut chain = Vec::new();
    let mut next = Some(err);
    while let Some(e) = next {
        chain.push(e);
        next = e.source();
    }
    chain_line(chain.into_iter())
}

fn chain_line<'a>(chain: impl Iterator<Item = &'a (dyn Error + 'static)>) -> String {
    let mut out = String::new();
    for cause in chain {
        let (text, complete) = describe(cause);
        // Wrappers often print their source inline ("database: {0}"); then the source, when
        // the chain reaches it, adds nothing.
        if text.is_empty() || out.contains(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
        if complete {
            break;
        }
    }
    out
}

/// A cause as one clean line, and whether it already says everything its own causes would.
fn describe(cause: &(dyn Error + 'static)) -> (String, bool) {
    if let Some(sqlx::Error::Database(db)) = cause.downcast_ref::<sqlx::Error>() {
        return (database_error(db.as_ref()), true);
    }
    if let Some(db) = cause.downcast_ref::<sqlx::postgres::PgDatabaseError>() {
        return (database_error(db), true);
    }
    let text = cause.to_string();
    let text = strip_source_lines(&text);
    (text.split_whitespace().collect::<Vec<_>>().join(" "), false)
}

/// A Postgres error without sqlx's "error returned from database:" nor the "at line N" of
/// Postgres's own C source that its Display appends.
fn database_error(db: &dyn sqlx::error::DatabaseError) -> String {
    match db.code() {
        Some(code) => format!("{} (SQLSTATE {code})", db.message()),
        None => db.message().to_owned(),
    }
}

/// `err` (a database error included) as one line: for `Display` impls of error types that
/// wrap one, e.g. `#[error("database: {}", report::sqlx_line(.0))]`.
pub fn sqlx_line(err: &sqlx::Error) -> String {
    error_line(err)
}

/// Removes every " at line N" that a Postgres error's Display put inside a wrapper's text.
fn strip_source_lines(text: &str) -> String {
    const MARK: &str = " at line ";
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(MARK) {
        let after = &rest[at + MARK.len()..];
        let digits = after.chars().take_while(char::is_ascii_digit).count();
        out.push_str(&rest[..at]);
        if digits == 0 {
            out.push_str(MARK);
        }
        rest = &after[digits..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    enum Outer {
        #[error("store: {0}")]
        Inner(#[from] std::io::Error),
    }

    #[test]
    fn a_cause_printed_inline_is_not_repeated() {
        let err = anyhow::Error::from(Outer::from(std::io::Error::other("disk full")))
            .context("saving the run");
        assert_eq!(one_line(&err), "saving the run: store: disk full");
    }

    #[test]
    fn postgres_source_lines_are_dropped_and_newlines_folded() {
        assert_eq!(
            strip_source_lines("relation \"runs\" does not exist at line 1392: x at line 7"),
            "relation \"runs\" does not exist: x"
        );
        assert_eq!(strip_source_lines("ends at line "), "ends at line ");
        let err = anyhow::anyhow!("two\n  lines");
        assert_eq!(one_line(&err), "two lines");
    }
}

//! `[export]`: `GET /v1/export`, a tenant's threads, runs, messages and tool calls as JSON lines.

use serde::Deserialize;

use super::{ConfigError, invalid};

/// A tenant's export (`GET /v1/export`): streamed page by page, so its size never sits in the
/// API's memory.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExportSettings {
    /// Rows one query of an export reads (a page of threads, runs, tool calls or messages); what
    /// an export holds in memory at once is one such page. 1–10000.
    pub page_size: u32,
}

impl ExportSettings {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if !(1..=10_000).contains(&self.page_size) {
            return Err(invalid("export.page_size", "must be within 1..=10000"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::config::tests::load;

    #[test]
    fn the_export_page_size_is_bounded() {
        assert_eq!(load(&[]).unwrap().export.page_size, 200);
        let err = load(&[("export.page_size", "0")]).unwrap_err().to_string();
        assert!(err.contains("`export.page_size`"), "{err}");
    }
}

//! Where the API address and key come from: flags, then the environment (`AGENTFLEET_API`,
//! `AGENTFLEET_KEY`; clap reads both into the flags), then a TOML file with `api` and `key`.
//! The file is `--config`, else `AGENTFLEETCTL_CONFIG`, else
//! `$XDG_CONFIG_HOME/agentfleet/ctl.toml` (or `~/.config/agentfleet/ctl.toml`). Its own
//! variable is not `AGENTFLEET_CONFIG`: that one names the servers' settings file, which an
//! operator may well have set in the same shell.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::error::{CtlError, Result};

/// Nobody keeps a config file this big; a larger one is a mistake (or not a config file).
const MAX_CONFIG_BYTES: u64 = 64 * 1024;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    api: Option<String>,
    key: Option<String>,
}

/// The resolved connection settings. `Debug` leaves the key out.
#[derive(Clone)]
pub struct Connection {
    /// Base URL without a trailing slash, e.g. `http://127.0.0.1:8080`.
    pub api: String,
    pub key: String,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("api", &self.api)
            .field("key", &"<redacted>")
            .finish()
    }
}

/// What the flags (or their environment variables) gave.
#[derive(Debug, Default)]
pub struct Given<'a> {
    pub api: Option<&'a str>,
    pub key: Option<&'a str>,
    /// `--config`/`AGENTFLEETCTL_CONFIG`: must exist when given explicitly.
    pub config: Option<&'a Path>,
}

pub fn default_path() -> Option<PathBuf> {
    let base = match std::env::var_os("XDG_CONFIG_HOME").filter(|v| !v.is_empty()) {
        Some(x) => PathBuf::from(x),
        None => PathBuf::from(std::env::var_os("HOME").filter(|v| !v.is_empty())?).join(".config"),
    };
    Some(base.join("agentfleet").join("ctl.toml"))
}

fn read_file(path: &Path) -> Result<FileConfig> {
    let meta = std::fs::metadata(path)
        .map_err(|e| CtlError::Usage(format!("config file {}: {e}", path.display())))?;
    if meta.len() > MAX_CONFIG_BYTES {
        return Err(CtlError::Usage(format!(
            "config file {}: larger than {MAX_CONFIG_BYTES} bytes",
            path.display()
        )));
    }
    let text = std::fs::read_to_string(path)
        .map_err(|e| CtlError::Usage(format!("config file {}: {e}", path.display())))?;
    // The parser's message quotes the offending line, which may hold the key: name only where.
    toml::from_str(&text).map_err(|e| {
        let at = e
            .span()
            .map(|s| format!(" (at byte {})", s.start))
            .unwrap_or_default();
        CtlError::Usage(format!(
            "config file {}: not valid TOML with string fields `api` and `key`{at}",
            path.display()
        ))
    })
}

/// Resolves the connection; a missing address or key is a usage error naming every source.
pub fn resolve(given: &Given<'_>) -> Result<Connection> {
    let file = match given.config {
        Some(p) => read_file(p)?,
        None => match default_path().filter(|p| p.exists()) {
            Some(p) => read_file(&p)?,
            None => FileConfig::default(),
        },
    };
    let pick = |flag: Option<&str>, file: Option<String>| {
        flag.map(str::to_owned)
            .or(file)
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty())
    };
    let api = pick(given.api, file.api).ok_or_else(|| {
        CtlError::Usage(
            "no API address: pass --api URL, set AGENTFLEET_API, or put `api = \"…\"` in the config file".into(),
        )
    })?;
    let key = pick(given.key, file.key).ok_or_else(|| {
        CtlError::Usage(
            "no API key: pass --key, set AGENTFLEET_KEY, or put `key = \"…\"` in the config file"
                .into(),
        )
    })?;
    let api = api.trim_end_matches('/').to_owned();
    let url = reqwest::Url::parse(&api)
        .map_err(|e| CtlError::Usage(format!("--api `{api}` is not a URL: {e}")))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(CtlError::Usage(format!(
            "--api `{api}` must be an http:// or https:// URL"
        )));
    }
    if key.chars().any(|c| c.is_control() || c == ' ') {
        return Err(CtlError::Usage(
            "the API key holds spaces or control characters".into(),
        ));
    }
    Ok(Connection { api, key })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(text: &str) -> (tempdir::Dir, PathBuf) {
        let d = tempdir::Dir::new();
        let p = d.0.join("ctl.toml");
        std::fs::write(&p, text).unwrap();
        (d, p)
    }

    mod tempdir {
        pub struct Dir(pub std::path::PathBuf);
        impl Dir {
            pub fn new() -> Dir {
                let p = std::env::temp_dir().join(format!("afctl-{}", uuid::Uuid::new_v4()));
                std::fs::create_dir_all(&p).unwrap();
                Dir(p)
            }
        }
        impl Drop for Dir {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
    }

    #[test]
    fn flags_win_over_the_file_and_the_file_fills_the_rest() {
        let (_d, p) = write("api = \"http://file:1/\"\nkey = \"filekey\"\n");
        let c = resolve(&Given {
            api: Some("http://flag:2"),
            key: None,
            config: Some(&p),
        })
        .unwrap();
        assert_eq!(c.api, "http://flag:2");
        assert_eq!(c.key, "filekey");
        let c = resolve(&Given {
            api: None,
            key: None,
            config: Some(&p),
        })
        .unwrap();
        assert_eq!(c.api, "http://file:1", "the trailing slash is dropped");
    }

    #[test]
    fn a_missing_key_or_bad_file_is_a_usage_error_that_never_shows_the_key() {
        let (_d, p) = write("api = \"http://x:1\"\n");
        let e = resolve(&Given {
            config: Some(&p),
            ..Given::default()
        })
        .unwrap_err();
        assert!(e.to_string().contains("no API key"), "{e}");
        assert_eq!(e.exit_code(), 2);
        let (_d, p) = write("key = \"secret-key-value\nnot toml");
        let e = resolve(&Given {
            config: Some(&p),
            ..Given::default()
        })
        .unwrap_err();
        assert!(!e.to_string().contains("secret-key-value"), "{e}");
        assert_eq!(e.exit_code(), 2);
        let e = resolve(&Given {
            api: Some("ftp://x"),
            key: Some("k"),
            config: Some(&p.with_file_name("absent.toml")),
        })
        .unwrap_err();
        assert!(e.to_string().contains("absent.toml"), "{e}");
        assert!(
            format!(
                "{:?}",
                Connection {
                    api: "a".into(),
                    key: "sekrit".into()
                }
            )
            .contains("redacted")
        );
    }
}

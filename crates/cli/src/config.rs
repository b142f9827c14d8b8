//! Where the CLI talks to and as whom: `--server`/`BERTH_SERVER` and
//! `--token`/`BERTH_TOKEN`, else the current context of the config file
//! (`$BERTH_CONFIG`, else `~/.config/berth/config.toml`), written by `berth login`:
//!
//! ```toml
//! current = "prod"
//! [contexts.prod]
//! server = "https://berth.example.org"
//! token = "eyJ…"
//! team = "nlp"          # the team commands use when none is given
//! ```

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::{Context as _, Result};
use serde::{Deserialize, Serialize};

/// The server berthd listens on when nothing else is said.
pub const DEFAULT_SERVER: &str = "http://127.0.0.1:8080";

#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Config {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current: Option<String>,
    #[serde(default)]
    pub contexts: BTreeMap<String, Context>,
}

/// One Berth installation and the credentials for it.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Context {
    pub server: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub team: Option<String>,
}

impl Config {
    pub fn path() -> PathBuf {
        if let Some(p) = std::env::var_os("BERTH_CONFIG") {
            return PathBuf::from(p);
        }
        let base = std::env::var_os("XDG_CONFIG_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")))
            .unwrap_or_else(|| PathBuf::from("."));
        base.join("berth").join("config.toml")
    }

    /// The config file, or an empty config when there is none.
    pub fn load() -> Result<Self> {
        let path = Self::path();
        match std::fs::read_to_string(&path) {
            Ok(text) => toml::from_str(&text).with_context(|| format!("reading {}", path.display())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Self::default()),
            Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
        }
    }

    /// Writes the file, readable by its owner only (it holds tokens).
    pub fn save(&self) -> Result<PathBuf> {
        let path = Self::path();
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        let text = toml::to_string(self).context("writing the config")?;
        let tmp = path.with_extension("toml.tmp");
        {
            use std::io::Write as _;
            use std::os::unix::fs::OpenOptionsExt as _;
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&tmp)
                .with_context(|| format!("writing {}", tmp.display()))?;
            f.write_all(text.as_bytes())?;
        }
        std::fs::rename(&tmp, &path).with_context(|| format!("writing {}", path.display()))?;
        Ok(path)
    }

    /// The context named, or the current one.
    pub fn context(&self, name: Option<&str>) -> Option<&Context> {
        self.contexts.get(name.or(self.current.as_deref())?)
    }
}

//! The service token: a value, or a file (a mounted Secret) re-read when it changes.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::SystemTime;

/// Why there is no token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("no service token: {0}")]
pub struct TokenError(pub String);

/// The version of a file last read: what identifies it (device, inode, size, mtime),
/// so a file is re-read only when it changed. Kubernetes updates a mounted Secret by
/// swapping a `..data` symlink, which a `stat` through the link sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileVersion {
    dev: u64,
    ino: u64,
    len: u64,
    modified: Option<SystemTime>,
}

impl FileVersion {
    /// The version of the file `path` leads to now (symlinks followed).
    pub fn of(path: &Path) -> std::io::Result<Self> {
        let meta = std::fs::metadata(path)?;
        #[cfg(unix)]
        let (dev, ino) = {
            use std::os::unix::fs::MetadataExt;
            (meta.dev(), meta.ino())
        };
        #[cfg(not(unix))]
        let (dev, ino) = (0, 0);
        Ok(Self {
            dev,
            ino,
            len: meta.len(),
            modified: meta.modified().ok(),
        })
    }
}

/// Where the service token comes from: a value, or a file (a mounted Secret) that is
/// re-read when it changes, so a rotated token needs no restart.
pub enum TokenSource {
    Static(String),
    File {
        path: PathBuf,
        cached: Mutex<(Option<FileVersion>, String)>,
    },
}

impl Clone for TokenSource {
    /// The same source; a file is read again by the copy when it changes.
    fn clone(&self) -> Self {
        match self {
            TokenSource::Static(token) => TokenSource::Static(token.clone()),
            TokenSource::File { path, cached } => TokenSource::File {
                path: path.clone(),
                cached: Mutex::new(cached.lock().unwrap_or_else(|e| e.into_inner()).clone()),
            },
        }
    }
}

impl TokenSource {
    /// A token read from `path`; fails at once when the file is unreadable or empty.
    pub fn file(path: PathBuf) -> anyhow::Result<Self> {
        let source = TokenSource::File {
            path,
            cached: Mutex::new((None, String::new())),
        };
        source.token().map_err(|e| anyhow::anyhow!(e))?;
        Ok(source)
    }

    /// From a value (trimmed, when not empty) or else a file: how every component's
    /// `--service-token` / `--service-token-file` pair reads.
    pub fn from_options(value: Option<&str>, file: Option<&Path>) -> anyhow::Result<Self> {
        match (value.map(str::trim), file) {
            (Some(token), _) if !token.is_empty() => Ok(TokenSource::Static(token.to_owned())),
            (_, Some(path)) => TokenSource::file(path.to_owned()).map_err(|e| {
                anyhow::anyhow!("reading the service token file {}: {e}", path.display())
            }),
            _ => anyhow::bail!("give --service-token or --service-token-file"),
        }
    }

    pub fn token(&self) -> Result<String, TokenError> {
        match self {
            TokenSource::Static(token) => Ok(token.clone()),
            TokenSource::File { path, cached } => {
                let version = FileVersion::of(path).ok();
                let mut cached = cached.lock().unwrap_or_else(|e| e.into_inner());
                if version.is_some() && cached.0 == version {
                    return Ok(cached.1.clone());
                }
                let token = std::fs::read_to_string(path)
                    .map_err(|e| TokenError(format!("{}: {e}", path.display())))?
                    .trim()
                    .to_owned();
                if token.is_empty() {
                    return Err(TokenError(format!("{} is empty", path.display())));
                }
                *cached = (version, token.clone());
                Ok(token)
            }
        }
    }
}

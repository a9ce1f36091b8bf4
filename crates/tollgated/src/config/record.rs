//! `[record]`: the traffic record `tollgate plan` replays (see `crate::record`).
//!
//! ```toml
//! [record]
//! path = "traffic.jsonl"     # relative to this file; unset: nothing is recorded
//! max_file_bytes = 67108864  # a file is rotated past this size (path.1, path.2, ...)
//! keep_files = 4             # rotated files kept beside the live one
//! sample = 1.0               # the share of identities recorded, each with all its traffic
//! identities = "raw"         # or "hashed": keyed hashes (see hash_key_env)
//! hash_key_env = "TOLLGATE_RECORD_HASH_KEY"
//! buffer = 16384             # lines queued for the writer; a full queue drops and counts
//! buffer_bytes = 16777216    # and what they hold at most (their identities, their requests)
//! ```

use std::path::{Path, PathBuf};

use serde::Deserialize;
use toml::Spanned;

use super::{ConfigError, Errors};

/// `[record]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRecord {
    pub(super) path: Option<Spanned<String>>,
    pub(super) max_file_bytes: Option<Spanned<u64>>,
    pub(super) keep_files: Option<Spanned<u32>>,
    pub(super) sample: Option<Spanned<f64>>,
    pub(super) identities: Option<Spanned<String>>,
    pub(super) hash_key_env: Option<Spanned<String>>,
    pub(super) buffer: Option<Spanned<u32>>,
    pub(super) buffer_bytes: Option<Spanned<u64>>,
}

/// `[record]`, validated: `None` when no path is set.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RecordSettings {
    /// The live file; rotated files are `path.1` (newest) to `path.<keep_files>`.
    pub(crate) path: PathBuf,
    pub(crate) max_file_bytes: u64,
    pub(crate) keep_files: u32,
    /// The share of identities recorded, in (0, 1].
    pub(crate) sample: f64,
    /// The variable holding the hashing key, when identities are hashed.
    pub(crate) hash_key_env: Option<String>,
    /// Lines queued for the writer.
    pub(crate) buffer: usize,
    /// What the queued lines hold at most, in bytes (their identities, their Envoy requests).
    pub(crate) buffer_bytes: usize,
}

/// Default `record.max_file_bytes`: 64 MiB.
const DEFAULT_MAX_FILE_BYTES: u64 = 64 << 20;
/// Default `record.keep_files`.
const DEFAULT_KEEP_FILES: u32 = 4;
/// Default `record.hash_key_env`.
pub(crate) const DEFAULT_HASH_KEY_ENV: &str = "TOLLGATE_RECORD_HASH_KEY";
/// Default `record.buffer`.
const DEFAULT_BUFFER: u32 = 16_384;
/// Default `record.buffer_bytes`: 16 MiB.
const DEFAULT_BUFFER_BYTES: u64 = 16 << 20;

impl RawRecord {
    pub(super) fn validate(
        self,
        errors: &Errors<'_>,
    ) -> Result<Option<RecordSettings>, ConfigError> {
        let Some(path) = self.path else {
            return Ok(None);
        };
        if path.get_ref().trim().is_empty() {
            return Err(errors.at(
                Some(path.span()),
                "record.path",
                "expected a file to write the record to",
            ));
        }
        // Relative to the configuration file, wherever the server was started.
        let given = PathBuf::from(path.get_ref());
        let path = match Path::new(errors.file).parent() {
            Some(dir) if given.is_relative() => dir.join(given),
            _ => given,
        };
        let max_file_bytes = match self.max_file_bytes {
            Some(n) if *n.get_ref() < 4096 => {
                return Err(errors.at(
                    Some(n.span()),
                    "record.max_file_bytes",
                    "a record file holds at least 4096 bytes",
                ));
            }
            Some(n) => n.into_inner(),
            None => DEFAULT_MAX_FILE_BYTES,
        };
        let keep_files = match self.keep_files {
            Some(n) if *n.get_ref() > 1000 => {
                return Err(errors.at(
                    Some(n.span()),
                    "record.keep_files",
                    "at most 1000 rotated files are kept",
                ));
            }
            Some(n) => n.into_inner(),
            None => DEFAULT_KEEP_FILES,
        };
        let sample = match self.sample {
            Some(s) if !(*s.get_ref() > 0.0 && *s.get_ref() <= 1.0) => {
                return Err(errors.at(
                    Some(s.span()),
                    "record.sample",
                    "expected the share of identities recorded, above 0 and at most 1",
                ));
            }
            Some(s) => s.into_inner(),
            None => 1.0,
        };
        let hashed = match &self.identities {
            None => false,
            Some(i) => match i.get_ref().as_str() {
                "raw" => false,
                "hashed" => true,
                other => {
                    return Err(errors.at(
                        Some(i.span()),
                        "record.identities",
                        format!("{other:?}: expected \"raw\" or \"hashed\""),
                    ));
                }
            },
        };
        let hash_key_env = match (hashed, self.hash_key_env) {
            (true, Some(var)) => Some(var.into_inner()),
            (true, None) => Some(DEFAULT_HASH_KEY_ENV.to_owned()),
            (false, Some(var)) => {
                return Err(errors.at(
                    Some(var.span()),
                    "record.hash_key_env",
                    "a hashing key is used only with identities = \"hashed\"",
                ));
            }
            (false, None) => None,
        };
        let buffer = match self.buffer {
            Some(n) if *n.get_ref() == 0 => {
                return Err(errors.at(
                    Some(n.span()),
                    "record.buffer",
                    "the writer's queue holds at least 1 line",
                ));
            }
            Some(n) => n.into_inner(),
            None => DEFAULT_BUFFER,
        };
        let buffer_bytes = match self.buffer_bytes {
            Some(n) if *n.get_ref() < 4096 => {
                return Err(errors.at(
                    Some(n.span()),
                    "record.buffer_bytes",
                    "the writer's queue holds at least 4096 bytes",
                ));
            }
            Some(n) => n.into_inner(),
            None => DEFAULT_BUFFER_BYTES,
        };
        Ok(Some(RecordSettings {
            path,
            max_file_bytes,
            keep_files,
            sample,
            hash_key_env,
            buffer: buffer as usize,
            buffer_bytes: usize::try_from(buffer_bytes).unwrap_or(usize::MAX),
        }))
    }
}

#[cfg(test)]
mod tests {
    use crate::Config;

    fn error(text: &str) -> String {
        Config::parse("t.toml", text).unwrap_err().to_string()
    }

    #[test]
    fn a_record_is_read_with_defaults_beside_the_file() {
        let config = Config::parse("dir/t.toml", "[record]\npath = \"traffic.jsonl\"\n").unwrap();
        let record = config.record.unwrap();
        assert_eq!(record.path, std::path::Path::new("dir/traffic.jsonl"));
        assert_eq!(record.max_file_bytes, 64 << 20);
        assert_eq!(record.keep_files, 4);
        assert_eq!(record.sample, 1.0);
        assert_eq!(record.hash_key_env, None);
        assert_eq!((record.buffer, record.buffer_bytes), (16_384, 16 << 20));
        assert!(Config::parse("t.toml", "").unwrap().record.is_none());
        let hashed = Config::parse(
            "t.toml",
            "[record]\npath = \"/r.jsonl\"\nidentities = \"hashed\"\nsample = 0.25\n",
        )
        .unwrap()
        .record
        .unwrap();
        assert_eq!(hashed.path, std::path::Path::new("/r.jsonl"));
        assert_eq!(
            hashed.hash_key_env.as_deref(),
            Some("TOLLGATE_RECORD_HASH_KEY")
        );
        assert_eq!(hashed.sample, 0.25);
    }

    #[test]
    fn bad_record_settings_name_their_line_and_field() {
        assert_eq!(
            error("[record]\npath = \"r\"\nsample = 0.0\n"),
            "t.toml:3: record.sample: expected the share of identities recorded, above 0 and at most 1"
        );
        assert_eq!(
            error("[record]\npath = \"r\"\nidentities = \"masked\"\n"),
            "t.toml:3: record.identities: \"masked\": expected \"raw\" or \"hashed\""
        );
        assert_eq!(
            error("[record]\npath = \"r\"\nmax_file_bytes = 10\n"),
            "t.toml:3: record.max_file_bytes: a record file holds at least 4096 bytes"
        );
        assert_eq!(
            error("[record]\npath = \"r\"\nbuffer_bytes = 100\n"),
            "t.toml:3: record.buffer_bytes: the writer's queue holds at least 4096 bytes"
        );
        assert_eq!(
            error("[record]\npath = \"r\"\nhash_key_env = \"K\"\n"),
            "t.toml:3: record.hash_key_env: a hashing key is used only with identities = \"hashed\""
        );
        assert!(error("[record]\npath = \"r\"\nrotate = 1\n").contains("unknown field `rotate`"));
    }

    #[test]
    fn the_record_can_be_switched_on_from_the_environment() {
        let config = Config::parse_with_env("t.toml", "", &|var| match var {
            "TOLLGATE_RECORD_PATH" => Some("/tmp/r.jsonl".into()),
            "TOLLGATE_RECORD_SAMPLE" => Some("0.5".into()),
            "TOLLGATE_RECORD_IDENTITIES" => Some("hashed".into()),
            _ => None,
        })
        .unwrap();
        let record = config.record.unwrap();
        assert_eq!(record.path, std::path::Path::new("/tmp/r.jsonl"));
        assert_eq!(record.sample, 0.5);
        assert!(record.hash_key_env.is_some());
        let bad = Config::parse_with_env("t.toml", "", &|var| {
            (var == "TOLLGATE_RECORD_SAMPLE").then(|| "half".into())
        })
        .unwrap_err()
        .to_string();
        assert_eq!(
            bad,
            "TOLLGATE_RECORD_SAMPLE: record.sample: \"half\": expected a number above 0 and at most 1"
        );
    }
}

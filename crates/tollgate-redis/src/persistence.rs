//! [`Persistence`]: whether the Redis behind a store keeps its counters across a restart.
//!
//! A Redis that keeps nothing on disk starts empty after a restart: every window starts again,
//! and a monthly quota is given again in full. Read from the server, so that a deployment that
//! runs such windows on it is told.

use redis::Value;
use tollgate::StoreError;

use crate::backend::Backend;

/// How the Redis server behind a store keeps what it holds across a restart, as it says
/// (see [`RedisStore::persistence`](crate::RedisStore::persistence)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Persistence {
    /// The append-only file is on (`INFO persistence`: `aof_enabled:1`); on a Cluster, on every
    /// primary.
    pub aof: bool,
    /// RDB snapshots are scheduled (`CONFIG GET save` is not empty); `None` when the server
    /// does not let its configuration be read (`CONFIG` renamed or refused, as managed services
    /// often do).
    pub rdb: Option<bool>,
}

impl Persistence {
    /// Whether the counters survive a restart of the server: `Some(true)` with AOF or RDB on,
    /// `Some(false)` with neither, `None` when the server does not say.
    pub fn survives_restart(&self) -> Option<bool> {
        if self.aof { Some(true) } else { self.rdb }
    }
}

/// Reads the persistence settings through `backend`.
pub(crate) async fn read(backend: &Backend) -> Result<Persistence, StoreError> {
    let mut conn = backend.conn();
    let info: Value = backend
        .bounded(
            "INFO persistence",
            redis::cmd("INFO").arg("persistence").query_async(&mut conn),
        )
        .await?;
    let aof = aof_enabled(&info);
    // On a Cluster, CONFIG GET goes to one node: the nodes of one cluster share a configuration.
    let save: Result<Vec<String>, StoreError> = backend
        .bounded(
            "CONFIG GET save",
            redis::cmd("CONFIG")
                .arg("GET")
                .arg("save")
                .query_async(&mut conn),
        )
        .await;
    let rdb = match save {
        Ok(pair) => pair.get(1).map(|schedule| !schedule.trim().is_empty()),
        Err(_) => None,
    };
    Ok(Persistence { aof, rdb })
}

/// Whether every `INFO persistence` text in `info` (one, or one per primary of a Cluster) says
/// the append-only file is on.
fn aof_enabled(info: &Value) -> bool {
    let mut texts = Vec::new();
    collect_texts(info, &mut texts);
    !texts.is_empty()
        && texts
            .iter()
            .all(|text| text.lines().any(|line| line.trim() == "aof_enabled:1"))
}

fn collect_texts(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::BulkString(bytes) => out.push(String::from_utf8_lossy(bytes).into_owned()),
        Value::SimpleString(text) | Value::VerbatimString { text, .. } => out.push(text.clone()),
        // A Cluster answers node by node.
        Value::Map(pairs) => {
            for (_, value) in pairs {
                collect_texts(value, out);
            }
        }
        Value::Array(values) => {
            for value in values {
                collect_texts(value, out);
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn aof_is_on_only_when_every_node_says_so() {
        let on = "# Persistence\r\nloading:0\r\naof_enabled:1\r\n";
        let off = "# Persistence\r\nloading:0\r\naof_enabled:0\r\n";
        assert!(aof_enabled(&text(on)));
        assert!(!aof_enabled(&text(off)));
        let nodes = |a: &str, b: &str| {
            Value::Map(vec![
                (text("127.0.0.1:7000"), text(a)),
                (text("127.0.0.1:7001"), text(b)),
            ])
        };
        assert!(aof_enabled(&nodes(on, on)));
        assert!(!aof_enabled(&nodes(on, off)));
        assert!(!aof_enabled(&Value::Nil), "nothing said is not on");
    }

    #[test]
    fn a_restart_is_survived_with_either_file() {
        let p = |aof, rdb| Persistence { aof, rdb };
        assert_eq!(p(true, Some(false)).survives_restart(), Some(true));
        assert_eq!(p(false, Some(true)).survives_restart(), Some(true));
        assert_eq!(p(false, Some(false)).survives_restart(), Some(false));
        assert_eq!(p(false, None).survives_restart(), None);
        assert_eq!(p(true, None).survives_restart(), Some(true));
    }
}

//! The connection behind a store, whatever the deployment, and script calls that survive a
//! node without the script.

use std::time::Duration;

use redis::{
    Client, Cmd, ErrorKind, FromRedisValue, Pipeline, RedisFuture, RedisResult, ServerErrorKind,
    ToRedisArgs, Value,
    aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig},
    cluster::ClusterClient,
    cluster_async::ClusterConnection,
};

use crate::sentinel::SentinelConnection;

/// One connection handle, cheap to clone, for each kind of deployment.
#[derive(Clone)]
pub(crate) enum Conn {
    /// One server; reconnects by itself.
    Standalone(ConnectionManager),
    /// A Redis Cluster: routes each command to its slot's primary, follows MOVED/ASK.
    Cluster(ClusterConnection),
    /// The primary the sentinels name, found again after a failover.
    Sentinel(SentinelConnection),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Standalone(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
            Conn::Sentinel(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Standalone(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Sentinel(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Standalone(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
            Conn::Sentinel(c) => c.get_db(),
        }
    }
}

/// How to open another connection to the same deployment, with the same settings: the
/// connection replicated checks wait on (`WAIT` blocks the connection it is sent on, so it
/// gets one of its own). Nothing connects until [`connect`](Self::connect).
pub(crate) enum Dial {
    Standalone(Client, ConnectionManagerConfig),
    Cluster(ClusterClient),
    /// A handle of its own on the sentinels' primary, not connected yet.
    Sentinel(SentinelConnection),
}

impl Dial {
    pub(crate) async fn connect(&self) -> RedisResult<Conn> {
        Ok(match self {
            Dial::Standalone(client, config) => Conn::Standalone(
                ConnectionManager::new_with_config(client.clone(), config.clone()).await?,
            ),
            Dial::Cluster(client) => Conn::Cluster(client.get_async_connection().await?),
            Dial::Sentinel(conn) => Conn::Sentinel(conn.clone()),
        })
    }
}

/// A Lua script: its source (its parts spliced in, see `script::assemble`) and SHA-1.
pub(crate) struct Lua {
    code: String,
    hash: String,
}

impl Lua {
    pub(crate) fn new(code: String) -> Lua {
        let hash = redis::Script::new(&code).get_hash().to_owned();
        Lua { code, hash }
    }

    /// The source, as sent to Redis.
    #[cfg(test)]
    pub(crate) fn code(&self) -> &str {
        &self.code
    }

    /// A call of this script, to be filled with keys and arguments.
    pub(crate) fn call(&self) -> Call<'_> {
        Call {
            lua: self,
            keys: Vec::new(),
            args: Vec::new(),
        }
    }

    /// `SCRIPT LOAD`: on a cluster connection, every node loads it.
    pub(crate) fn load_cmd(&self) -> Cmd {
        let mut cmd = redis::cmd("SCRIPT");
        cmd.arg("LOAD").arg(&self.code);
        cmd
    }
}

/// One call of a [`Lua`] script: `KEYS` and `ARGV`.
pub(crate) struct Call<'a> {
    lua: &'a Lua,
    keys: Vec<Vec<u8>>,
    args: Vec<Vec<u8>>,
}

impl Call<'_> {
    /// Appends to `KEYS` (a list appends each item).
    pub(crate) fn key<T: ToRedisArgs>(&mut self, key: T) -> &mut Self {
        key.write_redis_args(&mut self.keys);
        self
    }

    /// Appends to `ARGV` (a list appends each item).
    pub(crate) fn arg<T: ToRedisArgs>(&mut self, arg: T) -> &mut Self {
        arg.write_redis_args(&mut self.args);
        self
    }

    /// The keys and arguments given so far, to be sent later with others ([`append`]).
    ///
    /// [`append`]: Self::append
    pub(crate) fn into_parts(self) -> (Vec<Vec<u8>>, Vec<Vec<u8>>) {
        (self.keys, self.args)
    }

    /// Appends keys and arguments taken by [`into_parts`](Self::into_parts) from a call of
    /// the same script.
    pub(crate) fn append(&mut self, keys: &mut Vec<Vec<u8>>, args: &mut Vec<Vec<u8>>) {
        self.keys.append(keys);
        self.args.append(args);
    }

    fn cmd(&self, by_hash: bool) -> Cmd {
        let mut cmd = if by_hash {
            let mut c = redis::cmd("EVALSHA");
            c.arg(&self.lua.hash);
            c
        } else {
            let mut c = redis::cmd("EVAL");
            c.arg(&self.lua.code);
            c
        };
        cmd.arg(self.keys.len());
        for key in &self.keys {
            cmd.arg(&key[..]);
        }
        for arg in &self.args {
            cmd.arg(&arg[..]);
        }
        cmd
    }

    /// [`invoke`](Self::invoke), followed on the same connection by `WAIT replicas timeout`:
    /// the script's reply and how many replicas acknowledged every write the connection had
    /// sent by then. One pipeline: the `WAIT` leaves with the script (on a Cluster, to the
    /// node of the script's keys).
    pub(crate) async fn invoke_waiting<T: FromRedisValue>(
        &self,
        conn: &mut impl ConnectionLike,
        replicas: u32,
        timeout: Duration,
    ) -> RedisResult<(T, u64)> {
        let waiting = |by_hash: bool| {
            let mut wait = redis::cmd("WAIT");
            wait.arg(replicas).arg(
                u64::try_from(timeout.as_millis())
                    .unwrap_or(u64::MAX)
                    .max(1),
            );
            let mut pipe = redis::pipe();
            pipe.add_command(self.cmd(by_hash)).add_command(wait);
            pipe
        };
        match waiting(true).query_async(conn).await {
            Err(err) if err.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                waiting(false).query_async(conn).await
            }
            other => other,
        }
    }

    /// `EVALSHA`, and `EVAL` with the source if the node does not know the script (a node
    /// that restarted, a replica promoted since the store loaded its scripts): `EVAL` goes to
    /// the same node as the `EVALSHA` (the one serving the first key) and caches the script
    /// there, without reaching for the other nodes, some of which may be down.
    pub(crate) async fn invoke<T: FromRedisValue>(
        &self,
        conn: &mut impl ConnectionLike,
    ) -> RedisResult<T> {
        match self.cmd(true).query_async(conn).await {
            Err(err) if err.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                self.cmd(false).query_async(conn).await
            }
            other => other,
        }
    }
}

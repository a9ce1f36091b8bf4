//! Persistence as the server says it: AOF from `INFO persistence` (every primary of a Cluster),
//! RDB from `CONFIG GET save`, unknown when `CONFIG` is refused.

use tollgate_redis::{Persistence, RedisStore};
use tollgate_testkit::{RedisCluster, RedisServer};

async fn persistence_of(server: &RedisServer) -> Persistence {
    let store = RedisStore::connect(&server.url()).await.unwrap();
    store.persistence().await.unwrap()
}

#[tokio::test]
async fn a_server_without_files_does_not_survive_a_restart() {
    let server = RedisServer::start();
    let p = persistence_of(&server).await;
    assert_eq!((p.aof, p.rdb), (false, Some(false)));
    assert_eq!(p.survives_restart(), Some(false));
}

#[tokio::test]
async fn an_append_only_file_or_a_snapshot_schedule_survives_it() {
    let aof = RedisServer::builder()
        .arg("--appendonly")
        .arg("yes")
        .start();
    let p = persistence_of(&aof).await;
    assert_eq!((p.aof, p.survives_restart()), (true, Some(true)));

    let rdb = RedisServer::builder().arg("--save").arg("60 1").start();
    let p = persistence_of(&rdb).await;
    assert_eq!(
        (p.aof, p.rdb, p.survives_restart()),
        (false, Some(true), Some(true))
    );
}

#[tokio::test]
async fn a_server_that_refuses_config_leaves_snapshots_unknown() {
    let server = RedisServer::builder()
        .arg("--rename-command")
        .arg("CONFIG")
        .arg("")
        .start();
    let p = persistence_of(&server).await;
    assert_eq!((p.aof, p.rdb, p.survives_restart()), (false, None, None));
}

#[tokio::test]
async fn a_cluster_is_read_on_every_primary() {
    let cluster = RedisCluster::start();
    let store = RedisStore::connect(&cluster.url()).await.unwrap();
    let p = store.persistence().await.unwrap();
    assert_eq!((p.aof, p.rdb), (false, Some(false)));
}

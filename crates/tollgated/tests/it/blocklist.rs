//! The blocklist at scale: the admin listing pages, and a metrics scrape counts the bans with
//! one `ZCOUNT` of the ban index, however many there are.

use std::process::Command;

use serde_json::{Value, json};
use tollgate_testkit::RedisServer;

use crate::support::{Server, error_message};

const MEMORY: &str = r#"
[server]
admin_token_env = "TG_TEST_ADMIN"

[policies.a]
limiters = [{ by = "ip", rules = ["1/1h"] }]
"#;

/// `redis-cli` on `server` with `args`; its standard output.
fn redis_cli(server: &RedisServer, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &server.port().to_string()])
        .args(args)
        .output()
        .expect("run redis-cli");
    assert!(out.status.success(), "redis-cli {args:?}: {out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `(calls, usec)` of `command` in `INFO commandstats`, zeros if it never ran.
fn command_stats(server: &RedisServer, command: &str) -> (u64, u64) {
    let info = redis_cli(server, &["INFO", "commandstats"]);
    let Some(line) = info
        .lines()
        .find(|l| l.starts_with(&format!("cmdstat_{command}:")))
    else {
        return (0, 0);
    };
    let field = |name: &str| -> u64 {
        line.split([':', ','])
            .find_map(|kv| kv.strip_prefix(&format!("{name}=")))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {name} in {line}"))
    };
    (field("calls"), field("usec"))
}

#[tokio::test]
async fn the_admin_listing_pages_in_the_order_bans_end() {
    let server = Server::start(MEMORY);
    for i in 0..7 {
        let (status, body) = server
            .post_admin(
                "/v1/blocklist",
                json!({ "kind": "user_id", "value": format!("u{i}"), "duration": format!("{}m", 10 - i) }),
            )
            .await;
        assert_eq!(status, 200, "{body}");
    }
    let mut listed = Vec::new();
    let mut path = "/v1/blocklist?limit=3".to_owned();
    for page in 0.. {
        let (status, body) = server.get_admin(&path).await;
        assert_eq!(status, 200, "{body}");
        let bans = body["bans"].as_array().unwrap();
        assert!(bans.len() <= 3, "{body}");
        listed.extend(bans.iter().cloned());
        match &body["next_cursor"] {
            Value::String(cursor) => path = format!("/v1/blocklist?limit=3&cursor={cursor}"),
            Value::Null => break,
            other => panic!("next_cursor {other}"),
        }
        assert!(page < 5, "the pages never end");
    }
    // u6 ends first (4 minutes), u0 last (10 minutes); each once.
    let values: Vec<&str> = listed
        .iter()
        .map(|b| b["value"].as_str().unwrap())
        .collect();
    assert_eq!(values, ["u6", "u5", "u4", "u3", "u2", "u1", "u0"]);
    assert!(
        listed
            .iter()
            .all(|b| b["kind"] == "user_id" && b["strikes"] == 1)
    );
    // Without a limit: a page of up to 100.
    let (_, all) = server.get_admin("/v1/blocklist").await;
    assert_eq!(all["bans"].as_array().unwrap().len(), 7);
    assert_eq!(all["next_cursor"], Value::Null);

    for (query, says) in [
        ("limit=0", "limit \"0\""),
        ("limit=1001", "from 1 to 1000"),
        ("limit=ten", "limit \"ten\""),
        ("cursor=nonsense", "cursor"),
        ("cursor=1.zz", "cursor"),
        ("page=2", "page"),
    ] {
        let (status, body) = server.get_admin(&format!("/v1/blocklist?{query}")).await;
        let message = error_message(status, &body, 400);
        assert!(message.contains(says), "{query}: {message}");
    }
    let (status, body) = server.get("/v1/blocklist?limit=1").await;
    error_message(status, &body, 401);
}

#[tokio::test]
async fn a_scrape_counts_100k_bans_with_one_zcount() {
    let redis = RedisServer::start();
    // 100k live bans as the store lays them out, 10k per script call.
    let write = r"
        local t = redis.call('TIME')
        local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
        for i = tonumber(ARGV[1]), tonumber(ARGV[2]) do
          local key = 'tg:{ban}:user_id:u' .. i
          local u = string.format('%d', now + 3600000000 + i)
          redis.call('HSET', key, 'u', u, 's', '1', 'x', u, 'k', 'user_id', 'v', 'u' .. i)
          redis.call('PEXPIRE', key, 7200000)
          redis.call('ZADD', KEYS[1], u, key)
        end
        redis.call('PEXPIRE', KEYS[1], 7200000)
        return redis.call('ZCARD', KEYS[1])
    ";
    let mut written = String::new();
    for from in (1..=100_000).step_by(10_000) {
        let (from, to) = (from.to_string(), (from + 9_999).to_string());
        written = redis_cli(&redis, &["EVAL", write, "1", "tg:{ban}:index", &from, &to]);
    }
    assert_eq!(written.trim(), "100000");

    let config = format!(
        r#"
[server]
admin_token_env = "TG_TEST_ADMIN"

[store]
url = "{}"
timeout = "1s"

[policies.a]
limiters = [{{ by = "ip", rules = ["1/1h"] }}]
"#,
        redis.url()
    );
    let server = Server::start(&config);
    redis_cli(&redis, &["CONFIG", "RESETSTAT"]);
    let (status, metrics) = server.get_text("/metrics").await;
    assert_eq!(status, 200);
    assert!(
        metrics.contains("tollgate_blocklist_entries 100000"),
        "{metrics}"
    );
    // One script call and one ZCOUNT, no ban read one by one: the scrape's cost does not grow
    // with the bans (its time is the benchmarks' business, not a test's).
    let (calls, _) = command_stats(&redis, "evalsha");
    assert_eq!(calls, 1, "one script call per scrape");
    assert_eq!(command_stats(&redis, "zcount").0, 1);
    assert_eq!(
        command_stats(&redis, "hmget").0,
        0,
        "no ban read one by one"
    );

    // The admin listing reads one page: from the start, then from its cursor.
    let (status, first) = server.get_admin("/v1/blocklist?limit=50").await;
    assert_eq!(status, 200);
    assert_eq!(first["bans"].as_array().unwrap().len(), 50);
    assert_eq!(first["bans"][0]["value"], "u1", "the ban that ends first");
    let cursor = first["next_cursor"].as_str().unwrap();
    redis_cli(&redis, &["CONFIG", "RESETSTAT"]);
    let (_, second) = server
        .get_admin(&format!("/v1/blocklist?limit=50&cursor={cursor}"))
        .await;
    assert_eq!(second["bans"][0]["value"], "u51");
    assert_eq!(
        command_stats(&redis, "hmget").0,
        50,
        "one read per listed ban"
    );
}

/// `ban_scope = "policy"`: a violation bans from that policy alone; its bans are listed and
/// lifted with `?policy=`, apart from the blocklist every policy sees.
#[tokio::test]
async fn a_policy_with_bans_of_its_own_keeps_them_to_itself() {
    let server = Server::start(
        r#"
[server]
admin_token_env = "TG_TEST_ADMIN"

[policies.login]
limiters = [{ by = "ip", rules = ["1/1h"], blocklist = "10m" }]
ban_scope = "policy"

[policies.search]
limiters = [{ by = "ip", rules = ["100/1h"] }]
"#,
    );
    let who = json!({ "ip": "203.0.113.77" });
    server.check("login", who.clone()).await;
    let (_, over) = server
        .post("/v1/check", json!({ "policy": "login", "identity": who }))
        .await;
    assert_eq!(over["reason"], "rate_limited", "{over}");
    let (_, blocked) = server
        .post("/v1/check", json!({ "policy": "login", "identity": who }))
        .await;
    assert_eq!(blocked["reason"], "blocked", "{blocked}");
    assert_eq!(server.check("search", who.clone()).await["allowed"], true);

    let (status, every) = server.get_admin("/v1/blocklist").await;
    assert_eq!(status, 200, "{every}");
    assert_eq!(
        every["bans"],
        json!([]),
        "not in the blocklist every policy sees"
    );
    // A policy whose bans every policy sees has no list of its own.
    let (status, body) = server.get_admin("/v1/blocklist?policy=search").await;
    assert_eq!(
        (status, &body["code"]),
        (400, &json!("policy_bans_shared")),
        "{body}"
    );
    let (status, own) = server.get_admin("/v1/blocklist?policy=login").await;
    assert_eq!(status, 200, "{own}");
    assert_eq!(own["bans"][0]["value"], "203.0.113.77", "{own}");

    let unban = server
        .request(
            reqwest::Method::DELETE,
            "/v1/blocklist/ip/203.0.113.77?policy=login",
        )
        .bearer_auth(crate::support::ADMIN_TOKEN);
    let (status, body) = server.send(unban).await;
    assert_eq!((status, &body), (200, &json!({ "removed": true })));
    let (_, after) = server
        .post("/v1/check", json!({ "policy": "login", "identity": who }))
        .await;
    assert_eq!(after["reason"], "rate_limited", "banned no more: {after}");
}

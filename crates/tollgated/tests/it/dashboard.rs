//! The dashboard: who may see what over plain HTTP, and the page itself in a real browser
//! (Debian's `chromium` driven through `chromedriver` over WebDriver).

use std::{
    net::TcpStream,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{Value, json};

use crate::support::{ADMIN_TOKEN, HANG, Server, TempDir};

const CONFIG: &str = r#"
[server]
admin_token_env = "TG_TEST_ADMIN"

[policies.login]
limiters = [{ by = "ip", rules = ["2/1m"], overrides = true }]
"#;

/// Aggregates for anyone who reaches a loopback listener; identities only with the token.
#[tokio::test]
async fn stats_are_open_and_identities_need_the_admin_token() {
    let server = Server::start(CONFIG);
    for _ in 0..4 {
        server.check("login", json!({ "ip": "203.0.113.50" })).await;
    }
    let (status, page) = server.get_text("/").await;
    assert_eq!(status, 200);
    assert!(page.contains("tollgate dashboard"), "{page}");

    // The sampler reads the metrics once a second: wait for it to have seen the denials.
    let deadline = Instant::now() + HANG;
    let stats = loop {
        let (status, stats) = server.get("/v1/stats").await;
        assert_eq!(status, 200, "{stats}");
        let denied = series_total(&stats, "login", "rate_limited");
        if denied == 2 {
            break stats;
        }
        assert!(
            Instant::now() < deadline,
            "no 2 rate_limited decisions in /v1/stats after {HANG:?}: {stats}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(series_total(&stats, "login", "ok"), 2);
    assert!(!stats.to_string().contains("203.0.113.50"), "{stats}");
    assert_eq!(stats["admin"]["enabled"], true);
    assert_eq!(
        stats["policies"][0]["limiters"][0]["rules"][0]["rule"],
        "2/1m"
    );
    assert_eq!(stats["store"]["kind"], "memory");

    let (status, body) = server.get("/v1/stats/top").await;
    assert_eq!(status, 401, "{body}");
    let (status, top) = server.get_admin("/v1/stats/top").await;
    assert_eq!(status, 200, "{top}");
    assert_eq!(
        top["top"][0],
        json!({
            "policy": "login", "limiter": "ip", "by": "ip", "value": "203.0.113.50",
            "rule": "2/1m", "denials": 2, "at_least": 2,
        })
    );
    let (status, body) = server.get("/v1/stats?since=soon").await;
    assert_eq!(status, 400, "{body}");
    // Only the seconds after `since`: none after the last one.
    let now = stats["decisions"]["now"].as_u64().unwrap();
    let (_, later) = server.get(&format!("/v1/stats?since={}", now + 3600)).await;
    assert_eq!(later["decisions"]["seconds"], json!([]));
    let (status, last) = server.get(&format!("/v1/stats?since={}", u64::MAX)).await;
    assert_eq!(status, 200, "{last}");
    assert_eq!(last["decisions"]["seconds"], json!([]));
}

#[tokio::test]
async fn the_dashboard_can_be_turned_off() {
    let server = Server::start(
        &format!("{CONFIG}\n").replace("[server]\n", "[server]\ndashboard = false\n"),
    );
    for path in ["/", "/v1/stats", "/dashboard.js"] {
        let (status, _) = server.get_text(path).await;
        assert_eq!(status, 404, "{path}");
    }
}

fn series_total(stats: &Value, policy: &str, reason: &str) -> u64 {
    stats["decisions"]["series"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|s| s["policy"] == policy && s["reason"] == reason)
        .map(|s| s["total"].as_u64().unwrap_or(0))
        .sum()
}

/// A program on `PATH` (or in Debian's places for it).
fn find(program: &str, also: &[&str]) -> Option<PathBuf> {
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|dir| dir.join(program))
        .chain(also.iter().map(PathBuf::from))
        .find(|p| p.is_file())
}

/// A `chromedriver` on a free loopback port; killed on drop.
pub(crate) struct Chromedriver {
    child: Child,
    url: String,
}

impl Chromedriver {
    pub(crate) fn start() -> Chromedriver {
        let Some(binary) = find("chromedriver", &["/usr/lib/chromium/chromedriver"]) else {
            panic!(
                "the browser tests (dashboard, plan report) need chromium and its WebDriver: \
                 apt-get install -y chromium chromium-driver (scripts/test installs them when run as root)"
            );
        };
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let child = Command::new(&binary)
            .arg(format!("--port={port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", binary.display()));
        let mut driver = Chromedriver {
            child,
            url: format!("http://127.0.0.1:{port}"),
        };
        let deadline = Instant::now() + HANG;
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Ok(Some(status)) = driver.child.try_wait() {
                panic!("chromedriver exited ({status}) before listening on {port}");
            }
            assert!(
                Instant::now() < deadline,
                "chromedriver did not listen on {port} within {HANG:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        driver
    }
}

impl Drop for Chromedriver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A headless chromium session through `driver`, its profile in `profile`.
pub(crate) async fn headless(driver: &Chromedriver, profile: &TempDir) -> Client {
    let mut options = json!({
        "args": [
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--window-size=1400,1000",
            format!("--user-data-dir={}", profile.path().display()),
        ],
    });
    if let Some(chromium) = find("chromium", &[]) {
        options["binary"] = json!(chromium.display().to_string());
    }
    let mut capabilities = serde_json::Map::new();
    capabilities.insert("browserName".into(), json!("chrome"));
    capabilities.insert("goog:chromeOptions".into(), options);
    ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
        .capabilities(capabilities)
        .connect(&driver.url)
        .await
        .unwrap_or_else(|e| panic!("a chromium session through {}: {e}", driver.url))
}

/// Polls `condition` (a JavaScript expression) in the page until it is true; on the deadline,
/// fails naming `what` and showing the page's text.
pub(crate) async fn wait_until(browser: &Client, what: &str, condition: &str) {
    let deadline = Instant::now() + HANG;
    let script = format!("return Boolean({condition});");
    loop {
        let value = browser
            .execute(&script, vec![])
            .await
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        if value == Value::Bool(true) {
            return;
        }
        if Instant::now() >= deadline {
            let text = browser
                .execute("return document.body.innerText;", vec![])
                .await
                .unwrap_or_default();
            panic!("{what}: not seen within {HANG:?}; the page reads:\n{text}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Clicks the element `css` selects. The page redraws rows when the data behind them change:
/// an element found just before a redraw is stale, and is looked up again until the deadline.
async fn click(browser: &Client, css: &str) {
    let deadline = Instant::now() + HANG;
    loop {
        let clicked = match browser.find(Locator::Css(css)).await {
            Ok(element) => element.click().await,
            Err(e) => Err(e),
        };
        match clicked {
            Ok(()) => return,
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("click {css}: {e}"),
        }
    }
}

/// The text of the table with id `table`, as a JavaScript expression.
fn table_text(table: &str) -> String {
    format!("document.querySelector('#{table} tbody').innerText")
}

fn docs_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_works_in_a_real_browser() {
    let driver = Chromedriver::start();
    let server = Server::start(CONFIG);
    let profile = TempDir::new();
    let browser = headless(&driver, &profile).await;

    // The token comes in the fragment, which the browser never sends to the server.
    browser
        .goto(&format!("{}/#token={ADMIN_TOKEN}", server.http))
        .await
        .unwrap();
    wait_until(
        &browser,
        "the page is live",
        "document.querySelector('#live').textContent.startsWith('live')",
    )
    .await;
    assert_eq!(
        browser.current_url().await.unwrap().fragment(),
        None,
        "the token is taken out of the address"
    );

    // Denials show the identity in the top list, with its limiter and rule.
    for _ in 0..5 {
        server.check("login", json!({ "ip": "203.0.113.50" })).await;
    }
    server.check("login", json!({ "ip": "192.0.2.20" })).await;
    wait_until(
        &browser,
        "203.0.113.50 in the top list",
        &format!(
            "{}.includes('ip 203.0.113.50\\tlogin / ip\\t2/1m\\t3')",
            table_text("top")
        ),
    )
    .await;
    wait_until(
        &browser,
        "the chart's rate_limited series",
        "document.querySelector('#legend').innerText.includes('login · rate_limited')",
    )
    .await;
    // Colours by meaning: refusals red, admissions green, whatever the order of the series.
    let swatch = |label: &str| {
        format!(
            "[...document.querySelectorAll('#legend li')].find((li) => li.innerText.includes('{label}')).querySelector('.swatch').style.background"
        )
    };
    wait_until(
        &browser,
        "rate_limited drawn red and ok green",
        &format!(
            "{} === 'rgb(164, 22, 26)' && {} === 'rgb(27, 110, 53)'",
            swatch("login · rate_limited"),
            swatch("login · ok")
        ),
    )
    .await;
    // With the token in use, the page says so; the top list fits a 1400 px window.
    wait_until(
        &browser,
        "the admin badge",
        "!document.querySelector('#admin-badge').hidden",
    )
    .await;
    wait_until(
        &browser,
        "the top list within its panel",
        "document.querySelector('#top').scrollWidth <= document.querySelector('#top').parentElement.clientWidth",
    )
    .await;

    // A ban from the form: the check API denies the address.
    wait_until(
        &browser,
        "the ban form enabled",
        "!document.querySelector('#ban-value').disabled",
    )
    .await;
    browser
        .find(Locator::Id("ban-value"))
        .await
        .unwrap()
        .send_keys("198.51.100.7")
        .await
        .unwrap();
    let duration = browser.find(Locator::Id("ban-duration")).await.unwrap();
    duration.clear().await.unwrap();
    duration.send_keys("10m").await.unwrap();
    click(&browser, "#ban-form button[type=submit]").await;
    wait_until(
        &browser,
        "the ban in the bans table",
        &format!("{}.includes('ip 198.51.100.7')", table_text("bans")),
    )
    .await;
    let banned = server.check("login", json!({ "ip": "198.51.100.7" })).await;
    assert_eq!(banned["allowed"], false, "{banned}");
    assert_eq!(banned["reason"], "blocked", "{banned}");
    // Blocked traffic is counted in the top list too.
    wait_until(
        &browser,
        "the banned address in the top list",
        &format!(
            "{}.includes('ip 198.51.100.7\\tlogin / ip\\tbanned')",
            table_text("top")
        ),
    )
    .await;

    // The picture for the docs, taken by hand (TOLLGATE_DASHBOARD_SCREENSHOT=1), with the top
    // list, the ban and the chart on it.
    let png = browser.screenshot().await.unwrap();
    assert!(png.starts_with(b"\x89PNG"), "a PNG screenshot");
    if std::env::var_os("TOLLGATE_DASHBOARD_SCREENSHOT").is_some() {
        std::fs::write(docs_dir().join("dashboard.png"), &png).unwrap();
    }

    // An override set over the API is listed with its rules.
    let (status, body) = server
        .send(
            server
                .request(reqwest::Method::PUT, "/v1/overrides")
                .bearer_auth(ADMIN_TOKEN)
                .json(&json!({
                    "policy": "login", "limiter": "ip",
                    "identity": { "ip": "192.0.2.99" }, "rules": ["50/1m"],
                })),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    wait_until(
        &browser,
        "the override in the overrides table",
        &format!(
            "{}.includes('login / ip\t192.0.2.99\t50/1m\tnever')",
            table_text("overrides")
        ),
    )
    .await;

    // Unban: the address is admitted again.
    click(&browser, "button[aria-label='Unban ip 198.51.100.7']").await;
    wait_until(
        &browser,
        "the ban gone from the bans table",
        &format!("!{}.includes('198.51.100.7')", table_text("bans")),
    )
    .await;
    let admitted = server.check("login", json!({ "ip": "198.51.100.7" })).await;
    assert_eq!(admitted["allowed"], true, "{admitted}");

    // Forgetting the token hides the identities again.
    browser
        .find(Locator::Id("forget"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    wait_until(
        &browser,
        "the top list and the admin badge hidden",
        "document.querySelector('#top').hidden && document.querySelector('#admin-badge').hidden",
    )
    .await;

    // On a Redis that keeps nothing on disk, the store panel names the long windows at risk.
    let redis = tollgate_testkit::RedisServer::start();
    let on_redis = Server::start(&format!(
        r#"
[store]
url = "{}"
timeout = "5s"

[policies.monthly]
limiters = [{{ by = "user_id", rules = ["1000/1mo@UTC"] }}]
"#,
        redis.url()
    ));
    browser.goto(&on_redis.http).await.unwrap();
    wait_until(
        &browser,
        "the store's persistence and the windows at risk",
        "document.querySelector('#store').innerText.includes('no append-only file · no RDB snapshots') \
         && document.querySelector('#store').innerText.includes('start again if the store restarts: monthly')",
    )
    .await;
    browser.close().await.unwrap();
}

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::Duration,
};

use axum::{Json, Router, extract::State, routing::post};
use serde_json::{Value, json};
use tokio::sync::Notify;
use tollgate::{Clock as _, Dimension, Identity, Limiter, Policy, Reason};
use tollgate_tower::{
    Context, ContextLayer, HeaderStyle, IdentityResolver, RateLimitLayer, Rejection,
    prevent_duplicate, rate_limit,
};

use crate::support::{Server, client, gate, header, problem};

#[rate_limit(by = "ip", rules = ["2/1m"])]
#[rate_limit(by = "user_id", rules = ["3/1d"])]
async fn send_code(Json(body): Json<Value>) -> Result<Json<Value>, Rejection> {
    Ok(Json(json!({ "sent": true, "to": body["phone"] })))
}

#[rate_limit(by = "ip", rules = ["4/1m"], warn_at = 0.5)]
async fn warned_export() -> Result<&'static str, Rejection> {
    Ok("ok")
}

#[rate_limit(by = "ip", rules = ["2/1m"], scope = "reports", overrides = true)]
async fn overridable_report() -> Result<&'static str, Rejection> {
    Ok("ok")
}

/// What a completion says it cost.
fn tokens_used(result: &Result<u64, Rejection>) -> Option<u64> {
    result.as_ref().ok().copied()
}

/// A completion checked for the tokens it may use, settled at what it used.
#[rate_limit(
    by = "user_id",
    rules = ["100/1h"],
    algorithm = "fixed_window",
    scope = "completions",
    cost = "max_tokens",
    settle = "tokens_used"
)]
async fn complete(max_tokens: u64, used: u64) -> Result<u64, Rejection> {
    Ok(used)
}

/// A checkout smoothed rather than refused: 2 a second, waiting up to 600 ms for its turn.
#[rate_limit(
    by = "user_id",
    rules = ["2/1s"],
    algorithm = "gcra",
    scope = "checkout",
    max_delay = "600ms"
)]
async fn checkout() -> Result<(), Rejection> {
    Ok(())
}

#[rate_limit(by = "ip", rules = ["3/1m"], soft = ["1/1m"])]
async fn soft_upload() -> Result<&'static str, Rejection> {
    Ok("ok")
}

fn proxied_users() -> IdentityResolver {
    IdentityResolver::new()
        .trust_proxy("127.0.0.1/32".parse().unwrap())
        .enrich(
            |who, headers, _| match headers.get("x-user-id").and_then(|v| v.to_str().ok()) {
                Some(id) => who.with_user_id(id),
                None => who,
            },
        )
}

#[tokio::test]
async fn stacked_limits_are_one_atomic_check_with_ratelimit_fields() {
    let (gate, _) = gate();
    let app = Router::new()
        .route("/sms/code", post(send_code))
        .layer(ContextLayer::new(gate, proxied_users()));
    let server = Server::start(app).await;
    let send = |ip: &str, user: Option<&str>| {
        let mut request = client()
            .post(server.at("/sms/code"))
            .header("x-forwarded-for", ip)
            .json(&json!({ "phone": "+15550100" }));
        if let Some(user) = user {
            request = request.header("x-user-id", user);
        }
        request.send()
    };

    let first = send("203.0.113.1", Some("alice")).await.unwrap();
    assert_eq!(first.status(), 200);
    assert_eq!(
        header(&first, "ratelimit-policy").as_deref(),
        Some(r#""ip-1m";q=2;w=60, "user_id-1d";q=3;w=86400"#)
    );
    assert_eq!(
        header(&first, "ratelimit").as_deref(),
        Some(r#""ip-1m";r=1;t=60, "user_id-1d";r=2;t=86400"#)
    );
    assert_eq!(first.json::<Value>().await.unwrap()["to"], "+15550100");
    assert_eq!(
        send("203.0.113.1", Some("alice")).await.unwrap().status(),
        200
    );

    // The address's minute is used up; the refusal costs the user nothing.
    let by_ip = send("203.0.113.1", Some("alice")).await.unwrap();
    assert_eq!(by_ip.status(), 429);
    assert_eq!(
        header(&by_ip, "ratelimit")
            .as_deref()
            .map(|v| v.split(", ").nth(1).unwrap().to_owned()),
        Some(r#""user_id-1d";r=1;t=86400"#.to_owned())
    );
    assert_eq!(
        send("203.0.113.2", Some("alice")).await.unwrap().status(),
        200
    );

    // The user's day is used up; the refusal costs the new address nothing.
    let by_user = send("203.0.113.2", Some("alice")).await.unwrap();
    assert_eq!(by_user.status(), 429);
    assert_eq!(
        header(&by_user, "ratelimit").as_deref(),
        Some(r#""ip-1m";r=1;t=60, "user_id-1d";r=0;t=86400"#)
    );
    let body = problem(by_user).await;
    assert_eq!(body["violated-policies"], json!(["user_id-1d"]));
    assert_eq!(body["violated"][0]["policy"], "user_id-1d");
    assert_eq!(body["violated"].as_array().unwrap().len(), 1);

    let anonymous = send("203.0.113.3", None).await.unwrap();
    assert_eq!(anonymous.status(), 401);
}

#[tokio::test]
async fn the_context_layers_header_style_applies_to_admissions_and_refusals() {
    let (gate, _) = gate();
    let app = Router::new()
        .route("/sms/code", post(send_code))
        .layer(ContextLayer::new(gate, proxied_users()).header_style(HeaderStyle::Legacy));
    let server = Server::start(app).await;
    let send = || {
        client()
            .post(server.at("/sms/code"))
            .header("x-user-id", "bob")
            .json(&json!({ "phone": "+15550100" }))
            .send()
    };
    let first = send().await.unwrap();
    assert_eq!(first.status(), 200);
    assert_eq!(header(&first, "ratelimit"), None);
    // The rule closest to denying: the minute's, one left.
    assert_eq!(header(&first, "x-ratelimit-limit").as_deref(), Some("2"));
    assert_eq!(
        header(&first, "x-ratelimit-remaining").as_deref(),
        Some("1")
    );
    assert_eq!(header(&first, "x-ratelimit-reset").as_deref(), Some("60"));
    send().await.unwrap();
    let refused = send().await.unwrap();
    assert_eq!(refused.status(), 429);
    assert_eq!(header(&refused, "ratelimit"), None);
    assert_eq!(
        header(&refused, "x-ratelimit-remaining").as_deref(),
        Some("0")
    );
    assert_eq!(header(&refused, "retry-after").as_deref(), Some("60"));
}

/// A rate-limit layer on the route below the context layer: the response carries the layer's
/// fields and the handler's macro checks', the layer's first (it wrote them first).
#[tokio::test]
async fn the_context_layer_adds_its_fields_beside_a_rate_limit_layers() {
    let (gate, _) = gate();
    let api = Policy::builder("api")
        .limiter(Limiter::new(Dimension::Ip, ["100/1h".parse().unwrap()]))
        .build()
        .unwrap();
    let app = Router::new()
        .route(
            "/sms/code",
            post(send_code).layer(RateLimitLayer::new(gate.clone(), api)),
        )
        .layer(ContextLayer::new(gate, proxied_users()));
    let server = Server::start(app).await;
    let first = client()
        .post(server.at("/sms/code"))
        .header("x-user-id", "bob")
        .json(&json!({ "phone": "+15550100" }))
        .send()
        .await
        .unwrap();
    assert_eq!(first.status(), 200);
    assert_eq!(
        header(&first, "ratelimit").as_deref(),
        Some(r#""ip-1h";r=99;t=3600, "ip-1m";r=1;t=60, "user_id-1d";r=2;t=86400"#)
    );
    assert_eq!(
        header(&first, "ratelimit-policy").as_deref(),
        Some(r#""ip-1h";q=100;w=3600, "ip-1m";q=2;w=60, "user_id-1d";q=3;w=86400"#)
    );
}

#[rate_limit(by = "ip", rules = ["1/1m"])]
async fn once_a_minute() -> Result<&'static str, Rejection> {
    Ok("ok")
}

async fn twice() -> Result<&'static str, Rejection> {
    once_a_minute().await?;
    once_a_minute().await
}

/// A handler whose second guarded call is refused answers with the refusal's fields alone: the
/// admission before it, of the same rule, is not listed beside them.
#[tokio::test]
async fn a_guarded_refusal_answers_with_its_own_fields_only() {
    let (gate, _) = gate();
    let app = Router::new()
        .route("/twice", post(twice))
        .layer(ContextLayer::new(gate, proxied_users()));
    let server = Server::start(app).await;
    let refused = client().post(server.at("/twice")).send().await.unwrap();
    assert_eq!(refused.status(), 429);
    assert_eq!(
        header(&refused, "ratelimit").as_deref(),
        Some(r#""ip-1m";r=0;t=60"#)
    );
    assert_eq!(
        header(&refused, "ratelimit-policy").as_deref(),
        Some(r#""ip-1m";q=1;w=60"#)
    );
}

#[rate_limit(by = "ip", rules = ["2/1m"], ipv6_prefix = 48, ipv4_prefix = 24)]
async fn sign_up() -> Result<&'static str, Rejection> {
    Ok("welcome")
}

#[tokio::test]
async fn the_macro_counts_ip_by_the_prefixes_it_is_given() {
    let (gate, _) = gate();
    let app = Router::new()
        .route("/signup", post(sign_up))
        .layer(ContextLayer::new(gate, proxied_users()));
    let server = Server::start(app).await;
    let mut statuses = Vec::new();
    // Four /64s of one /48, then four addresses of one /24, then another /48.
    for ip in [
        "2001:db8:7:1::1",
        "2001:db8:7:2::1",
        "2001:db8:7:3::1",
        "2001:db8:7:ffff::1",
        "192.0.2.1",
        "192.0.2.2",
        "192.0.2.3",
        "192.0.2.254",
        "2001:db8:8::1",
    ] {
        let response = client()
            .post(server.at("/signup"))
            .header("x-forwarded-for", ip)
            .send()
            .await
            .unwrap();
        statuses.push(response.status().as_u16());
    }
    assert_eq!(statuses, [200, 200, 429, 429, 200, 200, 429, 429, 200]);
}

#[tokio::test]
async fn a_guarded_handler_without_a_context_layer_is_a_500_that_says_why() {
    let app = Router::new().route("/sms/code", post(send_code));
    let server = Server::start(app).await;
    let response = client()
        .post(server.at("/sms/code"))
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 500);
    let body = problem(response).await;
    assert_eq!(body["code"], "no_context");
    assert!(body["detail"].as_str().unwrap().contains("ContextLayer"));
}

#[derive(Clone, Default)]
struct Hold {
    hold: Arc<AtomicBool>,
    entered: Arc<Notify>,
    proceed: Arc<Notify>,
    calls: Arc<AtomicUsize>,
}

impl Hold {
    async fn pass(&self) {
        self.calls.fetch_add(1, Ordering::SeqCst);
        if self.hold.load(Ordering::SeqCst) {
            self.entered.notify_one();
            self.proceed.notified().await;
        }
    }
}

#[prevent_duplicate(by = "user_id", ttl = "2s")]
async fn save_profile(
    State(hold): State<Hold>,
    Json(body): Json<Value>,
) -> Result<Json<Value>, Rejection> {
    hold.pass().await;
    if body["fail"] == true {
        return Err(Rejection::BadBody("refused by the handler".into()));
    }
    Ok(Json(json!({ "saved": true })))
}

#[prevent_duplicate(by = "args", ttl = "5s", args = ["body"])]
async fn post_comment(
    State(hold): State<Hold>,
    Json(body): Json<Value>,
) -> Result<&'static str, Rejection> {
    hold.pass().await;
    Ok("posted")
}

async fn duplicate_app() -> (Server, Hold) {
    let (gate, _) = gate();
    let hold = Hold::default();
    let app = Router::new()
        .route("/profile", post(save_profile))
        .route("/comments", post(post_comment))
        .with_state(hold.clone())
        .layer(ContextLayer::new(gate, proxied_users()));
    (Server::start(app).await, hold)
}

#[tokio::test]
async fn prevent_duplicate_by_user_is_409_in_flight_then_429() {
    let (server, hold) = duplicate_app().await;
    let save = |body: Value| {
        client()
            .post(server.at("/profile"))
            .header("x-user-id", "alice")
            .json(&body)
            .send()
    };
    hold.hold.store(true, Ordering::SeqCst);
    let first = tokio::spawn(save(json!({ "name": "A" })));
    hold.entered.notified().await;
    let in_flight = save(json!({ "name": "B" })).await.unwrap();
    assert_eq!(in_flight.status(), 409);
    assert_eq!(problem(in_flight).await["code"], "in_progress");
    hold.hold.store(false, Ordering::SeqCst);
    hold.proceed.notify_one();
    assert_eq!(first.await.unwrap().unwrap().status(), 200);

    let after = save(json!({ "name": "C" })).await.unwrap();
    assert_eq!(after.status(), 429);
    let wait: u64 = header(&after, "retry-after").unwrap().parse().unwrap();
    assert!((1..=2).contains(&wait), "{wait}");
    assert_eq!(hold.calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn an_err_from_the_guarded_handler_frees_the_lock() {
    let (server, hold) = duplicate_app().await;
    let save = |body: Value| {
        client()
            .post(server.at("/profile"))
            .header("x-user-id", "bob")
            .json(&body)
            .send()
    };
    assert_eq!(save(json!({ "fail": true })).await.unwrap().status(), 400);
    assert_eq!(save(json!({ "name": "ok" })).await.unwrap().status(), 200);
    assert_eq!(save(json!({ "name": "ok" })).await.unwrap().status(), 429);
    assert_eq!(hold.calls.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn prevent_duplicate_by_args_fingerprints_the_chosen_arguments() {
    let (server, hold) = duplicate_app().await;
    let comment = |text: &str| {
        client()
            .post(server.at("/comments"))
            .json(&json!({ "text": text }))
            .send()
    };
    assert_eq!(comment("first!").await.unwrap().status(), 200);
    let again = comment("first!").await.unwrap();
    assert_eq!(again.status(), 429);
    assert_eq!(problem(again).await["detail"], "repeated request");
    assert_eq!(comment("second").await.unwrap().status(), 200);
    assert_eq!(hold.calls.load(Ordering::SeqCst), 2);
}

#[rate_limit(by = "arg:phone", rules = ["1/1m"], name = "phone", message = "one code per number per minute")]
async fn code_for(phone: String) -> Result<String, Rejection> {
    Ok(format!("code for {phone}"))
}

struct Sms;
struct Email;

/// Two types' methods of one name in one module: by default, each has a scope of its own.
trait Notifier {
    async fn notify(&self, to: String) -> Result<(), Rejection>;
}

impl Sms {
    #[rate_limit(by = "arg:to", rules = ["1/1m"])]
    #[prevent_duplicate(by = "args", ttl = "1m")]
    async fn send(&self, to: String) -> Result<(), Rejection> {
        let _ = to;
        Ok(())
    }
}

impl Email {
    #[rate_limit(by = "arg:to", rules = ["1/1m"])]
    #[prevent_duplicate(by = "args", ttl = "1m")]
    async fn send(&self, to: String) -> Result<(), Rejection> {
        let _ = to;
        Ok(())
    }
}

impl Notifier for Sms {
    #[rate_limit(by = "arg:to", rules = ["1/1m"])]
    async fn notify(&self, to: String) -> Result<(), Rejection> {
        let _ = to;
        Ok(())
    }
}

impl Notifier for Email {
    #[rate_limit(by = "arg:to", rules = ["1/1m"])]
    async fn notify(&self, to: String) -> Result<(), Rejection> {
        let _ = to;
        Ok(())
    }
}

#[tokio::test]
async fn methods_of_one_name_on_two_types_count_apart() {
    let (gate, _) = gate();
    Context::new(gate, Identity::new())
        .scope(async {
            let to = || "+1555".to_owned();
            assert!(Sms.send(to()).await.is_ok());
            assert!(
                Email.send(to()).await.is_ok(),
                "Sms::send spent Email::send's quota"
            );
            assert!(matches!(
                Sms.send(to()).await,
                Err(Rejection::RateLimited(_))
            ));
            assert!(Sms.notify(to()).await.is_ok());
            assert!(
                Email.notify(to()).await.is_ok(),
                "one impl spent the other's quota"
            );
            assert!(matches!(
                Email.notify(to()).await,
                Err(Rejection::RateLimited(_))
            ));
        })
        .await;
}

impl Sms {
    /// The scope the macros would give this method.
    async fn scope() -> String {
        fn __tollgate_scope() {}
        tollgate_tower::__private::scope_of(std::any::type_name_of_val(&__tollgate_scope))
    }
}

/// What the compiler writes for a function's item, read as the macros read it: a free async
/// function's scope is its module path and name, as before; a method's names its type.
#[test]
fn a_default_scope_is_the_functions_path() {
    use tollgate_tower::__private::scope_of;
    async fn free() -> String {
        fn __tollgate_scope() {}
        scope_of(std::any::type_name_of_val(&__tollgate_scope))
    }
    let ready = |f: std::pin::Pin<&mut dyn std::future::Future<Output = String>>| match f
        .poll(&mut std::task::Context::from_waker(std::task::Waker::noop()))
    {
        std::task::Poll::Ready(scope) => scope,
        std::task::Poll::Pending => unreachable!("nothing to wait for"),
    };
    let module = module_path!();
    assert_eq!(
        ready(std::pin::pin!(free())),
        format!("{module}::a_default_scope_is_the_functions_path::free")
    );
    assert_eq!(
        ready(std::pin::pin!(Sms::scope())),
        format!("{module}::Sms::scope")
    );
    assert_eq!(
        scope_of("app::orders::send::{{closure}}::__tollgate_scope"),
        "app::orders::send"
    );
    assert_eq!(
        scope_of("app::Sms::send::{{closure}}::__tollgate_scope"),
        "app::Sms::send"
    );
    assert_eq!(
        scope_of("<app::Sms as app::Notify>::send::{{closure}}::__tollgate_scope"),
        "<app::Sms as app::Notify>::send"
    );
}

/// Failures are limited; a double submission is refused by the guard before it runs.
#[rate_limit(by = "arg:user", rules = ["2/15m"], count = "failures")]
#[prevent_duplicate(by = "args", ttl = "1m")]
async fn log_in(user: String) -> Result<&'static str, Rejection> {
    let _ = user;
    Ok("welcome")
}

/// A call the duplicate guard refused never ran: it is not a failure, and its charge comes
/// back. Counted as one, double submissions locked the user out of logging in.
#[tokio::test]
async fn a_duplicate_refusal_is_not_a_counted_failure() {
    let (gate, clock) = gate();
    Context::new(gate, Identity::new())
        .scope(async {
            assert_eq!(log_in("ann".into()).await.unwrap(), "welcome");
            for _ in 0..3 {
                assert!(matches!(
                    log_in("ann".into()).await,
                    Err(Rejection::Repeated { .. })
                ));
            }
            clock.advance(Duration::from_secs(60));
            assert_eq!(log_in("ann".into()).await.unwrap(), "welcome");
        })
        .await;
}

#[tokio::test]
async fn outside_http_a_scope_supplies_the_context_and_args_are_dimensions() {
    let (gate, _) = gate();
    let context = Context::new(gate, Identity::new());
    context
        .scope(async {
            assert!(code_for("+1555".into()).await.is_ok());
            let Err(Rejection::RateLimited(decision)) = code_for("+1555".into()).await else {
                panic!("the second code for one number is refused");
            };
            assert_eq!(decision.reason(), Reason::RateLimited);
            assert_eq!(decision.message(), Some("one code per number per minute"));
            assert!(code_for("+1666".into()).await.is_ok());
            let admitted = Context::current().unwrap().admitted_rules();
            assert_eq!(admitted.len(), 2);
        })
        .await;
    assert!(matches!(
        code_for("+1777".into()).await,
        Err(Rejection::NoContext)
    ));
}

/// An application error that wraps refusals, and a body using `?`.
#[derive(Debug)]
enum AppError {
    Refused(Rejection),
    Parse(std::num::ParseIntError),
}

impl From<Rejection> for AppError {
    fn from(r: Rejection) -> AppError {
        AppError::Refused(r)
    }
}

impl From<std::num::ParseIntError> for AppError {
    fn from(e: std::num::ParseIntError) -> AppError {
        AppError::Parse(e)
    }
}

struct Jobs {
    entered: Arc<Notify>,
    hold: AtomicBool,
}

impl Jobs {
    #[rate_limit(by = "user_id", rules = ["100/1m"])]
    #[prevent_duplicate(by = "args", ttl = "1m")]
    async fn run(&self, job: String) -> Result<u32, AppError> {
        if self.hold.load(Ordering::SeqCst) {
            self.entered.notify_one();
            std::future::pending::<()>().await;
        }
        Ok(job.parse::<u32>()?)
    }
}

#[tokio::test]
async fn methods_custom_errors_and_cancelled_calls() {
    let (gate, _) = gate();
    let jobs = Arc::new(Jobs {
        entered: Arc::new(Notify::new()),
        hold: AtomicBool::new(false),
    });
    let context = Context::new(gate, Identity::new().with_user_id("u1"));

    let outcome = context
        .clone()
        .scope(async {
            // A failed call (here a parse error through `?`) frees the lock for a retry.
            for _ in 0..2 {
                let Err(AppError::Parse(e)) = jobs.run("x".into()).await else {
                    panic!("the parse error comes through `?`");
                };
                assert_eq!(e.to_string(), "invalid digit found in string");
            }
            assert_eq!(jobs.run("7".into()).await.unwrap(), 7);
            jobs.run("7".into()).await
        })
        .await;
    assert!(matches!(
        outcome,
        Err(AppError::Refused(Rejection::Repeated { .. }))
    ));

    // A call cancelled mid-way frees its lock too.
    jobs.hold.store(true, Ordering::SeqCst);
    let running = tokio::spawn(context.clone().scope({
        let jobs = jobs.clone();
        async move { jobs.run("9".into()).await.map_err(|e| format!("{e:?}")) }
    }));
    jobs.entered.notified().await;
    running.abort();
    let _ = running.await;
    jobs.hold.store(false, Ordering::SeqCst);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        match context.clone().scope(jobs.run("9".into())).await {
            Ok(n) => {
                assert_eq!(n, 9);
                break;
            }
            Err(AppError::Refused(Rejection::InProgress { .. })) => {
                assert!(tokio::time::Instant::now() < deadline, "never released");
                tokio::task::yield_now().await;
            }
            Err(other) => panic!("{other:?}"),
        }
    }
}

#[rate_limit(by = "user_id", rules = ["10/10s"], algorithm = "sliding_window")]
async fn export(_: u32) -> Result<(), Rejection> {
    Ok(())
}

#[tokio::test]
async fn a_sliding_window_rule_through_the_macro() {
    let (gate, clock) = gate();
    let context = Context::new(gate, Identity::new().with_user_id("u1"));
    context
        .scope(async {
            // 10 in the window, then the previous window weighs by what the sliding window
            // still covers: 5 s into the next, half of them, so 5 more fit.
            for n in 0..10 {
                export(n).await.unwrap();
            }
            assert!(matches!(export(10).await, Err(Rejection::RateLimited(_))));
            let into = clock.now_us() % 10_000_000;
            clock.advance(Duration::from_micros(15_000_000 - into));
            for n in 0..5 {
                export(n).await.unwrap();
            }
            let Err(Rejection::RateLimited(decision)) = export(5).await else {
                panic!("the sixth is over the estimate");
            };
            assert_eq!(decision.retry_after(), Some(Duration::from_secs(1)));
        })
        .await;
}

#[rate_limit(by = "user_id", rules = ["3/1m"])]
#[rate_limit(by = "user_id", name = "trial", rules = ["1/1m"], shadow = true)]
async fn search(_: u32) -> Result<(), Rejection> {
    Ok(())
}

#[tokio::test]
async fn a_shadow_limiter_through_the_macro_never_refuses() {
    let (gate, _) = gate();
    let context = Context::new(gate, Identity::new().with_user_id("u1"));
    context
        .scope(async {
            for n in 0..3 {
                search(n).await.expect("the trial limit is not enforced");
            }
            let Err(Rejection::RateLimited(decision)) = search(3).await else {
                panic!("the enforced limit refuses the fourth");
            };
            let denied: Vec<String> = decision
                .denied_rules()
                .map(|r| r.limiter.to_string())
                .collect();
            assert_eq!(denied, ["user_id"]);
            assert!(
                decision.shadow_denied(),
                "the trial limit would have refused too"
            );
        })
        .await;
}

#[rate_limit(by = "user_id", rules = ["2/1m"], count = "failures")]
async fn verify_code(code: u32) -> Result<(), AppError> {
    if code == 1234 {
        Ok(())
    } else {
        Err(AppError::Parse("x".parse::<u32>().unwrap_err()))
    }
}

#[rate_limit(by = "user_id", rules = ["1/1m"], count = "successes")]
async fn flaky(panics: bool) -> Result<(), Rejection> {
    assert!(!panics, "the call fails");
    Ok(())
}

#[tokio::test]
async fn count_through_the_macro() {
    let (first, _) = gate();
    let context = Context::new(first, Identity::new().with_user_id("u1"));
    context
        .scope(async {
            // Right codes are refunded: any number of them.
            for _ in 0..5 {
                assert!(verify_code(1234).await.is_ok());
            }
            // Wrong ones count: two, then refused.
            assert!(matches!(verify_code(1).await, Err(AppError::Parse(_))));
            assert!(matches!(verify_code(2).await, Err(AppError::Parse(_))));
            assert!(matches!(
                verify_code(1234).await,
                Err(AppError::Refused(Rejection::RateLimited(_)))
            ));
        })
        .await;

    // Only successes count: a call that panics is refunded (in the background).
    let (second, _) = gate();
    let context = Context::new(second, Identity::new().with_user_id("u2"));
    let panicked = tokio::spawn(context.clone().scope(flaky(true))).await;
    assert!(panicked.unwrap_err().is_panic());
    context
        .scope(async {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
            loop {
                match flaky(false).await {
                    Ok(()) => break,
                    Err(Rejection::RateLimited(_)) => {
                        assert!(tokio::time::Instant::now() < deadline, "never refunded");
                        tokio::task::yield_now().await;
                    }
                    Err(other) => panic!("{other:?}"),
                }
            }
            assert!(matches!(flaky(false).await, Err(Rejection::RateLimited(_))));
        })
        .await;
}

#[rate_limit(by = "user_id", rules = ["2/1d@UTC"])]
async fn daily_report() -> Result<(), Rejection> {
    Ok(())
}

#[tokio::test]
async fn a_calendar_window_through_the_macro() {
    // The test clock: 2023-11-14T22:13:20Z, 6,400 s before the UTC day ends.
    let (gate, clock) = gate();
    let context = Context::new(gate, Identity::new().with_user_id("u1"));
    context
        .scope(async {
            daily_report().await.unwrap();
            daily_report().await.unwrap();
            let Err(Rejection::RateLimited(decision)) = daily_report().await else {
                panic!("the third report of the day is refused");
            };
            assert_eq!(decision.retry_after(), Some(Duration::from_secs(6_400)));
            clock.advance(Duration::from_secs(6_400));
            daily_report().await.expect("a new day");
        })
        .await;
}

#[rate_limit(by = "user_id", concurrent = 1, lease_ttl = "1m")]
#[rate_limit(by = "user_id", name = "hourly", rules = ["10/1h"])]
async fn export_job(entered: Arc<Notify>, done: Arc<Notify>) -> Result<(), Rejection> {
    entered.notify_one();
    done.notified().await;
    Ok(())
}

#[tokio::test]
async fn a_concurrency_limit_through_the_macro() {
    let (gate, _) = gate();
    let context = Context::new(gate, Identity::new().with_user_id("u1"));
    let (entered, done) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let running = tokio::spawn(
        context
            .clone()
            .scope(export_job(entered.clone(), done.clone())),
    );
    // The first job holds its slot once it is inside: then a second is refused.
    entered.notified().await;
    let at_once = || {
        let done = Arc::new(Notify::new());
        done.notify_one();
        export_job(Arc::new(Notify::new()), done)
    };
    context
        .clone()
        .scope(async {
            let Err(Rejection::RateLimited(refusal)) = at_once().await else {
                panic!("a second job while the first runs is refused");
            };
            assert_eq!(refusal.reason(), Reason::ConcurrencyLimited);
            assert!(refusal.retry_after() <= Some(Duration::from_secs(60)));
        })
        .await;
    // The first job ends: its slot is free as soon as it returns.
    done.notify_one();
    running.await.unwrap().unwrap();
    context
        .scope(async {
            at_once().await.expect("the slot is free");
        })
        .await;
}

#[rate_limit(by = "user_id", concurrent = 1, lease_ttl = "3s")]
async fn long_export(entered: Arc<Notify>, done: Arc<Notify>) -> Result<(), Rejection> {
    entered.notify_one();
    done.notified().await;
    Ok(())
}

/// A call longer than its lease's TTL keeps its slot: the lease is renewed every third of the
/// TTL while the call runs, and freed when it returns.
#[tokio::test(start_paused = true)]
async fn a_call_longer_than_its_lease_keeps_its_slot() {
    let (gate, clock) = gate();
    let context = Context::new(gate, Identity::new().with_user_id("u1"));
    let (entered, done) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let running = tokio::spawn(
        context
            .clone()
            .scope(long_export(entered.clone(), done.clone())),
    );
    entered.notified().await;
    let at_once = || {
        let done = Arc::new(Notify::new());
        done.notify_one();
        long_export(Arc::new(Notify::new()), done)
    };
    // Five seconds of the store's time, second by second, each after a renewal's turn.
    for _ in 0..5 {
        crate::support::step(&clock, Duration::from_secs(1), Duration::from_secs(1)).await;
    }
    context
        .clone()
        .scope(async {
            let Err(Rejection::RateLimited(refusal)) = at_once().await else {
                panic!("the slot is still the running call's");
            };
            assert_eq!(refusal.reason(), Reason::ConcurrencyLimited);
        })
        .await;
    done.notify_one();
    running.await.unwrap().unwrap();
    context
        .scope(async {
            at_once()
                .await
                .expect("the slot is free once the call returned");
        })
        .await;
}

#[tokio::test]
async fn warn_at_on_a_handler_says_ratelimit_warning() {
    let (gate, _) = gate();
    let app = Router::new()
        .route("/export", post(warned_export))
        .layer(ContextLayer::new(gate, IdentityResolver::new()));
    let server = Server::start(app).await;
    let mut seen = Vec::new();
    for _ in 0..3 {
        let response = client().post(server.at("/export")).send().await.unwrap();
        seen.push(header(&response, "ratelimit-warning"));
    }
    assert_eq!(
        seen,
        [
            None,
            Some(r#""ip-1m";r=2;t=60"#.to_owned()),
            Some(r#""ip-1m";r=1;t=60"#.to_owned()),
        ]
    );
}

#[tokio::test]
async fn a_soft_rule_on_a_handler_never_refuses() {
    let (gate, _) = gate();
    let app = Router::new()
        .route("/upload", post(soft_upload))
        .layer(ContextLayer::new(gate, IdentityResolver::new()));
    let server = Server::start(app).await;
    let mut statuses = Vec::new();
    for _ in 0..4 {
        let response = client().post(server.at("/upload")).send().await.unwrap();
        statuses.push(response.status().as_u16());
    }
    // Past the soft 1/1m from the second on; refused by the enforced 3/1m only.
    assert_eq!(statuses, [200, 200, 200, 429]);
}

#[tokio::test]
async fn an_override_raises_a_handlers_limit_for_one_identity() {
    let (gate, _) = gate();
    let app = Router::new()
        .route("/report", post(overridable_report))
        .layer(ContextLayer::new(gate.clone(), IdentityResolver::new()));
    let server = Server::start(app).await;
    // The handler's policy, addressed by its scope, limiter and rules.
    let policy = tollgate::Policy::builder("reports")
        .limiter(
            tollgate::Limiter::new(tollgate::Dimension::Ip, ["2/1m".parse().unwrap()])
                .with_overrides(true),
        )
        .build()
        .unwrap();
    let me = tollgate::Identity::new().with_ip("127.0.0.1".parse().unwrap());
    gate.set_override(&policy, "ip", &me, &["3/1m".parse().unwrap()], None)
        .await
        .unwrap();
    let mut statuses = Vec::new();
    for _ in 0..4 {
        let response = client().post(server.at("/report")).send().await.unwrap();
        statuses.push(response.status().as_u16());
    }
    assert_eq!(statuses, [200, 200, 200, 429]);
}

#[tokio::test]
async fn a_cost_from_the_arguments_is_settled_at_what_the_result_says() {
    let (gate, _) = gate();
    let user = tollgate::Identity::new().with_user_id("u1");
    let context = tollgate_tower::Context::new(gate.clone(), user.clone());
    let policy = tollgate::Policy::builder("completions")
        .limiter(tollgate::Limiter::new(
            tollgate::Dimension::UserId,
            ["100/1h"
                .parse::<tollgate::Rule>()
                .unwrap()
                .with_algorithm(tollgate::Algorithm::FixedWindow)],
        ))
        .build()
        .unwrap();
    let left = || async {
        gate.peek(&policy, &user, 0)
            .await
            .unwrap()
            .remaining()
            .unwrap()
    };
    // Checked for 0 (nothing recorded), used 20: 20 charged.
    assert_eq!(context.clone().scope(complete(0, 20)).await.unwrap(), 20);
    assert_eq!(left().await, 80);
    // Checked for 30, used 30: 50 charged in all.
    assert_eq!(context.clone().scope(complete(30, 30)).await.unwrap(), 30);
    assert_eq!(left().await, 50);
    // Checked for 40, used 10: 10 charged (30 given back).
    assert_eq!(context.clone().scope(complete(40, 10)).await.unwrap(), 10);
    assert_eq!(left().await, 40);
    // 41 cannot be checked any more; 40 can.
    assert!(context.clone().scope(complete(41, 1)).await.is_err());
    assert_eq!(context.clone().scope(complete(40, 40)).await.unwrap(), 40);
    assert_eq!(left().await, 0);
}

#[tokio::test(start_paused = true)]
async fn a_call_within_max_delay_waits_its_turn_and_gives_it_back_if_dropped() {
    let (gate, _) = gate();
    let context = tollgate_tower::Context::new(gate, tollgate::Identity::new().with_user_id("u"));
    let run = || context.clone().scope(checkout());
    let start = tokio::time::Instant::now();
    // The burst of 2 goes at once.
    run().await.unwrap();
    run().await.unwrap();
    assert_eq!(start.elapsed(), Duration::ZERO);
    // The third's turn is 500 ms away: within 600 ms, so it waits, then goes.
    run().await.unwrap();
    assert_eq!(start.elapsed(), Duration::from_millis(500));
    // The store's clock has not moved (a manual one): the next turn is 1 s away, too far.
    let refused = run().await.unwrap_err();
    assert!(
        matches!(refused, Rejection::RateLimited { .. }),
        "{refused:?}"
    );
    // A caller that stops waiting gives its place back: the next one gets it.
    let gate2 = gate_with_turn_taken().await;
    let context2 = tollgate_tower::Context::new(gate2, tollgate::Identity::new().with_user_id("v"));
    let waited = tokio::time::timeout(
        Duration::from_millis(100),
        context2.clone().scope(checkout()),
    )
    .await;
    assert!(waited.is_err(), "dropped while waiting");
    // The give-back runs in the background.
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    let before = tokio::time::Instant::now();
    context2.clone().scope(checkout()).await.unwrap();
    assert_eq!(
        before.elapsed(),
        Duration::from_millis(500),
        "the dropped call's place, not the one after it"
    );
}

/// A gate whose user `v` has used the burst of `checkout`.
async fn gate_with_turn_taken() -> std::sync::Arc<tollgate::Tollgate<tollgate::MemoryStore>> {
    let (gate, _) = gate();
    let context =
        tollgate_tower::Context::new(gate.clone(), tollgate::Identity::new().with_user_id("v"));
    context.clone().scope(checkout()).await.unwrap();
    context.scope(checkout()).await.unwrap();
    gate
}

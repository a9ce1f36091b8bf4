use tollgate_tower::rate_limit;

#[rate_limit(by = "ip", rules = ["1/1m"])]
async fn send_code() -> &'static str {
    "sent"
}

fn main() {}

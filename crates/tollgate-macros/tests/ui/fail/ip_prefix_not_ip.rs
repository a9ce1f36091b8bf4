use tollgate_tower::{Rejection, rate_limit};

#[rate_limit(by = "user_id", rules = ["1/1m"], ipv6_prefix = 48)]
async fn send_code() -> Result<(), Rejection> {
    Ok(())
}

fn main() {}

use tollgate_tower::{Rejection, rate_limit};

#[rate_limit(by = "ip", rules = ["100/1h"], settle = "42")]
async fn complete(max_tokens: u64) -> Result<u64, Rejection> {
    Ok(max_tokens)
}

fn main() {}

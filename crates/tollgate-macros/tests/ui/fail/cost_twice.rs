use tollgate_tower::{Rejection, rate_limit};

#[rate_limit(by = "ip", rules = ["100/1h"], cost = "max_tokens")]
#[rate_limit(by = "user_id", rules = ["1000/1d"], cost = "max_tokens")]
async fn complete(max_tokens: u64) -> Result<u64, Rejection> {
    Ok(max_tokens)
}

fn main() {}

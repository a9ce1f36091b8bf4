use tollgate_tower::{Rejection, rate_limit};

#[rate_limit(by = "ip", rules = ["10/1m"], warn_at = 1.5)]
async fn send_code() -> Result<(), Rejection> {
    Ok(())
}

fn main() {}

use tollgate_tower::{Rejection, rate_limit};

#[rate_limit(by = "ip", rules = ["5/15m"], count = "errors")]
async fn login() -> Result<(), Rejection> {
    Ok(())
}

fn main() {}

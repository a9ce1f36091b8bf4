use tollgate_tower::{Rejection, rate_limit};

#[rate_limit(by = "ip", rules = ["5/15m"], count = "failures")]
#[rate_limit(by = "user_id", rules = ["20/1d"], count = "successes")]
async fn login() -> Result<(), Rejection> {
    Ok(())
}

fn main() {}

use tollgate_tower::{Rejection, rate_limit};

// A calendar window is a fixed window; the policy refuses another algorithm for it.
#[rate_limit(by = "user_id", rules = ["60/1d@UTC"], algorithm = "gcra")]
async fn export() -> Result<(), Rejection> {
    Ok(())
}

fn main() {}

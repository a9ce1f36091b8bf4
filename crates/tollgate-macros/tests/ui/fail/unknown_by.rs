use tollgate_tower::{Rejection, rate_limit};

#[rate_limit(by = "cookie", rules = ["1/1m"])]
async fn send_code() -> Result<(), Rejection> {
    Ok(())
}

fn main() {}

use tollgate_tower::{Rejection, rate_limit};

#[rate_limit(by = "ip", rules = ["1/1m", "10/1d@Mars/Olympus"])]
async fn send_code() -> Result<(), Rejection> {
    Ok(())
}

fn main() {}

use tollgate_tower::{Rejection, rate_limit};

#[rate_limit(by = "ip", rules = ["10/1m"], soft = ["10/1m"])]
async fn send_code() -> Result<(), Rejection> {
    Ok(())
}

fn main() {}

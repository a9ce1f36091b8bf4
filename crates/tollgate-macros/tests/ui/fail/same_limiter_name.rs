use tollgate_tower::{Rejection, rate_limit};

#[rate_limit(by = "ip", rules = ["1/1m"])]
#[rate_limit(by = "ip", rules = ["10/1h"])]
async fn send_code() -> Result<(), Rejection> {
    Ok(())
}

fn main() {}

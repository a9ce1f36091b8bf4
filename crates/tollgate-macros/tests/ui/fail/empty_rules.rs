use tollgate_tower::{Rejection, rate_limit};

#[rate_limit(by = "ip", rules = [])]
async fn send_code() -> Result<(), Rejection> {
    Ok(())
}

fn main() {}

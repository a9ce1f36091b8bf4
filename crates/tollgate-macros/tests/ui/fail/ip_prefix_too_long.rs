use tollgate_tower::{Rejection, rate_limit};

#[rate_limit(by = "ip", rules = ["1/1m"], ipv6_prefix = 129)]
async fn send_code() -> Result<(), Rejection> {
    Ok(())
}

#[rate_limit(by = "ip", rules = ["1/1m"], ipv4_prefix = 33)]
async fn sign_up() -> Result<(), Rejection> {
    Ok(())
}

fn main() {}

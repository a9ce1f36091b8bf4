use tollgate_tower::{Rejection, rate_limit};

#[rate_limit(by = "ip", concurrent = 0, lease_ttl = "1m")]
async fn export() -> Result<(), Rejection> {
    Ok(())
}

fn main() {}

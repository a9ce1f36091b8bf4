use tollgate_tower::{Rejection, rate_limit};

// Every rule parses, but the policy cannot hold a sliding log of two million entries.
#[rate_limit(by = "ip", rules = ["2000000/1d"])]
async fn send_code() -> Result<(), Rejection> {
    Ok(())
}

fn main() {}

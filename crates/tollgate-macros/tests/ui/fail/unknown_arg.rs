use tollgate_tower::{Rejection, rate_limit};

#[rate_limit(by = "arg:phone", rules = ["1/1m"])]
async fn send_code(number: String) -> Result<String, Rejection> {
    Ok(number)
}

fn main() {}

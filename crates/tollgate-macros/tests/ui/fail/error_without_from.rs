use tollgate_tower::rate_limit;

#[derive(Debug)]
struct MyError;

#[rate_limit(by = "ip", rules = ["1/1m"])]
async fn send_code() -> Result<(), MyError> {
    Ok(())
}

fn main() {}

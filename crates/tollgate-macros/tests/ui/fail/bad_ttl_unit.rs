use tollgate_tower::{Rejection, prevent_duplicate};

#[prevent_duplicate(by = "args", ttl = "5x")]
async fn submit(order: u32) -> Result<u32, Rejection> {
    Ok(order)
}

fn main() {}

use tollgate_tower::{Rejection, prevent_duplicate};

#[prevent_duplicate(by = "user_id", args = ["item"])]
async fn submit(item: u32) -> Result<u32, Rejection> {
    Ok(item)
}

fn main() {}

use tollgate_tower::{Rejection, prevent_duplicate};

struct Order {
    item: u32,
}

#[prevent_duplicate(by = "args")]
async fn submit(order: Order) -> Result<u32, Rejection> {
    Ok(order.item)
}

fn main() {}

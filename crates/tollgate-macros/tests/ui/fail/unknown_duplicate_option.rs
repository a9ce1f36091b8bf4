use tollgate_tower::{Rejection, prevent_duplicate};

#[prevent_duplicate(by = "ip", expire = "1s")]
async fn submit() -> Result<(), Rejection> {
    Ok(())
}

fn main() {}

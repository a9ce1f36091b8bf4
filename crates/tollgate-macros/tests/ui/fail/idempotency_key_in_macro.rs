use tollgate_tower::{Rejection, prevent_duplicate};

#[prevent_duplicate(by = "key")]
async fn submit() -> Result<(), Rejection> {
    Ok(())
}

fn main() {}

use tollgate_tower::{Rejection, prevent_duplicate};

#[prevent_duplicate(by = "user_id")]
fn submit() -> Result<(), Rejection> {
    Ok(())
}

fn main() {}

use tollgate_tower::{Rejection, prevent_duplicate};

#[prevent_duplicate(by = "session")]
async fn submit() -> Result<(), Rejection> {
    Ok(())
}

fn main() {}

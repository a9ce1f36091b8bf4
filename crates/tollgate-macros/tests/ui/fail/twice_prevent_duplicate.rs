use tollgate_tower::{Rejection, prevent_duplicate};

#[prevent_duplicate(by = "user_id")]
#[prevent_duplicate(by = "ip")]
async fn submit() -> Result<(), Rejection> {
    Ok(())
}

fn main() {}

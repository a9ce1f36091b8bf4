use tollgate_tower::rate_limit;

#[rate_limit(by = "ip", rules = ["1/1m"])]
async fn list() -> axum::Json<Vec<u32>> {
    axum::Json(vec![1])
}

fn main() {}

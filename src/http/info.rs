//! `GET /v1/models`, `GET /v1/models/{id}` and `GET /health`.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use serde_json::{Value, json};

use super::error::ApiError;
use super::json::json_response;
use super::state::Shared;

fn model_object(st: &Shared) -> Value {
    json!({
        "id": st.model(),
        "object": "model",
        "created": st.started,
        "owned_by": "colibri",
    })
}

/// The served model, as OpenAI lists models.
pub async fn models(State(st): State<Shared>) -> Response {
    json_response(
        StatusCode::OK,
        &json!({ "object": "list", "data": [model_object(&st)] }),
    )
}

/// One model by id (only the served one exists).
pub async fn model(State(st): State<Shared>, Path(id): Path<String>) -> Result<Response, ApiError> {
    if id == st.model() {
        Ok(json_response(StatusCode::OK, &model_object(&st)))
    } else {
        Err(ApiError::not_found(format!("The model '{id}' does not exist.")).with_code("model_not_found"))
    }
}

/// Liveness: the process answers (no key needed).
pub async fn health() -> Response {
    json_response(StatusCode::OK, &json!({ "status": "ok" }))
}

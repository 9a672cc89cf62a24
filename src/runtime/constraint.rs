//! What a request's generated text must match: the shapes agents ask for
//! (`response_format`, a `grammar`, a forced tool call), carried from the
//! front ends to the decode loop, which enforces them token by token.

/// A constraint on a reply, as a front end parsed it.
#[derive(Clone, Debug, PartialEq)]
pub enum ConstraintSpec {
    /// Any JSON object (`response_format: {"type": "json_object"}`).
    JsonObject,
    /// JSON valid against `schema` (`response_format: {"type":
    /// "json_schema"}`); `strict` refuses schema features that cannot be
    /// enforced exactly instead of approximating them.
    JsonSchema { schema: serde_json::Value, strict: bool },
    /// A grammar in llguidance's Lark dialect (it may embed JSON schemas
    /// with `%json{...}`): the `grammar` extension and forced tool calls.
    Lark(String),
}

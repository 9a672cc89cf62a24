//! The layer-compute actor: owns the model's weights and the compute
//! threads, and runs one forward step at a time for a batch of sequences.
//! The decode loop sends it [`Step`]s over a bounded channel (one step in
//! flight: the loop builds the next batch from this one's results).

mod actor;
mod msg;

pub use actor::ComputeHandle;
pub use msg::{Step, StepDone, StepItem};

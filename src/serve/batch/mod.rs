//! `coli serve --batch`: the multiplexed stdin/stdout protocol
//! (docs/serve-batch-protocol.md). Several requests, each named by a client
//! id and pinned to a KV slot, run at once on the decode loop; their replies
//! are interleaved on stdout, in order within each request.
//!
//! - [`codec`]: bytes in -> frames, never losing sync on bad input;
//! - [`reply`]: the exact bytes out.

pub mod codec;
pub mod reply;

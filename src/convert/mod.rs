//! `coli convert`: HF checkpoint to streaming container.

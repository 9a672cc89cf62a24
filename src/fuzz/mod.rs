//! A seeded mutational fuzzer for the parsers that read untrusted bytes:
//! safetensors headers, GGUF headers, `config.json`, `.coli_kv` state files and `coli
//! serve` frames. It runs on stable Rust (no cargo-fuzz, no nightly): each
//! target starts from valid seed inputs, mutates them with a deterministic
//! generator (byte flips, interesting numbers, splices, and structural edits
//! of the JSON inside), and feeds every mutant to the real parser under
//! `catch_unwind`. A panic, or a broken invariant the target checks, is a
//! finding, reported with the seed and iteration that reproduce it.
//!
//! The test suite runs a quick pass (tests/fuzz_parsers.rs); the long pass
//! and its figures are in docs/fuzzing.md.

mod gguf_model;
mod mutate;
mod targets;

use std::panic::{AssertUnwindSafe, catch_unwind};

pub use gguf_model::gguf_model_target;
pub use mutate::Rng;
pub use targets::{Target, all_targets};

/// What one fuzzing run found.
#[derive(Debug, Default, Clone)]
pub struct FuzzReport {
    /// Inputs fed to the target.
    pub inputs: u64,
    /// Inputs the parser accepted (the rest were refused with an error).
    pub accepted: u64,
    /// Findings: a panic or a broken invariant, with the reproducing input.
    pub findings: Vec<Finding>,
}

/// One input that made a target misbehave.
#[derive(Debug, Clone)]
pub struct Finding {
    pub iteration: u64,
    pub what: String,
    pub input: Vec<u8>,
}

/// What a target did with one input.
pub enum Verdict {
    /// Parsed (and every invariant held).
    Accepted,
    /// Refused with an error: the expected outcome for most mutants.
    Refused,
    /// Parsed, but an invariant is broken.
    Broken(String),
}

/// Runs `iterations` mutants of `target`'s seeds, generated from `seed`.
/// Keeps at most 8 findings (the first ones) and never stops early, so the
/// input count is the same for every run with the same arguments.
pub fn run(target: &Target, seed: u64, iterations: u64) -> FuzzReport {
    let seeds = (target.seeds)();
    let mut rng = Rng::new(seed ^ target.name.len() as u64);
    let mut report = FuzzReport::default();
    for i in 0..iterations {
        let input = match seeds.len() {
            0 => Vec::new(),
            n => {
                let base = &seeds[rng.below(n as u64) as usize];
                let other = &seeds[rng.below(n as u64) as usize];
                (target.mutate)(&mut rng, base, other)
            }
        };
        report.inputs += 1;
        match catch_unwind(AssertUnwindSafe(|| (target.check)(&input))) {
            Ok(Verdict::Accepted) => report.accepted += 1,
            Ok(Verdict::Refused) => {}
            Ok(Verdict::Broken(what)) => {
                if report.findings.len() < 8 {
                    report.findings.push(Finding {
                        iteration: i,
                        what,
                        input,
                    });
                }
            }
            Err(payload) => {
                let what = payload
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_else(|| "a panic".into());
                if report.findings.len() < 8 {
                    report.findings.push(Finding {
                        iteration: i,
                        what: format!("panic: {what}"),
                        input,
                    });
                }
            }
        }
    }
    report
}

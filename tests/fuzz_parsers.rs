//! The parsers of untrusted bytes under the seeded mutational fuzzer
//! (colibri::fuzz). Quick by default; the long pass of docs/fuzzing.md:
//!
//! ```sh
//! COLI_FUZZ_ITERS=1000000 cargo test --release --test fuzz_parsers -- --nocapture
//! ```
//!
//! `COLI_FUZZ_SEED` picks another seed (default 1); a finding prints the
//! seed, the iteration and the input, which reproduce it exactly.

use colibri::fuzz::{all_targets, gguf_model_target, run};

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[test]
fn parsers_survive_mutated_inputs() {
    let iters = env_u64("COLI_FUZZ_ITERS", 20_000);
    let seed = env_u64("COLI_FUZZ_SEED", 1);
    let mut failed = Vec::new();
    for target in all_targets() {
        let t0 = std::time::Instant::now();
        let r = run(&target, seed, iters);
        let secs = t0.elapsed().as_secs_f64();
        eprintln!(
            "{:<20} {:>9} inputs, {:>8} accepted, {} findings, {:.1} s ({:.0} inputs/s)",
            target.name,
            r.inputs,
            r.accepted,
            r.findings.len(),
            secs,
            r.inputs as f64 / secs.max(1e-9)
        );
        assert_eq!(r.inputs, iters);
        assert!(
            r.accepted > 0,
            "{}: no mutant was accepted; the seeds are broken",
            target.name
        );
        for f in &r.findings {
            failed.push(format!(
                "{} seed {seed} iteration {}: {}\n  input: {:?}",
                target.name,
                f.iteration,
                f.what,
                String::from_utf8_lossy(&f.input)
            ));
        }
    }
    assert!(failed.is_empty(), "findings:\n{}", failed.join("\n"));
}

/// Whole GGUF models, mutated, loaded by the engine and run (each input
/// writes a file and loads a model, so fewer inputs: `COLI_FUZZ_MODEL_ITERS`).
#[test]
fn gguf_models_survive_mutation() {
    let iters = env_u64("COLI_FUZZ_MODEL_ITERS", 5_000);
    let seed = env_u64("COLI_FUZZ_SEED", 1);
    let target = gguf_model_target();
    let t0 = std::time::Instant::now();
    let r = run(&target, seed, iters);
    eprintln!(
        "{:<20} {:>9} inputs, {:>8} accepted, {} findings, {:.1} s",
        target.name,
        r.inputs,
        r.accepted,
        r.findings.len(),
        t0.elapsed().as_secs_f64()
    );
    assert_eq!(r.inputs, iters);
    assert!(r.accepted > 0, "no mutant was accepted; the seeds are broken");
    let failed: Vec<String> = r
        .findings
        .iter()
        .map(|f| {
            format!(
                "iteration {}: {}\n  input: {} bytes",
                f.iteration,
                f.what,
                f.input.len()
            )
        })
        .collect();
    assert!(
        failed.is_empty(),
        "findings (seed {seed}):\n{}",
        failed.join("\n")
    );
}

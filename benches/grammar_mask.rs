//! Constrained decoding's per-token mask (llguidance) on its own: one whole
//! JSON reply generated under a `json_object` and a `json_schema`
//! constraint, compile included, on the bundled tiny model's vocabulary
//! (1024 tokens) and on a synthetic byte-level vocabulary of OLMoE's size
//! (50304). After criterion's reports, a summary prints the mean mask per
//! token from `grammar::measure::mask_cost` (the figure `coli bench
//! --grammar-bench` sets against a decode step). `COLI_BENCH_QUICK=1`
//! skips criterion's reports.

use std::hint::black_box;
use std::path::Path;

use colibri::grammar::measure::{BenchGrammar, mask_cost};
use colibri::grammar::{Grammars, tokens};
use criterion::Criterion;

fn vocabularies() -> Vec<(&'static str, Grammars)> {
    let tiny = Path::new(env!("CARGO_MANIFEST_DIR")).join("models/colibri-tiny");
    let olmoe = 50304;
    vec![
        ("colibri-tiny (1024)", Grammars::for_model(&tiny, 1024, &[5, 0])),
        (
            "synthetic (50304)",
            Grammars::from_words(tokens::synthetic_vocabulary(olmoe, 1), olmoe, &[olmoe as u32 - 1]),
        ),
    ]
}

fn main() {
    let vocabs = vocabularies();
    let kinds = [BenchGrammar::Json, BenchGrammar::Schema];
    if std::env::var_os("COLI_BENCH_QUICK").is_none() {
        let mut c = Criterion::default().configure_from_args().sample_size(10);
        for (name, g) in &vocabs {
            for kind in kinds {
                c.bench_function(&format!("{kind:?} reply, {name}"), |b| {
                    b.iter(|| black_box(mask_cost(g, kind, 1).ok()))
                });
            }
        }
        c.final_summary();
    }
    println!(
        "{:<22} {:<8} {:>8} {:>12} {:>12} {:>12}",
        "vocabulary", "kind", "tokens", "mean us", "max us", "compile ms"
    );
    for (name, g) in &vocabs {
        for kind in kinds {
            match mask_cost(g, kind, 5) {
                Ok(m) => println!(
                    "{name:<22} {:<8} {:>8} {:>12.1} {:>12.1} {:>12.2}",
                    format!("{kind:?}"),
                    m.tokens,
                    m.mean_us,
                    m.max_us,
                    m.compile_us / 1e3
                ),
                Err(e) => println!("{name:<22} {kind:?}: {e}"),
            }
        }
    }
}

//! What the `coli synth` tests share: the CLI run on a directory with its
//! own state home, a container's bytes, and a short bench's flags.

use std::path::Path;

/// `coli ARGS DIR` with `XDG_STATE_HOME` at `state`: (success, stdout, stderr).
pub fn coli_on(args: &[&str], dir: &Path, state: &Path) -> (bool, String, String) {
    let out = super::coli_command()
        .args(args)
        .arg(dir)
        .env("XDG_STATE_HOME", state)
        .output();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A container's weights and config.json, to compare two writes.
pub fn container_files(dir: &Path) -> (Vec<u8>, Vec<u8>) {
    let read = |f: &str| std::fs::read(dir.join(f)).unwrap_or_default();
    (read("model.safetensors"), read("config.json"))
}

/// A four-token `coli bench` on a tiny model (the model's path follows).
pub const SHORT_BENCH: [&str; 10] = [
    "bench",
    "--prompt-len",
    "4",
    "--warmup",
    "1",
    "--tokens",
    "4",
    "--probe-mb",
    "1",
    "--model",
];

/// Decodes `steps` tokens after a `prompt_len`-token synthetic prompt, twice
/// on one engine (a warm cache must give the same tokens), checking that
/// every routed expert of every sparse layer was delivered each step.
pub fn decode_twice(
    dir: &Path,
    spec: &colibri::synth::SynthSpec,
    opts: &colibri::engine::EngineOptions,
    prompt_len: usize,
    steps: usize,
) -> Vec<u32> {
    use colibri::synth::{decode_pass, synthetic_prompt};
    let mut engine = colibri::engine::Engine::load(dir, opts).unwrap_or_else(|e| panic!("{opts:?}: {e}"));
    let prompt = synthetic_prompt(spec.vocab, prompt_len, 1);
    let mut session = engine.new_session();
    let r = decode_pass(&mut engine, &mut session, &prompt, 1, steps).unwrap();
    let again = decode_pass(&mut engine, &mut session, &prompt, 1, steps).unwrap();
    assert_eq!(r.tokens, again.tokens, "{opts:?}: a warm cache, the same tokens");
    assert_eq!(r.tokens.len(), steps + 1);
    assert!(r.tokens.iter().all(|&t| (t as usize) < spec.vocab));
    let w = r.window;
    assert_eq!(
        (w.hits + w.misses) as usize,
        steps * spec.sparse_layers() * spec.top_k,
        "{opts:?}: every routed expert of every layer delivered: {w:?}"
    );
    r.tokens
}

/// The placements a synthetic model must give the same tokens under:
/// mapped, and streamed through a cache of two experts a layer.
pub fn mapped_and_streamed() -> [colibri::engine::EngineOptions; 2] {
    use colibri::engine::{EngineOptions, Placement};
    [
        EngineOptions {
            placement: Placement::Mapped,
            ..EngineOptions::default()
        },
        EngineOptions {
            placement: Placement::Streamed,
            cache_cap: Some(2),
            ..EngineOptions::default()
        },
    ]
}

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

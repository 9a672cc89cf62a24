//! `coli synth` output: a container the engine loads and decodes
//! deterministically, laid out like `coli convert`'s.

mod support;

use colibri::convert::ALIGN;
use colibri::engine::{Engine, EngineOptions};
use colibri::quant::QFormat;
use colibri::st::Checkpoint;
use colibri::synth::{SynthSpec, decode_pass, synth, synthetic_prompt};

fn decode(dir: &std::path::Path, spec: &SynthSpec) -> Vec<u32> {
    let mut engine = Engine::load(dir, &EngineOptions::default()).unwrap();
    let prompt = synthetic_prompt(spec.vocab, 5, 1);
    let mut session = engine.new_session();
    let r = decode_pass(&mut engine, &mut session, &prompt, 1, 4).unwrap();
    // Again on the same engine: a warm cache, the same tokens.
    let again = decode_pass(&mut engine, &mut session, &prompt, 1, 4).unwrap();
    assert_eq!(r.tokens, again.tokens);
    assert_eq!(r.tokens.len(), 5);
    assert_eq!(r.measured, 4);
    let w = r.window;
    assert_eq!(
        (w.hits + w.misses) as usize,
        4 * spec.layers * spec.top_k,
        "every routed expert delivered: {w:?}"
    );
    r.tokens
}

#[test]
fn tiny_model_loads_and_decodes_deterministically() {
    let tmp = tempfile::tempdir().unwrap();
    let spec = SynthSpec {
        seed: 11,
        ..SynthSpec::tiny()
    };
    let dir = tmp.path().join("m");
    let report = synth(&spec, &dir, None).unwrap();
    assert_eq!(report.experts, spec.layers * spec.experts);
    assert!(dir.join("config.json").is_file());
    assert!(!tmp.path().join(format!("m.tmp-{}", std::process::id())).exists());

    // Experts are int8 with scales, each expert's first byte aligned.
    let ck = Checkpoint::open(&dir).unwrap();
    let g = ck.info("model.layers.1.mlp.experts.3.gate_proj.weight").unwrap();
    assert_eq!(g.shape, vec![spec.intermediate, spec.hidden]);
    assert_eq!(g.offset % ALIGN, 0);
    assert!(ck.has("model.layers.1.mlp.experts.3.gate_proj.weight.qs"));
    assert!(ck.has("model.embed_tokens.weight.qs"), "dense int8 by default");
    assert!(!ck.has("model.layers.0.mlp.gate.weight.qs"), "router stays f32");
    drop(ck);

    let a = decode(&dir, &spec);
    let b = decode(&dir, &spec);
    assert_eq!(a, b, "same model, same prompt, same tokens");

    // Same seed, same bytes; another seed, other weights.
    let again = tmp.path().join("again");
    synth(&spec, &again, None).unwrap();
    let bytes = |d: &std::path::Path| std::fs::read(d.join("model.safetensors")).unwrap();
    assert_eq!(bytes(&dir), bytes(&again));
    let other = tmp.path().join("other");
    synth(
        &SynthSpec {
            seed: 12,
            ..spec.clone()
        },
        &other,
        None,
    )
    .unwrap();
    assert_ne!(bytes(&dir), bytes(&other));

    // A non-empty output is refused.
    assert!(synth(&spec, &dir, None).is_err());
}

#[test]
fn f32_dense_and_fewer_layers() {
    let tmp = tempfile::tempdir().unwrap();
    let spec = SynthSpec {
        layers: 1,
        experts: 4,
        dense_format: QFormat::F32,
        ..SynthSpec::tiny()
    };
    let dir = tmp.path().join("m");
    synth(&spec, &dir, None).unwrap();
    let ck = Checkpoint::open(&dir).unwrap();
    assert!(!ck.has("model.embed_tokens.weight.qs"));
    assert!(!ck.has("model.layers.1.input_layernorm.weight"));
    drop(ck);
    let a = decode(&dir, &spec);
    assert!(a.iter().all(|&t| (t as usize) < spec.vocab));
}

#[test]
fn disk_probe_reads_the_expert_extents() {
    use colibri::bounds::{CacheTreatment, ProbeOptions, probe};
    use colibri::model::olmoe::OlmoeConfig;
    use colibri::model::olmoe::{LoadOptions, expert_map};

    let tmp = tempfile::tempdir().unwrap();
    let spec = SynthSpec::tiny();
    let dir = tmp.path().join("m");
    synth(&spec, &dir, None).unwrap();
    let cfg = OlmoeConfig::load(&dir).unwrap();
    let ck = Checkpoint::open(&dir).unwrap();
    let (map, _) = expert_map(&cfg, &ck, LoadOptions::default()).unwrap();
    let per_expert = map.extent(colibri_actors::ExpertKey::new(0, 0)).unwrap().bytes();
    let opts = ProbeOptions {
        bytes: u64::MAX,
        repeats: 2,
        queue_depth: 3,
        ..ProbeOptions::default()
    };
    let all = probe(&map, &opts).unwrap();
    let n = (spec.layers * spec.experts) as u64;
    // Every expert once a repeat, each rounded up to whole 4096-byte blocks.
    for r in &all.repeats {
        assert!(
            r.bytes >= n * per_expert && r.bytes < n * (per_expert + 2 * ALIGN),
            "{all:?}"
        );
    }
    assert_eq!(all.kind, "pread");
    assert_eq!(all.cache, CacheTreatment::Dropped);
    let some = probe(&map, &ProbeOptions { bytes: 1, ..opts }).unwrap();
    assert!(
        some.repeats[0].bytes > 0 && some.repeats[0].bytes < all.repeats[0].bytes,
        "stops after one expert: {some:?}"
    );
    assert_eq!(some.read_bytes, some.repeats[0].bytes, "one read a repeat");
}

#[test]
fn replay_forces_tokens_and_accounts_bytes_and_pilot() {
    use colibri::synth::replay_pass;
    let tmp = tempfile::tempdir().unwrap();
    let spec = SynthSpec::tiny();
    let dir = tmp.path().join("m");
    synth(&spec, &dir, None).unwrap();
    // A small cache, so experts are read and evicted during the window.
    let opts = EngineOptions {
        cache_cap: Some(1),
        ..EngineOptions::default()
    };
    let prompt = synthetic_prompt(spec.vocab, 3, 2);
    let forced = synthetic_prompt(spec.vocab, 8, 3);
    let run = |opts: &EngineOptions| {
        let mut engine = Engine::load(&dir, opts).unwrap();
        let mut session = engine.new_session();
        replay_pass(&mut engine, &mut session, &prompt, &forced, 2, 6).unwrap()
    };
    let r = run(&opts);
    assert_eq!(r.tokens.len(), 8);
    assert_eq!(r.tokens, run(&opts).tokens, "forced replay is deterministic");
    // Every fetch of the window has returned, so its routings are all
    // counted (predictions may still arrive late: only those counters move).
    let p = r.profile.expect("the pipeline reports a profile");
    assert!(p.pilot_hits <= p.pilot_routed && p.pilot_hits <= p.pilot_predicted);
    // Only layers the pilot predicts are counted (never layer 0), each
    // routed expert at most once (how many depends on when the first
    // prediction of a layer arrived, so only the bound is checked).
    assert!(
        p.pilot_routed as usize <= 6 * (spec.layers - 1) * spec.top_k,
        "{p:?}"
    );

    // Without the pilot every read is a demand read, done when its fetch
    // returns: the byte split is exact.
    let plain = run(&EngineOptions {
        pilot: false,
        ..opts.clone()
    });
    assert_eq!(plain.tokens, r.tokens, "the pilot never changes tokens");
    let q = plain.profile.unwrap();
    assert!(q.bytes_read > 0);
    assert_eq!((q.demand_bytes, q.prefetch_bytes), (q.bytes_read, 0));
    assert_eq!(q.needed_bytes(), q.bytes_read);
    assert_eq!((q.pilot_routed, q.prefetch_wasted_bytes), (0, 0));

    // Too few forced tokens is an error, not a short window.
    let mut engine = Engine::load(&dir, &opts).unwrap();
    let mut session = engine.new_session();
    assert!(replay_pass(&mut engine, &mut session, &prompt, &forced, 4, 6).is_err());
}

#[test]
fn coli_bench_replays_an_id_file() {
    let tmp = tempfile::tempdir().unwrap();
    let spec = SynthSpec::tiny();
    let dir = tmp.path().join("m");
    synth(&spec, &dir, None).unwrap();
    let ids: Vec<String> = synthetic_prompt(spec.vocab, 12, 5)
        .iter()
        .map(|t| t.to_string())
        .collect();
    let file = tmp.path().join("ids.txt");
    std::fs::write(&file, ids.join(", ")).unwrap();
    let out = support::coli_command()
        .args(["bench", "--model"])
        .arg(&dir)
        .arg("--replay")
        .arg(&file)
        .args([
            "--prompt-len",
            "4",
            "--warmup",
            "2",
            "--tokens",
            "6",
            "--probe-mb",
            "1",
        ])
        .output();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("forced from --replay"), "{stdout}");
    assert!(stdout.contains("memory budget"), "{stdout}");
    assert!(
        stdout.contains("deterministic: tokens identical across 2 passes"),
        "{stdout}"
    );
    // An id outside the vocabulary is refused.
    std::fs::write(&file, format!("{} 1 2 3 4 5 6 7 8 9 10 11", spec.vocab)).unwrap();
    let bad = support::coli_command()
        .args(["bench", "--model"])
        .arg(&dir)
        .arg("--replay")
        .arg(&file)
        .args(["--prompt-len", "4", "--warmup", "2", "--tokens", "6"])
        .output();
    assert!(!bad.status.success());
}

/// `coli bench --interfere`: a long prompt submitted beside a decoding
/// stream is read in `--prefill-chunk` pieces, one per step, and the stream
/// gets every one of its tokens (counts only; the gaps are timings).
#[test]
fn bench_interfere_splits_the_long_prompt_beside_a_stream() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("models/colibri-tiny");
    let out = support::coli_command()
        .args(["bench", "--model"])
        .arg(&dir)
        .args([
            "--interfere",
            "600",
            "--prefill-chunk",
            "64",
            "--prompt-len",
            "8",
            "--tokens",
            "30",
        ])
        .args(["--warmup", "2"])
        .output();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("long prompt 600 tokens in chunks of 64: 10 chunks"),
        "{stdout}"
    );
    let steps: u64 = stdout
        .split(" steps")
        .next()
        .and_then(|s| s.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
        .expect("a step count");
    assert!(steps >= 10, "10 chunks need 10 steps at least: {stdout}");
    let counts: Vec<usize> = stdout
        .lines()
        .find(|l| l.starts_with("stream      tokens"))
        .and_then(|l| l.rsplit(": ").next())
        .map(|l| l.split(" / ").filter_map(|n| n.trim().parse().ok()).collect())
        .unwrap_or_default();
    assert_eq!(counts.iter().sum::<usize>(), 32, "{stdout}");

    let too_long = support::coli_command()
        .args(["bench", "--model"])
        .arg(&dir)
        .args(["--interfere", "5000"])
        .output();
    assert!(!too_long.status.success());
    assert!(
        String::from_utf8_lossy(&too_long.stderr).contains("needs"),
        "{}",
        String::from_utf8_lossy(&too_long.stderr)
    );
}

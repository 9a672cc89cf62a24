//! `coli doctor`: the machine and the install on one screen, so a newcomer
//! (or a bug report) says in one paste what the engine will see: CPU
//! features and the kernels chosen, the memory budget and where it comes
//! from, the disk's speed and O_DIRECT support, free space, a model
//! directory's formats and integrity, and the conversation state on disk.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Args;
use colibri_actors::cache::memory_headroom;

use super::ModelArg;
use crate::bounds::{ProbeOptions, probe};
use crate::kernels::{Kernels, dispatch};
use crate::model::olmoe::LoadOptions;
use crate::synth::ModelShape;

#[derive(Debug, Args)]
pub struct DoctorArgs {
    #[command(flatten)]
    pub model: ModelArg,
    /// MB of expert extents each of the disk probe's three repeats reads
    /// (0: no probe).
    #[arg(long, default_value_t = 256)]
    pub probe_mb: u64,
}

/// The CPU flags that decide which kernels run.
const FEATURES: &[&str] = &[
    "avx2",
    "fma",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512_vnni",
    "avx512_bf16",
    "asimd",
    "asimddp",
];

fn cpu(out: &mut Vec<String>) {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let field = |key: &str| {
        info.lines()
            .find(|l| l.starts_with(key))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_string())
    };
    let name = field("model name")
        .or_else(|| field("CPU part"))
        .unwrap_or_else(|| "unknown".into());
    let flags = field("flags").or_else(|| field("Features")).unwrap_or_default();
    let have: Vec<&str> = FEATURES
        .iter()
        .copied()
        .filter(|f| flags.split_whitespace().any(|x| x == *f))
        .collect();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    out.push(format!("cpu         {name}, {threads} threads"));
    out.push(format!(
        "features    {}",
        if have.is_empty() {
            "none of the SIMD sets coli uses".to_string()
        } else {
            have.join(" ")
        }
    ));
    let available: Vec<&str> = Kernels::available().iter().map(|k| k.name).collect();
    out.push(kernels_line(
        dispatch().name,
        std::env::var("COLI_KERNELS").ok().as_deref(),
        &available,
    ));
}

/// The kernels line: the set that runs and, when `COLI_KERNELS` asked for
/// one, whether this CPU has it ([`dispatch`] falls back to the best set
/// when it does not, so the name alone would read as the asked set's).
fn kernels_line(running: &str, asked: Option<&str>, available: &[&str]) -> String {
    match asked {
        None => format!("kernels     {running}"),
        Some(a) if a == running => format!("kernels     {running} (asked by COLI_KERNELS={a})"),
        Some(a) => format!(
            "kernels     {running} (COLI_KERNELS={a} asked, not available on this CPU, which has {}; running the best instead)",
            available.join(", ")
        ),
    }
}

fn memory(out: &mut Vec<String>) {
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let total_kb = meminfo
        .lines()
        .find(|l| l.starts_with("MemTotal:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse::<u64>().ok());
    if let Some(kb) = total_kb {
        out.push(format!(
            "memory      {:.1} GiB installed",
            kb as f64 / (1u64 << 20) as f64
        ));
    }
    match memory_headroom() {
        Some(h) => out.push(format!(
            "budget      {h}; a run's expert cache gets 90% of what is left once the dense weights are loaded, less the KV cache and working set"
        )),
        None => out.push("budget      no readable memory limit: pass --ram-gb".into()),
    }
}

/// Free and total bytes of the filesystem holding `path`.
fn free_space(path: &Path) -> Option<(u64, u64)> {
    let st = rustix::fs::statvfs(path).ok()?;
    Some((st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize))
}

/// Whether the filesystem of `file` accepts O_DIRECT opens.
fn direct_io(file: &Path) -> Result<(), String> {
    use rustix::fs::{Mode, OFlags};
    rustix::fs::open(
        file,
        OFlags::RDONLY | OFlags::DIRECT | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map(drop)
    .map_err(|e| e.to_string())
}

fn gib(b: u64) -> f64 {
    b as f64 / (1u64 << 30) as f64
}

fn disk(dir: &Path, out: &mut Vec<String>) {
    match free_space(dir) {
        Some((free, total)) => out.push(format!(
            "disk        {:.1} GiB free of {:.1} GiB at {}",
            gib(free),
            gib(total),
            dir.display()
        )),
        None => out.push(format!("disk        free space unknown at {}", dir.display())),
    }
}

fn model(dir: &Path, args: &DoctorArgs, out: &mut Vec<String>) -> anyhow::Result<()> {
    let ck = crate::engine::ModelFiles::resolve(dir)?
        .weights()
        .with_context(|| format!("model {}: opening the checkpoint", dir.display()))?;
    let mut by_dtype: BTreeMap<String, (usize, u64)> = BTreeMap::new();
    let mut scales = 0usize;
    for name in ck.names() {
        if name.ends_with(crate::st::SCALE_SUFFIX) {
            scales += 1;
        }
        let meta = ck.info(name)?;
        let label = meta
            .block
            .map_or_else(|| format!("{:?}", meta.dtype), |b| b.name().to_string());
        let e = by_dtype.entry(label).or_default();
        e.0 += 1;
        e.1 += meta.len;
    }
    let total: u64 = by_dtype.values().map(|(_, b)| b).sum();
    out.push(format!(
        "model       {} ({} files, {} tensors, {:.2} GiB); every tensor's byte range checked against its file",
        dir.display(),
        ck.files().len(),
        ck.len(),
        gib(total)
    ));
    let kinds: Vec<String> = by_dtype
        .iter()
        .map(|(d, (n, b))| format!("{d} {n} ({:.2} GiB)", gib(*b)))
        .collect();
    out.push(format!(
        "formats     {}{}",
        kinds.join(", "),
        if scales > 0 {
            format!("; {scales} .qs scale tensors: a colibri container")
        } else {
            "; no .qs scales: a Hugging Face checkpoint (quantized at load, or `coli convert` it)".into()
        }
    ));
    let shape = ModelShape::load(dir).with_context(|| format!("reading {}", dir.display()))?;
    out.push(format!(
        "shape       {}: {} layers, {} experts top-{}, hidden {}, vocab {}",
        shape.model_type,
        shape.num_hidden_layers,
        shape.num_experts,
        shape.num_experts_per_tok,
        shape.hidden_size,
        shape.vocab_size
    ));
    let (map, _) = shape.expert_map(&ck, LoadOptions::default())?;
    let expert_bytes: u64 = map.extents.iter().map(|e| e.bytes()).sum();
    out.push(format!(
        "experts     {:.2} GiB routed ({} experts), {:.2} GiB resident weights besides",
        gib(expert_bytes),
        map.extents.len(),
        gib(total.saturating_sub(expert_bytes))
    ));
    if let Some(h) = memory_headroom() {
        // As `coli plan` counts it at its defaults (one slot, the context
        // the engine takes by default under that budget).
        let budget = h.bytes / 10 * 9;
        let kv = crate::engine::DEFAULT_KV_TYPES;
        let ctx = super::fit::context_for(&ck, &shape, budget, None, 1, kv)?.ctx;
        let f = super::fit::fit(&ck, &shape, budget, ctx, 1, kv)?;
        let fits = f.placement == super::fit::Placement::Mapped;
        out.push(format!(
            "placement   {} (auto): the experts {} the {:.2} GiB expert cache left by 90% of the headroom",
            if fits { "mapped" } else { "streamed" },
            if fits { "fit in" } else { "do not fit in" },
            gib(f.cache_bytes)
        ));
    }
    if let Some(first) = ck.files().first() {
        match direct_io(first) {
            Ok(()) => out.push("O_DIRECT    supported (--direct reads bypass the page cache)".into()),
            Err(e) => out.push(format!(
                "O_DIRECT    refused here ({e}): --direct falls back to buffered reads"
            )),
        }
    }
    if args.probe_mb > 0 && !map.extents.is_empty() {
        let opts = ProbeOptions {
            bytes: args.probe_mb << 20,
            queue_depth: crate::engine::EngineOptions::default().io_workers,
            ..ProbeOptions::default()
        };
        let p = probe(&map, &opts)?;
        out.push(format!("disk probe  {}", p.describe()));
    }
    Ok(())
}

/// Conversation state files under the default state base.
fn state(out: &mut Vec<String>) {
    let base = match crate::engine::state::default_state_dir(
        0,
        std::env::var_os("XDG_STATE_HOME").as_deref(),
        std::env::var_os("HOME").as_deref(),
    ) {
        Ok(d) => d.parent().map(Path::to_path_buf).unwrap_or(d),
        Err(e) => {
            out.push(format!("state       {e}"));
            return;
        }
    };
    let mut found: Vec<(PathBuf, u64)> = Vec::new();
    if let Ok(models) = std::fs::read_dir(&base) {
        for m in models.flatten() {
            if let Ok(files) = std::fs::read_dir(m.path()) {
                for f in files.flatten() {
                    if f.file_name().to_string_lossy().starts_with(".coli_kv") {
                        found.push((f.path(), f.metadata().map_or(0, |md| md.len())));
                    }
                }
            }
        }
    }
    found.sort();
    out.push(format!(
        "state       {} conversation file(s) under {} (one folder per model fingerprint)",
        found.len(),
        base.display()
    ));
    for (p, len) in found.iter().take(8) {
        out.push(format!(
            "            {} ({:.1} MB)",
            p.display(),
            *len as f64 / 1e6
        ));
    }
}

pub fn run(args: DoctorArgs) -> anyhow::Result<bool> {
    let mut out = Vec::new();
    cpu(&mut out);
    memory(&mut out);
    let dir = args.model.resolve().ok();
    disk(dir.as_deref().unwrap_or(Path::new(".")), &mut out);
    let mut ok = true;
    if let Some(d) = &dir {
        if let Err(e) = model(d, &args, &mut out) {
            out.push(format!("PROBLEM     {}", super::error_chain(&e)));
            ok = false;
        }
    } else {
        out.push("model       none given (--model DIR or COLI_MODEL) and no bundled model".into());
    }
    state(&mut out);
    let mut stdout = super::output::stdout();
    for l in out {
        writeln!(stdout, "{l}")?;
    }
    Ok(ok)
}

#[cfg(test)]
mod tests {
    use super::kernels_line;

    #[test]
    fn the_kernels_line_says_whether_the_asked_set_runs() {
        let have = ["scalar", "avx2", "avx512", "avx512+vnni"];
        assert_eq!(
            kernels_line("avx512+vnni", None, &have),
            "kernels     avx512+vnni"
        );
        assert_eq!(
            kernels_line("avx2", Some("avx2"), &have),
            "kernels     avx2 (asked by COLI_KERNELS=avx2)"
        );
        assert_eq!(
            kernels_line("avx512+vnni", Some("neon"), &have),
            "kernels     avx512+vnni (COLI_KERNELS=neon asked, not available on this CPU, which has \
             scalar, avx2, avx512, avx512+vnni; running the best instead)"
        );
    }
}

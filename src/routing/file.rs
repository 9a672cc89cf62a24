//! The routing trace as a text file, so policies can be replayed offline
//! by coli (`coli policy`) or by any script.
//!
//! ```text
//! coli-routing-trace 1
//! layers 4
//! experts 8
//! top_k 2
//! window 12 312
//! expert_bytes 786432 786432 786432 786432
//! 0:3,5;1:0,7;2:2,6;3:1,4
//! ...
//! ```
//!
//! The header ends with `expert_bytes`. After it, one line per step: `layer:expert,expert,...` groups
//! separated by `;`, in the order they were fetched (an empty line is a
//! step that fetched nothing). `window A B` (optional) marks the steps
//! `A..B` a benchmark measured. Lines starting with `#` are comments.

use std::io::{BufRead, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use colibri_actors::ExpertKey;

use super::RoutingTrace;

/// The format's first line.
pub const MAGIC: &str = "coli-routing-trace 1";
/// Most keys a file may hold (a guard against unbounded reads).
pub const MAX_ACCESSES: usize = 1 << 26;
/// Largest `layers` or `experts` a header may give.
pub const MAX_DIM: usize = 1 << 16;

#[derive(Debug, thiserror::Error)]
pub enum TraceFileError {
    #[error("{op} {}: {source}", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: line {line}: {why}", path.display())]
    Invalid { path: PathBuf, line: usize, why: String },
}

/// A trace read from a file, with its optional window mark.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceFile {
    pub trace: RoutingTrace,
    pub window: Option<(usize, usize)>,
}

/// Writes `trace` to `path` crash-safely (temporary file, fsync, rename).
pub fn save(path: &Path, trace: &RoutingTrace, window: Option<(usize, usize)>) -> Result<(), TraceFileError> {
    let io = |op| {
        move |source| TraceFileError::Io {
            op,
            path: path.to_path_buf(),
            source,
        }
    };
    let tmp = path.with_extension("trace.tmp");
    // 0600 like the state files beside it: the routing follows the text.
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(io("creating"))?;
    let mut w = std::io::BufWriter::new(file);
    write_to(&mut w, trace, window).map_err(io("writing"))?;
    let file = w.into_inner().map_err(|e| io("writing")(e.into_error()))?;
    file.sync_all().map_err(io("syncing"))?;
    drop(file);
    std::fs::rename(&tmp, path).map_err(io("renaming into"))
}

fn write_to(w: &mut dyn Write, t: &RoutingTrace, window: Option<(usize, usize)>) -> std::io::Result<()> {
    writeln!(w, "{MAGIC}")?;
    writeln!(w, "layers {}", t.layers)?;
    writeln!(w, "experts {}", t.experts)?;
    writeln!(w, "top_k {}", t.top_k)?;
    if let Some((a, b)) = window {
        writeln!(w, "window {a} {b}")?;
    }
    write!(w, "expert_bytes")?;
    for b in &t.expert_bytes {
        write!(w, " {b}")?;
    }
    writeln!(w)?;
    let mut line = String::new();
    for i in 0..t.steps() {
        line.clear();
        let mut layer = None;
        for k in t.step(i) {
            use std::fmt::Write as _;
            if layer == Some(k.layer) {
                let _ = write!(line, ",{}", k.expert);
            } else {
                if layer.is_some() {
                    line.push(';');
                }
                let _ = write!(line, "{}:{}", k.layer, k.expert);
                layer = Some(k.layer);
            }
        }
        writeln!(w, "{line}")?;
    }
    Ok(())
}

/// Reads a trace file; `Ok(None)` when there is none.
pub fn load(path: &Path) -> Result<Option<TraceFile>, TraceFileError> {
    let file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(TraceFileError::Io {
                op: "opening",
                path: path.to_path_buf(),
                source,
            });
        }
    };
    parse(std::io::BufReader::new(file), path).map(Some)
}

/// Parses a trace from `r`; `path` names it in errors.
pub fn parse(r: impl BufRead, path: &Path) -> Result<TraceFile, TraceFileError> {
    let bad = |line: usize, why: String| TraceFileError::Invalid {
        path: path.to_path_buf(),
        line,
        why,
    };
    let mut header: Vec<(String, Vec<u64>)> = Vec::new();
    let mut trace: Option<RoutingTrace> = None;
    let mut window = None;
    let mut step = Vec::new();
    for (i, line) in r.lines().enumerate() {
        let n = i + 1;
        let line = line.map_err(|source| TraceFileError::Io {
            op: "reading",
            path: path.to_path_buf(),
            source,
        })?;
        if n == 1 {
            if line.trim_end() != MAGIC {
                return Err(bad(n, format!("expected {MAGIC:?}, found {:?}", clip(&line))));
            }
            continue;
        }
        if line.starts_with('#') {
            continue;
        }
        let Some(t) = trace.as_mut() else {
            let mut words = line.split_whitespace();
            let Some(key) = words.next() else {
                return Err(bad(n, "an empty line inside the header".into()));
            };
            let values = words
                .map(|w| {
                    w.parse::<u64>()
                        .map_err(|_| bad(n, format!("{key}: {:?} is not a number", clip(w))))
                })
                .collect::<Result<Vec<_>, _>>()?;
            if key == "window" {
                match values[..] {
                    [a, b] if a <= b => window = Some((a as usize, b as usize)),
                    _ => {
                        return Err(bad(
                            n,
                            "window takes two step numbers, the first not past the second".into(),
                        ));
                    }
                }
            } else {
                header.push((key.to_string(), values));
            }
            if key == "expert_bytes" {
                trace = Some(header_trace(&header).map_err(|why| bad(n, why))?);
            }
            continue;
        };
        step.clear();
        parse_step(&line, t, &mut step).map_err(|why| bad(n, why))?;
        if t.accesses() + step.len() > MAX_ACCESSES {
            return Err(bad(n, format!("more than {MAX_ACCESSES} expert fetches")));
        }
        t.push_step(&step);
    }
    let trace = trace.ok_or_else(|| bad(0, "the header ends before expert_bytes".into()))?;
    if let Some((_, b)) = window
        && b > trace.steps()
    {
        return Err(bad(
            0,
            format!("window ends at step {b}, the trace has {}", trace.steps()),
        ));
    }
    Ok(TraceFile { trace, window })
}

fn header_trace(header: &[(String, Vec<u64>)]) -> Result<RoutingTrace, String> {
    let one = |name: &str| -> Result<usize, String> {
        match header.iter().find(|(k, _)| k == name).map(|(_, v)| &v[..]) {
            Some([v]) if (*v as usize) <= MAX_DIM => Ok(*v as usize),
            Some([v]) => Err(format!("{name} {v} is larger than {MAX_DIM}")),
            Some(_) => Err(format!("{name} takes one number")),
            None => Err(format!("{name} is missing before expert_bytes")),
        }
    };
    let (layers, experts, top_k) = (one("layers")?, one("experts")?, one("top_k")?);
    if let Some((k, _)) = header
        .iter()
        .find(|(k, _)| !matches!(k.as_str(), "layers" | "experts" | "top_k" | "expert_bytes"))
    {
        return Err(format!("unknown header field {:?}", clip(k)));
    }
    let bytes = header
        .iter()
        .find(|(k, _)| k == "expert_bytes")
        .map(|(_, v)| v.clone())
        .unwrap_or_default();
    if bytes.len() != layers {
        return Err(format!(
            "expert_bytes has {} numbers for {layers} layers",
            bytes.len()
        ));
    }
    Ok(RoutingTrace::new(layers, experts, top_k, bytes))
}

fn parse_step(line: &str, t: &RoutingTrace, out: &mut Vec<ExpertKey>) -> Result<(), String> {
    let line = line.trim();
    if line.is_empty() {
        return Ok(());
    }
    for group in line.split(';') {
        let (layer, experts) = group
            .split_once(':')
            .ok_or_else(|| format!("{:?} is not layer:expert,...", clip(group)))?;
        let layer: u32 = layer
            .trim()
            .parse()
            .map_err(|_| format!("layer {:?} is not a number", clip(layer)))?;
        if layer as usize >= t.layers {
            return Err(format!("layer {layer} is past the model's {} layers", t.layers));
        }
        for e in experts.split(',') {
            let e: u32 = e
                .trim()
                .parse()
                .map_err(|_| format!("expert {:?} of layer {layer} is not a number", clip(e)))?;
            if e as usize >= t.experts {
                return Err(format!(
                    "expert {e} of layer {layer} is past the model's {} experts",
                    t.experts
                ));
            }
            out.push(ExpertKey::new(layer, e));
        }
    }
    Ok(())
}

/// At most 40 characters of `s`, for error messages about hostile lines.
fn clip(s: &str) -> String {
    s.chars().take(40).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> RoutingTrace {
        let mut t = RoutingTrace::new(2, 4, 2, vec![100, 200]);
        t.push_step(&[ExpertKey::new(0, 1), ExpertKey::new(0, 3), ExpertKey::new(1, 0)]);
        t.push_step(&[]);
        t.push_step(&[ExpertKey::new(1, 2), ExpertKey::new(1, 3)]);
        t
    }

    #[test]
    fn round_trip() {
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("routing.trace");
        assert_eq!(load(&p).unwrap(), None);
        save(&p, &sample(), Some((1, 3))).unwrap();
        let text = std::fs::read_to_string(&p).unwrap();
        assert!(text.contains("\n0:1,3;1:0\n\n1:2,3\n"), "{text}");
        let back = load(&p).unwrap().unwrap();
        assert_eq!(back.trace, sample());
        assert_eq!(back.window, Some((1, 3)));
        assert_eq!(
            std::fs::read_dir(tmp.path()).unwrap().count(),
            1,
            "no temporary file left"
        );
    }

    #[test]
    fn bad_files_name_the_line_and_the_fault() {
        let mut good = Vec::new();
        write_to(&mut good, &sample(), None).unwrap();
        let good = String::from_utf8(good).unwrap();
        let cases = [
            ("not a trace\n", "line 1", "expected"),
            (&good.replace("layers 2", "layers x"), "line 2", "not a number"),
            (
                &good.replace("layers 2", "layers 99999999"),
                "line 5",
                "larger than",
            ),
            (
                &good.replace("expert_bytes 100 200", "expert_bytes 100"),
                "line 5",
                "1 numbers for 2 layers",
            ),
            (&good.replace("top_k 2\n", ""), "line 4", "top_k is missing"),
            (&good.replace("0:1,3", "0:1,9"), "line 6", "expert 9 of layer 0"),
            (&good.replace("0:1,3", "7:1"), "line 6", "layer 7 is past"),
            (&good.replace("0:1,3", "0-1"), "line 6", "not layer:expert"),
            (
                &good.replace("top_k 2", "top_k 2\nwindow 5 1"),
                "line 5",
                "window",
            ),
            (
                &good.replace("top_k 2", "top_k 2\ncolour 3"),
                "line 6",
                "unknown header field",
            ),
            (
                &good.replace("top_k 2", "top_k 2\nwindow 0 9"),
                "line 0",
                "window ends at step 9",
            ),
            (
                "coli-routing-trace 1\nlayers 1\n",
                "line 0",
                "before expert_bytes",
            ),
        ];
        for (text, line, why) in cases {
            let e = parse(text.as_bytes(), Path::new("t")).unwrap_err().to_string();
            assert!(e.contains(line) && e.contains(why), "{e} (wanted {line}: {why})");
        }
    }
}

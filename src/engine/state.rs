//! Where conversation state lives and which model it belongs to.
//!
//! State files hold token ids of private conversations, so they are kept out
//! of the model directory (often a shared checkout or a read-only mount) and
//! out of other users' reach: by default under
//! `$XDG_STATE_HOME/colibri/<fingerprint>/` (`~/.local/state/...` when the
//! variable is unset), in a 0700 directory, as 0600 files.
//!
//! The fingerprint names the directory and is written in each file's header.
//! It covers what makes a saved KV state valid: the model's shape, its
//! weights and the formats they are computed in. Hashing gigabytes of weights
//! at every start would cost more than the re-prefill the files save, so the
//! weights are identified by their container metadata (every file's name and
//! size and every safetensors header, which holds each tensor's name, dtype,
//! shape and offsets) plus a fixed sample of bytes spread over each file: a
//! converted, re-quantized or retrained model changes at least one of them.

use std::fs::File;
use std::io::Read;
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::path::{Path, PathBuf};

use super::{EngineOptions, ModelFiles};

/// Sample reads per weight file, spread evenly over it.
const SAMPLES_PER_FILE: u64 = 64;
/// Bytes per sample read.
const SAMPLE_BYTES: usize = 256;
/// Largest safetensors header hashed in full (real headers are a few MB).
const HEADER_CAP: u64 = 64 << 20;

/// Why the state directory or the fingerprint could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "the state directory {path} is writable by other users (mode {mode:03o}); conversation state holds private token ids: `chmod go-w` it or choose another --state-dir"
    )]
    Insecure { path: PathBuf, mode: u32 },
    #[error("{0} is not a directory")]
    NotADirectory(PathBuf),
    #[error("neither XDG_STATE_HOME nor HOME is set: give --state-dir")]
    NoHome,
}

fn io_err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> StateError + 'a {
    move |source| StateError::Io {
        op,
        path: path.to_path_buf(),
        source,
    }
}

/// 64-bit FNV-1a, fed incrementally; stable across builds and platforms.
pub(crate) struct Fnv(pub(crate) u64);

impl Fnv {
    pub(crate) fn new() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
    pub(crate) fn bytes(&mut self, b: &[u8]) {
        for &x in b {
            self.0 ^= x as u64;
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
    }
    fn u64(&mut self, v: u64) {
        self.bytes(&v.to_le_bytes());
    }
}

/// The fingerprint of the model in `dir` as loaded with `opts`:
/// `shape` (the model's own shape digest), the bit widths and activation
/// format chosen at load, `config.json`, and every weight file's name, size,
/// safetensors header and sampled bytes. Reads about 16 KB per file plus
/// the headers, whatever the model's size.
pub fn model_fingerprint(files: &ModelFiles, opts: &EngineOptions, shape: u64) -> Result<u64, StateError> {
    let mut h = Fnv::new();
    h.u64(shape);
    h.u64(opts.expert_bits as u64);
    h.u64(opts.dense_bits as u64);
    h.u64(opts.int8_acts as u64);
    let weights = match files {
        ModelFiles::Checkpoint(dir) => {
            let config = dir.join("config.json");
            let text = std::fs::read(&config).map_err(io_err("reading", &config))?;
            h.bytes(&text);
            let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
                .map_err(io_err("listing", dir))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| {
                    p.extension()
                        .is_some_and(|e| e == "safetensors" || e == "bin" || e == "qs")
                        || p.file_name().is_some_and(|n| n == "model.safetensors.index.json")
                })
                .collect();
            found.sort();
            found
        }
        // The GGUF's config as rebuilt from its metadata, and its shards.
        ModelFiles::Gguf(path) => {
            let model_err = |e: crate::model::ModelError| StateError::Io {
                op: "reading",
                path: path.clone(),
                source: std::io::Error::other(e.to_string()),
            };
            h.bytes(&files.config_text().map_err(model_err)?);
            files.weight_files().map_err(model_err)?
        }
    };
    for path in &weights {
        weight_file(&mut h, path)?;
    }
    Ok(h.0)
}

/// One weight file's name, size, safetensors header (when it has one) and samples.
fn weight_file(h: &mut Fnv, path: &Path) -> Result<(), StateError> {
    let mut f = File::open(path).map_err(io_err("opening", path))?;
    let len = f.metadata().map_err(io_err("reading metadata of", path))?.len();
    if let Some(name) = path.file_name() {
        h.bytes(name.as_encoded_bytes());
    }
    h.u64(len);
    if path.extension().is_some_and(|e| e == "safetensors") && len >= 8 {
        let mut n = [0u8; 8];
        f.read_exact(&mut n).map_err(io_err("reading", path))?;
        let header_len = u64::from_le_bytes(n).min(HEADER_CAP).min(len - 8);
        let mut header = Vec::new();
        (&mut f)
            .take(header_len)
            .read_to_end(&mut header)
            .map_err(io_err("reading", path))?;
        h.bytes(&header);
    }
    let mut buf = [0u8; SAMPLE_BYTES];
    for i in 0..SAMPLES_PER_FILE {
        // From the first byte to the last: sample i starts at i/(n-1) of the way.
        let span = len.saturating_sub(SAMPLE_BYTES as u64) as u128;
        let at = (span * i as u128 / (SAMPLES_PER_FILE - 1) as u128) as u64;
        let want = (len - at.min(len)).min(SAMPLE_BYTES as u64) as usize;
        f.read_exact_at(&mut buf[..want], at)
            .map_err(io_err("sampling", path))?;
        h.bytes(&buf[..want]);
    }
    Ok(())
}

/// The default state directory: `$XDG_STATE_HOME/colibri/<fingerprint>`,
/// else `$HOME/.local/state/colibri/<fingerprint>`. A relative
/// `XDG_STATE_HOME` is ignored, as the XDG base-directory spec asks.
pub fn default_state_dir(
    fingerprint: u64,
    xdg_state_home: Option<&std::ffi::OsStr>,
    home: Option<&std::ffi::OsStr>,
) -> Result<PathBuf, StateError> {
    let base = match xdg_state_home.map(PathBuf::from).filter(|p| p.is_absolute()) {
        Some(p) => p,
        None => match home.filter(|h| !h.is_empty()) {
            Some(home) => PathBuf::from(home).join(".local").join("state"),
            None => return Err(StateError::NoHome),
        },
    };
    Ok(base.join("colibri").join(format!("{fingerprint:016x}")))
}

/// Makes `dir` ready for state files: created 0700 when missing (whatever
/// the umask), refused when it is not a directory or when other users can
/// write to it (they could replace a conversation or plant a link).
pub fn prepare_state_dir(dir: &Path) -> Result<(), StateError> {
    if !dir.exists() {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(io_err("creating the state directory", dir))?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .map_err(io_err("setting permissions of", dir))?;
    }
    let meta = std::fs::metadata(dir).map_err(io_err("reading metadata of", dir))?;
    if !meta.is_dir() {
        return Err(StateError::NotADirectory(dir.to_path_buf()));
    }
    let mode = meta.permissions().mode() & 0o7777;
    if mode & 0o022 != 0 {
        return Err(StateError::Insecure {
            path: dir.to_path_buf(),
            mode,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_dir_follows_xdg_then_home() {
        let fp = 0xabc;
        let d = default_state_dir(fp, Some("/x/state".as_ref()), Some("/home/u".as_ref())).unwrap();
        assert_eq!(d, Path::new("/x/state/colibri/0000000000000abc"));
        let d = default_state_dir(fp, None, Some("/home/u".as_ref())).unwrap();
        assert_eq!(d, Path::new("/home/u/.local/state/colibri/0000000000000abc"));
        let d = default_state_dir(fp, Some("relative".as_ref()), Some("/h".as_ref())).unwrap();
        assert_eq!(d, Path::new("/h/.local/state/colibri/0000000000000abc"));
        assert!(matches!(
            default_state_dir(fp, None, None),
            Err(StateError::NoHome)
        ));
    }

    #[test]
    fn state_dir_is_private_and_loose_dirs_are_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path().join("a/b/c");
        prepare_state_dir(&d).unwrap();
        let mode = std::fs::metadata(&d).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
        let open = tmp.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = prepare_state_dir(&open).unwrap_err();
        assert!(matches!(e, StateError::Insecure { .. }), "{e}");
        assert!(e.to_string().contains("writable by other users"), "{e}");
        let file = tmp.path().join("f");
        std::fs::write(&file, b"x").unwrap();
        assert!(matches!(
            prepare_state_dir(&file),
            Err(StateError::NotADirectory(_))
        ));
    }

    #[test]
    fn fingerprint_covers_weights_and_formats() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path();
        std::fs::write(d.join("config.json"), b"{}").unwrap();
        let mut st = Vec::new();
        let header = br#"{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#;
        st.extend_from_slice(&(header.len() as u64).to_le_bytes());
        st.extend_from_slice(header);
        st.extend_from_slice(&[1u8; 8]);
        std::fs::write(d.join("model.safetensors"), &st).unwrap();
        let o = EngineOptions::default();
        let files = ModelFiles::Checkpoint(d.to_path_buf());
        let base = model_fingerprint(&files, &o, 7).unwrap();
        assert_eq!(base, model_fingerprint(&files, &o, 7).unwrap(), "stable");
        assert_ne!(base, model_fingerprint(&files, &o, 8).unwrap(), "shape");
        let int8 = EngineOptions {
            expert_bits: 8,
            ..EngineOptions::default()
        };
        assert_ne!(base, model_fingerprint(&files, &int8, 7).unwrap(), "bit widths");
        // Same shape and header, one weight changed.
        let n = st.len();
        st[n - 1] = 2;
        std::fs::write(d.join("model.safetensors"), &st).unwrap();
        assert_ne!(base, model_fingerprint(&files, &o, 7).unwrap(), "weights");
    }
}

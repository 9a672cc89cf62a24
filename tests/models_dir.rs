//! Models by name: an installed `coli` (outside its source tree) finds the
//! bundled model; `convert --output NAME` writes to the models directory,
//! `--model NAME` finds it, `list` shows it, `rm` deletes it; paths still
//! win over names; refused formats and outputs exit 2.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A sandbox: HOME and the XDG directories in a temporary directory, so
/// nothing reaches the user's own state or models.
struct Sandbox {
    tmp: tempfile::TempDir,
}

impl Sandbox {
    fn new() -> Sandbox {
        Sandbox {
            tmp: tempfile::tempdir().expect("tmp"),
        }
    }
    fn home(&self) -> PathBuf {
        self.tmp.path().join("home")
    }
    fn models(&self) -> PathBuf {
        self.home().join(".local/share/colibri/models")
    }
    /// `exe ARGS` in the sandbox, run from `cwd`.
    fn run_in(&self, exe: &Path, cwd: &Path, args: &[&str]) -> Output {
        std::fs::create_dir_all(self.home()).expect("home");
        Command::new(exe)
            .args(args)
            .current_dir(cwd)
            .env("HOME", self.home())
            .env_remove("XDG_STATE_HOME")
            .env_remove("XDG_DATA_HOME")
            .env_remove("COLI_MODELS")
            .env_remove("COLI_MODEL")
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .output()
            .expect("running coli")
    }
    fn run(&self, args: &[&str]) -> Output {
        self.run_in(Path::new(env!("CARGO_BIN_EXE_coli")), self.tmp.path(), args)
    }
}

fn err(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn out(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

const GEN: [&str; 8] = [
    "run",
    "--prompt-ids",
    "1,2,3",
    "--max-tokens",
    "6",
    "--temperature",
    "0",
    "--ids",
];

#[test]
fn an_installed_binary_finds_the_bundled_model_without_the_source_tree() {
    let s = Sandbox::new();
    let dev = s.run(&GEN);
    assert!(dev.status.success(), "{}", err(&dev));
    assert!(
        !s.models().exists(),
        "a binary in its source tree uses the tree's model and writes none"
    );
    // As `cargo install` leaves it: the binary alone, elsewhere.
    let bin = s.tmp.path().join("bin");
    std::fs::create_dir_all(&bin).expect("bin");
    let installed = bin.join("coli");
    std::fs::copy(env!("CARGO_BIN_EXE_coli"), &installed).expect("copy the binary");
    let o = s.run_in(&installed, s.tmp.path(), &GEN);
    assert!(o.status.success(), "{}", err(&o));
    assert_eq!(out(&o), out(&dev), "the embedded model is the bundled one");
    assert!(s.models().join("colibri-tiny/config.json").is_file());
    // Written once: a second run finds it in place.
    let o = s.run_in(&installed, s.tmp.path(), &GEN);
    assert_eq!(out(&o), out(&dev));
    let l = s.run_in(&installed, s.tmp.path(), &["list"]);
    assert!(l.status.success(), "{}", err(&l));
    assert!(out(&l).contains("colibri-tiny (bundled)"), "{}", out(&l));
    assert!(out(&l).contains("olmoe"), "{}", out(&l));
    // By name too.
    let mut by_name = GEN.to_vec();
    by_name.extend(["--model", "colibri-tiny"]);
    let o = s.run_in(&installed, s.tmp.path(), &by_name);
    assert_eq!(out(&o), out(&dev), "{}", err(&o));
}

#[test]
fn convert_to_a_name_then_run_list_and_rm_it() {
    let s = Sandbox::new();
    let fixture = repo().join("fixtures/olmoe-tiny");
    let fixture = fixture.to_str().expect("utf8");
    let conv = |experts: &str, extra: &[&str]| {
        let mut a = vec![
            "convert",
            "--input",
            fixture,
            "--output",
            "tiny8",
            "--experts",
            experts,
        ];
        a.extend_from_slice(extra);
        s.run(&a)
    };
    let o = conv("int8", &[]);
    assert!(o.status.success(), "{}", err(&o));
    let dir = s.models().join("tiny8");
    assert!(dir.join("model.safetensors").is_file(), "{}", err(&o));
    assert!(err(&o).contains("--model tiny8"), "{}", err(&o));

    let mut by_name = GEN.to_vec();
    by_name.extend(["--model", "tiny8"]);
    let named = s.run(&by_name);
    assert!(named.status.success(), "{}", err(&named));
    let mut by_path = GEN.to_vec();
    by_path.extend(["--model", dir.to_str().expect("utf8")]);
    let pathed = s.run(&by_path);
    assert_eq!(out(&named), out(&pathed));

    let l = s.run(&["list"]);
    assert!(l.status.success(), "{}", err(&l));
    let row = out(&l)
        .lines()
        .find(|r| r.starts_with("tiny8 "))
        .unwrap_or_else(|| panic!("no tiny8 row in\n{}", out(&l)))
        .to_string();
    assert!(
        row.contains("olmoe") && row.contains("experts int8, dense f32"),
        "{row}"
    );
    assert!(row.contains("yes, all in RAM"), "{row}");
    let j = s.run(&["list", "--json", "--ram-gb", "64"]);
    let rows: serde_json::Value = serde_json::from_slice(&j.stdout).expect("json");
    let r = rows
        .as_array()
        .and_then(|a| a.iter().find(|r| r["name"] == "tiny8"))
        .expect("tiny8 in the json");
    assert_eq!(r["family"], "olmoe");
    assert_eq!(r["placement"], "mapped");
    assert!(r["size_bytes"].as_u64().unwrap_or(0) > 0);

    // An existing output is refused (exit 2) unless --force, which replaces it.
    let again = conv("int8", &[]);
    assert_eq!(again.status.code(), Some(2), "{}", err(&again));
    assert!(err(&again).contains("--force"), "{}", err(&again));
    let forced = conv("int4", &["--force"]);
    assert!(forced.status.success(), "{}", err(&forced));
    let l = s.run(&["list"]);
    assert!(out(&l).contains("experts int4"), "{}", out(&l));
    let leftovers: Vec<_> = std::fs::read_dir(s.models())
        .expect("ls")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n != "tiny8")
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");

    let rm = s.run(&["rm", "tiny8"]);
    assert!(rm.status.success(), "{}", err(&rm));
    assert!(!dir.exists());
    let gone = s.run(&by_name);
    assert_eq!(gone.status.code(), Some(1), "{}", err(&gone));
    assert!(err(&gone).contains("no model \"tiny8\""), "{}", err(&gone));
    assert!(err(&gone).contains("coli list"), "{}", err(&gone));
    let o = s.run(&["rm", "tiny8"]);
    assert_eq!(o.status.code(), Some(1), "{}", err(&o));
    let o = s.run(&["rm", "../home"]);
    assert_eq!(o.status.code(), Some(2), "{}", err(&o));
    assert!(s.home().is_dir());
}

#[test]
fn a_path_wins_over_a_name() {
    let s = Sandbox::new();
    // A broken model of that name in the models directory...
    let broken = s.models().join("tiny");
    std::fs::create_dir_all(&broken).expect("mkdir");
    std::fs::write(broken.join("config.json"), "{").expect("config");
    // ...and a good one in the working directory.
    let here = s.tmp.path().join("tiny");
    std::fs::create_dir_all(&here).expect("mkdir");
    for f in [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ] {
        std::fs::copy(repo().join("fixtures/olmoe-tiny").join(f), here.join(f)).expect("copy");
    }
    let mut a = GEN.to_vec();
    a.extend(["--model", "tiny"]);
    let o = s.run(&a);
    assert!(o.status.success(), "{}", err(&o));
    // From elsewhere the name finds the broken one, and says what is wrong.
    let o = s.run_in(Path::new(env!("CARGO_BIN_EXE_coli")), &s.home(), &a);
    assert_eq!(o.status.code(), Some(1), "{}", err(&o));
    assert!(err(&o).contains("config.json"), "{}", err(&o));
    // `list` shows the broken one with its error instead of failing.
    let l = s.run(&["list"]);
    assert!(l.status.success(), "{}", err(&l));
    assert!(
        out(&l)
            .lines()
            .any(|r| r.starts_with("tiny ") && r.contains("error")),
        "{}",
        out(&l)
    );
}

#[test]
fn refused_formats_and_outputs_exit_2() {
    let s = Sandbox::new();
    let fixture = repo().join("fixtures/olmoe-tiny");
    let fixture = fixture.to_str().expect("utf8");
    let out_dir = s.tmp.path().join("out");
    let out_dir = out_dir.to_str().expect("utf8");
    for (flag, value) in [
        ("--experts", "int3"),
        ("--dense", "int2"),
        ("--dense", "int4-g64"),
    ] {
        let o = s.run(&["convert", "--input", fixture, "--output", out_dir, flag, value]);
        assert_eq!(o.status.code(), Some(2), "{flag} {value}: {}", err(&o));
        assert!(err(&o).contains(value), "{}", err(&o));
    }
    assert!(!Path::new(out_dir).exists());
    // --force never replaces what is not a model.
    let keep = s.tmp.path().join("notes");
    std::fs::create_dir_all(&keep).expect("mkdir");
    std::fs::write(keep.join("todo.txt"), "mine").expect("write");
    let o = s.run(&[
        "convert",
        "--input",
        fixture,
        "--output",
        keep.to_str().expect("utf8"),
        "--force",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", err(&o));
    assert!(keep.join("todo.txt").is_file());
    // Nor its own input.
    let o = s.run(&["convert", "--input", fixture, "--output", fixture, "--force"]);
    assert_eq!(o.status.code(), Some(2), "{}", err(&o));
    assert!(err(&o).contains("input"), "{}", err(&o));
}

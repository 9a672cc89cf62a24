//! The docs a newcomer reads first say what is true: the README's two
//! commands share one build profile and CI runs the README's test command;
//! every document the README and docs/ link to exists in the repository; no
//! file cites a document that lives outside it.

use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// The lines of the README's first `sh` block (the set-up commands).
fn setup_commands() -> Vec<String> {
    let readme = read(&repo().join("README.md"));
    let block = readme
        .split("```sh\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .expect("a sh block in README.md");
    block
        .lines()
        .map(|l| l.split('#').next().unwrap_or("").trim().to_string())
        .filter(|l| !l.is_empty())
        .collect()
}

#[test]
fn the_two_setup_commands_build_once_and_ci_runs_the_readme_tests() {
    let cmds = setup_commands();
    assert_eq!(cmds.len(), 2, "{cmds:?}");
    assert!(cmds[0].starts_with("cargo run --release"), "{cmds:?}");
    assert!(cmds[1].starts_with("cargo test --release"), "{cmds:?}");
    let ci = read(&repo().join(".ci").join("run"));
    assert!(
        ci.lines().any(|l| l.trim() == cmds[1]),
        ".ci/run does not run the README's test command {:?}",
        cmds[1]
    );
}

/// Relative markdown link targets in `text`.
fn links(text: &str) -> Vec<String> {
    text.split("](")
        .skip(1)
        .filter_map(|rest| rest.split(')').next())
        .filter(|t| !t.starts_with("http") && !t.starts_with('#'))
        .map(|t| t.split('#').next().unwrap_or(t).to_string())
        .collect()
}

#[test]
fn every_linked_document_exists() {
    let mut docs = vec![repo().join("README.md")];
    for e in std::fs::read_dir(repo().join("docs")).expect("docs/") {
        let p = e.expect("entry").path();
        if p.extension().is_some_and(|x| x == "md") {
            docs.push(p);
        }
    }
    for doc in &docs {
        let base = doc.parent().expect("parent");
        for link in links(&read(doc)) {
            assert!(
                base.join(&link).exists(),
                "{} links to missing {link}",
                doc.display()
            );
        }
    }
    for name in ["serve-protocol.md", "formats.md", "state-files.md", "fuzzing.md"] {
        assert!(repo().join("docs").join(name).is_file(), "docs/{name}");
    }
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(rd) = std::fs::read_dir(dir) else { return };
    for e in rd.flatten() {
        let p = e.path();
        let name = e.file_name();
        if name == "target" || name == ".git" || name.to_string_lossy().starts_with('.') {
            continue;
        }
        if p.is_dir() {
            walk(&p, out);
        } else if p
            .extension()
            .is_some_and(|x| ["rs", "md", "py", "sh", "toml"].iter().any(|e| x == *e))
        {
            out.push(p);
        }
    }
}

#[test]
fn nothing_cites_documents_outside_the_repository() {
    // Built at run time so this file does not match itself.
    let needles = [
        ["CONTRACTS", ".md"].concat(),
        ["ARCHITECTURE", ".md"].concat(),
        ["../", "shared"].concat(),
    ];
    let mut files = Vec::new();
    walk(&repo(), &mut files);
    files.push(repo().join(".ci").join("run"));
    assert!(files.len() > 50, "walked only {} files", files.len());
    for f in files {
        let text = read(&f);
        for n in &needles {
            assert!(!text.contains(n.as_str()), "{} cites {n}", f.display());
        }
    }
}

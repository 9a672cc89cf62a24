//! `coli serve` and `coli chat` end to end: the real binary on the bundled
//! model and the OLMoE fixture, stdin/stdout as a front end drives them.

mod support;

use std::io::Write;
use std::process::Stdio;
use std::time::Duration;

use colibri::tokenizer::Tokenizer;
use support::{Server, olmoe_fixture, state_dir, tiny_chat_model, wait_bounded};

const GREEDY: &str = "0 1";

fn no_save() -> Vec<&'static str> {
    vec!["--no-kv-save"]
}

#[test]
fn handshake_plain_line_reset_and_eof() {
    let mut s = Server::start(
        &tiny_chat_model(),
        &["--no-kv-save", "--temperature", "0", "--max-tokens", "24"],
    );
    let r = s.line("hello");
    assert_eq!(r.stat.len(), 6, "{r:?}");
    assert!(
        r.text.ends_with(b"\n"),
        "a chat reply ends with a newline before END: {r:?}"
    );
    let emitted = r.field(0);
    assert!((1..=24).contains(&emitted), "{r:?}");
    assert!(r.field(4) > 0, "prompt tokens of the turn: {r:?}");
    assert!(r.stat[5] == "0" || r.stat[5] == "1");
    assert_eq!(r.stat[5] == "1", emitted == 24, "{r:?}");
    assert!(r.stat[1].parse::<f64>().is_ok() && r.stat[2].parse::<f64>().is_ok());

    // A second turn continues the conversation: its prompt is only the new turn.
    let r2 = s.line("hello");
    assert_eq!(r2.stat.len(), 6);
    assert!(r2.field(4) <= r.field(4) + 2, "{r:?} then {r2:?}");

    s.send(b"\x02RESET\n");
    let reset = s.reply();
    assert!(reset.text.is_empty());
    assert_eq!(reset.stat.len(), 4, "{reset:?}");
    assert_eq!(&reset.stat[..3], ["0", "0.00", "0.0"]);

    // After RESET the same line is a fresh conversation again: same reply (greedy).
    let r3 = s.line("hello");
    assert_eq!(r3.text, r.text);
    assert_eq!(r3.field(4), r.field(4));

    s.send(b"\n");
    let empty = s.reply();
    assert!(empty.text.is_empty() && empty.stat.len() == 4, "{empty:?}");
    let (status, err) = s.finish();
    assert!(status.success(), "{status:?} {err}");
}

#[test]
fn more_continues_a_length_limited_reply() {
    let model = tiny_chat_model();
    let prompt = b"<|user|>\nWhat does the word \"river\" mean?\n<|assistant|>\n";
    let mut s = Server::start(&model, &no_save());
    let first = s.prompt(prompt, &format!("4 {GREEDY}"));
    assert_eq!(first.field(0), 4, "{first:?}");
    assert_eq!(first.stat[5], "1", "stopped at its limit: {first:?}");
    assert!(!first.text.ends_with(b"\n") || first.text.len() > 1);
    s.send(b"\x02MORE\n");
    let more = s.reply();
    assert_eq!(more.stat.len(), 4, "MORE closes with the short STAT: {more:?}");
    assert!(more.field(0) >= 1);
    assert!(more.text.ends_with(b"\n"));

    // The continuation equals one longer greedy reply.
    let mut t = Server::start(&model, &no_save());
    let whole = t.prompt(prompt, &format!("{} {GREEDY}", 4 + more.field(0)));
    let mut joined = first.text.clone();
    joined.extend_from_slice(&more.text[..more.text.len() - 1]);
    assert_eq!(whole.text_str(), String::from_utf8_lossy(&joined));

    // MORE with nothing to continue: END + zero STAT.
    let done = t.prompt(b"<|user|>\nhi\n<|assistant|>\n", &format!("200 {GREEDY}"));
    assert_eq!(done.stat[5], "0", "{done:?}");
    t.send(b"\x02MORE\n");
    let idle = t.reply();
    assert!(idle.text.is_empty() && idle.stat.len() == 4 && idle.stat[0] == "0");
    assert!(s.finish().0.success());
    assert!(t.finish().0.success());
}

#[test]
fn same_seed_same_output_across_processes() {
    let model = tiny_chat_model();
    let body = "<|user|>\nTell me about the moon.\n<|assistant|>\n".as_bytes();
    let run = |seed: u64| {
        let mut s = Server::start(&model, &["--no-kv-save", "--kv-slots", "3"]);
        let r = s.prompt(body, &format!("24 0.9 0.95 2 {seed}"));
        assert!(s.finish().0.success());
        r
    };
    let a = run(1234);
    let b = run(1234);
    assert_eq!(a.text, b.text);
    assert_eq!(a.field(0), b.field(0));
    assert!(a.field(0) >= 1);
    // Raw replies have no newline before END.
    assert_eq!(a.stat.len(), 6);
}

#[test]
fn malformed_frames_are_answered_and_the_stream_stays_in_sync() {
    let mut s = Server::start(&tiny_chat_model(), &["--no-kv-save", "--kv-slots", "2"]);
    let valid = |s: &mut Server| {
        let r = s.prompt(b"<|user|>\nhi\n<|assistant|>\n", &format!("3 {GREEDY} 1 5"));
        assert!(!r.is_malformed() && r.stat.len() == 6 && r.field(0) >= 1, "{r:?}");
    };
    let over = (16usize << 20) + 1;
    let bad: Vec<Vec<u8>> = vec![
        b"\x02PROMPT abc 5 0 1\n".to_vec(), // unparsable length: no body
        b"\x02PROMPT -5 5 0 1\n".to_vec(),  // negative length
        format!("\x02PROMPT {over} 5 0 1\n").into_bytes(), // over 16 MiB
        b"\x02PROMPT 99999999999999999999999 5 0 1\n".to_vec(), // overflowing length
        b"\x02PROMPT 2 x 0 1\nhi\n".to_vec(), // bad max_tokens, body consumed
        b"\x02PROMPT 2 5 NaN 1\nhi\n".to_vec(), // NaN temperature
        b"\x02PROMPT 2 5 0 inf\nhi\n".to_vec(), // bad top_p
        b"\x02PROMPT 2 5 0 1 2\nhi\n".to_vec(), // slot out of range (2 slots)
        b"\x02PROMPT 2 5 0 1 0 seedy\nhi\n".to_vec(), // bad seed
        b"\x02PROMPT 3 5 0 1\nh\0i\n".to_vec(), // NUL in the prompt
        b"\x02PROMPT 2 5 0\nhi\n".to_vec(), // too few fields
        b"\x02PROMPT\n".to_vec(),           // no length
        b"\x02FROB\n".to_vec(),             // unknown command
        b"\x02PROMPT 2 5 0 1\n\xff\xfe\n".to_vec(), // not UTF-8
    ];
    for frame in &bad {
        s.send(frame);
        let r = s.reply();
        assert!(r.is_malformed(), "{:?} got {r:?}", String::from_utf8_lossy(frame));
        valid(&mut s);
    }
    // A body shorter than announced at EOF: malformed reply, then a clean exit.
    s.send(b"\x02PROMPT 100 5 0 1\nabc");
    s.close_input();
    let r = s.reply();
    assert!(r.is_malformed(), "{r:?}");
    let (status, err) = s.finish();
    assert!(status.success(), "{status:?} {err}");
    assert!(err.contains("malformed"), "reasons go to stderr: {err}");
}

#[test]
fn two_slots_interleaved_do_not_disturb_each_other() {
    let model = tiny_chat_model();
    let a1 = b"<|user|>\nWhat is a dog?\n<|assistant|>\n".to_vec();
    let b1 = b"<|user|>\nDefine the word lamp.\n<|assistant|>\n".to_vec();
    let mut s = Server::start(&model, &["--no-kv-save", "--kv-slots", "2"]);
    let ra = s.prompt(&a1, &format!("12 {GREEDY} 0"));
    let rb = s.prompt(&b1, &format!("12 {GREEDY} 1"));
    let mut a2 = a1.clone();
    a2.extend_from_slice(&ra.text);
    a2.extend_from_slice(b"<|end|>\n<|user|>\nAnd a cat?\n<|assistant|>\n");
    let ra2 = s.prompt(&a2, &format!("12 {GREEDY} 0"));
    let rb2 = s.prompt(&b1, &format!("12 {GREEDY} 1"));
    assert_eq!(rb2.text, rb.text, "slot 1 untouched by slot 0");
    assert_eq!(
        rb2.field(4),
        1,
        "slot 1 kept its prompt: only the last token re-fed"
    );
    assert!(ra2.field(4) < a2.len(), "slot 0 reused its prefix: {ra2:?}");

    // Slot 0 alone in another process gives the same replies.
    let mut t = Server::start(&model, &no_save());
    assert_eq!(t.prompt(&a1, &format!("12 {GREEDY}")).text, ra.text);
    assert_eq!(t.prompt(&a2, &format!("12 {GREEDY}")).text, ra2.text);
    assert!(s.finish().0.success());
    assert!(t.finish().0.success());
}

fn lcp(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

#[test]
fn prompt_tokens_counts_only_the_prefilled_tail() {
    let model = tiny_chat_model();
    let tok = Tokenizer::load(&model).expect("tokenizer");
    let p1 = "<|user|>\nWhat does the word \"stone\" mean?\n<|assistant|>\n";
    let p2 = format!("{p1}A hard piece of rock.<|end|>\n<|user|>\nAnd sand?\n<|assistant|>\n");
    let t1 = tok.encode(p1).unwrap();
    let t2 = tok.encode(&p2).unwrap();
    let mut s = Server::start(&model, &no_save());
    let r1 = s.prompt(p1.as_bytes(), &format!("1 {GREEDY}"));
    assert_eq!(r1.field(4), t1.len(), "first prompt: everything prefilled");
    // The same prompt again: only its last token is re-fed.
    let again = s.prompt(p1.as_bytes(), &format!("1 {GREEDY}"));
    assert_eq!(again.field(4), 1);
    // An extension: only the tail (the reply token may or may not be reused).
    let r2 = s.prompt(p2.as_bytes(), &format!("4 {GREEDY}"));
    let tail = t2.len() - lcp(&t1, &t2);
    let got = r2.field(4);
    assert!(
        got == tail || got + 1 == tail,
        "prefilled {got}, tail {tail}, prompt {}",
        t2.len()
    );
    assert!(got < t2.len());
    assert!(s.finish().0.success());
}

/// Run A: two turns in one process. Run B: turn one, exit, a new process on
/// the same state directory, turn two: the same bytes as A's turn two.
#[test]
fn restart_and_resume_gives_the_same_reply() {
    let model = tiny_chat_model();
    let flags = ["--temperature", "0", "--max-tokens", "20", "--kv-slots", "2"];
    let raw1 = b"<|user|>\nWhat is a boat?\n<|assistant|>\n".to_vec();

    let dir_a = state_dir();
    let mut a = Server::start(
        &model,
        &[&flags[..], &["--state-dir", dir_a.path().to_str().unwrap()]].concat(),
    );
    let a1 = a.line("what is a tree?");
    let a2 = a.line("and a bush?");
    let ar1 = a.prompt(&raw1, &format!("10 {GREEDY} 1"));
    let mut raw2 = raw1.clone();
    raw2.extend_from_slice(&ar1.text);
    raw2.extend_from_slice(b" More please.");
    let ar2 = a.prompt(&raw2, &format!("10 {GREEDY} 1"));
    assert!(a.finish().0.success());

    let dir_b = state_dir();
    let dir_flag = ["--state-dir", dir_b.path().to_str().unwrap()];
    let mut b = Server::start(&model, &[&flags[..], &dir_flag[..]].concat());
    assert_eq!(b.line("what is a tree?").text, a1.text);
    assert_eq!(b.prompt(&raw1, &format!("10 {GREEDY} 1")).text, ar1.text);
    let (st, _) = b.finish();
    assert!(st.success());
    assert!(dir_b.path().join(".coli_kv").is_file());
    assert!(dir_b.path().join(".coli_kv.1").is_file());

    let mut b2 = Server::start(&model, &[&flags[..], &dir_flag[..]].concat());
    let b2_2 = b2.line("and a bush?");
    assert_eq!(b2_2.text_str(), a2.text_str());
    assert_eq!(
        b2_2.field(4),
        a2.field(4),
        "the resumed turn prefills the same tokens"
    );
    let br2 = b2.prompt(&raw2, &format!("10 {GREEDY} 1"));
    assert_eq!(br2.text, ar2.text);
    assert_eq!(
        br2.field(4),
        ar2.field(4),
        "resumed slot 1 reuses its prefix from disk"
    );
    let (st, err) = b2.finish();
    assert!(st.success());
    assert!(err.contains("resumed"), "{err}");

    // RESET clears the disk too: a new process starts slot 0 afresh.
    let mut c = Server::start(&model, &[&flags[..], &dir_flag[..]].concat());
    c.send(b"\x02RESET\n");
    c.reply();
    assert!(c.finish().0.success());
    let mut d = Server::start(&model, &[&flags[..], &dir_flag[..]].concat());
    assert_eq!(d.line("what is a tree?").text, a1.text);
    assert!(d.finish().0.success());
}

#[test]
fn a_state_file_of_another_model_is_ignored() {
    let dir = state_dir();
    let flag = ["--state-dir", dir.path().to_str().unwrap()];
    let mut s = Server::start(&tiny_chat_model(), &flag);
    s.prompt(b"<|user|>\nhi\n<|assistant|>\n", &format!("4 {GREEDY}"));
    assert!(s.finish().0.success());

    // The OLMoE fixture has another shape: the file is ignored, serving works.
    let mut f = Server::start(&olmoe_fixture(), &flag);
    let r = f.prompt(b"hello world", &format!("4 {GREEDY}"));
    assert_eq!(
        r.field(4),
        Tokenizer::load(&olmoe_fixture())
            .unwrap()
            .encode("hello world")
            .unwrap()
            .len()
    );
    let (st, err) = f.finish();
    assert!(st.success());
    assert!(
        err.contains("ignoring") && err.contains("different model"),
        "{err}"
    );

    // Garbage in the file: ignored too.
    std::fs::write(
        dir.path().join(".coli_kv"),
        b"not a state file at all, clearly not",
    )
    .unwrap();
    let mut g = Server::start(&tiny_chat_model(), &flag);
    let r = g.prompt(b"<|user|>\nhi\n<|assistant|>\n", &format!("4 {GREEDY}"));
    assert!(r.field(0) >= 1);
    let (st, err) = g.finish();
    assert!(st.success());
    assert!(err.contains("ignoring"), "{err}");
}

#[test]
fn an_unusable_state_dir_turns_saving_off_with_a_message() {
    let dir = state_dir();
    let file = dir.path().join("plain-file");
    std::fs::write(&file, b"x").unwrap();
    let mut s = Server::start(&tiny_chat_model(), &["--state-dir", file.to_str().unwrap()]);
    let r = s.prompt(b"<|user|>\nhi\n<|assistant|>\n", &format!("3 {GREEDY}"));
    assert!(r.field(0) >= 1);
    let (st, err) = s.finish();
    assert!(st.success());
    assert!(err.contains("will not be saved"), "{err}");
}

#[test]
fn kv_slots_is_validated() {
    for bad in ["0", "17", "x"] {
        let mut child = support::coli_command()
            .args(["serve", "--no-kv-save", "--kv-slots", bad])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn();
        let st = wait_bounded(&mut child, Duration::from_secs(60));
        assert!(!st.success(), "--kv-slots {bad} accepted");
    }
}

#[test]
fn fixture_model_serves_with_its_template() {
    let mut s = Server::start(
        &olmoe_fixture(),
        &["--no-kv-save", "--temperature", "0", "--max-tokens", "5"],
    );
    let r = s.line("hello");
    assert_eq!(r.stat.len(), 6);
    assert!(r.field(4) > 0);
    assert!(s.finish().0.success());
}

fn chat(input: &[u8], args: &[&str]) -> (bool, String, String) {
    let mut child = support::spawn_coli(["chat"].iter().chain(args));
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(input).unwrap();
    drop(stdin);
    let out = child.stdout.take().unwrap();
    let err = child.stderr.take().unwrap();
    let ro = std::thread::spawn(move || std::io::read_to_string(out).unwrap_or_default());
    let re = std::thread::spawn(move || std::io::read_to_string(err).unwrap_or_default());
    let st = wait_bounded(&mut child, support::REPLY_TIMEOUT);
    (st.success(), ro.join().unwrap(), re.join().unwrap())
}

#[test]
fn chat_piped_replies_and_quits() {
    let (ok, out, err) = chat(b"hello\n:q\n", &[]);
    assert!(ok, "{err}");
    assert!(out.starts_with("> "), "{out:?}");
    let reply = out.trim_start_matches("> ");
    assert!(reply.trim_end_matches("> ").trim().len() > 1, "{out:?}");
    assert!(
        err.contains("tok/s") && err.contains("hit rate") && err.contains("first token"),
        "{err}"
    );

    // :more, :reset and EOF without :q.
    let (ok, out, err) = chat(
        b"what is a bird?\n:more\n:reset\nwhat is a bird?\n",
        &["--max-tokens", "3", "--temperature", "0"],
    );
    assert!(ok, "{err}");
    assert_eq!(out.matches("> ").count(), 5, "{out:?}");
    let turns: Vec<&str> = out.split("> ").collect();
    assert_eq!(
        turns[1], turns[4],
        "after :reset the same question gets the same greedy reply"
    );
    assert!(err.contains(":more continues"), "{err}");
}

#[test]
fn drafts_change_no_greedy_reply() {
    let model = tiny_chat_model();
    let body =
        "<|user|>\nSay it twice: the river runs to the sea, the river runs to the sea.\n<|assistant|>\n"
            .as_bytes();
    let run = |extra: &[&str]| {
        let mut args = vec!["--no-kv-save", "--kv-slots", "2"];
        args.extend_from_slice(extra);
        let mut s = Server::start(&model, &args);
        let r = s.prompt(body, &format!("40 {GREEDY}"));
        let (status, err) = s.finish();
        assert!(status.success(), "{status:?} {err}");
        (r, err)
    };
    let (plain, err) = run(&[]);
    assert!(err.contains("drafts off"), "{err}");
    for mode in ["ngram", "auto"] {
        let (spec, err) = run(&["--draft", mode, "--draft-k", "4"]);
        assert_eq!(spec.text, plain.text, "--draft {mode}");
        assert_eq!(spec.field(0), plain.field(0), "--draft {mode}");
        assert!(err.contains("n-gram drafts of 4"), "{err}");
    }
}

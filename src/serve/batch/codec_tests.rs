//! Examples and properties of the `--batch` frame decoder.

use super::*;
use proptest::prelude::*;

fn decode(input: &[u8]) -> Vec<Item> {
    decode_chunked(input, &[input.len().max(1)])
}

/// Decodes `input` cut into pieces of the given sizes (cycled), then EOF.
fn decode_chunked(input: &[u8], sizes: &[usize]) -> Vec<Item> {
    let mut d = Decoder::new(Limits::new(4));
    let mut out = Vec::new();
    let mut rest = input;
    let mut i = 0;
    while !rest.is_empty() {
        let n = sizes[i % sizes.len()].clamp(1, rest.len());
        d.push(&rest[..n], &mut out);
        rest = &rest[n..];
        i += 1;
    }
    out.extend(d.finish());
    without_reasons(out)
}

/// The items with the reasons of refusals left out (examples compare codes;
/// `refusals_say_why` checks reasons).
fn without_reasons(items: Vec<Item>) -> Vec<Item> {
    items
        .into_iter()
        .map(|i| match i {
            Item::Rejected { id, why, .. } => Item::Rejected {
                id,
                why,
                reason: String::new(),
            },
            i => i,
        })
        .collect()
}

/// The reason of the one refusal in `input`.
fn reason(input: &[u8]) -> String {
    let mut d = Decoder::new(Limits::new(4));
    let mut out = Vec::new();
    d.push(input, &mut out);
    out.extend(d.finish());
    let reasons: Vec<String> = out
        .into_iter()
        .filter_map(|i| match i {
            Item::Rejected { reason, .. } => Some(reason),
            _ => None,
        })
        .collect();
    assert_eq!(reasons.len(), 1, "{reasons:?}");
    reasons[0].clone()
}

fn submit(id: &str, slot: usize, prompt: &[u8]) -> Item {
    Item::Submit(Submit {
        id: id.into(),
        slot,
        max_tokens: 8,
        temperature: 0.0,
        top_p: 1.0,
        prompt: prompt.to_vec(),
    })
}

fn rejected(id: Option<&str>, why: Reject) -> Item {
    Item::Rejected {
        id: id.map(str::to_string),
        why,
        reason: String::new(),
    }
}

#[test]
fn valid_frames() {
    let mut input = submit_frame("req-7", 2, 8, 0.0, 1.0, b"ab\ncd");
    input.extend_from_slice(b"STOP req-7\r\nCANCEL 9\n\n  \t\nHELLO there\n");
    input.extend_from_slice(b"SUBMIT 3 0 2 8 0 1 0 17\r\nhi\r\n");
    input.extend_from_slice(b"IMAGE 4 3 2 2\nxyz\n");
    assert_eq!(
        decode(&input),
        vec![
            submit("req-7", 2, b"ab\ncd"),
            Item::Stop("req-7".into()),
            Item::Cancel("9".into()),
            submit("3", 0, b"hi"),
            Item::Image("4".into()),
        ]
    );
}

#[test]
fn refused_submit_has_its_payload_skipped() {
    let cases: &[&[u8]] = &[
        b"SUBMIT 5 4 3 8 0 1\n",       // slot out of range
        b"SUBMIT 5 -1 3 8 0 1\n",      // negative slot
        b"SUBMIT 5 0 3 0 0 1\n",       // max_tokens 0
        b"SUBMIT 5 0 3 8 2.5 1\n",     // temperature above 2
        b"SUBMIT 5 0 3 8 nan 1\n",     // not finite
        b"SUBMIT 5 0 3 8 0 0\n",       // top_p 0
        b"SUBMIT 5 0 3 8 0 1.5\n",     // top_p above 1
        b"SUBMIT 5 0 3 8 0 abc\n",     // not a number
        b"SUBMIT 5 0 3 8 0 1 0 1 9\n", // a tenth positional field
        b"SUBMIT 5 0 3 8 0 1 0 logprobs=5\n",
        b"SUBMIT 5 0 3 8 0 1 logprobs=5\n",
    ];
    for header in cases {
        let mut input = header.to_vec();
        input.extend_from_slice(b"x\ny\n");
        input.extend_from_slice(b"CANCEL 6\n");
        assert_eq!(
            decode(&input),
            vec![rejected(Some("5"), Reject::BadRequest), Item::Cancel("6".into())],
            "{}",
            String::from_utf8_lossy(header)
        );
    }
    // Extra bytes after the prompt are skipped with it.
    assert_eq!(
        decode(b"SUBMIT 5 0 2 8 0 1 3\nhiABC\nCANCEL 6\n"),
        vec![rejected(Some("5"), Reject::BadRequest), Item::Cancel("6".into())]
    );
    // Over the payload limit: skipped too, not stored.
    let mut d = Decoder::new(Limits {
        slots: 1,
        max_payload: 2,
    });
    let mut out = Vec::new();
    d.push(b"SUBMIT 5 0 3 8 0 1\nabc\nSTOP 5\n", &mut out);
    assert_eq!(
        without_reasons(out),
        vec![rejected(Some("5"), Reject::BadRequest), Item::Stop("5".into())]
    );
}

#[test]
fn refusals_say_why_in_the_shared_words() {
    let r = reason(b"SUBMIT 5 0 1 0 0 1\nx\n");
    assert_eq!(r, "max_tokens must be a whole number >= 1, got 0");
    assert_eq!(
        reason(b"SUBMIT 5 0 1 8 3 1\nx\n"),
        "temperature must be a number in [0, 2], got 3"
    );
    assert_eq!(
        reason(b"SUBMIT 5 0 1 8 0 0\nx\n"),
        "top_p must be a number in (0, 1], got 0"
    );
    assert!(reason(b"SUBMIT 5 9 1 8 0 1\nx\n").contains("slot"));
    assert!(reason(b"SUBMIT 0 0 1 8 0 1\nx\n").contains("id"));
    assert!(reason(b"SUBMIT 5 0 1 8 0 1 0 logprobs=1\nx\n").contains("key=value"));
    assert!(reason(b"SUBMIT 5 0 1 8 0 1\nxY").contains("newline"));
    assert!(reason(b"SUBMIT 5 0 4 8 0 1\nx").contains("ended"));
}

#[test]
fn untrusted_lengths_consume_only_the_header() {
    for header in [
        &b"SUBMIT 5 0 x 8 0 1\n"[..],
        b"SUBMIT 5 0 -3 8 0 1\n",
        b"SUBMIT 5 0\n",
        b"SUBMIT 5 0 3 8 0 1 x\n",
        b"SUBMIT 5 0 18446744073709551615 8 0 1 1\n",
        b"IMAGE 5 x 2 2\n",
    ] {
        let mut input = header.to_vec();
        input.extend_from_slice(b"CANCEL 6\n");
        assert_eq!(
            decode(&input),
            vec![rejected(Some("5"), Reject::BadRequest), Item::Cancel("6".into())]
        );
    }
}

#[test]
fn ids_and_controls() {
    assert_eq!(
        decode(b"CANCEL\nSTOP 1 2\nCANCEL 0\nSTOP \x01\n"),
        vec![
            rejected(None, Reject::BadRequest),
            rejected(Some("1"), Reject::BadRequest),
            rejected(None, Reject::BadRequest),
            rejected(None, Reject::BadRequest),
        ]
    );
    let long = "x".repeat(MAX_ID + 1);
    assert_eq!(
        decode(format!("CANCEL {long}\nCANCEL {}\n", &long[1..]).as_bytes()),
        vec![
            rejected(None, Reject::BadRequest),
            Item::Cancel(long[1..].to_string())
        ]
    );
    // An image frame with a bad grid is refused after its payload.
    assert_eq!(
        decode(b"IMAGE 4 1 0 2\nz\nCANCEL 4\n"),
        vec![rejected(Some("4"), Reject::BadRequest), Item::Cancel("4".into())]
    );
}

#[test]
fn bad_terminator_is_a_bad_frame_then_resync() {
    assert_eq!(
        decode(b"SUBMIT 5 0 2 8 0 1\nhiX junk\nCANCEL 6\n"),
        vec![rejected(Some("5"), Reject::BadFrame), Item::Cancel("6".into())]
    );
    assert_eq!(
        decode(b"SUBMIT 5 0 2 8 0 1\nhi\rX\nCANCEL 6\n"),
        vec![rejected(Some("5"), Reject::BadFrame), Item::Cancel("6".into())]
    );
}

#[test]
fn overlong_header_is_refused_and_skipped() {
    let mut input = b"SUBMIT 5 ".to_vec();
    input.extend(std::iter::repeat_n(b'7', MAX_HEADER));
    input.extend_from_slice(b"\nCANCEL 6\n");
    assert_eq!(
        decode(&input),
        vec![rejected(Some("5"), Reject::BadRequest), Item::Cancel("6".into())]
    );
    // An overlong line that is not a command is ignored like any other.
    let mut input = vec![b'z'; MAX_HEADER + 10];
    input.extend_from_slice(b"\nCANCEL 6\n");
    assert_eq!(decode(&input), vec![Item::Cancel("6".into())]);
    // Exactly MAX_HEADER bytes is still a header.
    let mut line = b"CANCEL 6".to_vec();
    line.resize(MAX_HEADER, b' ');
    line.push(b'\n');
    assert_eq!(decode(&line), vec![Item::Cancel("6".into())]);
}

#[test]
fn eof_mid_frame_is_a_bad_frame() {
    assert_eq!(decode(b"CANCEL 6"), vec![rejected(Some("6"), Reject::BadFrame)]);
    assert_eq!(decode(b"garbage"), vec![rejected(None, Reject::BadFrame)]);
    assert_eq!(
        decode(b"SUBMIT 5 0 9 8 0 1\nhi"),
        vec![rejected(Some("5"), Reject::BadFrame)]
    );
    assert_eq!(
        decode(b"SUBMIT 5 0 2 8 0 1\nhi"),
        vec![rejected(Some("5"), Reject::BadFrame)]
    );
    assert_eq!(decode(b""), vec![]);
    assert_eq!(decode(b"CANCEL 6\n"), vec![Item::Cancel("6".into())]);
}

// ------------------------------------------------------------ properties

#[derive(Debug, Clone)]
enum Valid {
    Submit(Submit),
    Stop(String),
    Cancel(String),
}

fn id() -> impl Strategy<Value = String> {
    "[!-~]{1,63}".prop_filter("0 is not an id", |s| s != "0")
}

fn valid() -> impl Strategy<Value = Valid> {
    prop_oneof![
        (
            id(),
            0usize..4,
            1usize..100_000,
            0.0f32..=2.0,
            0.001f32..=1.0,
            proptest::collection::vec(any::<u8>(), 0..200)
        )
            .prop_map(|(id, slot, max_tokens, temperature, top_p, prompt)| {
                Valid::Submit(Submit {
                    id,
                    slot,
                    max_tokens,
                    temperature,
                    top_p,
                    prompt,
                })
            }),
        id().prop_map(Valid::Stop),
        id().prop_map(Valid::Cancel),
    ]
}

fn encode(v: &Valid) -> Vec<u8> {
    match v {
        Valid::Submit(s) => submit_frame(&s.id, s.slot, s.max_tokens, s.temperature, s.top_p, &s.prompt),
        Valid::Stop(id) => format!("STOP {id}\n").into_bytes(),
        Valid::Cancel(id) => format!("CANCEL {id}\n").into_bytes(),
    }
}

fn item(v: &Valid) -> Item {
    match v.clone() {
        Valid::Submit(s) => Item::Submit(s),
        Valid::Stop(id) => Item::Stop(id),
        Valid::Cancel(id) => Item::Cancel(id),
    }
}

/// A line that claims no payload: no `\n`, and its first field is not a
/// payload-carrying command.
fn junk_line() -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(any::<u8>(), 0..300).prop_filter("no payload claim", |l| {
        !l.contains(&b'\n') && !matches!(fields(l).first(), Some(&b"SUBMIT") | Some(&b"IMAGE"))
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]

    /// Arbitrary bytes never panic, and cutting the input differently
    /// never changes what comes out.
    #[test]
    fn any_bytes_any_chunking(
        input in proptest::collection::vec(any::<u8>(), 0..2000),
        sizes in proptest::collection::vec(1usize..64, 1..8),
    ) {
        let whole = decode(&input);
        prop_assert_eq!(decode_chunked(&input, &sizes), whole.clone());
        prop_assert_eq!(decode_chunked(&input, &[1]), whole);
    }

    /// Arbitrary bytes with commands mixed in: still chunking-invariant
    /// (the fields, not only the keywords, are exercised).
    #[test]
    fn command_soup_any_chunking(
        parts in proptest::collection::vec(prop_oneof![
            Just(b"SUBMIT ".to_vec()), Just(b"IMAGE ".to_vec()), Just(b"CANCEL ".to_vec()),
            Just(b"STOP ".to_vec()), Just(b"\n".to_vec()), Just(b"\r".to_vec()),
            Just(b"1 ".to_vec()), Just(b"0 ".to_vec()), Just(b"3 ".to_vec()),
            proptest::collection::vec(any::<u8>(), 0..8),
        ], 0..60),
        sizes in proptest::collection::vec(1usize..16, 1..6),
    ) {
        let input = parts.concat();
        prop_assert_eq!(decode_chunked(&input, &sizes), decode(&input));
    }

    /// Valid frames round-trip, in order, whatever the chunking.
    #[test]
    fn valid_frames_round_trip(
        frames in proptest::collection::vec(valid(), 0..12),
        sizes in proptest::collection::vec(1usize..300, 1..6),
    ) {
        let input: Vec<u8> = frames.iter().flat_map(encode).collect();
        let want: Vec<Item> = frames.iter().map(item).collect();
        prop_assert_eq!(decode_chunked(&input, &sizes), want);
    }

    /// No desynchronisation: after junk lines (which are ignored or
    /// refused, never more than their own line), a valid frame decodes
    /// exactly.
    #[test]
    fn junk_then_valid(
        junk in proptest::collection::vec(junk_line(), 0..6),
        frame in valid(),
    ) {
        let mut input = Vec::new();
        for j in &junk {
            input.extend_from_slice(j);
            input.push(b'\n');
        }
        input.extend(encode(&frame));
        let out = decode(&input);
        prop_assert_eq!(out.last(), Some(&item(&frame)));
        prop_assert!(out[..out.len() - 1].iter().all(|i| matches!(
            i, Item::Rejected { .. } | Item::Stop(_) | Item::Cancel(_)
        )), "{:?}", out);
    }

    /// A SUBMIT with a trustworthy length and any other field corrupted
    /// is refused with exactly its payload skipped.
    #[test]
    fn corrupted_submit_then_valid(
        prompt in proptest::collection::vec(any::<u8>(), 0..100),
        field in 2usize..7,
        garbage in "[a-z=]{1,5}|-[0-9]{1,3}|[0-9]{12}",
        frame in valid(),
    ) {
        let mut f: Vec<String> =
            ["SUBMIT", "r1", "1", "0", "8", "0.5", "0.9"].iter().map(|s| s.to_string()).collect();
        f[3] = prompt.len().to_string();
        if field != 3 {
            f[field] = garbage;
        }
        let mut input = f.join(" ").into_bytes();
        input.push(b'\n');
        input.extend_from_slice(&prompt);
        input.push(b'\n');
        input.extend(encode(&frame));
        let out = decode(&input);
        prop_assert_eq!(out.last(), Some(&item(&frame)));
        prop_assert_eq!(out.len(), 2, "{:?}", out);
    }

    /// A payload followed by anything but a newline: a bad frame, then the
    /// next line is a header again.
    #[test]
    fn bad_terminator_then_valid(
        prompt in proptest::collection::vec(any::<u8>(), 0..50),
        after in proptest::collection::vec(any::<u8>().prop_filter("not a newline", |b| *b != b'\n' && *b != b'\r'), 1..20)
            .prop_map(|mut v| { v.retain(|b| *b != b'\n'); v }),
        frame in valid(),
    ) {
        let mut input = submit_frame("r1", 0, 8, 0.0, 1.0, &prompt);
        input.pop();
        input.extend_from_slice(&after);
        input.push(b'\n');
        input.extend(encode(&frame));
        prop_assert_eq!(
            decode(&input),
            vec![rejected(Some("r1"), Reject::BadFrame), item(&frame)]
        );
    }
}

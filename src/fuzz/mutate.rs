//! The deterministic generator and the mutation operators.

/// xorshift64*: tiny, seedable, identical on every platform.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform-ish in `0..n` (`n` > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
    pub fn chance(&mut self, one_in: u64) -> bool {
        self.below(one_in) == 0
    }
}

/// Numbers that sit on the edges parsers get wrong.
pub const INTERESTING_NUMBERS: &[&str] = &[
    "0",
    "1",
    "-1",
    "2",
    "3",
    "7",
    "8",
    "255",
    "256",
    "-128",
    "65535",
    "65536",
    "2147483647",
    "2147483648",
    "4294967295",
    "4294967296",
    "16777216",
    "16777217",
    "9007199254740993",
    "18446744073709551615",
    "18446744073709551616",
    "-9223372036854775808",
    "0.5",
    "-0.0",
    "1e-300",
    "1e-45",
    "1e38",
    "3.5e38",
    "1e308",
    "-1e308",
    "1e400",
    "0.1",
    "1.0",
    "-2.5",
    "NaN",
];

const INTERESTING_BYTES: &[u8] = &[0, 1, 0x7f, 0x80, 0xff, b'\n', b'\x02', b' ', b'"', b'{', b'}'];

/// One random byte-level edit of `data` (which may come out empty).
pub fn byte_mutation(rng: &mut Rng, data: &mut Vec<u8>, other: &[u8]) {
    let len = data.len() as u64;
    match rng.below(9) {
        0 if len > 0 => {
            let i = rng.below(len) as usize;
            data[i] ^= 1 << rng.below(8);
        }
        1 if len > 0 => {
            let i = rng.below(len) as usize;
            data[i] = INTERESTING_BYTES[rng.below(INTERESTING_BYTES.len() as u64) as usize];
        }
        2 if len > 0 => {
            let i = rng.below(len) as usize;
            data[i] = rng.next_u64() as u8;
        }
        3 => {
            let i = rng.below(len + 1) as usize;
            data.truncate(i);
        }
        4 if len > 0 => {
            let a = rng.below(len) as usize;
            let b = (a + 1 + rng.below(16) as usize).min(data.len());
            data.drain(a..b);
        }
        5 => {
            let i = rng.below(len + 1) as usize;
            let n = 1 + rng.below(8) as usize;
            let fill: Vec<u8> = (0..n).map(|_| rng.next_u64() as u8).collect();
            data.splice(i..i, fill);
        }
        6 if len > 0 => {
            // Duplicate a chunk somewhere else.
            let a = rng.below(len) as usize;
            let b = (a + 1 + rng.below(32) as usize).min(data.len());
            let chunk = data[a..b].to_vec();
            let at = rng.below(data.len() as u64 + 1) as usize;
            data.splice(at..at, chunk);
        }
        7 if !other.is_empty() => {
            // Splice: our head, the other seed's tail.
            let a = rng.below(len + 1) as usize;
            let b = rng.below(other.len() as u64) as usize;
            data.truncate(a);
            data.extend_from_slice(&other[b..]);
        }
        _ => {
            // Replace a run of digits with an interesting number.
            number_mutation(rng, data);
        }
    }
}

/// Replaces one decimal number in `data` (text) with an interesting one.
pub fn number_mutation(rng: &mut Rng, data: &mut Vec<u8>) {
    let starts: Vec<usize> = (0..data.len())
        .filter(|&i| data[i].is_ascii_digit() && (i == 0 || !data[i - 1].is_ascii_digit()))
        .collect();
    if starts.is_empty() {
        return;
    }
    let s = starts[rng.below(starts.len() as u64) as usize];
    let mut e = s;
    while e < data.len() && (data[e].is_ascii_digit() || data[e] == b'.' || data[e] == b'e') {
        e += 1;
    }
    let s = if s > 0 && data[s - 1] == b'-' { s - 1 } else { s };
    let n = INTERESTING_NUMBERS[rng.below(INTERESTING_NUMBERS.len() as u64) as usize];
    data.splice(s..e, n.bytes());
}

/// An interesting JSON value for a structural edit.
pub fn interesting_value(rng: &mut Rng) -> serde_json::Value {
    match rng.below(8) {
        0 => serde_json::Value::Null,
        1 => serde_json::Value::Bool(rng.chance(2)),
        2 => serde_json::Value::String(
            ["", "x", "olmoe", "default", "yarn", "sparse", "full"][rng.below(7) as usize].into(),
        ),
        3 => serde_json::json!([]),
        4 => serde_json::json!({}),
        _ => {
            let n = INTERESTING_NUMBERS[rng.below(INTERESTING_NUMBERS.len() as u64) as usize];
            serde_json::from_str(n).unwrap_or(serde_json::Value::Null)
        }
    }
}

/// One structural edit of a JSON value: replace, drop or add a field, or
/// recurse into an object or array.
pub fn json_mutation(rng: &mut Rng, v: &mut serde_json::Value, depth: u32) {
    match v {
        serde_json::Value::Object(map) if !map.is_empty() && depth < 4 => {
            let keys: Vec<String> = map.keys().cloned().collect();
            let k = &keys[rng.below(keys.len() as u64) as usize];
            match rng.below(8) {
                0 => {
                    map.remove(k);
                }
                1 => {
                    map.insert(format!("{k}_x"), interesting_value(rng));
                }
                2 | 3 => {
                    if let Some(child) = map.get_mut(k) {
                        json_mutation(rng, child, depth + 1);
                    }
                }
                _ => {
                    map.insert(k.clone(), interesting_value(rng));
                }
            }
        }
        serde_json::Value::Array(a) if !a.is_empty() && depth < 4 => {
            let i = rng.below(a.len() as u64) as usize;
            match rng.below(4) {
                0 => {
                    a.remove(i);
                }
                1 => a.push(interesting_value(rng)),
                _ => json_mutation(rng, &mut a[i], depth + 1),
            }
        }
        _ => *v = interesting_value(rng),
    }
}

//! FP8 (float8 e4m3 with 128x128 block scales) decoding against values
//! produced by torch (tools/make_glm_fixtures.py, fixtures/glm-fp8).

use std::path::Path;

use colibri::st::fp8::{dequantize_fp8, e4m3_to_f32};
use colibri::st::{Checkpoint, decode_f32};

#[test]
fn fp8_decode_matches_torch() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/glm-fp8");
    let ck = Checkpoint::open(&dir).unwrap();
    let all = ck.bytes("all").unwrap();
    let want = ck.f32_tensor("all_f32", &[256]).unwrap();
    for (b, w) in all.iter().zip(&want) {
        let got = e4m3_to_f32(*b);
        if *w == 12345.0 {
            assert!(got.is_nan(), "byte {b:#04x}");
        } else {
            assert_eq!(got.to_bits(), w.to_bits(), "byte {b:#04x}");
        }
    }
    let w = ck.bytes("w").unwrap();
    let s = decode_f32(colibri::st::Dtype::F32, ck.bytes("w_scale_inv").unwrap()).unwrap();
    let got = dequantize_fp8("w", w, 130, 260, &s).unwrap();
    let expected = ck.f32_tensor("expected", &[130, 260]).unwrap();
    assert_eq!(got, expected);
}

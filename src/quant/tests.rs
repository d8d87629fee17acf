//! The tests of the type table and the row conversions, and `dot_row`, a
//! test-only oracle: a dot product of a stored row with f32 values in a 16-lane
//! order of its own. It is *not* the order of the CPU backend's kernels (those are
//! defined in `backend/cpu/simd.rs`, `qpack.rs` and `fpack.rs` and tested there);
//! here it checks that quantize / dequantize agree with a straight dot product.

use super::float::bf16_bits_to_f32;
use super::*;
use crate::util::XorShift;

/// Independent accumulators of [`dot_row`].
const LANES: usize = 16;

#[inline(always)]
fn ld_u16(b: &[u8], i: usize) -> u16 {
    u16::from_le_bytes([b[2 * i], b[2 * i + 1]])
}

#[inline(always)]
fn ld_f32(b: &[u8], i: usize) -> f32 {
    f32::from_le_bytes([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]])
}

/// `LANES` little-endian f32 from the first `4 * LANES` bytes of `b` (any alignment).
fn load_f32s(b: &[u8]) -> [f32; LANES] {
    std::array::from_fn(|i| ld_f32(b, i))
}

/// `LANES` little-endian u16 from the first `2 * LANES` bytes of `b` (any alignment).
fn load_u16s(b: &[u8]) -> [u16; LANES] {
    std::array::from_fn(|i| ld_u16(b, i))
}

/// The first `LANES` elements of `x` as an array.
#[inline(always)]
fn lanes(x: &[f32]) -> &[f32; LANES] {
    match x.get(..LANES).map(<&[f32; LANES]>::try_from) {
        Some(Ok(a)) => a,
        _ => panic!("internal: lane chunk shorter than {LANES}"),
    }
}

/// The fixed final reduction of the lanes: a pairwise tree.
#[inline(always)]
fn reduce(mut acc: [f32; LANES]) -> f32 {
    let mut w = LANES / 2;
    while w > 0 {
        for l in 0..w {
            acc[l] += acc[l + w];
        }
        w /= 2;
    }
    acc[0]
}

/// Dot product of one stored row (`x.len()` elements of type `dt`) with `x`, in
/// the oracle's own order: element `i` into lane `i % 16` (block types: a fixed
/// position within its block), lanes reduced by a pairwise tree. For Q8_0/Q4_0 each block's 32 products are summed into the
/// 16 lanes (lane `l` gets elements `l` and `l + 16` of the block, in that
/// order), scaled by the block scale and added to the running lanes.
///
/// # Panics
/// If `row.len() != dt.row_bytes(x.len())` (a caller bug).
fn dot_row(dt: DType, row: &[u8], x: &[f32]) -> f32 {
    check_row(dt, row.len(), x.len());
    match dt {
        DType::F32 => dot_f32(row, x),
        DType::F16 => dot_f16(row, x),
        DType::BF16 => dot_bf16(row, x),
        DType::Q8_0 => dot_q8_0(row, x),
        DType::Q4_0 => dot_q4_0(row, x),
        _ => unreachable!("the oracle has no {dt} (quant::groups is checked against gguf-py instead)"),
    }
}

/// The shared lane loop of the float types: `w(chunk)` decodes `LANES`
/// elements from `row_bytes_per_lane * LANES` bytes, `one(i)` decodes element `i`.
#[inline(always)]
fn dot_float(
    row: &[u8],
    x: &[f32],
    bytes_per_elem: usize,
    w: impl Fn(&[u8]) -> [f32; LANES],
    one: impl Fn(usize) -> f32,
) -> f32 {
    let mut acc = [0f32; LANES];
    let full = x.len() / LANES * LANES;
    let chunk = bytes_per_elem * LANES;
    for (rc, xc) in row[..bytes_per_elem * full].chunks_exact(chunk).zip(x[..full].chunks_exact(LANES)) {
        let wv = w(rc);
        let xv = lanes(xc);
        for l in 0..LANES {
            acc[l] += wv[l] * xv[l];
        }
    }
    for (l, i) in (full..x.len()).enumerate() {
        acc[l] += one(i) * x[i];
    }
    reduce(acc)
}

fn dot_f32(row: &[u8], x: &[f32]) -> f32 {
    dot_float(row, x, 4, load_f32s, |i| ld_f32(row, i))
}

#[inline(always)]
fn map_lanes(u: [u16; LANES], f: impl Fn(u16) -> f32) -> [f32; LANES] {
    let mut o = [0f32; LANES];
    for l in 0..LANES {
        o[l] = f(u[l]);
    }
    o
}

fn dot_bf16(row: &[u8], x: &[f32]) -> f32 {
    dot_float(row, x, 2, |c| map_lanes(load_u16s(c), bf16_bits_to_f32), |i| bf16_bits_to_f32(ld_u16(row, i)))
}

fn dot_f16(row: &[u8], x: &[f32]) -> f32 {
    dot_float(row, x, 2, |c| map_lanes(load_u16s(c), f16_bits_to_f32), |i| f16_bits_to_f32(ld_u16(row, i)))
}

fn dot_q8_0(row: &[u8], x: &[f32]) -> f32 {
    const H: usize = QK / 2;
    let mut acc = [0f32; LANES];
    for (b, xb) in row.chunks_exact(DType::Q8_0.block_bytes()).zip(x.chunks_exact(QK)) {
        let d = block_scale(b);
        let (x0, x1) = (lanes(&xb[..H]), lanes(&xb[H..]));
        let mut s = [0f32; H];
        for l in 0..H {
            s[l] = (b[2 + l] as i8) as f32 * x0[l];
        }
        for l in 0..H {
            s[l] += (b[2 + H + l] as i8) as f32 * x1[l];
        }
        for l in 0..H {
            acc[l] += d * s[l];
        }
    }
    reduce(acc)
}

fn dot_q4_0(row: &[u8], x: &[f32]) -> f32 {
    const H: usize = QK / 2;
    let mut acc = [0f32; LANES];
    for (b, xb) in row.chunks_exact(DType::Q4_0.block_bytes()).zip(x.chunks_exact(QK)) {
        let d = block_scale(b);
        let (x0, x1) = (lanes(&xb[..H]), lanes(&xb[H..]));
        let mut s = [0f32; H];
        for l in 0..H {
            s[l] = ((b[2 + l] & 0x0F) as i32 - 8) as f32 * x0[l];
        }
        for l in 0..H {
            s[l] += ((b[2 + l] >> 4) as i32 - 8) as f32 * x1[l];
        }
        for l in 0..H {
            acc[l] += d * s[l];
        }
    }
    reduce(acc)
}

fn quant(dt: DType, x: &[f32]) -> Vec<u8> {
    let mut q = vec![0u8; dt.row_bytes(x.len()).unwrap()];
    quantize_row(dt, x, &mut q);
    q
}

fn deq(dt: DType, q: &[u8], n: usize) -> Vec<f32> {
    let mut y = vec![0f32; n];
    dequantize_row(dt, q, &mut y);
    y
}

#[test]
fn type_table() {
    for dt in DType::all() {
        assert_eq!(DType::from_ggml(dt.ggml_id()), Some(dt));
        let (name, be, bb) = ggml_type_info(dt.ggml_id()).unwrap();
        assert_eq!((name, be, bb), (dt.name(), dt.block_elems(), dt.block_bytes()));
    }
    assert_eq!(DType::from_ggml(16), None); // IQ2_XXS: known to ggml, not supported
    assert_eq!(ggml_type_info(4), None);
    assert_eq!(ggml_type_info(43), None);
    assert_eq!(ggml_type_info(12), Some(("Q4_K", 256, 144)));
    assert_eq!(ggml_type_info(14), Some(("Q6_K", 256, 210)));
    assert_eq!(DType::Q8_0.row_bytes(64), Some(68));
    assert_eq!(DType::Q4_0.row_bytes(64), Some(36));
    assert_eq!(DType::Q4_0.row_bytes(33), None);
    assert_eq!(DType::F32.row_bytes(usize::MAX), None);
    assert_eq!(DType::F16.row_bytes(3), Some(6));
}

#[test]
fn known_bit_patterns() {
    // F16 1.0 = 0x3C00, -2.0 = 0xC000.
    assert_eq!(deq(DType::F16, &[0x00, 0x3C, 0x00, 0xC0], 2), vec![1.0, -2.0]);
    assert_eq!(quant(DType::F16, &[1.0, -2.0]), vec![0x00, 0x3C, 0x00, 0xC0]);
    // BF16 1.0 = 0x3F80, -0.5 = 0xBF00.
    assert_eq!(deq(DType::BF16, &[0x80, 0x3F, 0x00, 0xBF], 2), vec![1.0, -0.5]);
    assert_eq!(quant(DType::BF16, &[1.0, -0.5]), vec![0x80, 0x3F, 0x00, 0xBF]);
    // F32 1.0 = 0x3F800000.
    assert_eq!(deq(DType::F32, &[0, 0, 0x80, 0x3F], 1), vec![1.0]);

    // Q4_0: d = 0.5 (f16 0x3800); byte j = (hi << 4) | lo with lo = j, hi = 15 - j.
    let mut b = vec![0x00, 0x38];
    for j in 0..16u8 {
        b.push(((15 - j) << 4) | j);
    }
    let y = deq(DType::Q4_0, &b, 32);
    for j in 0..16 {
        assert_eq!(y[j], 0.5 * (j as f32 - 8.0));
        assert_eq!(y[j + 16], 0.5 * ((15 - j) as f32 - 8.0));
    }
    // ...and quantizing those values gives the block back (max |v| = -4 at j=0 -> d = 0.5).
    assert_eq!(quant(DType::Q4_0, &y), b);

    // Q8_0: d = 2.0 (f16 0x4000), q_j = j - 16.
    let mut b = vec![0x00, 0x40];
    for j in 0..32i32 {
        b.push((j - 16) as i8 as u8);
    }
    let y = deq(DType::Q8_0, &b, 32);
    for (j, v) in y.iter().enumerate() {
        assert_eq!(*v, 2.0 * (j as f32 - 16.0));
    }
}

#[test]
fn q8_0_reference_quantize() {
    // amax = 127 -> d = 1, values round half away from zero.
    let mut x = vec![0f32; 32];
    x[0] = 127.0;
    x[1] = 2.5;
    x[2] = -2.5;
    x[3] = 0.49;
    let q = quant(DType::Q8_0, &x);
    assert_eq!(&q[..2], &[0x00, 0x3C]);
    assert_eq!(q[2] as i8, 127);
    assert_eq!(q[3] as i8, 3);
    assert_eq!(q[4] as i8, -3);
    assert_eq!(q[5] as i8, 0);
    // All zeros: d = 0, q = 0.
    assert_eq!(quant(DType::Q8_0, &[0.0; 32]), vec![0u8; 34]);
    // Q4_0 of zeros: d = 0 / -8 = -0.0 (f16 0x8000, as in ggml), every nibble 8.
    assert_eq!(quant(DType::Q4_0, &[0.0; 32]), {
        let mut v = vec![0x00u8, 0x80];
        v.extend([0x88u8; 16]);
        v
    });
}

#[test]
fn round_trip_random() {
    let mut rng = XorShift::new(0x9E37_79B9_7F4A_7C15);
    for &n in &[32usize, 64, 96, 256, 4096] {
        let x = rng.vec(n, -3.0, 3.0);
        for dt in DType::all().into_iter().filter(|d| !d.is_grouped()) {
            let y = deq(dt, &quant(dt, &x), n);
            for b in 0..n / 32 {
                let blk = &x[32 * b..32 * b + 32];
                let amax = blk.iter().fold(0f32, |m, v| m.max(v.abs()));
                let tol = match dt {
                    DType::F32 => 0.0,
                    DType::F16 => amax * 1e-3,
                    DType::BF16 => amax * 8e-3,
                    // half a step of amax/127, plus the f16 rounding of d.
                    DType::Q8_0 => amax / 127.0 * 0.5 + amax * 1e-3,
                    // half a step of amax/8 (one extra step at the clamped end), plus f16.
                    DType::Q4_0 => amax / 8.0 + amax * 1e-3,
                    _ => unreachable!(),
                };
                for j in 32 * b..32 * b + 32 {
                    assert!((x[j] - y[j]).abs() <= tol, "{dt} n={n} j={j}: {} vs {} (tol {tol})", x[j], y[j]);
                }
            }
            // Re-quantizing dequantized values is idempotent for every type.
            assert_eq!(deq(dt, &quant(dt, &y), n), y, "{dt} idempotence");
        }
    }
}

#[test]
fn dot_matches_dequantize_then_dot() {
    let mut rng = XorShift::new(12345);
    for &n in &[32usize, 64, 160, 512, 2048] {
        let w = rng.vec(n, -1.0, 1.0);
        let x = rng.vec(n, -1.0, 1.0);
        for dt in DType::all().into_iter().filter(|d| !d.is_grouped()) {
            let q = quant(dt, &w);
            let y = deq(dt, &q, n);
            let exact: f64 = y.iter().zip(&x).map(|(a, b)| *a as f64 * *b as f64).sum();
            let abs: f64 = y.iter().zip(&x).map(|(a, b)| (*a as f64 * *b as f64).abs()).sum();
            let got = dot_row(dt, &q, &x) as f64;
            assert!((got - exact).abs() <= abs * 1e-6 + 1e-6, "{dt} n={n}: {got} vs {exact}");
        }
    }
    // Float types with lengths that are not a multiple of the lane count.
    for &n in &[1usize, 3, 17, 33, 100, 1000] {
        let w = rng.vec(n, -1.0, 1.0);
        let x = rng.vec(n, -1.0, 1.0);
        for dt in [DType::F32, DType::F16, DType::BF16] {
            let q = quant(dt, &w);
            let y = deq(dt, &q, n);
            let exact: f64 = y.iter().zip(&x).map(|(a, b)| *a as f64 * *b as f64).sum();
            let abs: f64 = y.iter().zip(&x).map(|(a, b)| (*a as f64 * *b as f64).abs()).sum();
            let got = dot_row(dt, &q, &x) as f64;
            assert!((got - exact).abs() <= abs * 1e-6 + 1e-6, "{dt} n={n}: {got} vs {exact}");
        }
    }
}

#[test]
fn dot_is_independent_of_alignment() {
    let mut rng = XorShift::new(777);
    let n = 320;
    let w = rng.vec(n, -1.0, 1.0);
    let x = rng.vec(n, -1.0, 1.0);
    for dt in DType::all().into_iter().filter(|d| !d.is_grouped()) {
        let q = quant(dt, &w);
        let want = dot_row(dt, &q, &x).to_bits();
        for shift in 1..8 {
            let mut buf = vec![0u8; shift];
            buf.extend_from_slice(&q);
            assert_eq!(dot_row(dt, &buf[shift..], &x).to_bits(), want, "{dt} shift {shift}");
        }
    }
}

#[test]
#[should_panic]
fn dot_row_rejects_wrong_length() {
    dot_row(DType::Q8_0, &[0u8; 33], &[0f32; 32]);
}

/// Every ggml type gguf-py knows has our name, block size and bytes
/// (tests/fixtures/quant/ggml_types.json, from gguf.constants.GGML_QUANT_SIZES);
/// ids only we list are the repacked ones ggml dropped from files.
#[test]
fn ggml_table_matches_gguf_py() {
    let p = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/quant/ggml_types.json");
    let doc: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap();
    let mut ids = Vec::new();
    for (name, t) in doc["types"].as_object().unwrap() {
        let id = t["ggml_type"].as_u64().unwrap() as u32;
        let want = (t["block_size"].as_u64().unwrap() as usize, t["type_size"].as_u64().unwrap() as usize);
        let (n, be, bb) = ggml_type_info(id).unwrap_or_else(|| panic!("{name} ({id}) missing"));
        assert_eq!((n, be, bb), (name.as_str(), want.0, want.1), "ggml type {id}");
        ids.push(id);
    }
    for id in 0..64 {
        if let Some((name, ..)) = ggml_type_info(id) {
            assert!(ids.contains(&id) || [31, 32, 33, 36, 37, 38].contains(&id), "{name} ({id}) not in gguf-py");
        }
    }
}

//! The memory read-bandwidth probe (`--membw`): the bound CPU decode rows are held against.

use std::time::Instant;

/// Read bandwidth in GB/s with `threads` threads summing a 1 GiB buffer: the
/// best of `passes` passes of each of two access patterns, every thread on its own
/// part. "4 streams": 4 interleaved streams of 64-byte lines; "1 stream": one
/// sequential stream with a software prefetch 4 KiB ahead (the access of the
/// CPU decode kernels). Both keep 8 independent (vectorisable) sums, so the
/// loops are bound by memory, not adds. The buffer is allocated like the CPU
/// backend's repacked weights (huge pages where the kernel has them), so the
/// bound and the decode read the same kind of memory. `passes`: 5 alone, 2
/// around each tg repetition. Returns (best, per pattern).
#[allow(clippy::needless_range_loop)]
pub(crate) fn membw(threads: usize, passes: usize) -> (f64, [f64; 2]) {
    static BUF: std::sync::OnceLock<llmrt::bench::HostBuf> = std::sync::OnceLock::new();
    let buf = BUF.get_or_init(|| {
        let Some(mut buf) = llmrt::bench::HostBuf::zeroed(1 << 30) else {
            eprintln!("llmrt-bench: cannot allocate 1 GiB for the bandwidth probe");
            std::process::exit(1);
        };
        for (i, w) in buf.bytes_mut().chunks_exact_mut(8).enumerate() {
            w.copy_from_slice(&(i as u64).to_le_bytes());
        }
        buf
    });
    let buf = buf.bytes();
    let n = buf.len();
    let chunk = n.div_ceil(threads).div_ceil(256) * 256;
    let word = |c: &[u8], k: usize| u64::from_le_bytes(c[8 * k..8 * k + 8].try_into().expect("8 bytes"));
    let four = |c: &[u8]| {
        let q = c.len() / 256 * 64; // four streams of q bytes each
        let (a, rest) = c.split_at(q);
        let (b, rest) = rest.split_at(q);
        let (cc, d) = rest.split_at(q);
        let mut s = [0u64; 8];
        for (((x, y), z), w) in
            a.chunks_exact(64).zip(b.chunks_exact(64)).zip(cc.chunks_exact(64)).zip(d.chunks_exact(64))
        {
            for k in 0..8 {
                s[k] = s[k].wrapping_add(word(x, k) ^ word(y, k)).wrapping_add(word(z, k) ^ word(w, k));
            }
        }
        s.iter().fold(0u64, |acc, &v| acc.wrapping_add(v))
    };
    let one = |c: &[u8]| {
        let mut s = [0u64; 8];
        #[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables))]
        for (i, l) in c.chunks_exact(256).enumerate() {
            #[cfg(target_arch = "x86_64")]
            for k in 0..4 {
                // SAFETY: a prefetch is a hint: it never faults, whatever the address.
                unsafe {
                    use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
                    _mm_prefetch::<_MM_HINT_T0>(c.as_ptr().wrapping_add(i * 256 + 4096 + 64 * k) as *const i8)
                };
            }
            for k in 0..8 {
                s[k] = s[k].wrapping_add(word(l, k) ^ word(l, 8 + k)).wrapping_add(word(l, 16 + k) ^ word(l, 24 + k));
            }
        }
        s.iter().fold(0u64, |acc, &v| acc.wrapping_add(v))
    };
    let mut best = [0f64; 2];
    for _ in 0..passes {
        for (p, bp) in best.iter_mut().enumerate() {
            let t0 = Instant::now();
            let total: u64 = std::thread::scope(|sc| {
                let hs: Vec<_> =
                    buf.chunks(chunk).map(|c| sc.spawn(move || if p == 0 { four(c) } else { one(c) })).collect();
                hs.into_iter().map(|h| h.join().expect("membw thread")).fold(0u64, |a, b| a.wrapping_add(b))
            });
            let dt = t0.elapsed().as_secs_f64();
            std::hint::black_box(total);
            *bp = bp.max(n as f64 / dt / 1e9);
        }
    }
    (best[0].max(best[1]), best)
}

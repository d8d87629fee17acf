//! Mixture-of-experts routing, shared by both backends so that they choose the same
//! experts with the same weights, bit for bit, from the same router scores: [`route`]
//! (softmax, top k, ties to the lower expert index, optional renormalisation),
//! [`expert_rows`] (the tokens routed to one expert, in token order) and [`sigmoid`]
//! (qwen2moe's shared-expert gate). The experts' matrix products are the backends' own
//! (`cpu/forward.rs::moe_ffn`, `cuda/runner.rs::moe_ffn`).

/// Routes one token: the softmax of its router scores `p` (in place), its `k` largest
/// (ties: the lower expert index first, so a token's experts depend on nothing but its
/// own scores), weighted by their probabilities, renormalized to sum 1 when `norm`.
/// `routes` (`k` entries) receives them ordered by expert index; `order` (`p.len()`
/// entries) is scratch.
pub(crate) fn route(p: &mut [f32], k: usize, norm: bool, order: &mut [u32], routes: &mut [(u32, f32)]) {
    let max = p.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0f32;
    for v in p.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    for v in p.iter_mut() {
        *v /= sum;
    }
    for (i, o) in order.iter_mut().enumerate() {
        *o = i as u32;
    }
    // NaN scores (a broken checkpoint) sort last, deterministically.
    let key = |i: u32| {
        let v = p[i as usize];
        if v.is_nan() {
            f32::NEG_INFINITY
        } else {
            v
        }
    };
    order.select_nth_unstable_by(k - 1, |&a, &b| key(b).total_cmp(&key(a)).then(a.cmp(&b)));
    let top = &mut order[..k];
    top.sort_unstable();
    let total: f32 = if norm { top.iter().map(|&e| p[e as usize]).sum() } else { 1.0 };
    for (r, &e) in routes.iter_mut().zip(top.iter()) {
        *r = (e, p[e as usize] / total);
    }
}

/// The tokens routed to expert `e` and their weights, in token order, into `rows`
/// (cleared first): `routes` holds `k` routes per token, as [`route`] writes them.
pub(crate) fn expert_rows(routes: &[(u32, f32)], k: usize, e: usize, rows: &mut Vec<(u32, f32)>) {
    rows.clear();
    for (t, r) in routes.chunks_exact(k).enumerate() {
        if let Some(&(_, wgt)) = r.iter().find(|r| r.0 as usize == e) {
            rows.push((t as u32, wgt));
        }
    }
}

/// The shared expert's gate (qwen2moe): `1 / (1 + exp(-g))` in f32.
pub(crate) fn sigmoid(g: f32) -> f32 {
    1.0 / (1.0 + (-g).exp())
}

#[cfg(test)]
mod tests {
    use super::{expert_rows, route};

    fn routes(scores: &[f32], k: usize, norm: bool) -> Vec<(u32, f32)> {
        let mut p = scores.to_vec();
        let mut order = vec![0u32; p.len()];
        let mut r = vec![(0u32, 0f32); k];
        route(&mut p, k, norm, &mut order, &mut r);
        r
    }

    #[test]
    fn routing_takes_the_largest_scores_by_softmax() {
        let s = [0.5f32, 2.0, -1.0, 1.5, 0.0];
        let r = routes(&s, 2, false);
        let z: f64 = s.iter().map(|&v| (v as f64).exp()).sum();
        assert_eq!(r.iter().map(|x| x.0).collect::<Vec<_>>(), [1, 3], "ordered by expert index");
        for &(e, w) in &r {
            let want = (s[e as usize] as f64).exp() / z;
            assert!((w as f64 - want).abs() < 1e-6, "expert {e}: {w} vs {want}");
        }
        let n = routes(&s, 2, true);
        let (a, b) = ((2.0f64).exp(), (1.5f64).exp());
        assert!((n[0].1 as f64 - a / (a + b)).abs() < 1e-6 && (n[1].1 as f64 - b / (a + b)).abs() < 1e-6);
        assert!((n[0].1 + n[1].1 - 1.0).abs() < 1e-6);
    }

    #[test]
    fn routing_ties_go_to_the_lower_expert_index() {
        // All equal: the first k experts.
        assert_eq!(routes(&[0.0; 8], 3, true).iter().map(|x| x.0).collect::<Vec<_>>(), [0, 1, 2]);
        // A tie at the boundary: of experts 2, 5 and 6 (equal), 2 and 5 are taken after 4.
        let r = routes(&[0.0, 0.0, 1.0, 0.0, 3.0, 1.0, 1.0, -2.0], 3, false);
        assert_eq!(r.iter().map(|x| x.0).collect::<Vec<_>>(), [2, 4, 5]);
        // NaN scores (a broken checkpoint) make every probability NaN; the choice is still
        // the same every time.
        let a = routes(&[0.0, f32::NAN, 1.0, 2.0], 2, true);
        let b = routes(&[0.0, f32::NAN, 1.0, 2.0], 2, true);
        assert_eq!(a.iter().map(|x| x.0).collect::<Vec<_>>(), b.iter().map(|x| x.0).collect::<Vec<_>>());
    }

    #[test]
    fn routing_every_expert_when_k_is_all() {
        let r = routes(&[0.3, -0.2, 0.9, 0.1], 4, true);
        assert_eq!(r.iter().map(|x| x.0).collect::<Vec<_>>(), [0, 1, 2, 3]);
        assert!((r.iter().map(|x| x.1).sum::<f32>() - 1.0).abs() < 1e-6);
    }

    #[test]
    fn expert_rows_lists_an_experts_tokens_in_token_order() {
        // Three tokens, two routes each.
        let r = [(0, 0.6), (2, 0.4), (1, 0.5), (2, 0.5), (0, 0.9), (3, 0.1)];
        let mut rows = vec![(9, 9.0)];
        expert_rows(&r, 2, 0, &mut rows);
        assert_eq!(rows, [(0, 0.6), (2, 0.9)]);
        expert_rows(&r, 2, 2, &mut rows);
        assert_eq!(rows, [(0, 0.4), (1, 0.5)]);
        expert_rows(&r, 2, 4, &mut rows);
        assert!(rows.is_empty());
    }
}

//! Sampling the next token from one row of logits.
//!
//! Order of operations (fixed; every step is skipped when its parameter is "off"). Steps 2-3
//! are llama.cpp's `logit_bias` and `penalties` samplers (src/llama-sampling.cpp), in the order
//! its `common_sampler` chains them; steps 5-9 are its `temp`, `top_k`, `top_p`, `min_p` and
//! `dist` in that order (llama.cpp's own default chain applies the temperature after min-p).
//! 1. NaN logits are treated as -inf (never drawn unless every logit is -inf/NaN).
//! 2. Logit bias: each (token, bias) pair of `logit_bias` is added to that token's logit
//!    (f32, in list order; a token listed twice gets both). -inf bans the token. A +inf logit
//!    with a -inf bias (NaN) counts as -inf. Ids >= the row length are ignored here (the entry
//!    points reject them before any step).
//! 3. Penalties over the window of `history` (the cache's tokens, the one just fed included):
//!    its last `penalty_last_n` tokens (-1 = all of them, 0 = no penalties; ids >= the row
//!    length are ignored). For each distinct token of the window, seen `count` times, in f32:
//!    the repetition penalty divides a positive logit by it and multiplies a logit <= 0 by it
//!    (CTRL / llama.cpp; once per token however often it occurs), then
//!    `logit -= count * frequency_penalty + presence_penalty`. Skipped as a whole when the
//!    repetition penalty is 1 and both others are 0, as llama.cpp does.
//!    Then the grammar mask (constrained sampling only, `crate::grammar`): every token the
//!    grammar does not allow here becomes -inf, so steps 4-10 see only allowed tokens.
//! 4. Temperature 0: greedy — the argmax of the biased, penalised logits, the lowest id among
//!    equal maxima; top-k/top-p/min-p and the seed are ignored.
//! 5. Candidates: the tokens with a finite logit, scaled by 1/temperature (f64), sorted by logit
//!    descending, then id ascending. This order is also the draw order.
//! 6. Top-k (0 = off): keep exactly the first k of that order (ties at the k-th logit are
//!    broken by lower id, so exactly k tokens stay).
//! 7. Softmax (f64, max subtracted).
//! 8. Top-p (1 = off): keep the smallest prefix whose cumulative probability is >= top_p
//!    (at least one token). A cut-off that falls within rounding error of a cumulative sum is
//!    not specified either way.
//! 9. Min-p (0 = off): keep the tokens with p >= min_p * p_max (p of the first candidate).
//! 10. Renormalise, then inverse-CDF draw: u in [0, 1) from `splitmix64(seed ^ position *
//!     0x9E3779B97F4A7C15)` (top 53 bits / 2^53); the token is the first candidate whose
//!     cumulative probability exceeds u (the last one if rounding leaves u above the total).
//!
//! The draw is a pure function of (logits, params, history, position): the same seed, logits,
//! history and cache position give the same token on every backend, in any batch, on any
//! thread, and from `llmrt_sample_logits` on caller-held logits.
//! A row that is all -inf/NaN, or empty, gives token 0. A +inf logit (after bias and
//! penalties) wins outright: the lowest id holding +inf is returned, greedy or not.

use crate::error::{Error, Result};
use crate::util::try_vec;

/// Sampling parameters. Defaults (llama.cpp's `common_params_sampling`): temperature 0.8,
/// top_k 40, top_p 0.95, min_p 0.05, repetition_penalty 1.0 (off), frequency and presence
/// penalties 0 (off), no logit bias, seed 0; penalty_last_n -1 (the whole cache; llama.cpp's
/// common default is 64, which only matters once a penalty is on).
#[derive(Clone, Debug, PartialEq)]
pub struct SamplerParams {
    /// 0 = greedy; otherwise > 0 and finite.
    pub temperature: f32,
    /// 0 = off.
    pub top_k: u32,
    /// In (0, 1]; 1 = off.
    pub top_p: f32,
    /// In [0, 1); 0 = off.
    pub min_p: f32,
    /// > 0 and finite; 1 = off.
    pub repetition_penalty: f32,
    /// The penalties' window: the last n tokens of the history; -1 = all, 0 = no penalties.
    pub penalty_last_n: i32,
    /// Finite; 0 = off. Subtracted once per occurrence in the window.
    pub frequency_penalty: f32,
    /// Finite; 0 = off. Subtracted once for a token present in the window.
    pub presence_penalty: f32,
    /// (token, bias) pairs added to the logits; a bias is finite or -inf (a ban).
    pub logit_bias: Vec<(u32, f32)>,
    pub seed: u64,
}

impl Default for SamplerParams {
    fn default() -> Self {
        SamplerParams {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repetition_penalty: 1.0,
            penalty_last_n: -1,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            logit_bias: Vec::new(),
            seed: 0,
        }
    }
}

impl SamplerParams {
    /// LLMRT_INVALID_ARGUMENT naming the field and value for: temperature NaN, negative or
    /// infinite; top_p outside (0, 1]; min_p outside [0, 1); repetition_penalty NaN, <= 0 or
    /// infinite; penalty_last_n below -1; frequency_penalty / presence_penalty not finite; a
    /// logit_bias entry whose bias is NaN or +inf (its index and token named). Token ids of
    /// the bias list are checked against a vocabulary by [`Self::validate_for`].
    pub fn validate(&self) -> Result<()> {
        let t = self.temperature;
        if !(t.is_finite() && t >= 0.0) {
            return Err(Error::invalid(format!("sampler temperature {t}: must be 0 (greedy) or a finite value > 0")));
        }
        let p = self.top_p;
        if !(p > 0.0 && p <= 1.0) {
            return Err(Error::invalid(format!("sampler top_p {p}: must be in (0, 1] (1 = off)")));
        }
        let m = self.min_p;
        if !(0.0..1.0).contains(&m) {
            return Err(Error::invalid(format!("sampler min_p {m}: must be in [0, 1) (0 = off)")));
        }
        let r = self.repetition_penalty;
        if !(r.is_finite() && r > 0.0) {
            return Err(Error::invalid(format!(
                "sampler repetition_penalty {r}: must be a finite value > 0 (1 = off)"
            )));
        }
        let n = self.penalty_last_n;
        if n < -1 {
            return Err(Error::invalid(format!(
                "sampler penalty_last_n {n}: must be -1 (the whole cache), 0 (no penalties) or a count > 0"
            )));
        }
        for (name, v) in [("frequency_penalty", self.frequency_penalty), ("presence_penalty", self.presence_penalty)] {
            if !v.is_finite() {
                return Err(Error::invalid(format!("sampler {name} {v}: must be finite (0 = off)")));
            }
        }
        for (i, &(tok, b)) in self.logit_bias.iter().enumerate() {
            if b.is_nan() || b == f32::INFINITY {
                return Err(Error::invalid(format!(
                    "sampler logit_bias[{i}] (token {tok}) has bias {b}: must be finite or -inf (a ban)"
                )));
            }
        }
        Ok(())
    }

    /// [`Self::validate`], then every logit_bias token must be below `n_vocab` (the row
    /// length): LLMRT_INVALID_ARGUMENT naming the entry's index, its token and `n_vocab`.
    pub fn validate_for(&self, n_vocab: usize) -> Result<()> {
        self.validate()?;
        if let Some((i, &(tok, _))) = self.logit_bias.iter().enumerate().find(|(_, e)| e.0 as usize >= n_vocab) {
            return Err(Error::invalid(format!(
                "sampler logit_bias[{i}] names token {tok}, outside the vocabulary (size {n_vocab})"
            )));
        }
        Ok(())
    }

    /// Whether step 3 changes anything (llama.cpp's `is_disabled` negated).
    fn penalties_on(&self) -> bool {
        self.penalty_last_n != 0
            && (self.repetition_penalty != 1.0 || self.frequency_penalty != 0.0 || self.presence_penalty != 0.0)
    }
}

/// splitmix64's output function of `x`.
fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The uniform draw in [0, 1) for (seed, position).
pub fn uniform(seed: u64, position: u64) -> f64 {
    let x = splitmix64(seed ^ position.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    (x >> 11) as f64 / (1u64 << 53) as f64
}

/// Step 1 and the repetition penalty alone over the whole of `history`, in place (the
/// sampler before penalty_last_n, frequency and presence penalties existed).
pub fn apply_penalty(logits: &mut [f32], penalty: f32, history: &[u32]) -> Result<()> {
    prepare(logits, &SamplerParams { repetition_penalty: penalty, ..Default::default() }, &[history])
}

/// Steps 1-3 in place over `logits`, the history given as consecutive parts (a cache's
/// committed tokens, then the ones a step is appending).
pub fn prepare(logits: &mut [f32], params: &SamplerParams, history: &[&[u32]]) -> Result<()> {
    for l in logits.iter_mut() {
        if l.is_nan() {
            *l = f32::NEG_INFINITY;
        }
    }
    for &(tok, b) in &params.logit_bias {
        if let Some(l) = logits.get_mut(tok as usize) {
            *l += b;
            if l.is_nan() {
                *l = f32::NEG_INFINITY;
            }
        }
    }
    if !params.penalties_on() {
        return Ok(());
    }
    let total: usize = history.iter().map(|h| h.len()).sum();
    let w = if params.penalty_last_n < 0 { total } else { (params.penalty_last_n as usize).min(total) };
    let n = logits.len();
    let window = history.iter().flat_map(|h| h.iter().copied()).skip(total - w);
    let mut ids = crate::util::try_with_capacity::<u32>(w, "the penalties' token window")?;
    ids.extend(window);
    ids.retain(|&t| (t as usize) < n);
    ids.sort_unstable();
    let (rep, freq, present) = (params.repetition_penalty, params.frequency_penalty, params.presence_penalty);
    for run in ids.chunk_by(|a, b| a == b) {
        let l = &mut logits[run[0] as usize];
        if *l <= 0.0 {
            *l *= rep;
        } else {
            *l /= rep;
        }
        *l -= run.len() as f32 * freq + present;
    }
    Ok(())
}

/// Steps 1-9: the distribution the draw is made from, as (token, probability) in draw order,
/// probabilities renormalised to sum 1. Temperature 0: the greedy token with probability 1.
/// Empty when the row is all -inf/NaN; a +inf logit gives that token with probability 1.
/// LLMRT_OUT_OF_MEMORY (never an abort) when a scratch copy of the row cannot be allocated.
pub fn try_distribution(logits: &[f32], params: &SamplerParams, history: &[&[u32]]) -> Result<Vec<(u32, f64)>> {
    try_distribution_masked(logits, params, history, None)
}

/// [`try_distribution`] with a grammar's mask between steps 3 and 4: `allowed` is a bit set
/// (token t allowed when bit `t % 32` of word `t / 32` is set; ids past it are not), and
/// every token it does not allow becomes -inf after the bias and the penalties, so greedy,
/// the +inf rule and the filters see only allowed tokens. `None`: no mask.
pub fn try_distribution_masked(
    logits: &[f32],
    params: &SamplerParams,
    history: &[&[u32]],
    allowed: Option<&[u32]>,
) -> Result<Vec<(u32, f64)>> {
    let mut l = try_vec(logits.len(), 0f32, "a copy of the sampled logits row")?;
    l.copy_from_slice(logits);
    prepare(&mut l, params, history)?;
    if let Some(words) = allowed {
        for (i, x) in l.iter_mut().enumerate() {
            if words.get(i / 32).is_none_or(|w| w >> (i % 32) & 1 == 0) {
                *x = f32::NEG_INFINITY;
            }
        }
    }
    if l.iter().all(|&x| x == f32::NEG_INFINITY) {
        return Ok(vec![]);
    }
    if params.temperature == 0.0 {
        return Ok(vec![(crate::util::argmax(&l), 1.0)]);
    }
    if let Some(i) = l.iter().position(|&x| x == f32::INFINITY) {
        return Ok(vec![(i as u32, 1.0)]);
    }
    let t = params.temperature as f64;
    let finite = l.iter().filter(|x| x.is_finite()).count();
    let mut c = crate::util::try_with_capacity::<(u32, f64)>(finite, "the sampler's candidates")?;
    c.extend(l.iter().enumerate().filter(|(_, x)| x.is_finite()).map(|(i, &x)| (i as u32, x as f64 / t)));
    drop(l);
    c.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    if params.top_k > 0 && (params.top_k as usize) < c.len() {
        c.truncate(params.top_k as usize);
    }
    let max = c[0].1;
    let mut sum = 0.0;
    for e in c.iter_mut() {
        e.1 = (e.1 - max).exp();
        sum += e.1;
    }
    for e in c.iter_mut() {
        e.1 /= sum;
    }
    if params.top_p < 1.0 {
        let p = params.top_p as f64;
        let mut cum = 0.0;
        let mut keep = c.len();
        for (i, e) in c.iter().enumerate() {
            cum += e.1;
            if cum >= p {
                keep = i + 1;
                break;
            }
        }
        c.truncate(keep.max(1));
    }
    if params.min_p > 0.0 {
        let floor = params.min_p as f64 * c[0].1;
        c.retain(|e| e.1 >= floor);
    }
    let total: f64 = c.iter().map(|e| e.1).sum();
    for e in c.iter_mut() {
        e.1 /= total;
    }
    Ok(c)
}

/// [`try_distribution`] with the history in one piece, for trusted (model-sized) rows:
/// a failed allocation panics.
pub fn distribution(logits: &[f32], params: &SamplerParams, history: &[u32]) -> Vec<(u32, f64)> {
    try_distribution(logits, params, &[history]).unwrap_or_else(|e| panic!("{}", e.message))
}

/// Picks the next token from one row of logits (see the module documentation for the exact
/// order, the tie rules and the RNG). `history`: the cache's tokens in consecutive parts
/// (penalties). `position`: the index the new token will have in its cache. Parameters are
/// assumed valid ([`SamplerParams::validate`]); an all -inf/NaN or empty row gives 0.
pub fn try_sample(logits: &[f32], params: &SamplerParams, history: &[&[u32]], position: u64) -> Result<u32> {
    let d = try_distribution(logits, params, history)?;
    Ok(draw(&d, params.seed, position))
}

/// Step 10 over a distribution of [`try_distribution`]: the seeded inverse-CDF draw (0 for an
/// empty one).
pub fn draw(d: &[(u32, f64)], seed: u64, position: u64) -> u32 {
    let Some(last) = d.last() else { return 0 };
    if d.len() == 1 {
        return d[0].0;
    }
    let u = uniform(seed, position);
    let mut cum = 0.0;
    for &(id, p) in d {
        cum += p;
        if u < cum {
            return id;
        }
    }
    last.0
}

/// [`try_sample`] with the history in one piece, for trusted (model-sized) rows: a failed
/// allocation panics.
pub fn sample(logits: &[f32], params: &SamplerParams, history: &[u32], position: u64) -> u32 {
    try_sample(logits, params, &[history], position).unwrap_or_else(|e| panic!("{}", e.message))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(temperature: f32, top_k: u32, top_p: f32, min_p: f32) -> SamplerParams {
        SamplerParams { temperature, top_k, top_p, min_p, repetition_penalty: 1.0, seed: 42, ..Default::default() }
    }

    fn ids(d: &[(u32, f64)]) -> Vec<u32> {
        d.iter().map(|e| e.0).collect()
    }

    #[test]
    fn validate_names_field_and_value() {
        assert!(SamplerParams::default().validate().is_ok());
        let cases: [(SamplerParams, &str); 9] = [
            (SamplerParams { temperature: f32::NAN, ..Default::default() }, "temperature NaN"),
            (SamplerParams { temperature: -0.5, ..Default::default() }, "temperature -0.5"),
            (SamplerParams { temperature: f32::INFINITY, ..Default::default() }, "temperature inf"),
            (SamplerParams { top_p: 0.0, ..Default::default() }, "top_p 0"),
            (SamplerParams { top_p: 1.5, ..Default::default() }, "top_p 1.5"),
            (SamplerParams { min_p: 1.0, ..Default::default() }, "min_p 1"),
            (SamplerParams { min_p: -0.1, ..Default::default() }, "min_p -0.1"),
            (SamplerParams { repetition_penalty: 0.0, ..Default::default() }, "repetition_penalty 0"),
            (SamplerParams { repetition_penalty: f32::NAN, ..Default::default() }, "repetition_penalty NaN"),
        ];
        for (sp, needle) in cases {
            let e = sp.validate().unwrap_err();
            assert_eq!(e.status, crate::Status::LLMRT_INVALID_ARGUMENT);
            assert!(e.message.contains(needle), "{needle:?} not in {}", e.message);
        }
        assert!(SamplerParams { temperature: 0.0, top_p: 1.0, min_p: 0.0, ..Default::default() }.validate().is_ok());
    }

    #[test]
    fn validate_new_fields_and_bias_ids() {
        let d = SamplerParams::default;
        let cases: [(SamplerParams, &str); 6] = [
            (SamplerParams { penalty_last_n: -2, ..d() }, "penalty_last_n -2"),
            (SamplerParams { frequency_penalty: f32::NAN, ..d() }, "frequency_penalty NaN"),
            (SamplerParams { presence_penalty: f32::NEG_INFINITY, ..d() }, "presence_penalty -inf"),
            (
                SamplerParams { logit_bias: vec![(1, 0.0), (4, f32::NAN)], ..d() },
                "logit_bias[1] (token 4) has bias NaN",
            ),
            (SamplerParams { logit_bias: vec![(4, f32::INFINITY)], ..d() }, "logit_bias[0] (token 4) has bias inf"),
            (SamplerParams { penalty_last_n: i32::MIN, ..d() }, "penalty_last_n -2147483648"),
        ];
        for (sp, needle) in cases {
            let e = sp.validate().unwrap_err();
            assert_eq!(e.status, crate::Status::LLMRT_INVALID_ARGUMENT);
            assert!(e.message.contains(needle), "{needle:?} not in {}", e.message);
        }
        let ok = SamplerParams { logit_bias: vec![(9, f32::NEG_INFINITY), (0, -3.0)], penalty_last_n: 0, ..d() };
        assert!(ok.validate_for(10).is_ok());
        let e = ok.validate_for(9).unwrap_err();
        assert!(e.message.contains("logit_bias[0] names token 9, outside the vocabulary (size 9)"), "{}", e.message);
    }

    #[test]
    fn windowed_penalties_and_bias() {
        // window of the last 4: [1, 2, 2, 2] (the parts are one history)
        let p = SamplerParams {
            penalty_last_n: 4,
            frequency_penalty: 0.5,
            presence_penalty: 1.0,
            repetition_penalty: 2.0,
            logit_bias: vec![(3, 0.25), (3, 0.25), (0, f32::NEG_INFINITY)],
            ..Default::default()
        };
        let mut l = [1.0f32, 1.0, -1.0, 1.0, 2.0];
        prepare(&mut l, &p, &[&[0, 0, 1], &[2, 2, 2]]).unwrap();
        // token 1: 1/2 - (0.5 + 1); token 2: -1*2 - (1.5 + 1); token 3 only biased; 0 banned
        assert_eq!(l, [f32::NEG_INFINITY, -1.0, -4.5, 1.5, 2.0]);
        // -1: the whole history; 0: no penalties (the bias still applies)
        let mut l = [1.0f32, 1.0, 1.0];
        prepare(&mut l, &SamplerParams { penalty_last_n: -1, ..p.clone() }, &[&[0, 0, 1]]).unwrap();
        assert_eq!(l, [f32::NEG_INFINITY, -1.0, 1.0]);
        let mut l = [1.0f32, 1.0, 1.0, 0.0];
        prepare(&mut l, &SamplerParams { penalty_last_n: 0, ..p.clone() }, &[&[0, 0, 1]]).unwrap();
        assert_eq!(l, [f32::NEG_INFINITY, 1.0, 1.0, 0.5]);
        // a window longer than the history is the whole history; ids past the row ignored
        let mut l = [1.0f32, 1.0];
        prepare(&mut l, &SamplerParams { penalty_last_n: 1000, logit_bias: vec![], ..p.clone() }, &[&[1, 7, 1]])
            .unwrap();
        assert_eq!(l, [1.0, 0.5 - 2.0]);
        // +inf logit with a -inf bias: -inf, not NaN
        let mut l = [f32::INFINITY, 0.0];
        prepare(&mut l, &SamplerParams { logit_bias: vec![(0, f32::NEG_INFINITY)], ..Default::default() }, &[])
            .unwrap();
        assert_eq!(l, [f32::NEG_INFINITY, 0.0]);
    }

    #[test]
    fn greedy_is_first_argmax_and_ignores_filters() {
        let l = [1.0, 3.0, -2.0, 3.0, f32::NAN];
        for seed in 0..5 {
            let sp = SamplerParams { seed, ..p(0.0, 1, 0.1, 0.9) };
            assert_eq!(sample(&l, &sp, &[], seed), 1);
        }
        // the penalty still applies under greedy
        let sp = SamplerParams { repetition_penalty: 2.0, ..p(0.0, 0, 1.0, 0.0) };
        assert_eq!(sample(&l, &sp, &[1], 0), 3);
    }

    #[test]
    fn penalty_math() {
        let mut l = [2.0f32, -2.0, 1.0, 0.0, f32::NAN, 4.0];
        apply_penalty(&mut l, 2.0, &[0, 1, 0, 0, 3, 99, 1]).unwrap();
        assert_eq!(&l[..4], &[1.0, -4.0, 1.0, 0.0]);
        assert_eq!(l[4], f32::NEG_INFINITY);
        assert_eq!(l[5], 4.0);
        let mut l = [2.0f32, -2.0];
        apply_penalty(&mut l, 0.5, &[0, 1]).unwrap(); // < 1 encourages
        assert_eq!(l, [4.0, -1.0]);
    }

    #[test]
    fn top_k_keeps_exactly_k_ties_by_id() {
        let l = [1.0, 5.0, 3.0, 3.0, 3.0, 0.0];
        let d = distribution(&l, &p(1.0, 3, 1.0, 0.0), &[]);
        assert_eq!(ids(&d), [1, 2, 3]);
        let d = distribution(&l, &p(1.0, 1, 1.0, 0.0), &[]);
        assert_eq!(d, vec![(1, 1.0)]);
        let d = distribution(&l, &p(1.0, 100, 1.0, 0.0), &[]);
        assert_eq!(ids(&d), [1, 2, 3, 4, 0, 5]);
        let s: f64 = d.iter().map(|e| e.1).sum();
        assert!((s - 1.0).abs() < 1e-12);
    }

    #[test]
    fn top_p_boundaries() {
        // probabilities 0.5, 0.25, 0.125, 0.125
        let l = [4f32.ln(), 2f32.ln(), 0.0, 0.0];
        let k = |tp: f32| ids(&distribution(&l, &p(1.0, 0, tp, 0.0), &[]));
        assert_eq!(k(0.01), [0]);
        assert_eq!(k(0.499), [0]);
        assert_eq!(k(0.501), [0, 1]);
        assert_eq!(k(0.749), [0, 1]);
        assert_eq!(k(0.751), [0, 1, 2]);
        assert_eq!(k(0.876), [0, 1, 2, 3]);
        assert_eq!(k(1.0), [0, 1, 2, 3]);
        let d = distribution(&l, &p(1.0, 0, 0.7, 0.0), &[]);
        assert!((d[0].1 - 2.0 / 3.0).abs() < 1e-6 && (d[1].1 - 1.0 / 3.0).abs() < 1e-6);
    }

    #[test]
    fn min_p_boundaries() {
        // probabilities 0.5, 0.25, 0.125, 0.125: ratios to p_max 1, 0.5, 0.25, 0.25
        let l = [4f32.ln(), 2f32.ln(), 0.0, 0.0];
        let k = |mp: f32| ids(&distribution(&l, &p(1.0, 0, 1.0, mp), &[]));
        assert_eq!(k(0.249), [0, 1, 2, 3]);
        assert_eq!(k(0.251), [0, 1]);
        assert_eq!(k(0.499), [0, 1]);
        assert_eq!(k(0.501), [0]);
        assert_eq!(k(0.999), [0]);
    }

    #[test]
    fn temperature_scales() {
        let l = [2.0f32, 0.0];
        let d = distribution(&l, &p(2.0, 0, 1.0, 0.0), &[]);
        let want = 1.0 / (1.0 + (-1.0f64).exp());
        assert!((d[0].1 - want).abs() < 1e-9, "{d:?}");
    }

    #[test]
    fn nan_and_all_inf_rows() {
        let l = [f32::NAN, 1.0, f32::NAN];
        for pos in 0..50 {
            assert_eq!(sample(&l, &p(1.0, 0, 1.0, 0.0), &[], pos), 1);
        }
        let l = [f32::NEG_INFINITY, f32::NAN, f32::NEG_INFINITY];
        assert_eq!(sample(&l, &p(1.0, 0, 1.0, 0.0), &[], 3), 0);
        assert_eq!(sample(&l, &p(0.0, 0, 1.0, 0.0), &[], 3), 0);
        assert_eq!(sample(&[], &p(1.0, 0, 1.0, 0.0), &[], 3), 0);
        // +inf wins outright, greedy or not
        assert_eq!(sample(&[0.0, f32::INFINITY, f32::INFINITY], &p(0.0, 0, 1.0, 0.0), &[], 0), 1);
        assert_eq!(sample(&[0.0, f32::INFINITY, f32::INFINITY], &p(1.0, 0, 1.0, 0.0), &[], 0), 1);
    }

    #[test]
    fn seeds_and_positions() {
        let l: Vec<f32> = (0..50).map(|i| (i % 7) as f32 * 0.1).collect();
        let run = |seed: u64| -> Vec<u32> {
            (0..200).map(|pos| sample(&l, &SamplerParams { seed, ..p(1.0, 0, 1.0, 0.0) }, &[], pos)).collect()
        };
        assert_eq!(run(7), run(7));
        assert_ne!(run(7), run(8));
        // the same (seed, position) gives the same token whatever came before
        let a = run(7);
        assert_eq!(sample(&l, &SamplerParams { seed: 7, ..p(1.0, 0, 1.0, 0.0) }, &[], 123), a[123]);
        for pos in 0..1000u64 {
            let u = uniform(5, pos);
            assert!((0.0..1.0).contains(&u));
        }
    }

    #[test]
    fn chi_square_against_filtered_distribution() {
        // 8 tokens; top_k 6 drops ids 6 and 7; min_p 0.1 drops id 5 (p/p_max ~0.05).
        let l = [2.0f32, 1.5, 1.0, 0.5, 0.2, -1.0, -2.0, -3.0];
        let sp = SamplerParams {
            temperature: 1.0,
            top_k: 6,
            top_p: 1.0,
            min_p: 0.1,
            repetition_penalty: 1.0,
            seed: 2024,
            ..Default::default()
        };
        let d = distribution(&l, &sp, &[]);
        assert_eq!(ids(&d), [0, 1, 2, 3, 4]);
        let n = 20000u64;
        let mut counts = [0u64; 8];
        for pos in 0..n {
            counts[sample(&l, &sp, &[], pos) as usize] += 1;
        }
        assert_eq!(counts[5] + counts[6] + counts[7], 0, "{counts:?}");
        let chi2: f64 = d
            .iter()
            .map(|&(id, p)| {
                let e = p * n as f64;
                (counts[id as usize] as f64 - e).powi(2) / e
            })
            .sum();
        // df = 5 categories - 1 = 4; chi-square critical value for p = 0.001 at df 4: 18.467.
        let df = d.len() - 1;
        assert_eq!(df, 4);
        assert!(chi2 < 18.467, "chi2 {chi2} with df {df}: counts {counts:?}, expected {d:?}");
    }
}

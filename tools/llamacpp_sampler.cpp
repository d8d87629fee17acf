// Prints what llama.cpp's own samplers make of generated logits, for
// tests/sampling_llamacpp.rs: logit bias and penalties (repeat / frequency /
// presence over the last n accepted tokens), then greedy, and the distribution
// after temperature, top-k, top-p and min-p (the order llmrt applies them).
//   llamacpp_sampler OUT.txt
// Built and run by scripts/make-sampling-fixture.sh against a llama.cpp build
// (static libllama.a + libggml*.a); no model is loaded.
//
// Output, one case after another (every float as %.9g, which reads back exactly):
//   case I
//   params TEMP TOP_K TOP_P MIN_P LAST_N REPEAT FREQ PRESENT   (LAST_N -1 = whole history)
//   logits V l0 l1 ...
//   history H t0 t1 ...        (oldest first; accepted in that order)
//   bias B tok0 b0 tok1 b1 ... (in list order)
//   greedy ID                  (chain: logit_bias, penalties, greedy)
//   probs K id0 p0 id1 p1 ...  (chain: logit_bias, penalties, temp, top_k, top_p, min_p,
//                               dist; the kept candidates with p > 0 in llama.cpp's
//                               order; only when TEMP > 0)
//   end
#include "llama.h"
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

namespace {

struct Case {
    float temp, top_p, min_p, repeat, freq, present;
    int32_t top_k, last_n;
    std::vector<float> logits;
    std::vector<llama_token> history;
    std::vector<llama_logit_bias> bias;
};

std::mt19937_64 rng(20240517);

double unit() { return (rng() >> 11) * (1.0 / 9007199254740992.0); }
size_t below(size_t n) { return (size_t) (unit() * n); }
template <class T, size_t N> T pick(const T (&a)[N]) { return a[below(N)]; }

// big: a vocabulary past 1024 (llama.cpp's top-p then takes its partial-sort path).
Case random_case(bool big) {
    static const size_t vocabs[] = {8, 32, 64, 64, 100};
    static const float temps[] = {0.0f, 0.5f, 0.8f, 1.0f, 1.7f};
    static const int32_t top_ks[] = {0, 0, 1, 3, 40};
    static const float top_ps[] = {1.0f, 1.0f, 0.95f, 0.6f};
    static const float min_ps[] = {0.0f, 0.0f, 0.05f, 0.3f};
    static const int32_t last_ns[] = {-1, -1, 0, 1, 3, 16, 64};
    static const float repeats[] = {1.0f, 1.1f, 1.5f, 0.7f};
    static const float freqs[] = {0.0f, 0.2f, 1.0f, -0.3f};
    static const float presents[] = {0.0f, 0.5f, 2.0f, -0.4f};
    static const size_t hists[] = {0, 1, 5, 20, 80};
    static const size_t biases[] = {0, 0, 1, 3, 8};
    Case c;
    size_t v = big ? 1500 : pick(vocabs);
    c.temp = pick(temps);
    c.top_k = pick(top_ks);
    c.top_p = pick(top_ps);
    c.min_p = pick(min_ps);
    c.last_n = pick(last_ns);
    c.repeat = pick(repeats);
    c.freq = pick(freqs);
    c.present = pick(presents);
    double scale = 0.5 + 3.0 * unit();
    for (size_t i = 0; i < v; i++) c.logits.push_back((float) ((unit() * 2.0 - 1.0) * scale));
    size_t h = pick(hists);
    size_t hot = v < 12 ? v : 12; // most history ids from a few tokens, so counts exceed 1
    for (size_t i = 0; i < h; i++) c.history.push_back((llama_token) (unit() < 0.8 ? below(hot) : below(v)));
    size_t nb = pick(biases);
    for (size_t i = 0; i < nb; i++) {
        llama_logit_bias b;
        b.token = (llama_token) (unit() < 0.5 ? below(hot) : below(v));
        double r = unit();
        b.bias = r < 0.1 ? -INFINITY : (float) ((unit() * 2.0 - 1.0) * 5.0);
        c.bias.push_back(b);
        if (r > 0.9) c.bias.push_back(b); // listed twice: both apply
    }
    return c;
}

llama_sampler * head(const Case & c) {
    llama_sampler * s = llama_sampler_chain_init(llama_sampler_chain_default_params());
    int32_t nv = (int32_t) c.logits.size();
    llama_sampler_chain_add(s, llama_sampler_init_logit_bias(nv, (int32_t) c.bias.size(), c.bias.data()));
    // llmrt's -1 (the whole history) is llama.cpp's last_n = the history's length.
    int32_t last_n = c.last_n < 0 ? (int32_t) c.history.size() : c.last_n;
    llama_sampler_chain_add(s, llama_sampler_init_penalties(nv, last_n, c.repeat, c.freq, c.present));
    return s;
}

std::vector<llama_token_data> run(llama_sampler * s, const Case & c, int64_t * selected) {
    for (llama_token t : c.history) llama_sampler_accept(s, t);
    std::vector<llama_token_data> d;
    for (size_t i = 0; i < c.logits.size(); i++) d.push_back({(llama_token) i, c.logits[i], 0.0f});
    llama_token_data_array a = {d.data(), d.size(), -1, false};
    llama_sampler_apply(s, &a);
    *selected = a.selected;
    d.resize(a.size);
    return d;
}

} // namespace

int main(int argc, char ** argv) {
    if (argc != 2) { fprintf(stderr, "usage: %s OUT.txt\n", argv[0]); return 2; }
    FILE * f = fopen(argv[1], "w");
    if (!f) { perror(argv[1]); return 1; }
    const int n_cases = 120;
    for (int i = 0; i < n_cases; i++) {
        Case c = random_case(i % 30 == 29);
        fprintf(f, "case %d\nparams %.9g %d %.9g %.9g %d %.9g %.9g %.9g\n", i, c.temp, c.top_k, c.top_p, c.min_p,
                c.last_n, c.repeat, c.freq, c.present);
        fprintf(f, "logits %zu", c.logits.size());
        for (float l : c.logits) fprintf(f, " %.9g", l);
        fprintf(f, "\nhistory %zu", c.history.size());
        for (llama_token t : c.history) fprintf(f, " %d", t);
        fprintf(f, "\nbias %zu", c.bias.size());
        for (const auto & b : c.bias) fprintf(f, " %d %.9g", b.token, b.bias);
        fprintf(f, "\n");

        llama_sampler * g = head(c);
        llama_sampler_chain_add(g, llama_sampler_init_greedy());
        int64_t sel = -1;
        std::vector<llama_token_data> d = run(g, c, &sel);
        fprintf(f, "greedy %d\n", d.at((size_t) sel).id);
        llama_sampler_free(g);

        if (c.temp > 0.0f) {
            llama_sampler * s = head(c);
            llama_sampler_chain_add(s, llama_sampler_init_temp(c.temp));
            llama_sampler_chain_add(s, llama_sampler_init_top_k(c.top_k));
            llama_sampler_chain_add(s, llama_sampler_init_top_p(c.top_p, 1));
            llama_sampler_chain_add(s, llama_sampler_init_min_p(c.min_p, 1));
            llama_sampler_chain_add(s, llama_sampler_init_dist(1234));
            d = run(s, c, &sel);
            size_t k = 0;
            for (const auto & e : d) k += e.p > 0.0f;
            fprintf(f, "probs %zu", k);
            for (const auto & e : d)
                if (e.p > 0.0f) fprintf(f, " %d %.9g", e.id, e.p);
            fprintf(f, "\n");
            llama_sampler_free(s);
        }
        fprintf(f, "end\n");
    }
    fclose(f);
    return 0;
}

/* Grammar-constrained decoding through the C API: llmrt_grammar_new / accept /
 * is_done / can_stop / reset / free, llmrt_decode_sample_constrained and
 * llmrt_sample_logits_constrained, on the llama_gqa fixture (SentencePiece with byte
 * fallback). The whole-vocabulary checks against external validators are in
 * tests/grammar.rs; here: the C contract (completions have the regex's shape, errors at
 * creation, a failed step changes nothing, the caller-held variant agrees with the step).
 * One program, one ctest per case:
 *     grammar CASE
 * `grammar --list` prints the case names. */
#include "harness.h" /* first: it sets the feature-test macros */

#define REGEX "[0-9]{3}-(yes|no)"

static llmrt_sampler_params params_seed(uint64_t seed) {
    llmrt_sampler_params p;
    llmrt_sampler_params_default(&p);
    p.temperature = 1.0f;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    p.seed = seed;
    return p;
}

/* A cache holding "Code:" but its last token, which is returned (fed by the first step). */
static llmrt_cache prompt_cache(llmrt_model *m, uint32_t *last) {
    uint32_t ids[16];
    size_t n = 0;
    OK(llmrt_tokenize(m, "Code:", 5, true, ids, 16, &n));
    REQUIRE(n >= 2, "prompt of %zu tokens", n);
    llmrt_cache c = 0;
    OK(llmrt_cache_reserve(m, 0, &c));
    OK(llmrt_prefill(m, c, ids, n - 1, NULL));
    *last = ids[n - 1];
    return c;
}

/* Whether `s` is 3 digits, '-', then "yes" or "no" (REGEX, by hand). */
static int matches_regex(const char *s) {
    for (int i = 0; i < 3; i++)
        if (s[i] < '0' || s[i] > '9') return 0;
    return s[3] == '-' && (strcmp(s + 4, "yes") == 0 || strcmp(s + 4, "no") == 0);
}

static void case_regex_completions(void) {
    llmrt_model *m = load_fixture_model();
    llmrt_model_info info = model_info(m);
    uint32_t last = 0;
    llmrt_cache base = prompt_cache(m, &last);
    for (uint64_t seed = 1; seed <= 6; seed++) {
        llmrt_grammar *g = NULL;
        OK(llmrt_grammar_new(m, LLMRT_GRAMMAR_REGEX, REGEX, &g));
        llmrt_cache c = 0;
        OK(llmrt_cache_fork(m, base, &c));
        llmrt_sampler_params p = params_seed(seed);
        const llmrt_sampler_params *pp = &p;
        char text[128] = {0};
        size_t len = 0;
        uint32_t tok = last;
        int ended = 0;
        for (int step = 0; step < 32 && !ended; step++) {
            uint32_t next = UINT32_MAX;
            OK(llmrt_decode_sample_constrained(m, 1, &c, &tok, &pp, &g, &next));
            if (llmrt_token_is_eog(m, next)) {
                ended = 1;
                break;
            }
            size_t n = 0;
            OK(llmrt_token_piece(m, next, text + len, sizeof text - 1 - len, &n));
            len += n;
            tok = next;
        }
        CHECK(ended, "seed %llu: no end in 32 tokens (\"%s\")", (unsigned long long)seed, text);
        CHECK(matches_regex(text), "seed %llu: \"%s\" is not " REGEX, (unsigned long long)seed, text);
        bool done = false;
        OK(llmrt_grammar_is_done(g, &done));
        CHECK(done, "seed %llu: not done after the end token", (unsigned long long)seed);
        /* Done: the next step gives the model's EOS. */
        uint32_t next = UINT32_MAX;
        OK(llmrt_decode_sample_constrained(m, 1, &c, &tok, &pp, &g, &next));
        CHECK(next == info.eos_token, "done grammar gave %u, EOS is %u", next, info.eos_token);
        OK(llmrt_cache_release(m, c));
        llmrt_grammar_free(g);
    }
    llmrt_grammar_free(NULL);
    llmrt_model_free(m);
}

static void case_errors(void) {
    llmrt_model *m = load_fixture_model();
    llmrt_grammar *g = (llmrt_grammar *)0x10;
    EXPECT_STATUS_MSG(LLMRT_INVALID_ARGUMENT, llmrt_grammar_new(m, LLMRT_GRAMMAR_REGEX, "(ab", &g),
                      "regex parse error");
    CHECK(g == (llmrt_grammar *)0x10, "out_grammar written by a failed call");
    EXPECT_STATUS_MSG(LLMRT_INVALID_ARGUMENT,
                      llmrt_grammar_new(m, LLMRT_GRAMMAR_JSON_SCHEMA, "{\"type\": \"integer\", \"minimum\": 3, "
                                                                       "\"maximum\": 1}", &g),
                      "Unsatisfiable");
    EXPECT_STATUS_MSG(LLMRT_INVALID_ARGUMENT, llmrt_grammar_new(m, LLMRT_GRAMMAR_LARK, "start: nope\n", &g),
                      "nope");
    EXPECT_STATUS_MSG(LLMRT_INVALID_ARGUMENT, llmrt_grammar_new(m, (llmrt_grammar_kind)9, "a", &g),
                      "kind = 9");
    EXPECT_STATUS_MSG(LLMRT_INVALID_ARGUMENT, llmrt_grammar_new(m, LLMRT_GRAMMAR_REGEX, NULL, &g), "source");
    EXPECT_STATUS_MSG(LLMRT_INVALID_ARGUMENT, llmrt_grammar_new(NULL, LLMRT_GRAMMAR_REGEX, "a", &g), "model");
    EXPECT_STATUS_MSG(LLMRT_INVALID_ARGUMENT, llmrt_grammar_new(m, LLMRT_GRAMMAR_REGEX, "a", NULL), "out_grammar");
    EXPECT_STATUS_MSG(LLMRT_INVALID_ARGUMENT, llmrt_grammar_accept(NULL, 0), "grammar");
    CHECK(g == (llmrt_grammar *)0x10, "out_grammar written by a failed call");

    /* A token the grammar does not allow: refused. The same grammar twice in one step:
     * refused before anything runs, no cache moves. */
    OK(llmrt_grammar_new(m, LLMRT_GRAMMAR_REGEX, REGEX, &g));
    uint32_t ids[4];
    size_t n = 0;
    OK(llmrt_tokenize(m, "x", 1, false, ids, 4, &n));
    EXPECT_STATUS_MSG(LLMRT_INVALID_ARGUMENT, llmrt_grammar_accept(g, ids[n - 1]), "not allowed");
    uint32_t last = 0;
    llmrt_cache a = prompt_cache(m, &last), b = 0;
    OK(llmrt_cache_fork(m, a, &b));
    uint32_t len_a = cache_len(m, a);
    llmrt_sampler_params p = params_seed(3);
    const llmrt_sampler_params *ps[2] = {&p, &p};
    llmrt_grammar *gs[2] = {g, g};
    llmrt_cache cs[2] = {a, b};
    uint32_t toks[2] = {last, last}, next[2] = {UINT32_MAX, UINT32_MAX};
    EXPECT_STATUS_MSG(LLMRT_INVALID_ARGUMENT, llmrt_decode_sample_constrained(m, 2, cs, toks, ps, gs, next),
                      "grammars[1]");
    CHECK(next[0] == UINT32_MAX && next[1] == UINT32_MAX, "next_tokens written by a failed step");
    CHECK(cache_len(m, a) == len_a && cache_len(m, b) == len_a, "a cache moved in a failed step");
    EXPECT_STATUS_MSG(LLMRT_INVALID_ARGUMENT, llmrt_decode_sample_constrained(m, 2, cs, toks, ps, NULL, next),
                      "grammars");
    /* A NULL entry is unconstrained. */
    gs[1] = NULL;
    OK(llmrt_decode_sample_constrained(m, 2, cs, toks, ps, gs, next));
    llmrt_model_info info = model_info(m);
    CHECK(next[0] < info.vocab_size && next[1] < info.vocab_size, "tokens %u %u", next[0], next[1]);
    llmrt_grammar_free(g);
    llmrt_model_free(m);
}

static void case_accept_and_sample_logits(void) {
    llmrt_model *m = load_fixture_model();
    llmrt_model_info info = model_info(m);
    llmrt_grammar *step_g = NULL, *host_g = NULL;
    OK(llmrt_grammar_new(m, LLMRT_GRAMMAR_REGEX, REGEX, &step_g));
    OK(llmrt_grammar_new(m, LLMRT_GRAMMAR_REGEX, REGEX, &host_g));
    uint32_t last = 0;
    llmrt_cache a = prompt_cache(m, &last), b = 0;
    OK(llmrt_cache_fork(m, a, &b));
    llmrt_sampler_params p = params_seed(9);
    const llmrt_sampler_params *pp = &p;
    float *row = alloc_floats(info.vocab_size);
    uint32_t ta = last, tb = last;
    int steps = 0;
    bool done = false;
    while (!done && steps < 32) {
        uint32_t got = UINT32_MAX;
        OK(llmrt_decode_sample_constrained(m, 1, &a, &ta, &pp, &step_g, &got));
        ta = got;
        OK(llmrt_decode(m, 1, &b, &tb, row));
        uint32_t t = UINT32_MAX;
        OK(llmrt_sample_logits_constrained(&p, host_g, row, info.vocab_size, NULL, 0, cache_len(m, b), &t));
        CHECK(t == ta, "step %d: caller-held %u, step %u", steps, t, ta);
        OK(llmrt_grammar_accept(host_g, t));
        tb = t;
        OK(llmrt_grammar_is_done(step_g, &done));
        steps++;
    }
    CHECK(done, "not done in 32 steps");
    bool can_stop = false;
    OK(llmrt_grammar_can_stop(host_g, &can_stop));
    CHECK(can_stop, "done but cannot stop");
    /* Reset: the start state again (nothing complete, a digit first). */
    OK(llmrt_grammar_reset(host_g));
    OK(llmrt_grammar_is_done(host_g, &done));
    OK(llmrt_grammar_can_stop(host_g, &can_stop));
    CHECK(!done && !can_stop, "after reset: done %d, can_stop %d", done, can_stop);
    EXPECT_STATUS(LLMRT_INVALID_ARGUMENT, llmrt_grammar_accept(host_g, info.eos_token));
    /* A row of the wrong size. */
    uint32_t t = 77;
    EXPECT_STATUS_MSG(LLMRT_INVALID_ARGUMENT,
                      llmrt_sample_logits_constrained(&p, host_g, row, info.vocab_size - 1, NULL, 0, 0, &t),
                      "n_logits");
    CHECK(t == 77, "out_token written by a failed call");
    free(row);
    llmrt_grammar_free(step_g);
    llmrt_grammar_free(host_g);
    llmrt_model_free(m);
}

/* ---- dispatch ------------------------------------------------------------- */

static const test_case CASES[] = {
    {"regex_completions", case_regex_completions},
    {"errors", case_errors},
    {"accept_and_sample_logits", case_accept_and_sample_logits},
};

int main(int argc, char **argv) {
    return run_cases(CASES, sizeof CASES / sizeof CASES[0], argc, argv);
}

/* Text and sampling through the C API (llmrt_tokenize, llmrt_detokenize,
 * llmrt_tokenize_ex, llmrt_token_piece, llmrt_sampler_params_default, llmrt_decode_sample,
 * llmrt_decode_sample_each, llmrt_sample_logits) on the
 * fixtures: reference ids (tests/fixtures/tokenizer/vectors.json), add_bos, the
 * buffer-size protocol, round trips, streaming pieces, seeded sampling. The
 * invalid-input cases are in errors.c (text_invalid, sampler_invalid_params).
 * One program, one ctest per case:
 *     text_sampling CASE
 * `text_sampling --list` prints the case names. */
#include "harness.h" /* first: it sets the feature-test macros */

#define QWEN2_REL "qwen2/qwen2.f32.gguf"

static llmrt_model *load_rel(const char *rel) {
    char *path = fixture_path(rel);
    llmrt_model *m = load_model_opts(path, 0);
    free(path);
    return m;
}

/* "Hello world" in the llama_gqa SentencePiece vocabulary, no BOS (vectors.json). */
static const uint32_t HELLO_IDS[8] = {316, 365, 313, 328, 323, 261, 269, 276};
#define HELLO "Hello world"

/* tokenize through the size query: NULL/0 first, then the exact size. */
static uint32_t *tokenize_all(llmrt_model *m, const char *text, bool add_bos, size_t *out_n) {
    size_t n = 12345;
    llmrt_status st = llmrt_tokenize(m, text, strlen(text), add_bos, NULL, 0, &n);
    REQUIRE(st == LLMRT_OK || st == LLMRT_BUFFER_TOO_SMALL, "size query for \"%s\": %s: %s", text,
            llmrt_status_name(st), llmrt_last_error());
    REQUIRE(st == LLMRT_BUFFER_TOO_SMALL || n == 0, "size query OK with %zu tokens", n);
    uint32_t *ids = malloc((n ? n : 1) * sizeof *ids);
    REQUIRE(ids != NULL, "out of memory");
    size_t got = 0;
    OK(llmrt_tokenize(m, text, strlen(text), add_bos, ids, n, &got));
    REQUIRE(got == n, "tokenize wrote %zu ids, the size query said %zu", got, n);
    *out_n = n;
    return ids;
}

/* detokenize through the size query; NUL-terminated copy, length in *out_len. */
static char *detokenize_all(llmrt_model *m, const uint32_t *ids, size_t n, size_t *out_len) {
    size_t len = 12345;
    llmrt_status st = llmrt_detokenize(m, ids, n, NULL, 0, &len);
    REQUIRE(st == LLMRT_OK || st == LLMRT_BUFFER_TOO_SMALL, "detokenize size query: %s: %s",
            llmrt_status_name(st), llmrt_last_error());
    REQUIRE(st == LLMRT_BUFFER_TOO_SMALL || len == 0, "size query OK with %zu bytes", len);
    char *text = malloc(len + 1);
    REQUIRE(text != NULL, "out of memory");
    size_t got = 0;
    OK(llmrt_detokenize(m, ids, n, text, len, &got));
    REQUIRE(got == len, "detokenize wrote %zu bytes, the size query said %zu", got, len);
    text[len] = '\0';
    *out_len = len;
    return text;
}

/* ---- tokenize: reference ids, add_bos -------------------------------------- */

static void case_tokenize_add_bos(void) {
    llmrt_model *m = load_fixture_model();
    const llmrt_model_info info = model_info(m);
    CHECK(info.bos_token == 1, "llama_gqa BOS is %u, want 1", info.bos_token);
    uint32_t ids[32];
    size_t n = 0;
    OK(llmrt_tokenize(m, HELLO, strlen(HELLO), false, ids, 32, &n));
    CHECK(n == 8 && memcmp(ids, HELLO_IDS, sizeof HELLO_IDS) == 0,
          "tokenize(\"" HELLO "\", add_bos false): %zu ids, want the 8 of vectors.json", n);
    OK(llmrt_tokenize(m, HELLO, strlen(HELLO), true, ids, 32, &n));
    CHECK(n == 9 && ids[0] == 1 && memcmp(ids + 1, HELLO_IDS, sizeof HELLO_IDS) == 0,
          "tokenize(\"" HELLO "\", add_bos true): %zu ids, first %u; want BOS 1 + the 8", n,
          ids[0]);
    /* Not NUL-terminated: text_len is what counts. */
    OK(llmrt_tokenize(m, HELLO "XYZ", strlen(HELLO), false, ids, 32, &n));
    CHECK(n == 8 && memcmp(ids, HELLO_IDS, sizeof HELLO_IDS) == 0, "text_len ignored");
    /* The empty text: nothing, or BOS alone. */
    OK(llmrt_tokenize(m, "", 0, false, ids, 32, &n));
    CHECK(n == 0, "empty text gave %zu ids", n);
    OK(llmrt_tokenize(m, NULL, 0, true, ids, 32, &n));
    CHECK(n == 1 && ids[0] == 1, "empty text with BOS gave %zu ids", n);
    llmrt_model_free(m);

    /* Byte-level BPE (qwen2): its tokenizer asks for no BOS, so add_bos adds none. */
    m = load_rel(QWEN2_REL);
    size_t n_with = 0, n_without = 0;
    uint32_t *with = tokenize_all(m, HELLO, true, &n_with);
    uint32_t *without = tokenize_all(m, HELLO, false, &n_without);
    static const uint32_t QWEN_HELLO[7] = {40, 318, 76, 79, 259, 267, 276};
    CHECK(n_without == 7 && memcmp(without, QWEN_HELLO, sizeof QWEN_HELLO) == 0,
          "qwen2 tokenize(\"" HELLO "\"): %zu ids, want the 7 of vectors.json", n_without);
    CHECK(n_with == n_without && memcmp(with, without, n_with * sizeof *with) == 0,
          "qwen2: add_bos changed the ids (%zu vs %zu)", n_with, n_without);
    free(with);
    free(without);
    llmrt_model_free(m);
}

/* ---- the buffer protocol --------------------------------------------------- */

static void case_buffer_protocol(void) {
    llmrt_model *m = load_fixture_model();
    const size_t len = strlen(HELLO);
    /* NULL with capacity 0 is a size query: BUFFER_TOO_SMALL with the count. */
    size_t n = 0;
    EXPECT_STATUS(LLMRT_BUFFER_TOO_SMALL, llmrt_tokenize(m, HELLO, len, true, NULL, 0, &n));
    CHECK(n == 9, "size query: %zu, want 9", n);
    n = 0;
    EXPECT_STATUS(LLMRT_BUFFER_TOO_SMALL, llmrt_tokenize(m, HELLO, len, false, NULL, 0, &n));
    CHECK(n == 8, "size query without BOS: %zu, want 8", n);
    /* Too small: the needed count, the buffer untouched. */
    uint32_t ids[16];
    for (size_t i = 0; i < 16; i++) ids[i] = 4242;
    n = 0;
    EXPECT_STATUS(LLMRT_BUFFER_TOO_SMALL, llmrt_tokenize(m, HELLO, len, true, ids, 8, &n));
    CHECK(n == 9, "BUFFER_TOO_SMALL reported %zu, want 9", n);
    for (size_t i = 0; i < 16; i++) CHECK(ids[i] == 4242, "too-small tokenize wrote ids[%zu]", i);
    /* Exactly enough. */
    OK(llmrt_tokenize(m, HELLO, len, true, ids, 9, &n));
    CHECK(n == 9 && ids[0] == 1 && ids[9] == 4242, "exact capacity: %zu ids", n);

    /* detokenize: the same rules, in bytes. */
    size_t bytes = 0;
    EXPECT_STATUS(LLMRT_BUFFER_TOO_SMALL, llmrt_detokenize(m, ids, 9, NULL, 0, &bytes));
    CHECK(bytes == len, "detokenize size query: %zu, want %zu", bytes, len);
    char text[32];
    memset(text, '#', sizeof text);
    bytes = 0;
    EXPECT_STATUS(LLMRT_BUFFER_TOO_SMALL, llmrt_detokenize(m, ids, 9, text, len - 1, &bytes));
    CHECK(bytes == len, "detokenize BUFFER_TOO_SMALL reported %zu, want %zu", bytes, len);
    for (size_t i = 0; i < sizeof text; i++)
        CHECK(text[i] == '#', "too-small detokenize wrote text[%zu]", i);
    OK(llmrt_detokenize(m, ids, 9, text, len, &bytes));
    CHECK(bytes == len && memcmp(text, HELLO, len) == 0 && text[len] == '#',
          "detokenize: \"%.*s\"", (int)bytes, text);
    /* Nothing to write: OK with 0, even into NULL. */
    bytes = 99;
    OK(llmrt_detokenize(m, NULL, 0, NULL, 0, &bytes));
    CHECK(bytes == 0, "detokenize of no ids: %zu bytes", bytes);
    bytes = 99;
    OK(llmrt_detokenize(m, ids, 1, NULL, 0, &bytes)); /* BOS alone: no text */
    CHECK(bytes == 0, "detokenize(BOS): %zu bytes", bytes);

    /* token_piece: "▁Hello"-style pieces keep their space; BOS gives nothing. */
    bytes = 99;
    OK(llmrt_token_piece(m, 1, NULL, 0, &bytes));
    CHECK(bytes == 0, "token_piece(BOS): %zu bytes", bytes);
    const uint32_t space = HELLO_IDS[0]; /* 316: the SentencePiece space */
    bytes = 0;
    EXPECT_STATUS(LLMRT_BUFFER_TOO_SMALL, llmrt_token_piece(m, space, NULL, 0, &bytes));
    CHECK(bytes == 1, "token_piece(%u) size query: %zu, want 1", space, bytes);
    memset(text, '#', sizeof text);
    OK(llmrt_token_piece(m, space, text, sizeof text, &bytes));
    CHECK(bytes == 1 && text[0] == ' ' && text[1] == '#', "token_piece(%u) = \"%.*s\"", space,
          (int)bytes, text);
    llmrt_model_free(m);
}

/* ---- round trips and streaming pieces -------------------------------------- */

static const char *const SENTENCES[] = {
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    " leading space, two  spaces,\ttab\nnewline",
    "caf\xc3\xa9 na\xc3\xafve \xe4\xbd\xa0\xe5\xa5\xbd \xf0\x9f\x98\x80",
    "",
};

/* detokenize(tokenize(s)) == s with and without BOS; the pieces of the ids
 * concatenate to prefix + s. */
static void check_round_trips(const char *rel, const char *prefix) {
    llmrt_model *m = load_rel(rel);
    for (size_t i = 0; i < sizeof SENTENCES / sizeof SENTENCES[0]; i++) {
        const char *s = SENTENCES[i];
        for (int bos = 0; bos < 2; bos++) {
            size_t n = 0, len = 0;
            uint32_t *ids = tokenize_all(m, s, bos == 1, &n);
            char *back = detokenize_all(m, ids, n, &len);
            CHECK(len == strlen(s) && memcmp(back, s, len) == 0,
                  "%s: detokenize(tokenize(\"%s\", add_bos %d)) = \"%s\"", rel, s, bos, back);
            /* Streaming: one piece per token, concatenated. */
            size_t cap = 4 * strlen(s) + 64, used = 0;
            char *joined = malloc(cap);
            REQUIRE(joined != NULL, "out of memory");
            for (size_t k = 0; k < n; k++) {
                size_t plen = 0;
                OK(llmrt_token_piece(m, ids[k], joined + used, cap - used, &plen));
                used += plen;
            }
            const size_t want = strlen(prefix) + strlen(s);
            CHECK(used == (s[0] ? want : 0) &&
                      (s[0] == '\0' || (memcmp(joined, prefix, strlen(prefix)) == 0 &&
                                        memcmp(joined + strlen(prefix), s, strlen(s)) == 0)),
                  "%s: pieces of \"%s\" (add_bos %d) give \"%.*s\", want \"%s%s\"", rel, s, bos,
                  (int)used, joined, prefix, s);
            free(joined);
            free(back);
            free(ids);
        }
    }
    llmrt_model_free(m);
}

static void case_round_trip_spm(void) { check_round_trips(MODEL_REL, " "); }
static void case_round_trip_bpe(void) { check_round_trips(QWEN2_REL, ""); }

/* ---- llmrt_tokenize_ex: parse_special --------------------------------------- */

/* Whether `ids[0..n]` holds `id`. */
static int has_id(const uint32_t *ids, size_t n, uint32_t id) {
    for (size_t i = 0; i < n; i++)
        if (ids[i] == id) return 1;
    return 0;
}

/* A control token written in the text becomes its id with parse_special = true (as
 * llmrt_tokenize does) and stays text with false; the buffer rule is llmrt_tokenize's. */
static void case_tokenize_ex_parse_special(void) {
    llmrt_model *m = load_fixture_model();
    const llmrt_model_info info = model_info(m);
    REQUIRE(info.bos_token == 1, "llama_gqa BOS is %u, want 1", info.bos_token);
    const char *text = "<s>" HELLO;
    const size_t len = strlen(text);
    uint32_t ids[32], plain[32];
    size_t n = 0, n_plain = 0;
    /* true: "<s>" is BOS, then the 8 ids of "Hello world"; what llmrt_tokenize gives. */
    OK(llmrt_tokenize_ex(m, text, len, false, true, ids, 32, &n));
    CHECK(n == 9 && ids[0] == 1 && memcmp(ids + 1, HELLO_IDS, sizeof HELLO_IDS) == 0,
          "tokenize_ex(\"<s>" HELLO "\", parse_special true): %zu ids, first %u; want BOS 1 + "
          "the 8", n, n ? ids[0] : 0);
    OK(llmrt_tokenize(m, text, len, false, plain, 32, &n_plain));
    CHECK(n_plain == n && memcmp(plain, ids, n * sizeof *ids) == 0,
          "llmrt_tokenize differs from llmrt_tokenize_ex with parse_special true");
    /* false: "<s>" is three characters of text, never the control token. */
    OK(llmrt_tokenize_ex(m, text, len, false, false, ids, 32, &n));
    CHECK(n > 9 && !has_id(ids, n, info.bos_token),
          "tokenize_ex(\"<s>" HELLO "\", parse_special false): %zu ids, BOS among them: %d", n,
          has_id(ids, n, info.bos_token));
    /* ... and round-trips to the text it was. */
    size_t bytes = 0;
    char *back = detokenize_all(m, ids, n, &bytes);
    CHECK(bytes == len && memcmp(back, text, len) == 0, "round trip: \"%s\"", back);
    free(back);
    /* add_bos still adds the one real BOS in front. */
    OK(llmrt_tokenize_ex(m, text, len, true, false, plain, 32, &n_plain));
    CHECK(n_plain == n + 1 && plain[0] == 1 && memcmp(plain + 1, ids, n * sizeof *ids) == 0,
          "add_bos with parse_special false: %zu ids, want %zu", n_plain, n + 1);

    /* Byte-level BPE (qwen2): <|endoftext|> (id 0, special) likewise. */
    llmrt_model *q = load_rel(QWEN2_REL);
    static const char EOT[] = "<|endoftext|>";
    OK(llmrt_tokenize_ex(q, EOT, strlen(EOT), false, true, ids, 32, &n));
    CHECK(n == 1 && ids[0] == 0, "qwen2 \"%s\", parse_special true: %zu ids, first %u", EOT, n,
          n ? ids[0] : 0);
    OK(llmrt_tokenize_ex(q, EOT, strlen(EOT), false, false, ids, 32, &n));
    CHECK(n > 1 && !has_id(ids, n, 0), "qwen2 \"%s\", parse_special false: %zu ids", EOT, n);
    llmrt_model_free(q);

    /* Bad arguments. Too small a buffer: BUFFER_TOO_SMALL with the count needed, nothing
     * written; NULL with capacity 0 is the size query. */
    for (size_t i = 0; i < 32; i++) ids[i] = 4242;
    n = 0;
    EXPECT_STATUS(LLMRT_BUFFER_TOO_SMALL, llmrt_tokenize_ex(m, text, len, false, true, ids, 8, &n));
    CHECK(n == 9, "BUFFER_TOO_SMALL reported %zu, want 9", n);
    for (size_t i = 0; i < 32; i++) CHECK(ids[i] == 4242, "too-small tokenize_ex wrote ids[%zu]", i);
    n = 0;
    EXPECT_STATUS(LLMRT_BUFFER_TOO_SMALL, llmrt_tokenize_ex(m, text, len, false, false, NULL, 0, &n));
    CHECK(n == n_plain - 1, "size query with parse_special false: %zu, want %zu", n, n_plain - 1);
    /* NULL text with a length, NULL out_n, NULL model: INVALID_ARGUMENT. */
    EXPECT_STATUS_MSG(LLMRT_INVALID_ARGUMENT, llmrt_tokenize_ex(m, NULL, 3, false, false, ids, 32, &n),
                      "text");
    EXPECT_STATUS_MSG(LLMRT_INVALID_ARGUMENT,
                      llmrt_tokenize_ex(m, text, len, false, false, ids, 32, NULL), "out_n");
    EXPECT_STATUS(LLMRT_INVALID_ARGUMENT, llmrt_tokenize_ex(NULL, text, len, false, false, ids, 32, &n));
    llmrt_model_free(m);
}

/* ---- sampling ---------------------------------------------------------------- */

static void case_sampler_defaults(void) {
    llmrt_sampler_params sp;
    memset(&sp, 0xA5, sizeof sp);
    llmrt_sampler_params_default(&sp);
    /* llama.cpp's defaults. */
    CHECK(sp.struct_size == sizeof sp, "struct_size %u, want %zu", sp.struct_size, sizeof sp);
    CHECK(sp.temperature == 0.8f, "temperature %g, want 0.8", sp.temperature);
    CHECK(sp.top_k == 40, "top_k %u, want 40", sp.top_k);
    CHECK(sp.top_p == 0.95f, "top_p %g, want 0.95", sp.top_p);
    CHECK(sp.min_p == 0.05f, "min_p %g, want 0.05", sp.min_p);
    CHECK(sp.repetition_penalty == 1.0f, "repetition_penalty %g, want 1", sp.repetition_penalty);
    CHECK(sp.seed == 0, "seed %llu, want 0", (unsigned long long)sp.seed);
    /* The appended fields default to off; the penalty window to the whole cache. */
    CHECK(sp.penalty_last_n == -1, "penalty_last_n %d, want -1", sp.penalty_last_n);
    CHECK(sp.frequency_penalty == 0.0f && sp.presence_penalty == 0.0f, "penalties %g %g, want 0",
          sp.frequency_penalty, sp.presence_penalty);
    CHECK(sp.logit_bias == NULL && sp.n_logit_bias == 0, "logit bias set by default");
    llmrt_sampler_params_default(NULL); /* a no-op */
}

/* `steps` tokens sampled after the reference greedy prompt, one decode_sample
 * per step, feeding each sampled token back. */
static void sample_run(llmrt_model *m, const llmrt_sampler_params *sp, uint32_t *out,
                       size_t steps) {
    llmrt_cache c = 0;
    OK(llmrt_cache_reserve(m, 0, &c));
    const uint32_t prompt[4] = {211, 15, 197, 380};
    OK(llmrt_prefill(m, c, prompt, 3, NULL));
    uint32_t tok = prompt[3];
    for (size_t i = 0; i < steps; i++) {
        OK(llmrt_decode_sample(m, 1, &c, &tok, sp, &out[i]));
        tok = out[i];
    }
    CHECK(cache_len(m, c) == 3 + steps, "cache length %u after %zu samples", cache_len(m, c),
          steps);
    OK(llmrt_cache_release(m, c));
}

static void case_sample_seeded(void) {
    llmrt_model *m = load_fixture_model();
    const llmrt_model_info info = model_info(m);
    enum { STEPS = 24 };
    llmrt_sampler_params sp;
    llmrt_sampler_params_default(&sp);
    sp.temperature = 1.5f; /* flat enough that the seed matters on a random model */
    sp.top_k = 0;
    sp.top_p = 1.0f;
    sp.min_p = 0.0f;
    sp.seed = 42;
    uint32_t a[STEPS], b[STEPS], other[STEPS];
    sample_run(m, &sp, a, STEPS);
    sample_run(m, &sp, b, STEPS);
    CHECK(memcmp(a, b, sizeof a) == 0, "same seed, other tokens");
    for (size_t i = 0; i < STEPS; i++) CHECK(a[i] < info.vocab_size, "token %u >= vocab", a[i]);
    sp.seed = 43;
    sample_run(m, &sp, other, STEPS);
    CHECK(memcmp(a, other, sizeof a) != 0, "seeds 42 and 43 sampled the same %d tokens", STEPS);
    /* The library's defaults are seeded too. */
    llmrt_sampler_params_default(&sp);
    sample_run(m, &sp, a, STEPS);
    sample_run(m, &sp, b, STEPS);
    CHECK(memcmp(a, b, sizeof a) == 0, "default params: same seed, other tokens");

    /* A batch samples each cache with the same params: twins agree. */
    llmrt_cache x = 0, y = 0;
    OK(llmrt_cache_reserve(m, 8, &x));
    OK(llmrt_prefill(m, x, (const uint32_t[]){211, 15}, 2, NULL));
    OK(llmrt_cache_fork(m, x, &y));
    uint32_t next[2] = {UINT32_MAX, UINT32_MAX};
    sp.temperature = 1.5f;
    sp.seed = 7;
    OK(llmrt_decode_sample(m, 2, (const llmrt_cache[]){x, y}, (const uint32_t[]){197, 197}, &sp,
                           next));
    CHECK(next[0] == next[1] && next[0] < info.vocab_size, "twin caches sampled %u and %u",
          next[0], next[1]);
    llmrt_model_free(m);
}

static void case_sample_temperature_zero_is_greedy(void) {
    llmrt_model *m = load_fixture_model();
    enum { STEPS = 16 };
    llmrt_sampler_params sp;
    llmrt_sampler_params_default(&sp); /* top_k/top_p/min_p stay on: greedy ignores them */
    sp.temperature = 0.0f;
    sp.seed = 1234;
    uint32_t sampled[STEPS];
    sample_run(m, &sp, sampled, STEPS);
    llmrt_cache c = 0;
    OK(llmrt_cache_reserve(m, 0, &c));
    const uint32_t prompt[4] = {211, 15, 197, 380};
    OK(llmrt_prefill(m, c, prompt, 3, NULL));
    uint32_t tok = prompt[3];
    for (size_t i = 0; i < STEPS; i++) {
        uint32_t g = UINT32_MAX;
        OK(llmrt_decode_greedy(m, 1, &c, &tok, &g));
        if (g != sampled[i]) {
            FAIL("step %zu: decode_sample at temperature 0 gave %u, decode_greedy %u", i,
                 sampled[i], g);
            break;
        }
        tok = g;
    }
    OK(llmrt_cache_release(m, c));
    llmrt_model_free(m);
}

/* Per-cache parameters in one step (llmrt_decode_sample_each): each cache's token is
 * the one llmrt_decode_sample of that cache alone gives, and the one
 * llmrt_sample_logits gives on llmrt_decode's row with the cache's tokens and length.
 * A bad set anywhere in the batch fails the step and no cache moves. */
static void case_sample_each_per_cache(void) {
    llmrt_model *m = load_fixture_model();
    const llmrt_model_info info = model_info(m);
    enum { N = 3, STEPS = 10, MAXH = 32 };
    const llmrt_logit_bias bias[2] = {{7, 4.0f}, {3, -INFINITY}};
    llmrt_sampler_params sp[N];
    for (int i = 0; i < N; i++) llmrt_sampler_params_default(&sp[i]);
    sp[0].temperature = 0.0f;
    sp[0].logit_bias = bias;
    sp[0].n_logit_bias = 2;
    sp[0].frequency_penalty = 0.5f;
    sp[0].penalty_last_n = 8;
    sp[1].temperature = 1.2f;
    sp[1].top_k = 0;
    sp[1].top_p = 1.0f;
    sp[1].min_p = 0.0f;
    sp[1].repetition_penalty = 1.3f;
    sp[1].presence_penalty = 1.0f;
    sp[1].seed = 11;
    const llmrt_sampler_params *ps[N] = {&sp[0], &sp[1], &sp[2]};
    const uint32_t prompt[3] = {211, 15, 197};
    llmrt_cache batch[N], lone[N], manual[N];
    uint32_t hist[N][MAXH];
    size_t nh = 3;
    for (int i = 0; i < N; i++) {
        OK(llmrt_cache_reserve(m, 0, &batch[i]));
        OK(llmrt_cache_reserve(m, 0, &lone[i]));
        OK(llmrt_cache_reserve(m, 0, &manual[i]));
        OK(llmrt_prefill(m, batch[i], prompt, 3, NULL));
        OK(llmrt_prefill(m, lone[i], prompt, 3, NULL));
        OK(llmrt_prefill(m, manual[i], prompt, 3, NULL));
        memcpy(hist[i], prompt, sizeof prompt);
    }
    float *row = malloc(info.vocab_size * sizeof *row);
    REQUIRE(row != NULL, "out of memory");
    uint32_t toks[N] = {380, 380, 380}, next[N];
    for (int step = 0; step < STEPS; step++) {
        OK(llmrt_decode_sample_each(m, N, batch, toks, ps, next));
        for (int i = 0; i < N; i++) {
            uint32_t alone = UINT32_MAX, from_row = UINT32_MAX;
            OK(llmrt_decode_sample(m, 1, &lone[i], &toks[i], &sp[i], &alone));
            OK(llmrt_decode(m, 1, &manual[i], &toks[i], row));
            hist[i][nh] = toks[i];
            OK(llmrt_sample_logits(&sp[i], row, info.vocab_size, hist[i], nh + 1, nh + 1, &from_row));
            CHECK(next[i] == alone && next[i] == from_row,
                  "step %d cache %d: batched %u, alone %u, llmrt_sample_logits %u", step, i, next[i],
                  alone, from_row);
        }
        CHECK(next[0] != 3, "step %d: the banned token 3 was drawn", step);
        nh++;
        memcpy(toks, next, sizeof toks);
    }
    /* A logit bias past the vocabulary in the middle set: nothing changes. */
    const llmrt_logit_bias past = {info.vocab_size, 1.0f};
    llmrt_sampler_params bad = sp[2];
    bad.logit_bias = &past;
    bad.n_logit_bias = 1;
    const llmrt_sampler_params *bps[N] = {&sp[0], &bad, &sp[2]};
    uint32_t untouched[N] = {UINT32_MAX, UINT32_MAX, UINT32_MAX};
    EXPECT_STATUS_MSG(LLMRT_INVALID_ARGUMENT, llmrt_decode_sample_each(m, N, batch, toks, bps, untouched),
                      "params[1]: sampler logit_bias[0] names token");
    bad = sp[2];
    bad.frequency_penalty = NAN;
    EXPECT_STATUS_MSG(LLMRT_INVALID_ARGUMENT, llmrt_decode_sample_each(m, N, batch, toks, bps, untouched),
                      "params[1]: sampler frequency_penalty NaN");
    for (int i = 0; i < N; i++) {
        CHECK(cache_len(m, batch[i]) == 3 + STEPS, "cache %d moved to %u", i, cache_len(m, batch[i]));
        CHECK(untouched[i] == UINT32_MAX, "next_tokens written by a failed step");
    }
    free(row);
    llmrt_model_free(m);
}

/* A caller built against the header before the bias/penalty fields: struct_size 32,
 * garbage past it is never read. */
static void case_sample_old_struct_size(void) {
    llmrt_model *m = load_fixture_model();
    llmrt_sampler_params sp, old;
    llmrt_sampler_params_default(&sp);
    sp.temperature = 0.9f;
    sp.repetition_penalty = 1.2f;
    sp.seed = 3;
    memset(&old, 0xA5, sizeof old);
    llmrt_sampler_params_init(&old, 32);
    CHECK(old.struct_size == 32, "init(32) set struct_size %u", old.struct_size);
    CHECK(old.penalty_last_n == (int32_t)0xA5A5A5A5, "init(32) wrote past 32 bytes");
    old.temperature = 0.9f;
    old.repetition_penalty = 1.2f;
    old.seed = 3;
    llmrt_cache a = 0, b = 0;
    OK(llmrt_cache_reserve(m, 0, &a));
    OK(llmrt_cache_reserve(m, 0, &b));
    OK(llmrt_prefill(m, a, (const uint32_t[]){211, 15}, 2, NULL));
    OK(llmrt_prefill(m, b, (const uint32_t[]){211, 15}, 2, NULL));
    uint32_t ta = 197, tb = 197;
    const llmrt_sampler_params *po = &old;
    for (int i = 0; i < 12; i++) {
        OK(llmrt_decode_sample_each(m, 1, &a, &ta, &po, &ta));
        OK(llmrt_decode_sample(m, 1, &b, &tb, &sp, &tb));
        CHECK(ta == tb, "step %d: old-size struct sampled %u, full %u", i, ta, tb);
    }
    llmrt_model_free(m);
}

/* ---- dispatch ------------------------------------------------------------- */

static const test_case CASES[] = {
    {"tokenize_add_bos", case_tokenize_add_bos},
    {"buffer_protocol", case_buffer_protocol},
    {"tokenize_ex_parse_special", case_tokenize_ex_parse_special},
    {"round_trip_spm", case_round_trip_spm},
    {"round_trip_bpe", case_round_trip_bpe},
    {"sampler_defaults", case_sampler_defaults},
    {"sample_seeded", case_sample_seeded},
    {"sample_temperature_zero_is_greedy", case_sample_temperature_zero_is_greedy},
    {"sample_each_per_cache", case_sample_each_per_cache},
    {"sample_old_struct_size", case_sample_old_struct_size},
};

int main(int argc, char **argv) {
    return run_cases(CASES, sizeof CASES / sizeof CASES[0], argc, argv);
}

/* Every error of the C API contract (docs/API.md), each asserting the documented
 * status and a non-empty llmrt_last_error(). One program, one ctest per case:
 *     errors CASE
 * `errors --list` prints the case names (CMakeLists.txt keeps its own list). */
#include "harness.h" /* first: it sets the feature-test macros */

#include <stddef.h>
#include <pthread.h>

/* ---- helpers ------------------------------------------------------------- */

static const uint32_t SOME_TOKENS[8] = {1, 2, 3, 4, 5, 6, 7, 8};

/* A cache on `m` already holding `n` tokens. */
static llmrt_cache filled_cache(llmrt_model *m, uint32_t positions, size_t n) {
    llmrt_cache c = 0;
    OK(llmrt_cache_reserve(m, positions, &c));
    if (n > 0) OK(llmrt_prefill(m, c, SOME_TOKENS, n, NULL));
    return c;
}

#define LEN_IS(m, c, want)                                                    \
    CHECK(cache_len((m), (c)) == (want), "cache length %u, want %u",          \
          cache_len((m), (c)), (unsigned)(want))

/* ---- NULL for every pointer argument ------------------------------------- */

static void case_null_pointers(void) {
    char *path = fixture_path(MODEL_REL);
    llmrt_model *const SENTINEL_MODEL = (llmrt_model *)(uintptr_t)0x5EED;
    llmrt_model *out = SENTINEL_MODEL;
    EXPECT_STATUS(LLMRT_INVALID_ARGUMENT, llmrt_model_load(NULL, NULL, &out));
    CHECK(out == SENTINEL_MODEL, "failed load wrote *out_model");
    EXPECT_STATUS(LLMRT_INVALID_ARGUMENT, llmrt_model_load(path, NULL, NULL));

    /* void functions: NULL must not crash. */
    llmrt_model_options_default(NULL);
    llmrt_sampler_params_default(NULL);
    llmrt_model_free(NULL);

    llmrt_model *m = load_fixture_model();
    const llmrt_model_info info = model_info(m);
    llmrt_model_info inf;
    memset(&inf, 0, sizeof inf);
    inf.struct_size = sizeof inf;
    EXPECT_STATUS(LLMRT_INVALID_ARGUMENT, llmrt_model_get_info(NULL, &inf));
    EXPECT_STATUS(LLMRT_INVALID_ARGUMENT, llmrt_model_get_info(m, NULL));

    const llmrt_cache SENTINEL_CACHE = 0xC0FFEEull;
    llmrt_cache oc = SENTINEL_CACHE;
    EXPECT_STATUS(LLMRT_INVALID_ARGUMENT, llmrt_cache_reserve(NULL, 4, &oc));
    CHECK(oc == SENTINEL_CACHE, "failed reserve wrote *out_cache");
    EXPECT_STATUS(LLMRT_INVALID_ARGUMENT, llmrt_cache_reserve(m, 4, NULL));

    llmrt_cache c = filled_cache(m, 8, 2);
    uint32_t pos = 12345;
    EXPECT_STATUS(LLMRT_INVALID_ARGUMENT, llmrt_cache_release(NULL, c));
    EXPECT_STATUS(LLMRT_INVALID_ARGUMENT, llmrt_cache_length(NULL, c, &pos));
    CHECK(pos == 12345, "failed cache_length wrote *out_positions");
    EXPECT_STATUS(LLMRT_INVALID_ARGUMENT, llmrt_cache_length(m, c, NULL));
    EXPECT_STATUS(LLMRT_INVALID_ARGUMENT, llmrt_cache_truncate(NULL, c, 0));
    EXPECT_STATUS(LLMRT_INVALID_ARGUMENT, llmrt_cache_fork(NULL, c, &oc));
    CHECK(oc == SENTINEL_CACHE, "failed fork wrote *out_cache");
    EXPECT_STATUS(LLMRT_INVALID_ARGUMENT, llmrt_cache_fork(m, c, NULL));
    LEN_IS(m, c, 2);

    float *logits = alloc_floats(2 * (size_t)info.vocab_size);
    const uint32_t tok = 1;
    EXPECT_STATUS(LLMRT_INVALID_ARGUMENT, llmrt_prefill(NULL, c, &tok, 1, logits));
    EXPECT_STATUS(LLMRT_INVALID_ARGUMENT, llmrt_prefill(m, c, NULL, 1, logits));
    EXPECT_STATUS(LLMRT_INVALID_ARGUMENT, llmrt_prefill_all(NULL, c, &tok, 1, logits));
    EXPECT_STATUS(LLMRT_INVALID_ARGUMENT, llmrt_prefill_all(m, c, NULL, 1, logits));
    EXPECT_STATUS(LLMRT_INVALID_ARGUMENT, llmrt_prefill_all(m, c, &tok, 1, NULL));
    LEN_IS(m, c, 2);

    EXPECT_STATUS(LLMRT_INVALID_ARGUMENT, llmrt_decode(NULL, 1, &c, &tok, logits));
    EXPECT_STATUS(LLMRT_INVALID_ARGUMENT, llmrt_decode(m, 1, NULL, &tok, logits));
    EXPECT_STATUS(LLMRT_INVALID_ARGUMENT, llmrt_decode(m, 1, &c, NULL, logits));
    uint32_t next = 777;
    EXPECT_STATUS(LLMRT_INVALID_ARGUMENT, llmrt_decode_greedy(NULL, 1, &c, &tok, &next));
    EXPECT_STATUS(LLMRT_INVALID_ARGUMENT, llmrt_decode_greedy(m, 1, NULL, &tok, &next));
    EXPECT_STATUS(LLMRT_INVALID_ARGUMENT, llmrt_decode_greedy(m, 1, &c, NULL, &next));
    EXPECT_STATUS(LLMRT_INVALID_ARGUMENT, llmrt_decode_greedy(m, 1, &c, &tok, NULL));
    CHECK(next == 777, "failed decode_greedy wrote next_tokens");

    llmrt_sampler_params sp;
    llmrt_sampler_params_default(&sp);
    EXPECT_STATUS(LLMRT_INVALID_ARGUMENT, llmrt_decode_sample(NULL, 1, &c, &tok, &sp, &next));
    EXPECT_STATUS(LLMRT_INVALID_ARGUMENT, llmrt_decode_sample(m, 1, NULL, &tok, &sp, &next));
    EXPECT_STATUS(LLMRT_INVALID_ARGUMENT, llmrt_decode_sample(m, 1, &c, NULL, &sp, &next));
    EXPECT_STATUS(LLMRT_INVALID_ARGUMENT, llmrt_decode_sample(m, 1, &c, &tok, NULL, &next));
    EXPECT_STATUS(LLMRT_INVALID_ARGUMENT, llmrt_decode_sample(m, 1, &c, &tok, &sp, NULL));
    CHECK(next == 777, "failed decode_sample wrote next_tokens");
    LEN_IS(m, c, 2);

    uint32_t ids[8];
    size_t out_n = 999;
    char text[64];
    EXPECT_STATUS(LLMRT_INVALID_ARGUMENT, llmrt_tokenize(NULL, "hi", 2, true, ids, 8, &out_n));
    EXPECT_STATUS(LLMRT_INVALID_ARGUMENT, llmrt_tokenize(m, NULL, 2, true, ids, 8, &out_n));
    EXPECT_STATUS(LLMRT_INVALID_ARGUMENT, llmrt_tokenize(m, "hi", 2, true, NULL, 8, &out_n));
    EXPECT_STATUS(LLMRT_INVALID_ARGUMENT, llmrt_tokenize(m, "hi", 2, true, ids, 8, NULL));
    EXPECT_STATUS(LLMRT_INVALID_ARGUMENT, llmrt_detokenize(NULL, &tok, 1, text, 64, &out_n));
    EXPECT_STATUS(LLMRT_INVALID_ARGUMENT, llmrt_detokenize(m, NULL, 1, text, 64, &out_n));
    EXPECT_STATUS(LLMRT_INVALID_ARGUMENT, llmrt_detokenize(m, &tok, 1, NULL, 64, &out_n));
    EXPECT_STATUS(LLMRT_INVALID_ARGUMENT, llmrt_detokenize(m, &tok, 1, text, 64, NULL));
    EXPECT_STATUS(LLMRT_INVALID_ARGUMENT, llmrt_token_piece(NULL, tok, text, 64, &out_n));
    EXPECT_STATUS(LLMRT_INVALID_ARGUMENT, llmrt_token_piece(m, tok, NULL, 64, &out_n));
    EXPECT_STATUS(LLMRT_INVALID_ARGUMENT, llmrt_token_piece(m, tok, text, 64, NULL));
    CHECK(out_n == 999, "failed tokenize/detokenize/token_piece wrote the out length");

    OK(llmrt_cache_release(m, c));
    llmrt_model_free(m);
    free(logits);
    free(path);
}

/* ---- files that are not models ------------------------------------------- */

static void case_missing_file(void) {
    char *p = temp_path("does-not-exist.gguf");
    llmrt_model *m = NULL;
    EXPECT_STATUS_MSG(LLMRT_IO, llmrt_model_load(p, NULL, &m), p);
    CHECK(m == NULL, "failed load wrote *out_model");
    free(p);
}

static void case_directory(void) {
    /* A directory without config.json: not a Hugging Face model directory. docs/API.md
     * allows IO (not a regular file) or BAD_MODEL; either way the path is named. */
    char *d = temp_path("a-directory");
    REQUIRE(mkdir(d, 0700) == 0, "mkdir %s: %s", d, strerror(errno));
    llmrt_model *m = NULL;
    llmrt_status st = llmrt_model_load(d, NULL, &m);
    const char *msg = llmrt_last_error();
    CHECK(st == LLMRT_IO || st == LLMRT_BAD_MODEL, "directory -> %s, want LLMRT_IO or BAD_MODEL: %s",
          llmrt_status_name(st), msg);
    CHECK(msg != NULL && strstr(msg, d) != NULL, "directory error \"%s\" does not name %s",
          msg ? msg : "(NULL)", d);
    CHECK(m == NULL, "failed load wrote *out_model");
    free(d);
}

static void expect_bad_model_file(const char *name, const void *bytes, size_t len) {
    char *p = temp_path(name);
    write_file(p, bytes, len);
    llmrt_model *m = NULL;
    if (!EXPECT_STATUS_MSG(LLMRT_BAD_MODEL, llmrt_model_load(p, NULL, &m), p))
        fprintf(stderr, "  (file %s, %zu bytes)\n", name, len);
    if (m != NULL) {
        FAIL("failed load of %s wrote *out_model", name);
        llmrt_model_free(m);
    }
    unlink(p);
    free(p);
}

static void case_empty_file(void) { expect_bad_model_file("empty.gguf", "", 0); }

static void case_random_bytes(void) {
    unsigned char buf[4096];
    uint32_t s = 12345u;
    for (size_t i = 0; i < sizeof buf; i++) {
        s = s * 1664525u + 1013904223u;
        buf[i] = (unsigned char)(s >> 24);
    }
    expect_bad_model_file("random.gguf", buf, sizeof buf);
    /* The right magic, then garbage: the header parser must not trust the counts. */
    memcpy(buf, "GGUF\x03\0\0\0", 8); /* version 3, then random counts */
    expect_bad_model_file("random-with-magic.gguf", buf, sizeof buf);
}

/* Minimal GGUF walker: finds the end of the metadata, of the tensor table and
 * the start of the data section so truncation lands inside each of them. */
struct gguf_layout {
    size_t meta_start, meta_end, table_end, data_start;
};

static uint64_t rd_u64(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}
static uint32_t rd_u32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static size_t gguf_scalar_size(uint32_t type) {
    static const size_t sizes[13] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    REQUIRE(type < 13 && type != 8 && type != 9, "unexpected GGUF value type %u", type);
    return sizes[type];
}

static size_t gguf_skip_value(const unsigned char *b, size_t len, size_t off, uint32_t type) {
    if (type == 8) { /* string */
        REQUIRE(off + 8 <= len, "GGUF walk past end");
        return off + 8 + (size_t)rd_u64(b + off);
    }
    if (type == 9) { /* array: elem type, count, elems */
        REQUIRE(off + 12 <= len, "GGUF walk past end");
        uint32_t et = rd_u32(b + off);
        uint64_t cnt = rd_u64(b + off + 4);
        off += 12;
        for (uint64_t i = 0; i < cnt; i++) {
            off = gguf_skip_value(b, len, off, et);
            if (et != 8 && et != 9) { /* fixed size: skip the rest at once */
                off += (size_t)(cnt - 1 - i) * gguf_scalar_size(et);
                break;
            }
        }
        return off;
    }
    return off + gguf_scalar_size(type);
}

static struct gguf_layout gguf_walk(const unsigned char *b, size_t len) {
    struct gguf_layout l;
    REQUIRE(len >= 24 && memcmp(b, "GGUF", 4) == 0, "fixture is not GGUF");
    uint64_t n_tensors = rd_u64(b + 8), n_kv = rd_u64(b + 16);
    size_t off = 24;
    l.meta_start = off;
    uint64_t alignment = 32;
    for (uint64_t i = 0; i < n_kv; i++) {
        REQUIRE(off + 8 <= len, "GGUF walk past end");
        size_t klen = (size_t)rd_u64(b + off);
        const char *key = (const char *)b + off + 8;
        off += 8 + klen;
        uint32_t type = rd_u32(b + off);
        off += 4;
        if (klen == 17 && memcmp(key, "general.alignment", 17) == 0 && type == 4)
            alignment = rd_u32(b + off);
        off = gguf_skip_value(b, len, off, type);
        REQUIRE(off <= len, "GGUF walk past end");
    }
    l.meta_end = off;
    for (uint64_t i = 0; i < n_tensors; i++) {
        size_t nlen = (size_t)rd_u64(b + off);
        off += 8 + nlen;
        uint32_t nd = rd_u32(b + off);
        off += 4 + 8 * (size_t)nd + 4 + 8;
        REQUIRE(off <= len, "GGUF walk past end");
    }
    l.table_end = off;
    l.data_start = (size_t)((off + alignment - 1) / alignment * alignment);
    REQUIRE(l.data_start < len, "GGUF data start %zu beyond file size %zu", l.data_start, len);
    return l;
}

static void case_truncated_gguf(void) {
    char *path = fixture_path(MODEL_REL);
    size_t len;
    unsigned char *b = read_file(path, &len);
    struct gguf_layout l = gguf_walk(b, len);
    size_t cuts[32], nc = 0;
    for (size_t o = 0; o <= 64; o += 7) cuts[nc++] = o;
    cuts[nc++] = l.meta_start + (l.meta_end - l.meta_start) / 2; /* mid metadata */
    cuts[nc++] = l.meta_end;                                     /* no tensor table */
    cuts[nc++] = l.meta_end + (l.table_end - l.meta_end) / 2;    /* mid tensor table */
    cuts[nc++] = l.table_end;                                    /* no data */
    cuts[nc++] = l.data_start + 1;
    cuts[nc++] = l.data_start + (len - l.data_start) / 2; /* mid data */
    cuts[nc++] = len - 1;
    for (size_t i = 0; i < nc; i++) {
        char name[64];
        snprintf(name, sizeof name, "truncated-at-%zu.gguf", cuts[i]);
        expect_bad_model_file(name, b, cuts[i]);
    }
    free(b);
    free(path);
}

/* ---- arguments out of range ---------------------------------------------- */

static void case_token_out_of_range(void) {
    llmrt_model *m = load_fixture_model();
    const llmrt_model_info info = model_info(m);
    const uint32_t V = info.vocab_size;
    llmrt_cache c = filled_cache(m, 16, 2);
    float *logits = alloc_floats(4 * (size_t)V);
    uint32_t bad[3] = {1, V, 2};
    uint32_t huge = UINT32_MAX;
    uint32_t next = 777;
    EXPECT_STATUS_MSG(LLMRT_INVALID_ARGUMENT, llmrt_prefill(m, c, bad, 3, logits), "token");
    EXPECT_STATUS(LLMRT_INVALID_ARGUMENT, llmrt_prefill_all(m, c, bad, 3, logits));
    EXPECT_STATUS(LLMRT_INVALID_ARGUMENT, llmrt_decode(m, 1, &c, &bad[1], logits));
    EXPECT_STATUS(LLMRT_INVALID_ARGUMENT, llmrt_decode(m, 1, &c, &huge, logits));
    EXPECT_STATUS(LLMRT_INVALID_ARGUMENT, llmrt_decode_greedy(m, 1, &c, &bad[1], &next));
    llmrt_sampler_params sp;
    llmrt_sampler_params_default(&sp);
    EXPECT_STATUS(LLMRT_INVALID_ARGUMENT, llmrt_decode_sample(m, 1, &c, &bad[1], &sp, &next));
    CHECK(next == 777, "failed step wrote next_tokens");
    LEN_IS(m, c, 2);
    /* Batch: one bad token means no cache advances. */
    llmrt_cache c2 = filled_cache(m, 16, 2);
    llmrt_cache pair[2] = {c, c2};
    uint32_t toks[2] = {3, V};
    EXPECT_STATUS(LLMRT_INVALID_ARGUMENT, llmrt_decode(m, 2, pair, toks, logits));
    LEN_IS(m, c, 2);
    LEN_IS(m, c2, 2);
    llmrt_model_free(m);
    free(logits);
}

static void case_context_full(void) {
    llmrt_model *m = load_fixture_model();
    llmrt_cache c = filled_cache(m, 4, 0);
    EXPECT_STATUS(LLMRT_CONTEXT_FULL, llmrt_prefill(m, c, SOME_TOKENS, 5, NULL));
    LEN_IS(m, c, 0);
    OK(llmrt_prefill(m, c, SOME_TOKENS, 3, NULL));
    EXPECT_STATUS(LLMRT_CONTEXT_FULL, llmrt_prefill(m, c, SOME_TOKENS, 2, NULL));
    LEN_IS(m, c, 3);
    const uint32_t t = 5;
    OK(llmrt_decode(m, 1, &c, &t, NULL));
    LEN_IS(m, c, 4);
    uint32_t next = 777;
    EXPECT_STATUS(LLMRT_CONTEXT_FULL, llmrt_decode(m, 1, &c, &t, NULL));
    EXPECT_STATUS(LLMRT_CONTEXT_FULL, llmrt_decode_greedy(m, 1, &c, &t, &next));
    CHECK(next == 777, "failed decode_greedy wrote next_tokens");
    LEN_IS(m, c, 4);
    /* A full cache in a batch stops the whole batch. */
    llmrt_cache roomy = filled_cache(m, 16, 2);
    llmrt_cache pair[2] = {roomy, c};
    uint32_t toks[2] = {1, 2};
    EXPECT_STATUS(LLMRT_CONTEXT_FULL, llmrt_decode(m, 2, pair, toks, NULL));
    LEN_IS(m, roomy, 2);
    LEN_IS(m, c, 4);
    /* Truncating makes room again. */
    OK(llmrt_cache_truncate(m, c, 2));
    OK(llmrt_prefill(m, c, SOME_TOKENS, 2, NULL));
    LEN_IS(m, c, 4);
    llmrt_model_free(m);
}

static void case_reserve_over_context(void) {
    llmrt_model *m = load_fixture_model();
    const llmrt_model_info info = model_info(m);
    llmrt_cache c = 0xC0FFEEull;
    EXPECT_STATUS(LLMRT_CONTEXT_FULL, llmrt_cache_reserve(m, info.context_length + 1, &c));
    EXPECT_STATUS(LLMRT_CONTEXT_FULL, llmrt_cache_reserve(m, UINT32_MAX, &c));
    CHECK(c == 0xC0FFEEull, "failed reserve wrote *out_cache");
    llmrt_model_free(m);

    /* max_context caps the positions per cache. */
    char *path = fixture_path(MODEL_REL);
    m = load_model_opts(path, 8);
    const llmrt_model_info capped = model_info(m);
    CHECK(capped.context_length == 8, "max_context 8 gives context_length %u",
          capped.context_length);
    EXPECT_STATUS(LLMRT_CONTEXT_FULL, llmrt_cache_reserve(m, 9, &c));
    OK(llmrt_cache_reserve(m, 0, &c));
    OK(llmrt_prefill(m, c, SOME_TOKENS, 8, NULL));
    const uint32_t t = 1;
    EXPECT_STATUS(LLMRT_CONTEXT_FULL, llmrt_decode(m, 1, &c, &t, NULL));
    llmrt_model_free(m);
    free(path);
}

static void case_zero_length(void) {
    llmrt_model *m = load_fixture_model();
    const llmrt_model_info info = model_info(m);
    llmrt_cache c = filled_cache(m, 16, 2);
    float *logits = alloc_floats(info.vocab_size);
    uint32_t next = 0;
    EXPECT_STATUS(LLMRT_INVALID_ARGUMENT, llmrt_prefill(m, c, SOME_TOKENS, 0, logits));
    EXPECT_STATUS(LLMRT_INVALID_ARGUMENT, llmrt_prefill_all(m, c, SOME_TOKENS, 0, logits));
    EXPECT_STATUS(LLMRT_INVALID_ARGUMENT, llmrt_decode(m, 0, &c, SOME_TOKENS, logits));
    EXPECT_STATUS(LLMRT_INVALID_ARGUMENT, llmrt_decode_greedy(m, 0, &c, SOME_TOKENS, &next));
    llmrt_sampler_params sp;
    llmrt_sampler_params_default(&sp);
    EXPECT_STATUS(LLMRT_INVALID_ARGUMENT, llmrt_decode_sample(m, 0, &c, SOME_TOKENS, &sp, &next));
    LEN_IS(m, c, 2);
    llmrt_model_free(m);
    free(logits);
}

static void case_duplicate_cache(void) {
    llmrt_model *m = load_fixture_model();
    llmrt_cache c = filled_cache(m, 16, 2);
    llmrt_cache other = filled_cache(m, 16, 2);
    llmrt_cache twice[3] = {c, other, c};
    uint32_t toks[3] = {1, 2, 3}, next[3] = {7, 7, 7};
    EXPECT_STATUS_MSG(LLMRT_INVALID_ARGUMENT, llmrt_decode(m, 2, (llmrt_cache[]){c, c}, toks, NULL),
                      "cache");
    EXPECT_STATUS(LLMRT_INVALID_ARGUMENT, llmrt_decode(m, 3, twice, toks, NULL));
    EXPECT_STATUS(LLMRT_INVALID_ARGUMENT, llmrt_decode_greedy(m, 3, twice, toks, next));
    LEN_IS(m, c, 2);
    LEN_IS(m, other, 2);
    llmrt_model_free(m);
}

/* ---- caches that are not live --------------------------------------------- */

static void expect_unknown_everywhere(llmrt_model *m, llmrt_cache bad, const char *what) {
    uint32_t pos = 4242;
    llmrt_cache out = 0xC0FFEEull;
    const uint32_t t = 1;
    uint32_t next = 777;
    fprintf(stderr, "-- %s (id %llu)\n", what, (unsigned long long)bad);
    EXPECT_STATUS(LLMRT_UNKNOWN_CACHE, llmrt_cache_length(m, bad, &pos));
    EXPECT_STATUS(LLMRT_UNKNOWN_CACHE, llmrt_cache_truncate(m, bad, 0));
    EXPECT_STATUS(LLMRT_UNKNOWN_CACHE, llmrt_cache_fork(m, bad, &out));
    EXPECT_STATUS(LLMRT_UNKNOWN_CACHE, llmrt_prefill(m, bad, &t, 1, NULL));
    EXPECT_STATUS(LLMRT_UNKNOWN_CACHE, llmrt_decode(m, 1, &bad, &t, NULL));
    EXPECT_STATUS(LLMRT_UNKNOWN_CACHE, llmrt_decode_greedy(m, 1, &bad, &t, &next));
    EXPECT_STATUS(LLMRT_UNKNOWN_CACHE, llmrt_cache_release(m, bad));
    CHECK(pos == 4242 && out == 0xC0FFEEull && next == 777, "%s: a failed call wrote an out pointer",
          what);
}

static void case_unknown_cache(void) {
    llmrt_model *m = load_fixture_model();
    llmrt_cache live = filled_cache(m, 16, 2);
    llmrt_cache gone = filled_cache(m, 16, 2);
    OK(llmrt_cache_release(m, gone));
    expect_unknown_everywhere(m, gone, "released cache");
    expect_unknown_everywhere(m, 0, "cache 0");
    expect_unknown_everywhere(m, live + gone + 1000, "never-issued cache");
    expect_unknown_everywhere(m, UINT64_MAX, "cache UINT64_MAX");
    /* A batch with one dead cache advances none. */
    llmrt_cache pair[2] = {live, gone};
    uint32_t toks[2] = {1, 2};
    EXPECT_STATUS(LLMRT_UNKNOWN_CACHE, llmrt_decode(m, 2, pair, toks, NULL));
    LEN_IS(m, live, 2);
    /* Ids are not reused: a new reservation never brings `gone` back. */
    llmrt_cache fresh = filled_cache(m, 16, 0);
    CHECK(fresh != gone && fresh != 0, "reserve re-issued id %llu", (unsigned long long)fresh);
    llmrt_model_free(m);
}

static void case_double_release(void) {
    llmrt_model *m = load_fixture_model();
    llmrt_cache c = filled_cache(m, 16, 2);
    llmrt_cache f = 0;
    OK(llmrt_cache_fork(m, c, &f));
    OK(llmrt_cache_release(m, c));
    EXPECT_STATUS(LLMRT_UNKNOWN_CACHE, llmrt_cache_release(m, c));
    /* The fork outlives its released source and still steps. */
    LEN_IS(m, f, 2);
    const uint32_t t = 3;
    OK(llmrt_decode(m, 1, &f, &t, NULL));
    OK(llmrt_cache_release(m, f));
    EXPECT_STATUS(LLMRT_UNKNOWN_CACHE, llmrt_cache_release(m, f));
    llmrt_model_free(m);
}

static void case_other_model_cache(void) {
    llmrt_model *a = load_fixture_model();
    llmrt_model *b = load_fixture_model();
    llmrt_cache ca = filled_cache(a, 16, 2);
    expect_unknown_everywhere(b, ca, "a cache of another model");
    llmrt_cache cb = filled_cache(b, 16, 1);
    if (cb != ca) expect_unknown_everywhere(b, ca, "a cache of another model, both busy");
    LEN_IS(a, ca, 2);
    LEN_IS(b, cb, 1);
    llmrt_model_free(b);
    LEN_IS(a, ca, 2); /* freeing b released only b's caches */
    llmrt_model_free(a);
}

/* ---- static strings ------------------------------------------------------- */

static void case_status_names(void) {
    static const char *const names[] = {
        "LLMRT_OK",          "LLMRT_INVALID_ARGUMENT", "LLMRT_IO",
        "LLMRT_BAD_MODEL",   "LLMRT_UNSUPPORTED",      "LLMRT_OUT_OF_MEMORY",
        "LLMRT_CONTEXT_FULL", "LLMRT_UNKNOWN_CACHE",   "LLMRT_DEVICE",
        "LLMRT_INTERNAL",    "LLMRT_BUFFER_TOO_SMALL",
    };
    static const llmrt_status codes[] = {
        LLMRT_OK,           LLMRT_INVALID_ARGUMENT, LLMRT_IO,       LLMRT_BAD_MODEL,
        LLMRT_UNSUPPORTED,  LLMRT_OUT_OF_MEMORY,    LLMRT_CONTEXT_FULL, LLMRT_UNKNOWN_CACHE,
        LLMRT_DEVICE,       LLMRT_INTERNAL,         LLMRT_BUFFER_TOO_SMALL,
    };
    for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++) {
        CHECK((int)codes[i] == (int)i, "%s has value %d, docs/API.md says %zu", names[i], (int)codes[i], i);
        const char *got = llmrt_status_name(codes[i]);
        CHECK(got != NULL && strcmp(got, names[i]) == 0, "llmrt_status_name(%zu) = \"%s\", want \"%s\"",
              i, got ? got : "(NULL)", names[i]);
        CHECK(got == llmrt_status_name(codes[i]), "status name for %zu is not a static string", i);
    }
}

static void case_version(void) {
    const char *v = llmrt_version();
    REQUIRE(v != NULL, "llmrt_version() returned NULL");
    unsigned a, b, c;
    int used = -1;
    CHECK(sscanf(v, "%u.%u.%u%n", &a, &b, &c, &used) == 3 && used == (int)strlen(v) &&
              isdigit((unsigned char)v[0]),
          "llmrt_version() = \"%s\", want MAJOR.MINOR.PATCH", v);
    char want[64];
    snprintf(want, sizeof want, "%d.%d.%d", LLMRT_VERSION_MAJOR, LLMRT_VERSION_MINOR,
             LLMRT_VERSION_PATCH);
    CHECK(strcmp(v, want) == 0, "llmrt_version() = \"%s\", header says %s", v, want);
}

static void case_model_free_null(void) {
    llmrt_model_free(NULL);
    llmrt_model_free(NULL);
}

/* ---- llmrt_last_error is per thread --------------------------------------- */

struct thread_result {
    char before[256]; /* last_error on a thread with no failure */
    int status;
    char after[256]; /* last_error after this thread's own failure */
};

static void *thread_body(void *arg) {
    struct thread_result *r = arg;
    const char *e = llmrt_last_error();
    snprintf(r->before, sizeof r->before, "%s", e ? e : "(NULL)");
    llmrt_model *m = NULL;
    r->status = (int)llmrt_model_load(NULL, NULL, &m);
    e = llmrt_last_error();
    snprintf(r->after, sizeof r->after, "%s", e ? e : "(NULL)");
    return NULL;
}

static void case_last_error_per_thread(void) {
    const char *e = llmrt_last_error();
    CHECK(e != NULL && e[0] == '\0', "last_error before any call = \"%s\", want \"\"",
          e ? e : "(NULL)");
    char *p = temp_path("missing.gguf");
    llmrt_model *m = NULL;
    EXPECT_STATUS(LLMRT_IO, llmrt_model_load(p, NULL, &m));
    char mine[512];
    snprintf(mine, sizeof mine, "%s", llmrt_last_error());

    struct thread_result r;
    memset(&r, 0, sizeof r);
    pthread_t th;
    REQUIRE(pthread_create(&th, NULL, thread_body, &r) == 0, "pthread_create");
    REQUIRE(pthread_join(th, NULL) == 0, "pthread_join");
    CHECK(r.before[0] == '\0', "fresh thread sees last_error \"%s\", want \"\"", r.before);
    CHECK(r.status == LLMRT_INVALID_ARGUMENT && r.after[0] != '\0',
          "thread's own failure: status %d, message \"%s\"", r.status, r.after);
    /* The other thread's failure did not overwrite this thread's message. */
    CHECK(strcmp(llmrt_last_error(), mine) == 0, "main thread message changed to \"%s\" (was \"%s\")",
          llmrt_last_error(), mine);
    free(p);
}

/* ---- a failed step leaves the cache unchanged ------------------------------ */

static void case_failed_step_unchanged(void) {
    llmrt_model *m = load_fixture_model();
    const llmrt_model_info info = model_info(m);
    const size_t V = info.vocab_size;
    /* Twin caches with the same 5 tokens and room for 6. */
    llmrt_cache hit = filled_cache(m, 6, 5);
    llmrt_cache twin = filled_cache(m, 6, 5);
    llmrt_cache dead = filled_cache(m, 6, 0);
    OK(llmrt_cache_release(m, dead));
    float *logits = alloc_floats(4 * V);
    for (size_t i = 0; i < 4 * V; i++) logits[i] = 1234.5f;
    const uint32_t badtok[2] = {2, (uint32_t)V};
    uint32_t next[2] = {0, 0};

    EXPECT_STATUS(LLMRT_INVALID_ARGUMENT, llmrt_prefill(m, hit, badtok, 2, logits));
    EXPECT_STATUS(LLMRT_CONTEXT_FULL, llmrt_prefill(m, hit, SOME_TOKENS, 2, logits));
    EXPECT_STATUS(LLMRT_CONTEXT_FULL, llmrt_prefill_all(m, hit, SOME_TOKENS, 2, logits));
    EXPECT_STATUS(LLMRT_INVALID_ARGUMENT,
                  llmrt_decode(m, 2, (llmrt_cache[]){hit, hit}, SOME_TOKENS, logits));
    EXPECT_STATUS(LLMRT_UNKNOWN_CACHE,
                  llmrt_decode(m, 2, (llmrt_cache[]){hit, dead}, SOME_TOKENS, logits));
    EXPECT_STATUS(LLMRT_INVALID_ARGUMENT,
                  llmrt_decode_greedy(m, 2, (llmrt_cache[]){hit, twin}, badtok, next));
    EXPECT_STATUS(LLMRT_UNKNOWN_CACHE, llmrt_cache_truncate(m, dead, 0));
    /* Truncating to more than the length is not documented: either no-op or an error. */
    llmrt_status st = llmrt_cache_truncate(m, hit, 6);
    CHECK(st == LLMRT_OK || llmrt_last_error()[0] != '\0', "truncate past length: %s, no message",
          llmrt_status_name(st));
    LEN_IS(m, hit, 5);
    LEN_IS(m, twin, 5);

    /* Both continue with the same token and must agree. */
    const uint32_t t = 9 % (uint32_t)V;
    float *a = alloc_floats(V), *b = alloc_floats(V);
    OK(llmrt_decode(m, 1, &hit, &t, a));
    OK(llmrt_decode(m, 1, &twin, &t, b));
    double e = rel_l2(a, b, V);
    CHECK(e < 1e-6, "after failed steps the cache gives other logits than its twin: rel L2 %.3g", e);
    LEN_IS(m, hit, 6);
    llmrt_model_free(m);
    free(b);
    free(a);
    free(logits);
}

/* ---- text: invalid input ------------------------------------------------- */

static void case_text_invalid(void) {
    llmrt_model *m = load_fixture_model();
    const llmrt_model_info info = model_info(m);
    uint32_t ids[16];
    for (size_t i = 0; i < 16; i++) ids[i] = 4242;
    char text[64];
    memset(text, '#', sizeof text);
    size_t n = 999;
    /* Not UTF-8: a stray 0xFF, a truncated sequence, an overlong encoding, a
     * surrogate. The message names the byte offset of the first bad byte. */
    static const struct {
        const char *bytes;
        size_t len;
        const char *offset;
    } bad[] = {
        {"a\xff" "b", 3, "offset 1"},
        {"ab\xe4\xbd", 4, "offset 2"},
        {"\xc0\xaf", 2, "offset 0"},
        {"x\xed\xa0\x80", 4, "offset 1"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        EXPECT_STATUS_MSG(LLMRT_INVALID_ARGUMENT,
                          llmrt_tokenize(m, bad[i].bytes, bad[i].len, true, ids, 16, &n),
                          bad[i].offset);
        EXPECT_STATUS(LLMRT_INVALID_ARGUMENT,
                      llmrt_tokenize(m, bad[i].bytes, bad[i].len, false, NULL, 0, &n));
    }
    /* Ids out of range: detokenize and token_piece. */
    const uint32_t over[3] = {1, info.vocab_size, 2};
    const uint32_t huge = UINT32_MAX;
    char vocab[32]; /* the message names the vocabulary size */
    snprintf(vocab, sizeof vocab, "%u", info.vocab_size);
    EXPECT_STATUS_MSG(LLMRT_INVALID_ARGUMENT, llmrt_detokenize(m, over, 3, text, sizeof text, &n),
                      vocab);
    EXPECT_STATUS(LLMRT_INVALID_ARGUMENT, llmrt_detokenize(m, &over[1], 1, NULL, 0, &n));
    EXPECT_STATUS(LLMRT_INVALID_ARGUMENT, llmrt_detokenize(m, &huge, 1, text, sizeof text, &n));
    EXPECT_STATUS(LLMRT_INVALID_ARGUMENT,
                  llmrt_token_piece(m, info.vocab_size, text, sizeof text, &n));
    EXPECT_STATUS(LLMRT_INVALID_ARGUMENT, llmrt_token_piece(m, UINT32_MAX, NULL, 0, &n));
    /* A NULL buffer is only allowed with capacity 0. */
    EXPECT_STATUS(LLMRT_INVALID_ARGUMENT, llmrt_tokenize(m, "hi", 2, true, NULL, 4, &n));
    EXPECT_STATUS(LLMRT_INVALID_ARGUMENT, llmrt_detokenize(m, over, 1, NULL, 4, &n));
    EXPECT_STATUS(LLMRT_INVALID_ARGUMENT, llmrt_token_piece(m, 300, NULL, 4, &n));
    /* NULL text with a nonzero length. */
    EXPECT_STATUS(LLMRT_INVALID_ARGUMENT, llmrt_tokenize(m, NULL, 3, true, ids, 16, &n));
    CHECK(n == 999, "a failed text call wrote the out length (%zu)", n);
    for (size_t i = 0; i < 16; i++) CHECK(ids[i] == 4242, "a failed tokenize wrote ids[%zu]", i);
    for (size_t i = 0; i < sizeof text; i++)
        CHECK(text[i] == '#', "a failed detokenize/token_piece wrote text[%zu]", i);
    llmrt_model_free(m);
}

/* ---- sampling: invalid parameters ----------------------------------------- */

static void case_sampler_invalid_params(void) {
    llmrt_model *m = load_fixture_model();
    llmrt_cache c = filled_cache(m, 16, 3);
    llmrt_cache c2 = filled_cache(m, 16, 2);
    const uint32_t tok = 4;
    const uint32_t toks[2] = {4, 5};
    const llmrt_cache pair[2] = {c, c2};
    static const struct {
        const char *what;
        const char *field;
        float temperature, top_p, min_p, repetition_penalty;
    } bad[] = {
        {"negative temperature", "temperature", -0.5f, 0.95f, 0.05f, 1.0f},
        {"NaN temperature", "temperature", NAN, 0.95f, 0.05f, 1.0f},
        {"infinite temperature", "temperature", INFINITY, 0.95f, 0.05f, 1.0f},
        {"top_p 0", "top_p", 0.8f, 0.0f, 0.05f, 1.0f},
        {"top_p > 1", "top_p", 0.8f, 1.5f, 0.05f, 1.0f},
        {"negative top_p", "top_p", 0.8f, -0.1f, 0.05f, 1.0f},
        {"min_p 1", "min_p", 0.8f, 0.95f, 1.0f, 1.0f},
        {"min_p > 1", "min_p", 0.8f, 0.95f, 2.0f, 1.0f},
        {"negative min_p", "min_p", 0.8f, 0.95f, -0.1f, 1.0f},
        {"repetition_penalty 0", "repetition_penalty", 0.8f, 0.95f, 0.05f, 0.0f},
        {"negative repetition_penalty", "repetition_penalty", 0.8f, 0.95f, 0.05f, -1.0f},
        {"NaN repetition_penalty", "repetition_penalty", 0.8f, 0.95f, 0.05f, NAN},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        llmrt_sampler_params sp;
        llmrt_sampler_params_default(&sp);
        sp.temperature = bad[i].temperature;
        sp.top_p = bad[i].top_p;
        sp.min_p = bad[i].min_p;
        sp.repetition_penalty = bad[i].repetition_penalty;
        uint32_t next[2] = {777, 777};
        fprintf(stderr, "-- %s\n", bad[i].what);
        EXPECT_STATUS_MSG(LLMRT_INVALID_ARGUMENT, llmrt_decode_sample(m, 1, &c, &tok, &sp, next),
                          bad[i].field);
        EXPECT_STATUS(LLMRT_INVALID_ARGUMENT, llmrt_decode_sample(m, 2, pair, toks, &sp, next));
        CHECK(next[0] == 777 && next[1] == 777, "%s: a failed decode_sample wrote next_tokens",
              bad[i].what);
        LEN_IS(m, c, 3);
        LEN_IS(m, c2, 2);
    }
    /* struct_size 0 (a struct never filled by llmrt_sampler_params_default). */
    llmrt_sampler_params sp;
    llmrt_sampler_params_default(&sp);
    sp.struct_size = 0;
    uint32_t next = 777;
    EXPECT_STATUS_MSG(LLMRT_INVALID_ARGUMENT, llmrt_decode_sample(m, 1, &c, &tok, &sp, &next),
                      "struct_size");
    CHECK(next == 777, "struct_size 0: a failed decode_sample wrote next_tokens");
    LEN_IS(m, c, 3);
    /* The defaults themselves are valid, and the failures left the cache usable. */
    llmrt_sampler_params_default(&sp);
    OK(llmrt_decode_sample(m, 1, &c, &tok, &sp, &next));
    CHECK(next < model_info(m).vocab_size, "sampled token %u >= vocab", next);
    LEN_IS(m, c, 4);
    llmrt_model_free(m);
}

/* ---- llmrt_model_info and struct_size ------------------------------------ */

/* The first llmrt_model_info: struct_size, then everything up to device_name (before
 * kv_pool_bytes, scratch_bytes, device_free_bytes, device_total_bytes). */
typedef struct {
    uint32_t struct_size;
    uint32_t vocab_size, context_length, n_layers, n_heads, n_kv_heads, head_dim, hidden_size;
    uint32_t bos_token, eos_token;
    llmrt_backend backend;
    uint64_t weight_bytes, kv_bytes_per_position;
    char architecture[32];
    char device_name[64];
} info_v1;

static void case_model_info_struct_size(void) {
    llmrt_model *m = load_fixture_model();
    const llmrt_model_info full = model_info(m);
    CHECK(full.struct_size == sizeof(llmrt_model_info), "struct_size after a full call: %u", full.struct_size);
    CHECK(offsetof(llmrt_model_info, kv_pool_bytes) == sizeof(info_v1), "v1 layout is %zu bytes",
          sizeof(info_v1));
    /* An older caller: the v1 struct followed by guard bytes. */
    struct {
        info_v1 info;
        unsigned char guard[64];
    } old;
    memset(&old, 0xAA, sizeof old);
    old.info.struct_size = sizeof old.info;
    OK(llmrt_model_get_info(m, (llmrt_model_info *)&old));
    for (size_t i = 0; i < sizeof old.guard; i++)
        CHECK(old.guard[i] == 0xAA, "guard byte %zu past the old struct was written", i);
    CHECK(old.info.struct_size == sizeof old.info, "struct_size %u", old.info.struct_size);
    CHECK(old.info.vocab_size == full.vocab_size && old.info.context_length == full.context_length &&
              old.info.n_layers == full.n_layers && old.info.eos_token == full.eos_token &&
              old.info.weight_bytes == full.weight_bytes &&
              old.info.kv_bytes_per_position == full.kv_bytes_per_position,
          "old struct's fields differ from the full call's");
    CHECK(strcmp(old.info.architecture, full.architecture) == 0 &&
              strcmp(old.info.device_name, full.device_name) == 0,
          "old struct's strings differ");
    /* Too small (unset or below the first version): refused, nothing written. */
    memset(&old, 0xAA, sizeof old);
    old.info.struct_size = sizeof old.info - 8;
    EXPECT_STATUS(LLMRT_INVALID_ARGUMENT, llmrt_model_get_info(m, (llmrt_model_info *)&old));
    CHECK(strstr(llmrt_last_error(), "struct_size") != NULL, "message: %s", llmrt_last_error());
    CHECK(old.info.vocab_size == 0xAAAAAAAAu, "a refused call wrote the struct");
    /* A newer caller's larger struct: ours is written, struct_size says how much. */
    struct {
        llmrt_model_info info;
        unsigned char more[32];
    } big;
    memset(&big, 0xAA, sizeof big);
    big.info.struct_size = sizeof big;
    OK(llmrt_model_get_info(m, (llmrt_model_info *)&big));
    CHECK(big.info.struct_size == sizeof(llmrt_model_info), "struct_size %u", big.info.struct_size);
    CHECK(big.info.device_total_bytes == full.device_total_bytes, "last field");
    for (size_t i = 0; i < sizeof big.more; i++) CHECK(big.more[i] == 0xAA, "byte %zu past ours written", i);
    llmrt_model_free(m);
}

/* ---- dispatch ------------------------------------------------------------- */

static const test_case CASES[] = {
    {"null_pointers", case_null_pointers},
    {"missing_file", case_missing_file},
    {"directory", case_directory},
    {"empty_file", case_empty_file},
    {"random_bytes", case_random_bytes},
    {"truncated_gguf", case_truncated_gguf},
    {"token_out_of_range", case_token_out_of_range},
    {"context_full", case_context_full},
    {"reserve_over_context", case_reserve_over_context},
    {"zero_length", case_zero_length},
    {"duplicate_cache", case_duplicate_cache},
    {"unknown_cache", case_unknown_cache},
    {"double_release", case_double_release},
    {"other_model_cache", case_other_model_cache},
    {"status_names", case_status_names},
    {"version", case_version},
    {"model_free_null", case_model_free_null},
    {"last_error_per_thread", case_last_error_per_thread},
    {"failed_step_unchanged", case_failed_step_unchanged},
    {"text_invalid", case_text_invalid},
    {"sampler_invalid_params", case_sampler_invalid_params},
    {"model_info_struct_size", case_model_info_struct_size},
};

int main(int argc, char **argv) {
    return run_cases(CASES, sizeof CASES / sizeof CASES[0], argc, argv);
}

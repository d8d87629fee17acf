/* Saved cache states through the C API (llmrt_cache_save, llmrt_cache_load): the
 * size query, a round trip whose next logits equal the saved cache's bit for bit,
 * a state written to a file and loaded into a fresh load of the model, and the
 * refusals (another model's state, truncated, flipped bit, NULLs, positions below
 * the length), each naming the offset, no cache created. One program, one ctest
 * per case:
 *     state CASE
 * `state --list` prints the case names. */
#include "harness.h" /* first: it sets the feature-test macros */

#define OTHER_REL "llama3_rope/llama3_rope.f32.gguf"

static const uint32_t PROMPT[21] = {1, 45, 96, 17, 211, 15, 197, 380, 42, 7, 99, 300, 12, 64, 128, 255, 256, 3, 77, 101, 5};

/* The state of cache c through the size query: NULL/0 first, then the exact size. */
static unsigned char *save_all(llmrt_model *m, llmrt_cache c, size_t *out_len) {
    size_t need = 0;
    llmrt_status st = llmrt_cache_save(m, c, NULL, 0, &need);
    REQUIRE(st == LLMRT_BUFFER_TOO_SMALL, "size query: %s: %s", llmrt_status_name(st), llmrt_last_error());
    unsigned char *buf = malloc(need);
    REQUIRE(buf != NULL, "out of memory");
    size_t got = 0;
    /* One byte short: the size again, nothing written. */
    memset(buf, 0xAB, need);
    CHECK(llmrt_cache_save(m, c, buf, need - 1, &got) == LLMRT_BUFFER_TOO_SMALL && got == need,
          "one byte short: got %zu of %zu", got, need);
    CHECK(buf[0] == 0xAB && buf[need - 2] == 0xAB, "a too-small save wrote into the buffer");
    OK(llmrt_cache_save(m, c, buf, need, &got));
    REQUIRE(got == need, "save wrote %zu bytes, the size query said %zu", got, need);
    *out_len = need;
    return buf;
}

static float *decode_row(llmrt_model *m, llmrt_cache c, uint32_t tok, size_t vocab) {
    float *row = malloc(vocab * sizeof *row);
    REQUIRE(row != NULL, "out of memory");
    OK(llmrt_decode(m, 1, &c, &tok, row));
    return row;
}

static void case_round_trip(void) {
    llmrt_model *m = load_fixture_model();
    llmrt_model_info info = model_info(m);
    llmrt_cache a = 0, b = 0;
    OK(llmrt_cache_reserve(m, 64, &a));
    OK(llmrt_prefill(m, a, PROMPT, 21, NULL));
    size_t n = 0;
    unsigned char *state = save_all(m, a, &n);
    CHECK(n == 52 + 4 * 21 + 21 * info.kv_bytes_per_position, "state of %zu bytes", n);
    CHECK(memcmp(state, "LLMRTKV", 8) == 0, "magic");
    OK(llmrt_cache_load(m, state, n, 0, &b));
    CHECK(b != 0 && b != a, "loaded cache id %llu", (unsigned long long)b);
    CHECK(cache_len(m, b) == 21, "loaded length %u", cache_len(m, b));
    uint32_t tok = 96;
    for (int step = 0; step < 3; step++) {
        float *x = decode_row(m, a, tok, info.vocab_size);
        float *y = decode_row(m, b, tok, info.vocab_size);
        CHECK(memcmp(x, y, info.vocab_size * sizeof *x) == 0, "step %d: logits differ", step);
        uint32_t best = 0;
        for (uint32_t i = 1; i < info.vocab_size; i++)
            if (x[i] > x[best]) best = i;
        tok = best;
        free(x);
        free(y);
    }
    /* The loaded cache has the saved capacity (64): 24 used, 40 more fit, 41 do not. */
    uint32_t more[41];
    for (int i = 0; i < 41; i++) more[i] = (uint32_t)(i * 7 + 1);
    EXPECT_STATUS(LLMRT_CONTEXT_FULL, llmrt_prefill(m, b, more, 41, NULL));
    OK(llmrt_prefill(m, b, more, 40, NULL));
    /* Or as many positions as asked, at least the state's length. */
    llmrt_cache c = 0;
    OK(llmrt_cache_load(m, state, n, 21, &c));
    EXPECT_STATUS(LLMRT_CONTEXT_FULL, llmrt_prefill(m, c, more, 1, NULL));
    free(state);
    llmrt_model_free(m);
}

/* Saved to a file, loaded into a fresh load of the model after the first was freed. */
static void case_file_round_trip(void) {
    llmrt_model *m = load_fixture_model();
    llmrt_model_info info = model_info(m);
    llmrt_cache a = 0;
    OK(llmrt_cache_reserve(m, 32, &a));
    OK(llmrt_prefill(m, a, PROMPT, 9, NULL));
    size_t n = 0;
    unsigned char *state = save_all(m, a, &n);
    float *want = decode_row(m, a, 17, info.vocab_size);
    llmrt_model_free(m);
    char *path = temp_path("cache.state");
    write_file(path, state, n);
    free(state);

    m = load_fixture_model();
    size_t len = 0;
    unsigned char *data = read_file(path, &len);
    REQUIRE(len == n, "read back %zu of %zu bytes", len, n);
    llmrt_cache b = 0;
    OK(llmrt_cache_load(m, data, len, 0, &b));
    float *got = decode_row(m, b, 17, info.vocab_size);
    CHECK(memcmp(got, want, info.vocab_size * sizeof *got) == 0, "logits after the reload differ");
    free(got);
    free(want);
    free(data);
    free(path);
    llmrt_model_free(m);
}

static void case_refusals(void) {
    llmrt_model *m = load_fixture_model();
    llmrt_cache a = 0;
    OK(llmrt_cache_reserve(m, 16, &a));
    OK(llmrt_prefill(m, a, PROMPT, 3, NULL));
    size_t n = 0;
    unsigned char *state = save_all(m, a, &n);
    llmrt_cache out = 12345;
    /* Every truncation. */
    for (size_t cut = 0; cut < n; cut++) {
        llmrt_status st = llmrt_cache_load(m, state, cut, 0, &out);
        CHECK(st == LLMRT_INVALID_ARGUMENT && out == 12345, "truncated to %zu: %s", cut, llmrt_status_name(st));
        CHECK(strstr(llmrt_last_error(), cut < 52 ? "shorter than" : "offset 44: length 3") != NULL,
              "truncated to %zu: %s", cut, llmrt_last_error());
    }
    /* A flipped bit in the header, the tokens, the KV, the checksum. */
    const size_t bytes[5] = {3, 9, 50, 300, 0};
    const char *names[5] = {"offset 0: magic", "offset 8: format version", "checksum", "checksum", "checksum"};
    for (int i = 0; i < 5; i++) {
        size_t at = i == 4 ? n - 1 : bytes[i];
        state[at] ^= 0x10;
        EXPECT_STATUS_MSG(LLMRT_INVALID_ARGUMENT, llmrt_cache_load(m, state, n, 0, &out), names[i]);
        state[at] ^= 0x10;
    }
    /* Another model of the same geometry: the fingerprint. */
    char *other_path = fixture_path(OTHER_REL);
    llmrt_model *other = load_model_opts(other_path, 0);
    free(other_path);
    EXPECT_STATUS_MSG(LLMRT_INVALID_ARGUMENT, llmrt_cache_load(other, state, n, 0, &out),
                      "offset 16: model fingerprint");
    llmrt_model_free(other);
    /* NULLs, positions below the length. */
    EXPECT_STATUS(LLMRT_INVALID_ARGUMENT, llmrt_cache_load(m, NULL, n, 0, &out));
    EXPECT_STATUS(LLMRT_INVALID_ARGUMENT, llmrt_cache_load(m, state, n, 0, NULL));
    EXPECT_STATUS(LLMRT_INVALID_ARGUMENT, llmrt_cache_load(NULL, state, n, 0, &out));
    EXPECT_STATUS_MSG(LLMRT_INVALID_ARGUMENT, llmrt_cache_load(m, state, n, 2, &out), "positions = 2");
    size_t got = 0;
    EXPECT_STATUS(LLMRT_INVALID_ARGUMENT, llmrt_cache_save(m, a, NULL, 8, &got));
    EXPECT_STATUS(LLMRT_INVALID_ARGUMENT, llmrt_cache_save(m, a, state, n, NULL));
    EXPECT_STATUS(LLMRT_UNKNOWN_CACHE, llmrt_cache_save(m, 987654321, state, n, &got));
    CHECK(out == 12345, "a refused load wrote out_cache");
    /* The undamaged state still loads. */
    OK(llmrt_cache_load(m, state, n, 0, &out));
    CHECK(cache_len(m, out) == 3, "length %u", cache_len(m, out));
    free(state);
    llmrt_model_free(m);
}

/* ---- dispatch ------------------------------------------------------------- */

static const test_case CASES[] = {
    {"round_trip", case_round_trip},
    {"file_round_trip", case_file_round_trip},
    {"refusals", case_refusals},
};

int main(int argc, char **argv) {
    return run_cases(CASES, sizeof CASES / sizeof CASES[0], argc, argv);
}

/* Chat through the C API: llmrt_chat_apply (a template of the caller's and the
 * model's own), llmrt_chat_template, llmrt_token_is_eog / llmrt_eog_tokens, and the
 * stop-string matcher (llmrt_stop_matcher_*). The expected Qwen2.5 rendering is
 * transformers' (tests/fixtures/chat/expected.json, tools/make_chat_fixtures.py).
 * One program, one ctest per case:
 *     chat_template CASE
 * `chat_template --list` prints the case names. */
#include "harness.h" /* first: it sets the feature-test macros */

/* transformers' render_jinja_template of Qwen2.5-7B-Instruct's template over
 * (system, user), add_generation_prompt = true (expected.json, system_user/gen). */
static const char QWEN_SYSTEM_USER_GEN[] =
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
    "<|im_start|>assistant\n";

static const llmrt_chat_message SYSTEM_USER[2] = {
    {"system", "You are a helpful assistant."},
    {"user", "What is the capital of France?"},
};

/* llmrt_chat_apply through the size query; returns a NUL-terminated copy. */
static char *apply_all(const llmrt_model *m, const char *tmpl, const llmrt_chat_message *msgs,
                       size_t n, bool gen) {
    size_t need = 12345;
    llmrt_status st = llmrt_chat_apply(m, tmpl, msgs, n, gen, NULL, 0, &need);
    REQUIRE(st == LLMRT_OK || st == LLMRT_BUFFER_TOO_SMALL, "size query: %s: %s",
            llmrt_status_name(st), llmrt_last_error());
    char *buf = calloc(need + 1, 1);
    REQUIRE(buf != NULL, "out of memory");
    if (need > 0) {
        size_t len = 0;
        st = llmrt_chat_apply(m, tmpl, msgs, n, gen, buf, need - 1, &len);
        CHECK(st == LLMRT_BUFFER_TOO_SMALL && len == need, "one byte short: %s, %zu (need %zu)",
              llmrt_status_name(st), len, need);
        CHECK(buf[0] == 0, "a too-small buffer was written");
    }
    size_t len = 0;
    OK(llmrt_chat_apply(m, tmpl, msgs, n, gen, buf, need, &len));
    CHECK(len == need, "wrote %zu bytes, size query said %zu", len, need);
    return buf;
}

static void case_apply_template_matches_transformers(void) {
    char *path = fixture_path("chat/templates/Qwen-Qwen2.5-7B-Instruct.jinja");
    size_t len = 0;
    char *tmpl = (char *)read_file(path, &len);
    free(path);
    /* No model: a template of the caller's own, bos/eos "". */
    char *got = apply_all(NULL, tmpl, SYSTEM_USER, 2, true);
    CHECK(strcmp(got, QWEN_SYSTEM_USER_GEN) == 0, "got \"%s\"", got);
    free(got);
    /* With a model: the same (this template uses no bos/eos). */
    llmrt_model *m = load_fixture_model();
    got = apply_all(m, tmpl, SYSTEM_USER, 2, true);
    CHECK(strcmp(got, QWEN_SYSTEM_USER_GEN) == 0, "with a model: \"%s\"", got);
    free(got);
    /* The model's bos/eos strings. */
    const llmrt_chat_message hi = {"user", "h\xc3\xa9llo"};
    got = apply_all(m, "{{ bos_token }}{{ messages[0].content }}{{ eos_token }}", &hi, 1, false);
    CHECK(strcmp(got, "<s>h\xc3\xa9llo</s>") == 0, "bos/eos: \"%s\"", got);
    free(got);
    free(tmpl);
    llmrt_model_free(m);
}

static void case_apply_errors(void) {
    llmrt_model *m = load_fixture_model();
    size_t len = 777;
    /* The fixture has no template of its own. */
    CHECK(llmrt_chat_apply(m, NULL, SYSTEM_USER, 2, true, NULL, 0, &len) == LLMRT_UNSUPPORTED,
          "no template: %s", llmrt_last_error());
    CHECK(strstr(llmrt_last_error(), "no chat template") != NULL, "message: %s", llmrt_last_error());
    CHECK(llmrt_chat_template(m, NULL, 0, &len) == LLMRT_UNSUPPORTED, "chat_template");
    /* A template that raises: non-OK, its message and line in llmrt_last_error. */
    const char *raising = "{% for m in messages %}\n{% if m.role == 'system' %}"
                          "{{ raise_exception('System role not supported') }}{% endif %}{% endfor %}";
    CHECK(llmrt_chat_apply(m, raising, SYSTEM_USER, 2, true, NULL, 0, &len) == LLMRT_INVALID_ARGUMENT,
          "raising template");
    CHECK(strstr(llmrt_last_error(), "System role not supported") != NULL &&
              strstr(llmrt_last_error(), "line 2") != NULL,
          "message: %s", llmrt_last_error());
    CHECK(len == 777, "out_len written on failure");
    /* A syntax error (runaway loops and recursion: tests/chat_api.rs; slow under valgrind). */
    CHECK(llmrt_chat_apply(m, "{% if %}", SYSTEM_USER, 2, true, NULL, 0, &len) == LLMRT_INVALID_ARGUMENT,
          "syntax error");
    CHECK(strstr(llmrt_last_error(), "line 1") != NULL, "message: %s", llmrt_last_error());
    /* NULLs. */
    CHECK(llmrt_chat_apply(m, "x", NULL, 2, true, NULL, 0, &len) == LLMRT_INVALID_ARGUMENT,
          "NULL messages");
    CHECK(strstr(llmrt_last_error(), "messages") != NULL, "message: %s", llmrt_last_error());
    CHECK(llmrt_chat_apply(m, "x", SYSTEM_USER, 2, true, NULL, 0, NULL) == LLMRT_INVALID_ARGUMENT,
          "NULL out_len");
    llmrt_model_free(m);
}

static void case_eog(void) {
    llmrt_model *m = load_fixture_model();
    llmrt_model_info info = model_info(m);
    size_t n = 0;
    llmrt_status st = llmrt_eog_tokens(m, NULL, 0, &n);
    CHECK(st == LLMRT_BUFFER_TOO_SMALL && n == 1, "size query: %s %zu", llmrt_status_name(st), n);
    uint32_t ids[4] = {0};
    OK(llmrt_eog_tokens(m, ids, 4, &n));
    CHECK(n == 1 && ids[0] == info.eos_token, "eog ids: %zu, first %u (eos %u)", n, ids[0],
          info.eos_token);
    CHECK(llmrt_token_is_eog(m, info.eos_token), "eos is not eog");
    CHECK(!llmrt_token_is_eog(m, info.bos_token), "bos is eog");
    CHECK(!llmrt_token_is_eog(m, UINT32_MAX), "UINT32_MAX is eog");
    CHECK(!llmrt_token_is_eog(NULL, info.eos_token), "NULL model");
    llmrt_model_free(m);
}

/* Feeds text split at `cut`; returns what was shown (NUL-terminated) and the stop index. */
static char *stream(const char *const *stops, size_t n_stops, const char *text, size_t cut,
                    uint32_t *stop) {
    llmrt_stop_matcher *sm = NULL;
    OK(llmrt_stop_matcher_new(stops, n_stops, &sm));
    size_t len = strlen(text), shown = 0;
    char *out = calloc(len + 1, 1);
    REQUIRE(out != NULL, "out of memory");
    *stop = UINT32_MAX;
    const size_t pieces[2][2] = {{0, cut}, {cut, len}};
    for (int i = 0; i < 2; i++) {
        size_t got = 0;
        uint32_t s = 0;
        OK(llmrt_stop_matcher_feed(sm, text + pieces[i][0], pieces[i][1] - pieces[i][0], out + shown,
                                   len - shown, &got, &s));
        /* A chunk never ends inside a character: its last byte is no lead byte. */
        if (got > 0) {
            unsigned char last = (unsigned char)out[shown + got - 1];
            CHECK(last < 0xC0, "cut %zu: a chunk ends in lead byte 0x%02x", cut, last);
        }
        shown += got;
        if (s != UINT32_MAX) *stop = s;
    }
    size_t got = 0;
    OK(llmrt_stop_matcher_flush(sm, out + shown, len - shown, &got));
    shown += got;
    out[shown] = 0;
    llmrt_stop_matcher_free(sm);
    return out;
}

static void case_stop_matcher(void) {
    const char *stops[2] = {"<|im_end|>", "\xe6\x97\xa5\xe6\x9c\xac"}; /* "日本" */
    /* "Grüße <|im_ ... 日本語<|im_end|>": the stop "日本" ends first. */
    const char *text = "Gr\xc3\xbc\xc3\x9f" "e <|im_ \xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e<|im_end|>";
    const char *want = "Gr\xc3\xbc\xc3\x9f" "e <|im_ ";
    for (size_t cut = 0; cut <= strlen(text); cut++) {
        uint32_t stop = 0;
        char *got = stream(stops, 2, text, cut, &stop);
        CHECK(strcmp(got, want) == 0 && stop == 1, "cut %zu: \"%s\", stop %u", cut, got, stop);
        free(got);
    }
    /* No stop: everything comes out, held prefixes at the flush. */
    const char *plain = "tail <|im_en";
    for (size_t cut = 0; cut <= strlen(plain); cut++) {
        uint32_t stop = 0;
        char *got = stream(stops, 2, plain, cut, &stop);
        CHECK(strcmp(got, plain) == 0 && stop == UINT32_MAX, "cut %zu: \"%s\"", cut, got);
        free(got);
    }
    /* Too small a buffer: the size, and the piece is not consumed. */
    llmrt_stop_matcher *sm = NULL;
    OK(llmrt_stop_matcher_new(stops, 2, &sm));
    size_t need = 0;
    CHECK(llmrt_stop_matcher_feed(sm, "hello", 5, NULL, 0, &need, NULL) == LLMRT_BUFFER_TOO_SMALL &&
              need == 5,
          "size query: %zu", need);
    char buf[8];
    size_t got = 0;
    OK(llmrt_stop_matcher_feed(sm, "hello", 5, buf, sizeof buf, &got, NULL));
    CHECK(got == 5 && memcmp(buf, "hello", 5) == 0, "after the retry: %zu", got);
    llmrt_stop_matcher_free(sm);
    llmrt_stop_matcher_free(NULL);
    /* Bad stop strings. */
    const char *bad[2] = {"ok", ""};
    sm = NULL;
    CHECK(llmrt_stop_matcher_new(bad, 2, &sm) == LLMRT_INVALID_ARGUMENT && sm == NULL, "empty stop");
    CHECK(strstr(llmrt_last_error(), "stop string 1") != NULL, "message: %s", llmrt_last_error());
}

/* ---- dispatch ------------------------------------------------------------- */

static const test_case CASES[] = {
    {"apply_template_matches_transformers", case_apply_template_matches_transformers},
    {"apply_errors", case_apply_errors},
    {"eog", case_eog},
    {"stop_matcher", case_stop_matcher},
};

int main(int argc, char **argv) {
    return run_cases(CASES, sizeof CASES / sizeof CASES[0], argc, argv);
}

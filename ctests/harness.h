/* Shared helpers for the C tests of llmrt: assertions that print the library's
 * own error message, fixture loading, a per-test temporary directory, and a
 * tiny scanner for the few numbers the tests need from reference.json.
 *
 * Every test program is built with -Wall -Wextra -Werror; this header is
 * included by exactly one translation unit per program, so plain static
 * functions are fine. */
#ifndef LLMRT_CTEST_HARNESS_H
#define LLMRT_CTEST_HARNESS_H

#define _XOPEN_SOURCE 700
#include <ctype.h>
#include <errno.h>
#include <ftw.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "llmrt.h"

#ifndef LLMRT_FIXTURES_DIR
#error "LLMRT_FIXTURES_DIR must be defined by the build (see CMakeLists.txt)"
#endif

/* ---- failure reporting --------------------------------------------------- */

static int g_failures = 0;

#define FAIL(...)                                                             \
    do {                                                                      \
        fprintf(stderr, "%s:%d: FAIL: ", __FILE__, __LINE__);                 \
        fprintf(stderr, __VA_ARGS__);                                         \
        fputc('\n', stderr);                                                  \
        g_failures++;                                                         \
    } while (0)

/* A hard requirement: later code cannot run without it. */
#define REQUIRE(cond, ...)                                                    \
    do {                                                                      \
        if (!(cond)) {                                                        \
            FAIL(__VA_ARGS__);                                                \
            exit(1);                                                          \
        }                                                                     \
    } while (0)

#define CHECK(cond, ...)                                                      \
    do {                                                                      \
        if (!(cond)) FAIL(__VA_ARGS__);                                       \
    } while (0)

/* The call must succeed; otherwise report the status and message and stop. */
#define OK(call)                                                              \
    do {                                                                      \
        llmrt_status st_ = (call);                                            \
        if (st_ != LLMRT_OK) {                                                \
            FAIL("%s -> %s: %s", #call, llmrt_status_name(st_),               \
                 llmrt_last_error());                                         \
            exit(1);                                                          \
        }                                                                     \
    } while (0)

/* The call must fail with `want` and leave a non-empty llmrt_last_error(). */
#define EXPECT_STATUS(want, call)                                             \
    expect_status_((want), (call), #call, __FILE__, __LINE__, NULL)

/* As EXPECT_STATUS, and the message must also contain `needle`. */
#define EXPECT_STATUS_MSG(want, call, needle)                                 \
    expect_status_((want), (call), #call, __FILE__, __LINE__, (needle))

static inline int expect_status_(llmrt_status want, llmrt_status got, const char *expr,
                          const char *file, int line, const char *needle) {
    const char *msg = llmrt_last_error();
    int ok = 1;
    if (got != want) {
        fprintf(stderr, "%s:%d: FAIL: %s -> %s (want %s): %s\n", file, line, expr,
                llmrt_status_name(got), llmrt_status_name(want), msg ? msg : "(NULL)");
        ok = 0;
    } else if (msg == NULL || msg[0] == '\0') {
        fprintf(stderr, "%s:%d: FAIL: %s -> %s with an empty llmrt_last_error()\n",
                file, line, expr, llmrt_status_name(got));
        ok = 0;
    } else if (needle != NULL && strstr(msg, needle) == NULL) {
        fprintf(stderr, "%s:%d: FAIL: %s -> %s, message \"%s\" does not name \"%s\"\n",
                file, line, expr, llmrt_status_name(got), msg, needle);
        ok = 0;
    }
    if (!ok) g_failures++;
    return ok;
}

static inline int finish(const char *name) {
    if (g_failures) {
        fprintf(stderr, "%s: %d failure(s)\n", name, g_failures);
        return 1;
    }
    printf("%s: ok\n", name);
    return 0;
}

/* ---- files --------------------------------------------------------------- */

static inline char *fixture_path(const char *rel) {
    size_t n = strlen(LLMRT_FIXTURES_DIR) + 1 + strlen(rel) + 1;
    char *p = malloc(n);
    REQUIRE(p != NULL, "out of memory");
    snprintf(p, n, "%s/%s", LLMRT_FIXTURES_DIR, rel);
    return p;
}

#define MODEL_REL "llama_gqa/llama_gqa.f32.gguf"
#define REFERENCE_REL "llama_gqa/reference.json"
#define LOGITS_REL "llama_gqa/logits.f32"

/* Whole file into memory (NUL-terminated for convenience). */
static inline unsigned char *read_file(const char *path, size_t *out_len) {
    FILE *f = fopen(path, "rb");
    REQUIRE(f != NULL, "cannot open %s: %s", path, strerror(errno));
    REQUIRE(fseek(f, 0, SEEK_END) == 0, "cannot seek %s", path);
    long len = ftell(f);
    REQUIRE(len >= 0, "cannot size %s", path);
    rewind(f);
    unsigned char *buf = malloc((size_t)len + 1);
    REQUIRE(buf != NULL, "out of memory reading %s", path);
    REQUIRE(fread(buf, 1, (size_t)len, f) == (size_t)len, "short read on %s", path);
    fclose(f);
    buf[len] = 0;
    *out_len = (size_t)len;
    return buf;
}

static inline void write_file(const char *path, const void *data, size_t len) {
    FILE *f = fopen(path, "wb");
    REQUIRE(f != NULL, "cannot create %s: %s", path, strerror(errno));
    REQUIRE(len == 0 || fwrite(data, 1, len, f) == len, "short write on %s", path);
    REQUIRE(fclose(f) == 0, "cannot close %s", path);
}

/* ---- per-test temporary directory ---------------------------------------- */

static char g_tmpdir[4096];

static inline void temp_cleanup(void);

/* Made on first use, removed at exit (also when a REQUIRE fails). */
static inline const char *temp_dir(void) {
    if (g_tmpdir[0] == '\0') {
        atexit(temp_cleanup);
        const char *base = getenv("TMPDIR");
        if (base == NULL || base[0] == '\0') base = "/tmp";
        snprintf(g_tmpdir, sizeof g_tmpdir, "%s/llmrt-ctest-XXXXXX", base);
        REQUIRE(mkdtemp(g_tmpdir) != NULL, "mkdtemp(%s): %s", g_tmpdir, strerror(errno));
    }
    return g_tmpdir;
}

static inline char *temp_path(const char *name) {
    const char *dir = temp_dir();
    size_t n = strlen(dir) + 1 + strlen(name) + 1;
    char *p = malloc(n);
    REQUIRE(p != NULL, "out of memory");
    snprintf(p, n, "%s/%s", dir, name);
    return p;
}

static inline int rm_entry_(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(path);
}

/* Removes the temporary directory, if one was made. */
static inline void temp_cleanup(void) {
    if (g_tmpdir[0] != '\0') {
        nftw(g_tmpdir, rm_entry_, 16, FTW_DEPTH | FTW_PHYS);
        g_tmpdir[0] = '\0';
    }
}

/* ---- reference.json scanning --------------------------------------------- */

/* Position just after `"key"` and the following ':' (first occurrence), or NULL. */
static inline const char *json_value_(const char *json, const char *key) {
    size_t klen = strlen(key);
    for (const char *p = strchr(json, '"'); p != NULL; p = strchr(p + 1, '"')) {
        if (strncmp(p + 1, key, klen) == 0 && p[1 + klen] == '"') {
            const char *v = p + 2 + klen;
            while (isspace((unsigned char)*v)) v++;
            if (*v != ':') continue;
            v++;
            while (isspace((unsigned char)*v)) v++;
            return v;
        }
    }
    return NULL;
}

/* The integer value of the first "key": N, or -1 when absent. */
static inline long json_int(const char *json, const char *key) {
    const char *v = json_value_(json, key);
    if (v == NULL) return -1;
    char *end;
    long n = strtol(v, &end, 10);
    return end == v ? -1 : n;
}

/* Copies the string value of the first "key": "..." into out; 0 when absent. */
static inline int json_str(const char *json, const char *key, char *out, size_t cap) {
    const char *v = json_value_(json, key);
    if (v == NULL || *v != '"') return 0;
    v++;
    size_t i = 0;
    while (v[i] != '"' && v[i] != '\0' && i + 1 < cap) {
        out[i] = v[i];
        i++;
    }
    out[i] = '\0';
    return 1;
}

/* The first "key": [ints] array (malloc'd, count in *out_n), or NULL when absent. */
static inline uint32_t *json_uint_array(const char *json, const char *key, size_t *out_n) {
    const char *v = json_value_(json, key);
    if (v == NULL || *v != '[') return NULL;
    v++;
    size_t cap = 16, n = 0;
    uint32_t *a = malloc(cap * sizeof *a);
    REQUIRE(a != NULL, "out of memory");
    for (;;) {
        while (isspace((unsigned char)*v) || *v == ',') v++;
        if (*v == ']') break;
        char *end;
        unsigned long x = strtoul(v, &end, 10);
        if (end == v) { /* not a flat array of integers */
            free(a);
            return NULL;
        }
        if (n == cap) {
            cap *= 2;
            a = realloc(a, cap * sizeof *a);
            REQUIRE(a != NULL, "out of memory");
        }
        a[n++] = (uint32_t)x;
        v = end;
    }
    *out_n = n;
    return a;
}

/* ---- numerics ------------------------------------------------------------ */

/* ||a - b|| / ||b|| over n floats. */
static inline double rel_l2(const float *a, const float *b, size_t n) {
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - (double)b[i];
        num += d * d;
        den += (double)b[i] * (double)b[i];
    }
    if (den == 0.0) return num == 0.0 ? 0.0 : INFINITY;
    return sqrt(num / den);
}

static inline uint32_t argmax(const float *x, size_t n) {
    size_t best = 0;
    for (size_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return (uint32_t)best;
}

static inline int all_finite(const float *x, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i])) return 0;
    return 1;
}

static inline float *alloc_floats(size_t n) {
    float *p = calloc(n ? n : 1, sizeof(float));
    REQUIRE(p != NULL, "out of memory (%zu floats)", n);
    return p;
}

/* ---- model --------------------------------------------------------------- */

/* CPU, a fixed thread count: the tests are about the contract, not speed, and
 * must give the same answer on a CI box with or without a GPU. */
static inline llmrt_model *load_model_opts(const char *path, uint32_t max_context) {
    llmrt_model_options opt;
    llmrt_model_options_default(&opt);
    opt.backend = LLMRT_BACKEND_CPU;
    opt.threads = 2;
    opt.max_context = max_context;
    llmrt_model *m = NULL;
    OK(llmrt_model_load(path, &opt, &m));
    REQUIRE(m != NULL, "llmrt_model_load returned OK with a NULL model");
    return m;
}

static inline llmrt_model *load_fixture_model(void) {
    char *path = fixture_path(MODEL_REL);
    llmrt_model *m = load_model_opts(path, 0);
    free(path);
    return m;
}

static inline llmrt_model_info model_info(const llmrt_model *m) {
    llmrt_model_info info;
    memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
    OK(llmrt_model_get_info(m, &info));
    return info;
}

static inline uint32_t cache_len(const llmrt_model *m, llmrt_cache c) {
    uint32_t n = UINT32_MAX;
    OK(llmrt_cache_length(m, c, &n));
    return n;
}


/* ---- case dispatch: `prog CASE` runs one case, `prog --list` names them ---- */

typedef struct test_case {
    const char *name;
    void (*run)(void);
} test_case;

static inline int run_cases(const test_case *cases, size_t n, int argc, char **argv) {
    if (argc == 2 && strcmp(argv[1], "--list") == 0) {
        for (size_t i = 0; i < n; i++) puts(cases[i].name);
        return 0;
    }
    if (argc != 2) {
        fprintf(stderr, "usage: %s CASE | --list\n", argv[0]);
        return 2;
    }
    for (size_t i = 0; i < n; i++) {
        if (strcmp(argv[1], cases[i].name) == 0) {
            cases[i].run();
            temp_cleanup();
            return finish(cases[i].name);
        }
    }
    fprintf(stderr, "unknown case \"%s\" (try --list)\n", argv[1]);
    return 2;
}

#endif /* LLMRT_CTEST_HARNESS_H */

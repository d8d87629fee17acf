/* The whole C API used as a caller would, on the llama_gqa fixture, checked
 * against the transformers reference in tests/fixtures/llama_gqa/:
 * load, get_info, reserve, prefill (last logits vs logits.f32), prefill_all,
 * batched decode, decode_greedy, fork (copy-on-write), truncate, length,
 * release, free. */
#include "harness.h"

/* reference.json (written by tools/make_fixtures.py): "vocab_size", "architecture",
 * "tokens" (the rows of logits.f32), "greedy_prompt" + "greedy_ids" (float64 greedy),
 * and hf_config's num_hidden_layers / num_attention_heads / num_key_value_heads. */

struct progress_log {
    int calls;
    int monotonic;
    int in_range;
    float last;
};

static void on_progress(float fraction, void *user_data) {
    struct progress_log *log = user_data;
    if (fraction < 0.0f || fraction > 1.0f) log->in_range = 0;
    if (log->calls > 0 && fraction < log->last) log->monotonic = 0;
    log->last = fraction;
    log->calls++;
}

/* Loading with explicit options reports progress within [0, 1], never going back. */
static void check_progress(const char *path) {
    struct progress_log log = {0, 1, 1, 0.0f};
    llmrt_model_options opt;
    memset(&opt, 0xA5, sizeof opt);
    llmrt_model_options_default(&opt);
    CHECK(opt.struct_size == sizeof opt, "options struct_size %u, want %zu", opt.struct_size,
          sizeof opt);
    CHECK(opt.progress == NULL, "default options carry a progress callback");
    opt.backend = LLMRT_BACKEND_CPU;
    opt.threads = 1;
    opt.progress = on_progress;
    opt.progress_user_data = &log;
    llmrt_model *m = NULL;
    OK(llmrt_model_load(path, &opt, &m));
    CHECK(log.calls > 0, "progress callback never called");
    CHECK(log.in_range, "progress fraction outside [0, 1]");
    CHECK(log.monotonic, "progress fraction went backwards");
    llmrt_model_info info = model_info(m);
    CHECK(info.backend == LLMRT_BACKEND_CPU, "asked for CPU, info.backend = %d", (int)info.backend);
    CHECK(strstr(info.device_name, "cpu") != NULL, "CPU model reports device \"%s\"",
          info.device_name);
    llmrt_model_free(m);
}

int main(void) {
    char *model_path = fixture_path(MODEL_REL);
    char *ref_path = fixture_path(REFERENCE_REL);
    char *logits_path = fixture_path(LOGITS_REL);
    size_t ref_len, logits_len;
    char *ref = (char *)read_file(ref_path, &ref_len);
    float *ref_logits = (float *)read_file(logits_path, &logits_len);

    size_t n = 0, n_greedy = 0, n_gprompt = 0;
    uint32_t *prompt = json_uint_array(ref, "tokens", &n);
    REQUIRE(prompt != NULL && n >= 2, "%s: no \"tokens\" array", ref_path);
    uint32_t *gprompt = json_uint_array(ref, "greedy_prompt", &n_gprompt);
    uint32_t *greedy = json_uint_array(ref, "greedy_ids", &n_greedy);
    REQUIRE(gprompt != NULL && greedy != NULL && n_gprompt > 0 && n_greedy > 0,
            "%s: no greedy_prompt / greedy_ids", ref_path);
    long want_vocab = json_int(ref, "vocab_size");
    long want_layers = json_int(ref, "num_hidden_layers");
    long want_heads = json_int(ref, "num_attention_heads");
    long want_kv_heads = json_int(ref, "num_key_value_heads");
    char want_arch[32];
    REQUIRE(want_vocab > 0 && want_layers > 0 && want_heads > 0 && want_kv_heads > 0 &&
                json_str(ref, "architecture", want_arch, sizeof want_arch),
            "%s: no vocab_size / architecture / num_hidden_layers / heads", ref_path);

    /* ---- load with NULL options (the defaults) and describe ---- */
    llmrt_model *m = NULL;
    OK(llmrt_model_load(model_path, NULL, &m));
    REQUIRE(m != NULL, "load returned OK and a NULL model");
    llmrt_model_info info = model_info(m);
    const size_t V = info.vocab_size;
    CHECK(info.vocab_size == (uint32_t)want_vocab, "vocab_size %u, reference %ld", info.vocab_size,
          want_vocab);
    CHECK(info.n_layers == (uint32_t)want_layers, "n_layers %u, reference %ld", info.n_layers,
          want_layers);
    CHECK(info.n_heads == (uint32_t)want_heads, "n_heads %u, reference %ld", info.n_heads,
          want_heads);
    CHECK(info.n_kv_heads == (uint32_t)want_kv_heads, "n_kv_heads %u, reference %ld",
          info.n_kv_heads, want_kv_heads);
    CHECK(info.n_kv_heads > 0 && info.n_kv_heads < info.n_heads,
          "llama_gqa should have grouped KV heads: n_heads %u n_kv_heads %u", info.n_heads,
          info.n_kv_heads);
    CHECK(strcmp(info.architecture, "llama") == 0 && strcmp(want_arch, "llama") == 0,
          "architecture \"%s\", reference \"%s\", want \"llama\"", info.architecture, want_arch);
    CHECK(memchr(info.device_name, '\0', sizeof info.device_name) != NULL && info.device_name[0],
          "device_name empty or not NUL-terminated");
    CHECK(info.context_length >= n + 16, "context_length %u too small", info.context_length);
    CHECK(info.head_dim > 0 && info.hidden_size > 0, "head_dim %u hidden_size %u", info.head_dim,
          info.hidden_size);
    CHECK(info.backend == LLMRT_BACKEND_CPU || info.backend == LLMRT_BACKEND_CUDA,
          "info.backend %d is not a concrete backend", (int)info.backend);
    CHECK(info.weight_bytes > 0, "weight_bytes 0");
    uint64_t kv_unit = 2ull * info.n_layers * info.n_kv_heads * info.head_dim;
    CHECK(info.kv_bytes_per_position > 0 && info.kv_bytes_per_position % kv_unit == 0,
          "kv_bytes_per_position %llu is not a multiple of 2*layers*kv_heads*head_dim = %llu",
          (unsigned long long)info.kv_bytes_per_position, (unsigned long long)kv_unit);
    CHECK(info.kv_pool_bytes >= info.kv_bytes_per_position * info.context_length,
          "kv_pool_bytes %llu is less than one context", (unsigned long long)info.kv_pool_bytes);
    CHECK(info.backend == LLMRT_BACKEND_CUDA ||
              (info.scratch_bytes == 0 && info.device_free_bytes == 0 && info.device_total_bytes == 0),
          "CPU model reports device memory");
    for (size_t i = 0; i < n; i++)
        REQUIRE(prompt[i] < V, "reference prompt token %u >= vocab %zu", prompt[i], V);
    REQUIRE(logits_len == n * V * sizeof(float),
            "%s: %zu bytes, want n_tokens %zu x vocab %zu x 4", logits_path, logits_len, n, V);

    /* ---- prefill: last-token logits against transformers ---- */
    llmrt_cache c = 0, c2 = 0;
    OK(llmrt_cache_reserve(m, 0, &c)); /* 0 = the full context */
    OK(llmrt_cache_reserve(m, (uint32_t)n + 8, &c2));
    CHECK(c != 0 && c2 != 0 && c != c2, "cache ids %llu %llu", (unsigned long long)c,
          (unsigned long long)c2);
    CHECK(cache_len(m, c) == 0, "fresh cache has length %u", cache_len(m, c));

    float *last = alloc_floats(V);
    OK(llmrt_prefill(m, c, prompt, n, last));
    CHECK(cache_len(m, c) == n, "length %u after prefilling %zu", cache_len(m, c), n);
    const float *ref_last = ref_logits + (n - 1) * V;
    double err = rel_l2(last, ref_last, V);
    CHECK(all_finite(last, V), "non-finite prefill logits");
    CHECK(err < 1e-4, "prefill last logits vs transformers: relative L2 %.3g >= 1e-4", err);
    printf("prefill last-token logits vs reference: rel L2 %.3g\n", err);

    /* ---- prefill_all: every row against transformers ---- */
    float *all = alloc_floats(n * V);
    OK(llmrt_prefill_all(m, c2, prompt, n, all));
    for (size_t t = 0; t < n; t++) {
        double e = rel_l2(all + t * V, ref_logits + t * V, V);
        CHECK(e < 1e-4, "prefill_all row %zu vs transformers: relative L2 %.3g", t, e);
    }
    CHECK(rel_l2(all + (n - 1) * V, last, V) < 1e-5, "prefill_all last row differs from prefill");

    /* ---- fork, then one batched decode over original, twin and fork ---- */
    const uint32_t t0 = argmax(last, V);
    llmrt_cache f = 0;
    OK(llmrt_cache_fork(m, c2, &f));
    CHECK(f != 0 && f != c && f != c2, "fork id %llu", (unsigned long long)f);
    CHECK(cache_len(m, f) == n, "fork length %u, source %zu", cache_len(m, f), n);

    const uint32_t x = (t0 + 1) % (uint32_t)V; /* the fork takes another path */
    llmrt_cache batch[3] = {c, c2, f};
    uint32_t toks[3] = {t0, t0, x};
    float *rows = alloc_floats(3 * V);
    OK(llmrt_decode(m, 3, batch, toks, rows));
    CHECK(cache_len(m, c) == n + 1 && cache_len(m, c2) == n + 1 && cache_len(m, f) == n + 1,
          "lengths after decode: %u %u %u", cache_len(m, c), cache_len(m, c2), cache_len(m, f));
    CHECK(all_finite(rows, 3 * V), "non-finite decode logits");
    CHECK(rel_l2(rows, rows + V, V) < 1e-5,
          "same tokens, twin caches, one batch: rows differ by %.3g", rel_l2(rows, rows + V, V));
    CHECK(rel_l2(rows + 2 * V, rows + V, V) > 1e-3,
          "the fork decoded another token yet gave the same logits as its source");

    /* The fork's write did not reach its source (copy-on-write): the source, alone,
     * decodes what a never-forked cache decodes. */
    float *one = alloc_floats(V);
    float *one_c = alloc_floats(V);
    const uint32_t t1 = argmax(rows, V);
    OK(llmrt_decode(m, 1, &c2, &t1, one));
    OK(llmrt_decode(m, 1, &c, &t1, one_c));
    CHECK(rel_l2(one, one_c, V) < 1e-5, "forked source diverged from an unforked twin: %.3g",
          rel_l2(one, one_c, V));

    /* ---- decode_greedy: the backend's argmax equals ours ---- */
    uint32_t next = UINT32_MAX;
    const uint32_t t2 = argmax(one, V);
    OK(llmrt_decode_greedy(m, 1, &c, &t2, &next));
    float *check = alloc_floats(V);
    OK(llmrt_decode(m, 1, &c2, &t2, check));
    CHECK(next == argmax(check, V), "decode_greedy chose %u, argmax of decode logits is %u", next,
          argmax(check, V));

    /* ---- greedy generation against transformers' float64 greedy ids ---- */
    {
        llmrt_cache g = 0;
        OK(llmrt_cache_reserve(m, (uint32_t)(n_gprompt + n_greedy), &g));
        OK(llmrt_prefill(m, g, gprompt, n_gprompt, check));
        uint32_t cur = argmax(check, V);
        for (size_t i = 0; i < n_greedy; i++) {
            if (cur != greedy[i]) {
                FAIL("greedy step %zu: %u, transformers %u", i, cur, greedy[i]);
                break;
            }
            if (i + 1 < n_greedy) {
                uint32_t nx = UINT32_MAX;
                OK(llmrt_decode_greedy(m, 1, &g, &cur, &nx));
                cur = nx;
            }
        }
        CHECK(cache_len(m, g) == n_gprompt + n_greedy - 1, "greedy cache length %u",
              cache_len(m, g));
        OK(llmrt_cache_release(m, g));
    }

    /* Batched greedy: two caches at once give their single answers. */
    {
        llmrt_cache pair[2] = {c2, f};
        uint32_t in[2] = {t2, x}, out[2] = {UINT32_MAX, UINT32_MAX};
        OK(llmrt_decode_greedy(m, 2, pair, in, out));
        CHECK(out[0] < V && out[1] < V, "greedy ids out of range: %u %u", out[0], out[1]);
    }

    /* ---- truncate: rewind and replay ---- */
    OK(llmrt_cache_truncate(m, c, (uint32_t)n - 1));
    CHECK(cache_len(m, c) == n - 1, "length %u after truncate to %zu", cache_len(m, c), n - 1);
    OK(llmrt_decode(m, 1, &c, &prompt[n - 1], one));
    CHECK(rel_l2(one, ref_last, V) < 1e-4,
          "replayed last prompt token after truncate: rel L2 %.3g vs reference",
          rel_l2(one, ref_last, V));
    OK(llmrt_cache_truncate(m, c, 0));
    CHECK(cache_len(m, c) == 0, "length %u after truncate to 0", cache_len(m, c));
    OK(llmrt_prefill(m, c, prompt, n, one));
    CHECK(rel_l2(one, ref_last, V) < 1e-4, "prefill after truncate to 0: rel L2 %.3g",
          rel_l2(one, ref_last, V));

    /* ---- release ---- */
    OK(llmrt_cache_release(m, f));
    OK(llmrt_cache_release(m, c2));
    OK(llmrt_cache_release(m, c));
    /* A cache left live is released by model_free (valgrind checks nothing leaks). */
    llmrt_cache leftover = 0;
    OK(llmrt_cache_reserve(m, 4, &leftover));
    llmrt_model_free(m);

    check_progress(model_path);
    /* A quantized file: the CPU backend repacks its matrices after binding. */
    char *q8_path = fixture_path("llama_gqa/llama_gqa.q8_0.gguf");
    check_progress(q8_path);
    free(q8_path);

    free(check);
    free(one_c);
    free(one);
    free(rows);
    free(all);
    free(last);
    free(greedy);
    free(gprompt);
    free(prompt);
    free(ref_logits);
    free(ref);
    free(logits_path);
    free(ref_path);
    free(model_path);
    return finish("happy_path");
}

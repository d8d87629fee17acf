/* generate: greedy generation from token ids with the llmrt C API.
 *
 *   generate MODEL.gguf [-n N] [-t THREADS] [-p "1,2,3"]
 *
 * Loads the model (with a progress bar), prints its description, prefills the
 * prompt (default: BOS, or token 1 when the model has none), then generates N
 * tokens (default 32): the first from the prefill's last-token logits, the rest
 * with llmrt_decode_greedy, printing each id as it comes, and finally the
 * prefill and decode speeds. Exit status 1 on any failure. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "llmrt.h"

static int fail(const char *what, llmrt_status st) {
    fprintf(stderr, "\nerror: %s: %s: %s\n", what, llmrt_status_name(st), llmrt_last_error());
    return 1;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void progress_bar(float fraction, void *user_data) {
    (void)user_data;
    const int width = 40;
    int filled = (int)(fraction * (float)width + 0.5f);
    if (filled < 0) filled = 0;
    if (filled > width) filled = width;
    fprintf(stderr, "\rloading [%.*s%*s] %3d%%", filled, "########################################",
            width - filled, "", (int)(fraction * 100.0f + 0.5f));
    fflush(stderr);
}

static int parse_u32(const char *s, uint32_t *out) {
    char *end;
    errno = 0;
    unsigned long v = strtoul(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0' || v > UINT32_MAX || s[0] == '-') return 0;
    *out = (uint32_t)v;
    return 1;
}

/* "1,2,3" -> ids; returns the count, 0 on a malformed list. */
static size_t parse_ids(const char *s, uint32_t **out) {
    size_t cap = 1;
    for (const char *p = s; *p; p++) cap += *p == ',';
    uint32_t *ids = malloc(cap * sizeof *ids);
    char *copy = strdup(s);
    if (ids == NULL || copy == NULL) {
        free(ids);
        free(copy);
        return 0;
    }
    size_t n = 0;
    for (char *save = NULL, *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        while (*tok == ' ') tok++;
        if (!parse_u32(tok, &ids[n])) {
            n = 0;
            break;
        }
        n++;
    }
    free(copy);
    if (n == 0) free(ids);
    else *out = ids;
    return n;
}

static int usage(const char *argv0) {
    fprintf(stderr, "usage: %s MODEL.gguf [-n N] [-t THREADS] [-p \"1,2,3\"]\n", argv0);
    return 1;
}

int main(int argc, char **argv) {
    const char *path = NULL, *prompt_arg = NULL;
    uint32_t n_gen = 32, threads = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-n") == 0 && i + 1 < argc) {
            if (!parse_u32(argv[++i], &n_gen)) return usage(argv[0]);
        } else if (strcmp(argv[i], "-t") == 0 && i + 1 < argc) {
            if (!parse_u32(argv[++i], &threads)) return usage(argv[0]);
        } else if (strcmp(argv[i], "-p") == 0 && i + 1 < argc) {
            prompt_arg = argv[++i];
        } else if (argv[i][0] != '-' && path == NULL) {
            path = argv[i];
        } else {
            return usage(argv[0]);
        }
    }
    if (path == NULL) return usage(argv[0]);

    llmrt_model_options opt;
    llmrt_model_options_default(&opt);
    opt.threads = threads;
    opt.progress = progress_bar;
    llmrt_model *model = NULL;
    double t_load = now_s();
    llmrt_status st = llmrt_model_load(path, &opt, &model);
    if (st != LLMRT_OK) return fail(path, st);
    t_load = now_s() - t_load;
    fprintf(stderr, "\n");

    int rc = 1;
    uint32_t *prompt = NULL;
    llmrt_cache cache = 0;
    llmrt_model_info info;
    st = llmrt_model_get_info(model, &info);
    if (st != LLMRT_OK) {
        fail("llmrt_model_get_info", st);
        goto out;
    }
    printf("llmrt %s | %s | %s | loaded in %.2f s\n", llmrt_version(), path, info.device_name,
           t_load);
    printf("%s: %u layers, hidden %u, heads %u/%u kv, head_dim %u, vocab %u, context %u, "
           "weights %.1f MiB\n",
           info.architecture, info.n_layers, info.hidden_size, info.n_heads, info.n_kv_heads,
           info.head_dim, info.vocab_size, info.context_length,
           (double)info.weight_bytes / (1024.0 * 1024.0));

    size_t n_prompt;
    if (prompt_arg != NULL) {
        n_prompt = parse_ids(prompt_arg, &prompt);
        if (n_prompt == 0) {
            fprintf(stderr, "error: -p wants comma-separated token ids, got \"%s\"\n", prompt_arg);
            goto out;
        }
    } else {
        n_prompt = 1;
        prompt = malloc(sizeof *prompt);
        if (prompt == NULL) goto out;
        prompt[0] = info.bos_token != UINT32_MAX ? info.bos_token : 1;
    }

    st = llmrt_cache_reserve(model, (uint32_t)n_prompt + n_gen, &cache);
    if (st != LLMRT_OK) {
        fail("llmrt_cache_reserve", st);
        goto out;
    }

    printf("prompt:");
    for (size_t i = 0; i < n_prompt; i++) printf(" %u", prompt[i]);
    printf("\n");

    /* Prefill the whole prompt; its last-token logits give the first new token,
     * then each decode_greedy step feeds the latest token and yields the next. */
    float *logits = malloc((size_t)info.vocab_size * sizeof *logits);
    if (logits == NULL) goto out;
    double t_prefill = now_s();
    st = llmrt_prefill(model, cache, prompt, n_prompt, logits);
    t_prefill = now_s() - t_prefill;
    if (st != LLMRT_OK) {
        free(logits);
        fail("llmrt_prefill", st);
        goto out;
    }
    uint32_t cur = 0;
    for (uint32_t v = 1; v < info.vocab_size; v++)
        if (logits[v] > logits[cur]) cur = v;
    free(logits);

    printf("output:");
    if (n_gen > 0) printf(" %u", cur);
    fflush(stdout);
    double t_decode = now_s();
    for (uint32_t i = 1; i < n_gen; i++) {
        uint32_t next;
        st = llmrt_decode_greedy(model, 1, &cache, &cur, &next);
        if (st != LLMRT_OK) {
            printf("\n");
            fail("llmrt_decode_greedy", st);
            goto out;
        }
        printf(" %u", next);
        fflush(stdout);
        cur = next;
    }
    t_decode = now_s() - t_decode;
    printf("\n");

    printf("prefill: %zu tokens in %.3f s (%.1f tokens/s)\n", n_prompt, t_prefill,
           (double)n_prompt / t_prefill);
    if (n_gen > 1)
        printf("decode:  %u tokens in %.3f s (%.1f tokens/s)\n", n_gen - 1, t_decode,
               (double)(n_gen - 1) / t_decode);
    rc = 0;

out:
    if (cache != 0) llmrt_cache_release(model, cache);
    llmrt_model_free(model);
    free(prompt);
    return rc;
}

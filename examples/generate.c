/* generate: text generation with the llmrt C API.
 *
 *   generate MODEL.gguf [-p "text" | -i 1,2,3] [-n N] [-t THREADS]
 *            [--temp T] [--top-k K] [--top-p P] [--min-p P] [--repeat-penalty R] [--seed S]
 *
 * Loads the model (with a progress bar) and prints its description. The prompt
 * is text (-p, tokenized with llmrt_tokenize, BOS first; default "Once upon a
 * time" when the model carries a tokenizer) or raw token ids (-i; default: BOS).
 * Then N tokens (default 32) are generated and printed as they come: as text
 * (llmrt_detokenize, multi-byte characters split across tokens held back until
 * complete) when the model has a tokenizer, else as ids. Greedy by default
 * (--temp 0); otherwise llmrt_decode_sample with the given parameters. Finally
 * the prefill and decode speeds. Exit status 1 on any failure.
 *
 * Text and sampling need llmrt_tokenize/llmrt_detokenize and
 * llmrt_decode_sample; builds against a header without them define neither
 * LLMRT_HAVE_TEXT nor LLMRT_HAVE_SAMPLING and keep ids and greedy decoding. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "llmrt.h"

#define DEFAULT_TEXT_PROMPT "Once upon a time"

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

static int parse_u64(const char *s, uint64_t *out) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0' || s[0] == '-') return 0;
    *out = (uint64_t)v;
    return 1;
}

static int parse_f32(const char *s, float *out) {
    char *end;
    errno = 0;
    float v = strtof(s, &end);
    if (errno != 0 || end == s || *end != '\0' || !isfinite(v) || v < 0.0f) return 0;
    *out = v;
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

/* ---- streaming text ------------------------------------------------------ */

#ifdef LLMRT_HAVE_TEXT
/* Length of the longest prefix of buf[0..n) that does not end inside a UTF-8
 * sequence: a trailing lead byte whose continuation bytes have not all arrived
 * is held back. Anything else (ASCII, complete or invalid sequences) passes. */
static size_t utf8_complete_prefix(const char *buf, size_t n) {
    size_t stop = n > 3 ? n - 3 : 0;
    for (size_t i = n; i > stop; i--) {
        unsigned char b = (unsigned char)buf[i - 1];
        if ((b & 0xC0) == 0x80) continue; /* continuation: look further back */
        if (b < 0xC0) return n;           /* ASCII */
        size_t need = b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : 2;
        return n - (i - 1) < need ? i - 1 : n;
    }
    return n;
}

struct text_out {
    char *buf; /* detokenize scratch */
    size_t cap;
    char pending[8]; /* bytes of a character not yet complete */
    size_t n_pending;
};

/* Detokenizes tokens into out->buf (grown on LLMRT_BUFFER_TOO_SMALL). */
static llmrt_status detok(const llmrt_model *m, const uint32_t *tokens, size_t n,
                          struct text_out *out, size_t *len) {
    if (out->buf == NULL) {
        out->buf = malloc(256);
        if (out->buf == NULL) return LLMRT_OUT_OF_MEMORY;
        out->cap = 256;
    }
    for (int attempt = 0; attempt < 2; attempt++) {
        llmrt_status st = llmrt_detokenize(m, tokens, n, out->buf, out->cap, len);
        if (st != LLMRT_BUFFER_TOO_SMALL || *len <= out->cap) return st;
        char *bigger = realloc(out->buf, *len);
        if (bigger == NULL) return LLMRT_OUT_OF_MEMORY;
        out->buf = bigger;
        out->cap = *len;
    }
    return LLMRT_BUFFER_TOO_SMALL;
}

/* Prints the bytes `token` adds after `prev`: detokenize(prev, token) minus
 * detokenize(prev), so that a tokenizer dropping the leading space of a text's
 * first token still prints spaces (prev UINT32_MAX: none, the token alone).
 * Holds back an incomplete UTF-8 tail. */
static llmrt_status emit_token(const llmrt_model *m, uint32_t prev, uint32_t token,
                               struct text_out *out) {
    const char *add = NULL;
    size_t n_add = 0;
    llmrt_status st;
    if (prev != UINT32_MAX) {
        uint32_t pair[2] = {prev, token};
        char head[64];
        size_t len_prev = 0;
        st = detok(m, pair, 1, out, &len_prev);
        if (st != LLMRT_OK) return st;
        if (len_prev <= sizeof head) {
            memcpy(head, out->buf, len_prev);
            st = detok(m, pair, 2, out, &n_add);
            if (st != LLMRT_OK) return st;
            if (n_add >= len_prev && memcmp(out->buf, head, len_prev) == 0) {
                add = out->buf + len_prev;
                n_add -= len_prev;
            }
        }
    }
    if (add == NULL) { /* no previous token, or no common prefix: the token alone */
        st = detok(m, &token, 1, out, &n_add);
        if (st != LLMRT_OK) return st;
        add = out->buf;
    }
    char joined[8 + 256];
    const char *p = add;
    size_t n = n_add;
    if (out->n_pending > 0 && n_add <= 256) {
        memcpy(joined, out->pending, out->n_pending);
        memcpy(joined + out->n_pending, add, n_add);
        p = joined;
        n = out->n_pending + n_add;
    } else if (out->n_pending > 0) {
        fwrite(out->pending, 1, out->n_pending, stdout);
    }
    size_t ready = utf8_complete_prefix(p, n);
    fwrite(p, 1, ready, stdout);
    out->n_pending = n - ready; /* at most 3 */
    memmove(out->pending, p + ready, out->n_pending);
    fflush(stdout);
    return LLMRT_OK;
}

/* Whether the model can turn ids into text (it carries a tokenizer). */
static bool has_tokenizer(const llmrt_model *m, const llmrt_model_info *info) {
    uint32_t t = info->bos_token != UINT32_MAX ? info->bos_token : 0;
    char buf[64];
    size_t len = 0;
    llmrt_status st = llmrt_detokenize(m, &t, 1, buf, sizeof buf, &len);
    return st == LLMRT_OK || st == LLMRT_BUFFER_TOO_SMALL;
}
#endif

static int usage(const char *argv0) {
    fprintf(stderr,
            "usage: %s MODEL.gguf [-p \"text\" | -i 1,2,3] [-n N] [-t THREADS]\n"
            "       [--temp T] [--top-k K] [--top-p P] [--min-p P] [--repeat-penalty R] "
            "[--seed S]\n",
            argv0);
    return 1;
}

struct sampling {
    float temp, top_p, min_p, repeat_penalty;
    uint32_t top_k;
    uint64_t seed;
};

int main(int argc, char **argv) {
    const char *path = NULL, *ids_arg = NULL, *text_arg = NULL;
    uint32_t n_gen = 32, threads = 0;
    struct sampling sp = {0.0f, 1.0f, 0.0f, 1.0f, 0, 0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        int ok = 1;
        if (v != NULL && strcmp(a, "-n") == 0) ok = parse_u32(v, &n_gen);
        else if (v != NULL && strcmp(a, "-t") == 0) ok = parse_u32(v, &threads);
        else if (v != NULL && strcmp(a, "-p") == 0) text_arg = v;
        else if (v != NULL && strcmp(a, "-i") == 0) ids_arg = v;
        else if (v != NULL && strcmp(a, "--temp") == 0) ok = parse_f32(v, &sp.temp);
        else if (v != NULL && strcmp(a, "--top-k") == 0) ok = parse_u32(v, &sp.top_k);
        else if (v != NULL && strcmp(a, "--top-p") == 0) ok = parse_f32(v, &sp.top_p);
        else if (v != NULL && strcmp(a, "--min-p") == 0) ok = parse_f32(v, &sp.min_p);
        else if (v != NULL && strcmp(a, "--repeat-penalty") == 0) ok = parse_f32(v, &sp.repeat_penalty);
        else if (v != NULL && strcmp(a, "--seed") == 0) ok = parse_u64(v, &sp.seed);
        else if (a[0] != '-' && path == NULL) {
            path = a;
            continue;
        } else return usage(argv[0]);
        if (!ok) return usage(argv[0]);
        i++;
    }
    if (path == NULL || (text_arg != NULL && ids_arg != NULL)) return usage(argv[0]);
    const bool sampling = sp.temp > 0.0f || sp.repeat_penalty != 1.0f;
#ifndef LLMRT_HAVE_TEXT
    if (text_arg != NULL) {
        fprintf(stderr, "error: this build has no llmrt_tokenize: give token ids with -i\n");
        return 1;
    }
#endif
#ifndef LLMRT_HAVE_SAMPLING
    if (sampling) {
        fprintf(stderr, "error: this build has no llmrt_decode_sample: only --temp 0 (greedy)\n");
        return 1;
    }
#endif

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
    float *logits = NULL;
    llmrt_cache cache = 0;
    bool text = false;
#ifdef LLMRT_HAVE_TEXT
    struct text_out out = {NULL, 0, {0}, 0};
#endif
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

    size_t n_prompt = 0;
#ifdef LLMRT_HAVE_TEXT
    text = has_tokenizer(model, &info);
    if (text_arg != NULL && !text) {
        fprintf(stderr, "error: %s carries no tokenizer: give token ids with -i\n", path);
        goto out;
    }
    if (ids_arg == NULL && text) {
        const char *t = text_arg != NULL ? text_arg : DEFAULT_TEXT_PROMPT;
        size_t cap = strlen(t) + 2;
        for (int attempt = 0; attempt < 2; attempt++) {
            free(prompt);
            prompt = malloc(cap * sizeof *prompt);
            if (prompt == NULL) goto out;
            st = llmrt_tokenize(model, t, strlen(t), true, prompt, cap, &n_prompt);
            if (st != LLMRT_BUFFER_TOO_SMALL || n_prompt <= cap) break;
            cap = n_prompt;
        }
        if (st != LLMRT_OK) {
            fail("llmrt_tokenize", st);
            goto out;
        }
        if (n_prompt == 0) {
            fprintf(stderr, "error: the prompt gave no tokens\n");
            goto out;
        }
    }
#endif
    if (ids_arg != NULL) {
        n_prompt = parse_ids(ids_arg, &prompt);
        if (n_prompt == 0) {
            fprintf(stderr, "error: -i wants comma-separated token ids, got \"%s\"\n", ids_arg);
            goto out;
        }
    } else if (n_prompt == 0) {
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

    /* Greedy: prefill the whole prompt, whose last-token logits give the first new
     * token; each decode_greedy step then feeds the latest token and yields the
     * next. Sampling: prefill all but the last prompt token, and let
     * decode_sample feed that one and sample every new token. */
    size_t n_prefill = sampling ? n_prompt - 1 : n_prompt;
    double t_prefill = now_s();
    if (n_prefill > 0) {
        logits = malloc((size_t)info.vocab_size * sizeof *logits);
        if (logits == NULL) goto out;
        st = llmrt_prefill(model, cache, prompt, n_prefill, sampling ? NULL : logits);
        if (st != LLMRT_OK) {
            fail("llmrt_prefill", st);
            goto out;
        }
    }
    t_prefill = now_s() - t_prefill;

    uint32_t cur = prompt[n_prompt - 1]; /* the token fed to the next step */
    uint32_t n_decoded = 0;
    if (text) {
#ifdef LLMRT_HAVE_TEXT
        printf("output: ");
        for (size_t i = 0; i < n_prompt; i++) { /* echo the prompt as text */
            if (i == 0 && prompt[0] == info.bos_token) continue;
            st = emit_token(model, i > 0 ? prompt[i - 1] : UINT32_MAX, prompt[i], &out);
            if (st != LLMRT_OK) {
                fail("llmrt_detokenize", st);
                goto out;
            }
        }
#endif
    } else {
        printf("output:");
    }
    fflush(stdout);

    double t_decode = now_s();
    for (uint32_t i = 0; i < n_gen; i++) {
        uint32_t next = 0;
        if (i == 0 && !sampling) {
            for (uint32_t v = 1; v < info.vocab_size; v++)
                if (logits[v] > logits[next]) next = v;
            t_decode = now_s();
        } else if (sampling) {
#ifdef LLMRT_HAVE_SAMPLING
            llmrt_sampler_params params;
            llmrt_sampler_params_default(&params);
            params.temperature = sp.temp;
            params.top_k = sp.top_k;
            params.top_p = sp.top_p;
            params.min_p = sp.min_p;
            params.repetition_penalty = sp.repeat_penalty;
            params.seed = sp.seed;
            st = llmrt_decode_sample(model, 1, &cache, &cur, &params, &next);
            if (st != LLMRT_OK) {
                printf("\n");
                fail("llmrt_decode_sample", st);
                goto out;
            }
            n_decoded++;
#endif
        } else {
            st = llmrt_decode_greedy(model, 1, &cache, &cur, &next);
            if (st != LLMRT_OK) {
                printf("\n");
                fail("llmrt_decode_greedy", st);
                goto out;
            }
            n_decoded++;
        }
        if (text) {
#ifdef LLMRT_HAVE_TEXT
            if (next == info.eos_token) break;
            st = emit_token(model, cur, next, &out);
            if (st != LLMRT_OK) {
                printf("\n");
                fail("llmrt_detokenize", st);
                goto out;
            }
#endif
        } else {
            printf(" %u", next);
            fflush(stdout);
        }
        cur = next;
    }
    t_decode = now_s() - t_decode;
#ifdef LLMRT_HAVE_TEXT
    if (out.n_pending > 0) fwrite(out.pending, 1, out.n_pending, stdout); /* a cut-off tail */
#endif
    printf("\n");

    if (n_prefill > 0)
        printf("prefill: %zu tokens in %.3f s (%.1f tokens/s)\n", n_prefill, t_prefill,
               (double)n_prefill / t_prefill);
    if (n_decoded > 0)
        printf("decode:  %u tokens in %.3f s (%.1f tokens/s)\n", n_decoded, t_decode,
               (double)n_decoded / t_decode);
    rc = 0;

out:
    if (cache != 0) llmrt_cache_release(model, cache);
    llmrt_model_free(model);
#ifdef LLMRT_HAVE_TEXT
    free(out.buf);
#endif
    free(logits);
    free(prompt);
    return rc;
}

/* generate: text generation with the llmrt C API.
 *
 *   generate MODEL.gguf [-p "text" | -i 1,2,3] [-n N] [-t THREADS]
 *            [--temp T] [--top-k K] [--top-p P] [--min-p P] [--repeat-penalty R] [--seed S]
 *
 * Loads the model (with a progress bar) and prints its description. The prompt
 * is text (-p, tokenized with llmrt_tokenize, BOS first where the tokenizer asks
 * for one; default "Once upon a time" when the model carries a tokenizer) or raw
 * token ids (-i; default: BOS). Then N tokens (default 32) are generated and
 * printed as they come: when the model has a tokenizer, the prompt as text
 * (llmrt_detokenize) followed by each new token's piece (llmrt_token_piece,
 * bytes of a multi-byte character split across tokens held back until it is
 * complete), else as ids. Greedy by default (--temp 0); otherwise
 * llmrt_decode_sample with the library's defaults (llama.cpp's: top-k 40,
 * top-p 0.95, min-p 0.05, repeat-penalty 1) and the parameters given. Finally
 * the prefill and decode speeds. Exit status 1 on any failure. */
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

/* Streaming output: buf[0..n_pending) holds the bytes of a character not yet
 * complete (at most 3); the next piece is written right after them. */
struct text_out {
    char *buf;
    size_t cap;
    size_t n_pending;
};

/* Grows out->buf to hold at least `need` bytes. */
static llmrt_status reserve_buf(struct text_out *out, size_t need) {
    if (need <= out->cap) return LLMRT_OK;
    char *bigger = realloc(out->buf, need);
    if (bigger == NULL) return LLMRT_OUT_OF_MEMORY;
    out->buf = bigger;
    out->cap = need;
    return LLMRT_OK;
}

/* Prints the prompt as text: llmrt_detokenize of all of it (the text it came
 * from: one leading SentencePiece space dropped, control tokens omitted). */
static llmrt_status emit_text(const llmrt_model *m, const uint32_t *tokens, size_t n,
                              struct text_out *out) {
    size_t len = 0;
    llmrt_status st = llmrt_detokenize(m, tokens, n, out->buf, out->cap, &len);
    if (st == LLMRT_BUFFER_TOO_SMALL) {
        st = reserve_buf(out, len);
        if (st != LLMRT_OK) return st;
        st = llmrt_detokenize(m, tokens, n, out->buf, out->cap, &len);
    }
    if (st != LLMRT_OK) return st;
    fwrite(out->buf, 1, len, stdout);
    fflush(stdout);
    return LLMRT_OK;
}

/* Prints `token` as it appears inside the text (llmrt_token_piece: its leading
 * space kept, nothing for control tokens), holding back an incomplete UTF-8 tail
 * until the tokens that complete it arrive. */
static llmrt_status emit_token(const llmrt_model *m, uint32_t token, struct text_out *out) {
    size_t len = 0;
    llmrt_status st = llmrt_token_piece(m, token, out->buf + out->n_pending,
                                        out->cap - out->n_pending, &len);
    if (st == LLMRT_BUFFER_TOO_SMALL) {
        st = reserve_buf(out, out->n_pending + len);
        if (st != LLMRT_OK) return st;
        st = llmrt_token_piece(m, token, out->buf + out->n_pending, out->cap - out->n_pending,
                               &len);
    }
    if (st != LLMRT_OK) return st;
    size_t n = out->n_pending + len;
    size_t ready = utf8_complete_prefix(out->buf, n);
    fwrite(out->buf, 1, ready, stdout);
    out->n_pending = n - ready; /* at most 3 */
    memmove(out->buf, out->buf + ready, out->n_pending);
    fflush(stdout);
    return LLMRT_OK;
}

/* Whether the model can turn ids into text (it carries a tokenizer): models
 * without one answer LLMRT_UNSUPPORTED. */
static bool has_tokenizer(const llmrt_model *m, const llmrt_model_info *info) {
    uint32_t t = info->bos_token != UINT32_MAX ? info->bos_token : 0;
    size_t len = 0;
    llmrt_status st = llmrt_token_piece(m, t, NULL, 0, &len);
    return st == LLMRT_OK || st == LLMRT_BUFFER_TOO_SMALL;
}

static int usage(const char *argv0) {
    fprintf(stderr,
            "usage: %s MODEL.gguf [-p \"text\" | -i 1,2,3] [-n N] [-t THREADS] [--backend auto|cpu|cuda]\n"
            "       [--temp T] [--top-k K] [--top-p P] [--min-p P] [--repeat-penalty R] "
            "[--seed S]\n",
            argv0);
    return 1;
}

int main(int argc, char **argv) {
    const char *path = NULL, *ids_arg = NULL, *text_arg = NULL;
    uint32_t n_gen = 32, threads = 0;
    llmrt_backend backend = LLMRT_BACKEND_AUTO;
    /* The library's defaults, but greedy unless --temp says otherwise. */
    llmrt_sampler_params sp;
    llmrt_sampler_params_default(&sp);
    sp.temperature = 0.0f;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        int ok = 1;
        if (v != NULL && strcmp(a, "-n") == 0) ok = parse_u32(v, &n_gen);
        else if (v != NULL && strcmp(a, "-t") == 0) ok = parse_u32(v, &threads);
        else if (v != NULL && strcmp(a, "-p") == 0) text_arg = v;
        else if (v != NULL && strcmp(a, "-i") == 0) ids_arg = v;
        else if (v != NULL && strcmp(a, "--temp") == 0) ok = parse_f32(v, &sp.temperature);
        else if (v != NULL && strcmp(a, "--top-k") == 0) ok = parse_u32(v, &sp.top_k);
        else if (v != NULL && strcmp(a, "--top-p") == 0) ok = parse_f32(v, &sp.top_p);
        else if (v != NULL && strcmp(a, "--min-p") == 0) ok = parse_f32(v, &sp.min_p);
        else if (v != NULL && strcmp(a, "--repeat-penalty") == 0) ok = parse_f32(v, &sp.repetition_penalty);
        else if (v != NULL && strcmp(a, "--seed") == 0) ok = parse_u64(v, &sp.seed);
        else if (v != NULL && strcmp(a, "--backend") == 0) {
            if (strcmp(v, "auto") == 0) backend = LLMRT_BACKEND_AUTO;
            else if (strcmp(v, "cpu") == 0) backend = LLMRT_BACKEND_CPU;
            else if (strcmp(v, "cuda") == 0) backend = LLMRT_BACKEND_CUDA;
            else ok = 0;
        }
        else if (a[0] != '-' && path == NULL) {
            path = a;
            continue;
        } else return usage(argv[0]);
        if (!ok) return usage(argv[0]);
        i++;
    }
    if (path == NULL || (text_arg != NULL && ids_arg != NULL)) return usage(argv[0]);
    const bool sampling = sp.temperature > 0.0f || sp.repetition_penalty != 1.0f;

    llmrt_model_options opt;
    llmrt_model_options_default(&opt);
    opt.threads = threads;
    opt.backend = backend;
    opt.progress = progress_bar;
    llmrt_model *model = NULL;
    double t_load = now_s();
    llmrt_status st = llmrt_model_load(path, &opt, &model);
    if (st != LLMRT_OK) return fail(path, st);
    t_load = now_s() - t_load;
    fprintf(stderr, "\n");

    int rc = 1;
    uint32_t *prompt = NULL;
    uint32_t *gen_ids = NULL; /* the generated ids, printed after the text */
    float *logits = NULL;
    llmrt_cache cache = 0;
    bool text = false;
    struct text_out out = {NULL, 0, 0};
    llmrt_model_info info;
    memset(&info, 0, sizeof info);
    info.struct_size = sizeof info;
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
        printf("output: ");
        st = reserve_buf(&out, 256);
        if (st == LLMRT_OK) st = emit_text(model, prompt, n_prompt, &out); /* the prompt */
        if (st != LLMRT_OK) {
            fail("llmrt_detokenize", st);
            goto out;
        }
    } else {
        printf("output:");
    }
    fflush(stdout);

    gen_ids = malloc((n_gen ? n_gen : 1) * sizeof *gen_ids);
    uint32_t n_gen_ids = 0;
    if (!gen_ids) {
        fprintf(stderr, "out of memory\n");
        goto out;
    }
    double t_decode = now_s();
    for (uint32_t i = 0; i < n_gen; i++) {
        uint32_t next = 0;
        if (i == 0 && !sampling) {
            for (uint32_t v = 1; v < info.vocab_size; v++)
                if (logits[v] > logits[next]) next = v;
            t_decode = now_s();
        } else if (sampling) {
            st = llmrt_decode_sample(model, 1, &cache, &cur, &sp, &next);
            if (st != LLMRT_OK) {
                printf("\n");
                fail("llmrt_decode_sample", st);
                goto out;
            }
            n_decoded++;
        } else {
            st = llmrt_decode_greedy(model, 1, &cache, &cur, &next);
            if (st != LLMRT_OK) {
                printf("\n");
                fail("llmrt_decode_greedy", st);
                goto out;
            }
            n_decoded++;
        }
        gen_ids[n_gen_ids++] = next;
        if (text) {
            if (next == info.eos_token) break;
            st = emit_token(model, next, &out);
            if (st != LLMRT_OK) {
                printf("\n");
                fail("llmrt_token_piece", st);
                goto out;
            }
        } else {
            printf(" %u", next);
            fflush(stdout);
        }
        cur = next;
    }
    t_decode = now_s() - t_decode;
    if (out.n_pending > 0) fwrite(out.buf, 1, out.n_pending, stdout); /* a cut-off tail */
    printf("\n");
    if (text) {
        printf("generated ids:");
        for (uint32_t i = 0; i < n_gen_ids; i++) printf(" %u", gen_ids[i]);
        printf("\n");
    }

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
    free(out.buf);
    free(gen_ids);
    free(logits);
    free(prompt);
    return rc;
}

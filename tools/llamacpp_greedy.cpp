// llama.cpp's greedy continuation of a token sequence, with the top-1/top-2 logit margin at
// every step, as one JSON object on stdout; optionally also the prompt's logits for every
// position (raw little-endian f32, n_prompt x n_vocab).
//   llamacpp_greedy MODEL.gguf THREADS KV N_STEPS LOGITS_OUT|- TOK [TOK...]
// KV: "f32" (f32 K/V cache, flash attention off: the setting in which llama.cpp matches an f32
// reference, see ../shared/models/README.md) or "default" (llama.cpp's defaults: f16 cache,
// flash attention auto). Greedy never stops at EOS. Built by tools/make_quant_fixtures.sh
// against the vendored llama.cpp of llama-cpp-python 0.3.36 (the g++ line of
// scripts/bench-vs-llamacpp.sh --logits).
#include "llama.h"
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

int main(int argc, char ** argv) {
    if (argc < 7) {
        fprintf(stderr, "usage: %s MODEL THREADS f32|default N_STEPS LOGITS_OUT|- TOK...\n", argv[0]);
        return 2;
    }
    const int n_threads = atoi(argv[2]);
    const bool kv_f32 = strcmp(argv[3], "f32") == 0;
    const int n_steps = atoi(argv[4]);
    const char * logits_out = argv[5];
    std::vector<llama_token> toks;
    for (int i = 6; i < argc; i++) toks.push_back(atoi(argv[i]));
    llama_backend_init();
    auto mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    llama_model * model = llama_model_load_from_file(argv[1], mp);
    if (!model) { fprintf(stderr, "cannot load %s\n", argv[1]); return 1; }
    auto cp = llama_context_default_params();
    cp.n_ctx = toks.size() + n_steps + 16;
    cp.n_batch = toks.size();
    cp.n_ubatch = toks.size();
    cp.n_threads = cp.n_threads_batch = n_threads;
    if (kv_f32) {
        cp.type_k = GGML_TYPE_F32;
        cp.type_v = GGML_TYPE_F32;
        cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    }
    llama_context * ctx = llama_init_from_model(model, cp);
    if (!ctx) { fprintf(stderr, "cannot create a context\n"); return 1; }
    const int nv = llama_vocab_n_tokens(llama_model_get_vocab(model));
    llama_batch b = llama_batch_init(toks.size(), 0, 1);
    for (size_t i = 0; i < toks.size(); i++) {
        b.token[i] = toks[i]; b.pos[i] = i; b.n_seq_id[i] = 1; b.seq_id[i][0] = 0; b.logits[i] = 1;
    }
    b.n_tokens = toks.size();
    if (llama_decode(ctx, b) != 0) { fprintf(stderr, "decode failed\n"); return 1; }
    if (strcmp(logits_out, "-") != 0) {
        FILE * f = fopen(logits_out, "wb");
        if (!f) { fprintf(stderr, "cannot write %s\n", logits_out); return 1; }
        for (size_t i = 0; i < toks.size(); i++) fwrite(llama_get_logits_ith(ctx, i), sizeof(float), nv, f);
        fclose(f);
    }
    const float * lg = llama_get_logits_ith(ctx, toks.size() - 1);
    printf("{\"n_vocab\": %d, \"steps\": [", nv);
    int pos = toks.size();
    llama_batch one = llama_batch_init(1, 0, 1);
    for (int s = 0; s < n_steps; s++) {
        int i1 = 0;
        for (int j = 1; j < nv; j++) if (lg[j] > lg[i1]) i1 = j;
        int i2 = i1 == 0 ? 1 : 0;
        for (int j = 0; j < nv; j++) if (j != i1 && lg[j] > lg[i2]) i2 = j;
        printf("%s{\"id\": %d, \"top1\": %.9g, \"second_id\": %d, \"top2\": %.9g, \"margin\": %.9g}", s ? ", " : "",
               i1, lg[i1], i2, lg[i2], (double) lg[i1] - (double) lg[i2]);
        if (s + 1 == n_steps) break;
        one.token[0] = i1; one.pos[0] = pos++; one.n_seq_id[0] = 1; one.seq_id[0][0] = 0; one.logits[0] = 1;
        one.n_tokens = 1;
        if (llama_decode(ctx, one) != 0) { fprintf(stderr, "decode failed at step %d\n", s); return 1; }
        lg = llama_get_logits_ith(ctx, 0);
    }
    printf("]}\n");
    llama_batch_free(one); llama_batch_free(b); llama_free(ctx); llama_model_free(model); llama_backend_free();
    return 0;
}

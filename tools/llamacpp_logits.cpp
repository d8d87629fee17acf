// Prints llama.cpp's logits for every position of a token sequence, as raw
// little-endian f32 (n_tokens x n_vocab), to calibrate the quantized-path bound
// of tests/reference_parity.rs against llama.cpp on the same file.
//   llamacpp_logits MODEL.gguf OUT.f32 THREADS TOK [TOK...]
// Built by scripts/bench-vs-llamacpp.sh --logits (against the vendored llama.cpp).
#include "llama.h"
#include <cstdio>
#include <cstdlib>
#include <vector>

int main(int argc, char ** argv) {
    if (argc < 5) { fprintf(stderr, "usage: %s MODEL OUT THREADS TOK...\n", argv[0]); return 2; }
    std::vector<llama_token> toks;
    for (int i = 4; i < argc; i++) toks.push_back(atoi(argv[i]));
    llama_backend_init();
    auto mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    llama_model * model = llama_model_load_from_file(argv[1], mp);
    if (!model) { fprintf(stderr, "cannot load %s\n", argv[1]); return 1; }
    auto cp = llama_context_default_params();
    cp.n_ctx = toks.size() + 16;
    cp.n_batch = toks.size();
    cp.n_ubatch = toks.size();
    cp.n_threads = cp.n_threads_batch = atoi(argv[3]);
    llama_context * ctx = llama_init_from_model(model, cp);
    llama_batch b = llama_batch_init(toks.size(), 0, 1);
    for (size_t i = 0; i < toks.size(); i++) {
        b.token[i] = toks[i]; b.pos[i] = i; b.n_seq_id[i] = 1; b.seq_id[i][0] = 0; b.logits[i] = 1;
    }
    b.n_tokens = toks.size();
    if (llama_decode(ctx, b) != 0) { fprintf(stderr, "decode failed\n"); return 1; }
    int nv = llama_vocab_n_tokens(llama_model_get_vocab(model));
    FILE * f = fopen(argv[2], "wb");
    for (size_t i = 0; i < toks.size(); i++) fwrite(llama_get_logits_ith(ctx, i), sizeof(float), nv, f);
    fclose(f);
    llama_batch_free(b); llama_free(ctx); llama_model_free(model); llama_backend_free();
    return 0;
}

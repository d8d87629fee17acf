/* A minimal program built against an installed llmrt (see run.sh): loads the
 * model given on the command line, prefills two tokens and greedily decodes
 * four, printing the ids. Exit status 0 on success. */
#include <stdio.h>
#include <stdlib.h>

#include <llmrt.h>

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s MODEL.gguf\n", argv[0]);
        return 2;
    }
    llmrt_model_options opt;
    llmrt_model_options_default(&opt);
    opt.backend = LLMRT_BACKEND_CPU;
    opt.threads = 1;
    llmrt_model *m = NULL;
    llmrt_cache c = 0;
    const uint32_t prompt[2] = {1, 2};
    uint32_t tok = 3;
    if (llmrt_model_load(argv[1], &opt, &m) != LLMRT_OK ||
        llmrt_cache_reserve(m, 8, &c) != LLMRT_OK ||
        llmrt_prefill(m, c, prompt, 2, NULL) != LLMRT_OK) {
        fprintf(stderr, "consumer: %s\n", llmrt_last_error());
        llmrt_model_free(m);
        return 1;
    }
    printf("llmrt %s:", llmrt_version());
    for (int i = 0; i < 4; i++) {
        uint32_t next = 0;
        if (llmrt_decode_greedy(m, 1, &c, &tok, &next) != LLMRT_OK) {
            fprintf(stderr, "consumer: %s\n", llmrt_last_error());
            llmrt_model_free(m);
            return 1;
        }
        printf(" %u", next);
        tok = next;
    }
    printf("\nconsumer: ok\n");
    llmrt_model_free(m);
    return 0;
}

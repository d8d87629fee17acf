// The C++ wrapper from an installed llmrt: greedy ids, and an llmrt::Error.
#include <cstdio>

#include <llmrt.hpp>

int main(int argc, char **argv) {
    if (argc != 2) return 2;
    try {
        llmrt::Model model = llmrt::Model::load(argv[1]);
        llmrt::Cache cache = model.reserve(8);
        uint32_t tok = llmrt::argmax(cache.prefill({1, 2}));
        for (int i = 0; i < 4; i++) tok = cache.decode_greedy(tok);
        try {
            model.reserve(model.info().context_length + 1);
            return 1;
        } catch (const llmrt::Error &e) {
            if (e.status() != LLMRT_CONTEXT_FULL) return 1;
        }
        std::printf("consumer_cpp: ok (%u)\n", tok);
    } catch (const llmrt::Error &e) {
        std::fprintf(stderr, "consumer_cpp: %s\n", e.what());
        return 1;
    }
    return 0;
}

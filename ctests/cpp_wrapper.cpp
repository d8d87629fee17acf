// The C++ wrapper (include/llmrt.hpp) on the llama_gqa fixture: RAII (valgrind
// checks that nothing leaks), move semantics, exceptions carrying the right
// status and message, logits identical to the C API's, sampling, and text
// (tokenize/detokenize round trips, streaming pieces) on llama_gqa
// (SentencePiece) and qwen2 (byte-level BPE).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <type_traits>
#include <vector>

#include "llmrt.hpp"

#ifndef LLMRT_FIXTURES_DIR
#error "LLMRT_FIXTURES_DIR must be defined by the build (see CMakeLists.txt)"
#endif

static int g_failures = 0;

#define CHECK(cond, ...)                                                                \
    do {                                                                                \
        if (!(cond)) {                                                                  \
            std::fprintf(stderr, "%s:%d: FAIL: ", __FILE__, __LINE__);                  \
            std::fprintf(stderr, __VA_ARGS__);                                          \
            std::fputc('\n', stderr);                                                   \
            g_failures++;                                                               \
        }                                                                               \
    } while (0)

// `expr` must throw llmrt::Error with `want` and a non-empty message.
#define EXPECT_THROW_STATUS(want, expr)                                                 \
    do {                                                                                \
        bool thrown_ = false;                                                           \
        try {                                                                           \
            (void)(expr);                                                               \
        } catch (const llmrt::Error &e_) {                                              \
            thrown_ = true;                                                             \
            CHECK(e_.status() == (want), "%s threw %s (want %s): %s", #expr,            \
                  e_.status_name(), llmrt_status_name(want), e_.what());                \
            CHECK(!e_.message().empty(), "%s threw with an empty message", #expr);      \
            CHECK(std::string(e_.what()).find(e_.message()) != std::string::npos,       \
                  "what() \"%s\" lacks the message", e_.what());                        \
        }                                                                               \
        CHECK(thrown_, "%s did not throw", #expr);                                      \
    } while (0)

static_assert(!std::is_copy_constructible<llmrt::Model>::value, "Model is move-only");
static_assert(!std::is_copy_assignable<llmrt::Model>::value, "Model is move-only");
static_assert(std::is_nothrow_move_constructible<llmrt::Model>::value, "Model moves");
static_assert(std::is_nothrow_move_assignable<llmrt::Model>::value, "Model moves");
static_assert(!std::is_copy_constructible<llmrt::Cache>::value, "Cache is move-only");
static_assert(!std::is_copy_assignable<llmrt::Cache>::value, "Cache is move-only");
static_assert(std::is_nothrow_move_constructible<llmrt::Cache>::value, "Cache moves");
static_assert(std::is_nothrow_move_assignable<llmrt::Cache>::value, "Cache moves");
static_assert(std::is_base_of<std::runtime_error, llmrt::Error>::value, "Error is runtime_error");

static std::string fixture(const char *rel) { return std::string(LLMRT_FIXTURES_DIR) + "/" + rel; }

static std::string slurp(const std::string &path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) {
        std::fprintf(stderr, "cannot open %s\n", path.c_str());
        std::exit(1);
    }
    return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

// The integers of the first "key": [ ... ] array in reference.json.
static std::vector<uint32_t> json_ids(const std::string &json, const std::string &key) {
    std::vector<uint32_t> out;
    size_t p = json.find("\"" + key + "\"");
    if (p == std::string::npos) return out;
    p = json.find('[', p);
    size_t end = json.find(']', p);
    const char *s = json.c_str() + p + 1;
    const char *stop = json.c_str() + end;
    while (s < stop) {
        char *next = nullptr;
        unsigned long v = std::strtoul(s, &next, 10);
        if (next == s) {
            s++;
            continue;
        }
        out.push_back(static_cast<uint32_t>(v));
        s = next;
    }
    return out;
}

static double rel_l2(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = double(a[i]) - double(b[i]);
        num += d * d;
        den += double(b[i]) * double(b[i]);
    }
    return den == 0 ? (num == 0 ? 0 : INFINITY) : std::sqrt(num / den);
}

static llmrt_model_options cpu_options() {
    llmrt_model_options o = llmrt::default_model_options();
    o.backend = LLMRT_BACKEND_CPU;
    o.threads = 2;
    return o;
}

// Text on one fixture: the pieces of a tokenized sentence concatenate to the
// sentence as it appears inside a text (`prefix` + sentence: SentencePiece's
// dummy-prefix space, none for byte-level BPE), and detokenize gives back the
// very text it was tokenized from, with BOS or without.
static void check_text(const char *rel, const char *prefix) {
    llmrt::Model m = llmrt::Model::load(fixture(rel), cpu_options());
    const char *sentences[] = {
        "The quick brown fox jumps over the lazy dog.",
        "Hello, world!  Two spaces,\ttab and\nnewline.",
        "caf\xc3\xa9 na\xc3\xafve \xe4\xbd\xa0\xe5\xa5\xbd \xf0\x9f\x98\x80 done",
    };
    for (const char *sentence : sentences) {
        const std::string s = sentence;
        std::vector<uint32_t> ids = m.tokenize(s, false);
        std::string pieces;
        for (uint32_t id : ids) pieces += m.token_piece(id);
        CHECK(pieces == prefix + s, "%s: pieces of \"%s\" give \"%s\"", rel, sentence,
              pieces.c_str());
        std::vector<uint32_t> with_bos = m.tokenize(s, true);
        std::string streamed;
        for (uint32_t id : with_bos) streamed += m.token_piece(id); // BOS gives nothing
        CHECK(streamed == pieces, "%s: BOS has a piece", rel);
        std::string back = m.detokenize(with_bos);
        CHECK(back == s, "%s: detokenize(tokenize(\"%s\", add_bos)) = \"%s\"", rel, sentence,
              back.c_str());
        CHECK(m.detokenize(ids) == s, "%s: detokenize(tokenize(\"%s\"))", rel, sentence);
    }
    CHECK(m.detokenize(m.tokenize("", true)).empty(), "%s: empty text round trip", rel);
}

int main() {
    const std::string path = fixture("llama_gqa/llama_gqa.f32.gguf");
    const std::string ref = slurp(fixture("llama_gqa/reference.json"));
    const std::string ref_logits_bytes = slurp(fixture("llama_gqa/logits.f32"));
    const std::vector<uint32_t> prompt = json_ids(ref, "tokens");
    const std::vector<uint32_t> gprompt = json_ids(ref, "greedy_prompt");
    const std::vector<uint32_t> greedy = json_ids(ref, "greedy_ids");
    if (prompt.size() < 2 || gprompt.empty() || greedy.empty()) {
        std::fprintf(stderr, "reference.json: no tokens / greedy_prompt / greedy_ids\n");
        return 1;
    }

    try {
        // ---- errors: the right status, the library's message ----
        EXPECT_THROW_STATUS(LLMRT_IO, llmrt::Model::load(fixture("no/such/model.gguf")));
        try {
            llmrt::Model::load(fixture("no/such/model.gguf"));
        } catch (const llmrt::Error &e) {
            CHECK(std::string(e.what()).find("LLMRT_IO") != std::string::npos,
                  "what() \"%s\" does not name the status", e.what());
            CHECK(std::string(e.what()).find("model.gguf") != std::string::npos,
                  "what() \"%s\" does not name the file", e.what());
        }

        llmrt::Model model = llmrt::Model::load(path, cpu_options());
        const size_t V = model.vocab_size();
        CHECK(model.info().n_layers > 0, "info: %u layers", model.info().n_layers);
        CHECK(ref_logits_bytes.size() == prompt.size() * V * sizeof(float),
              "logits.f32 has %zu bytes", ref_logits_bytes.size());
        std::vector<float> ref_logits(prompt.size() * V);
        std::memcpy(ref_logits.data(), ref_logits_bytes.data(), ref_logits.size() * sizeof(float));

        {
            llmrt::Cache c = model.reserve(16);
            EXPECT_THROW_STATUS(LLMRT_INVALID_ARGUMENT, c.prefill({1, static_cast<uint32_t>(V)}));
            EXPECT_THROW_STATUS(LLMRT_INVALID_ARGUMENT, c.decode(static_cast<uint32_t>(V)));
            EXPECT_THROW_STATUS(LLMRT_INVALID_ARGUMENT, c.decode_greedy(UINT32_MAX));
            CHECK(c.length() == 0, "failed steps advanced the cache to %u", c.length());
            EXPECT_THROW_STATUS(LLMRT_INVALID_ARGUMENT, c.prefill(std::vector<uint32_t>{}));
            EXPECT_THROW_STATUS(LLMRT_CONTEXT_FULL, model.reserve(model.info().context_length + 1));
            EXPECT_THROW_STATUS(LLMRT_INVALID_ARGUMENT, c.truncate(5));
            EXPECT_THROW_STATUS(LLMRT_INVALID_ARGUMENT, model.decode({c}, {1, 2}));
            c.prefill({1, 2, 3});
            EXPECT_THROW_STATUS(LLMRT_CONTEXT_FULL, c.prefill(std::vector<uint32_t>(14, 5)));
            const llmrt_cache dead = c.id();
            c.release();
            CHECK(!c && c.id() == 0, "released Cache still holds an id");
            llmrt::Cache stale = llmrt::Cache::adopt(model.get(), dead);
            EXPECT_THROW_STATUS(LLMRT_UNKNOWN_CACHE, stale.length());
            EXPECT_THROW_STATUS(LLMRT_UNKNOWN_CACHE, stale.release());
            CHECK(!stale, "a Cache whose release failed still holds an id");
        }

        // ---- the wrapper's logits equal the C API's, and transformers' ----
        llmrt::Cache a = model.reserve(0);
        std::vector<float> last = a.prefill(prompt);
        std::vector<float> c_last(V);
        {
            llmrt_cache raw = 0;
            llmrt::detail::check(llmrt_cache_reserve(model.get(), 0, &raw), "reserve");
            llmrt::detail::check(
                llmrt_prefill(model.get(), raw, prompt.data(), prompt.size(), c_last.data()),
                "prefill");
            llmrt::detail::check(llmrt_cache_release(model.get(), raw), "release");
        }
        CHECK(last == c_last, "wrapper prefill logits differ from the C API's");
        const double err = rel_l2(last.data(), ref_logits.data() + (prompt.size() - 1) * V, V);
        CHECK(err < 1e-4, "last-token logits vs transformers: rel L2 %.3g", err);
        std::printf("prefill last-token logits vs reference: rel L2 %.3g\n", err);

        {
            llmrt::Cache all_c = model.reserve(0);
            std::vector<float> all = all_c.prefill_all(prompt);
            CHECK(all.size() == prompt.size() * V, "prefill_all gave %zu floats", all.size());
            for (size_t t = 0; t < prompt.size(); t++)
                CHECK(rel_l2(all.data() + t * V, ref_logits.data() + t * V, V) < 1e-4,
                      "prefill_all row %zu", t);
        }

        // ---- fork, batched decode, move semantics ----
        const uint32_t t0 = llmrt::argmax(last);
        llmrt::Cache f = a.fork();
        CHECK(f.id() != a.id() && f.length() == a.length(), "fork id/length");
        std::vector<float> rows = model.decode({a, f}, {t0, t0});
        CHECK(rows.size() == 2 * V, "decode gave %zu floats", rows.size());
        CHECK(std::equal(rows.begin(), rows.begin() + V, rows.begin() + V),
              "same token on a cache and its fork gave different logits");
        CHECK(a.length() == prompt.size() + 1 && f.length() == prompt.size() + 1,
              "lengths after batched decode: %u %u", a.length(), f.length());

        const llmrt_cache fid = f.id();
        llmrt::Cache moved(std::move(f));
        CHECK(!f && f.id() == 0, "moved-from Cache still holds an id");
        CHECK(moved.id() == fid, "moved-to Cache lost the id");
        llmrt::Cache assigned = model.reserve(4);
        assigned = std::move(moved); // releases the 4-position cache
        CHECK(assigned.id() == fid && !moved, "move assignment");
        std::vector<uint32_t> next = model.decode_greedy({a, assigned}, {1, 2});
        CHECK(next.size() == 2 && next[0] < V && next[1] < V, "decode_greedy batch");

        // ---- truncate and replay ----
        a.truncate(static_cast<uint32_t>(prompt.size() - 1));
        CHECK(a.length() == prompt.size() - 1, "length %u after truncate", a.length());
        std::vector<float> replay = a.decode(prompt.back());
        CHECK(rel_l2(replay.data(), last.data(), V) < 1e-5, "replay after truncate differs");

        // ---- greedy generation equals transformers' ----
        {
            llmrt::Cache g = model.reserve(static_cast<uint32_t>(gprompt.size() + greedy.size()));
            uint32_t cur = llmrt::argmax(g.prefill(gprompt));
            for (size_t i = 0; i < greedy.size(); i++) {
                if (cur != greedy[i]) {
                    CHECK(false, "greedy step %zu: %u, transformers %u", i, cur, greedy[i]);
                    break;
                }
                if (i + 1 < greedy.size()) cur = g.decode_greedy(cur);
            }
        }

        // ---- Model moves; a moved-from Model throws; caches keep working ----
        llmrt::Model m2 = std::move(model);
        CHECK(!model && m2, "moved-from Model still owns the model");
        EXPECT_THROW_STATUS(LLMRT_INVALID_ARGUMENT, model.reserve(4));
        CHECK(a.length() == prompt.size(), "cache broke when its Model object moved");

        {
            llmrt_sampler_params sp = llmrt::default_sampler_params();
            // llama.cpp's defaults.
            CHECK(sp.struct_size == sizeof(llmrt_sampler_params), "struct_size %u", sp.struct_size);
            CHECK(sp.temperature == 0.8f && sp.top_k == 40 && sp.top_p == 0.95f &&
                      sp.min_p == 0.05f && sp.repetition_penalty == 1.0f && sp.seed == 0,
                  "default_sampler_params: temperature %g top_k %u top_p %g min_p %g "
                  "repetition_penalty %g seed %llu",
                  sp.temperature, sp.top_k, sp.top_p, sp.min_p, sp.repetition_penalty,
                  static_cast<unsigned long long>(sp.seed));
            sp.temperature = 0.0f;
            llmrt::Cache s1 = m2.reserve(0), s2 = m2.reserve(0);
            std::vector<float> l1 = s1.prefill(gprompt);
            s2.prefill_only(gprompt);
            uint32_t g1 = llmrt::argmax(l1);
            CHECK(s1.decode_sample(g1, sp) == s2.decode_greedy(g1), "temperature 0 is not greedy");
            sp.temperature = 0.8f;
            sp.seed = 42;
            std::vector<uint32_t> sampled = m2.decode_sample({s1, s2}, {3, 3}, sp);
            CHECK(sampled.size() == 2 && sampled[0] < V && sampled[1] < V, "decode_sample batch");
            CHECK(sampled[0] == sampled[1], "same seed, same history: %u vs %u", sampled[0],
                  sampled[1]);
            EXPECT_THROW_STATUS(LLMRT_INVALID_ARGUMENT, s1.decode_sample(UINT32_MAX, sp));
            sp.top_p = 0.0f;
            const uint32_t len = s1.length();
            EXPECT_THROW_STATUS(LLMRT_INVALID_ARGUMENT, s1.decode_sample(3, sp));
            CHECK(s1.length() == len, "a rejected decode_sample advanced the cache");
        }
        {
            // ---- decode_sample_each (one parameter set per cache) and sample_logits ----
            llmrt_sampler_params greedy = llmrt::default_sampler_params();
            greedy.temperature = 0.0f;
            llmrt_sampler_params hot = llmrt::default_sampler_params();
            hot.seed = 7;
            const uint32_t forced = 5;
            const llmrt_logit_bias bias[1] = {{forced, 1000.0f}};
            llmrt_sampler_params biased = greedy;
            biased.logit_bias = bias;
            biased.n_logit_bias = 1;
            std::vector<llmrt::Cache> cs, twins;
            std::vector<float> row;
            for (int i = 0; i < 3; i++) {
                cs.push_back(m2.reserve(0));
                twins.push_back(m2.reserve(0));
                row = cs.back().prefill(gprompt);
                twins.back().prefill_only(gprompt);
            }
            std::vector<uint32_t> each =
                m2.decode_sample_each({cs[0], cs[1], cs[2]}, {3, 3, 3}, {greedy, hot, biased});
            CHECK(each.size() == 3, "decode_sample_each gave %zu tokens", each.size());
            CHECK(each[0] == twins[0].decode_greedy(3), "per-cache greedy differs from decode_greedy");
            CHECK(each[1] == twins[1].decode_sample(3, hot), "per-cache sampling differs from a lone call");
            CHECK(each[2] == forced, "a +1000 logit bias did not force token %u (got %u)", forced, each[2]);
            // sample_logits on the row a cache's prefill returned: the token a decode_sample
            // of that cache's next step would draw, here forced by the bias.
            std::vector<uint32_t> history(gprompt.begin(), gprompt.end());
            CHECK(llmrt::sample_logits(biased, row, history, gprompt.size()) == forced,
                  "sample_logits ignored the bias");
            CHECK(llmrt::sample_logits(greedy, row, history, gprompt.size()) == llmrt::argmax(row),
                  "greedy sample_logits is not the argmax");
            const uint32_t len0 = cs[0].length();
            EXPECT_THROW_STATUS(LLMRT_INVALID_ARGUMENT,
                                m2.decode_sample_each({cs[0], cs[1]}, {3, 3}, {greedy}));
            const llmrt_logit_bias bad[1] = {{static_cast<uint32_t>(V), 1.0f}};
            llmrt_sampler_params bad_bias = greedy;
            bad_bias.logit_bias = bad;
            bad_bias.n_logit_bias = 1;
            EXPECT_THROW_STATUS(LLMRT_INVALID_ARGUMENT,
                                m2.decode_sample_each({cs[0], cs[1]}, {3, 3}, {greedy, bad_bias}));
            CHECK(cs[0].length() == len0, "a rejected decode_sample_each advanced a cache");
        }
        {
            // ---- grammars (llmrt::Grammar, RAII): regex-constrained sampling, errors ----
            static_assert(!std::is_copy_constructible<llmrt::Grammar>::value, "Grammar is move-only");
            static_assert(std::is_nothrow_move_constructible<llmrt::Grammar>::value, "Grammar moves");
            llmrt::Grammar first = m2.grammar(LLMRT_GRAMMAR_REGEX, "[0-9]{2}(ab|cd)");
            llmrt::Grammar g = std::move(first);
            CHECK(!first && g, "a moved-from Grammar is empty");
            llmrt_sampler_params hot = llmrt::default_sampler_params();
            hot.temperature = 1.0f;
            hot.top_k = 0;
            hot.top_p = 1.0f;
            hot.min_p = 0.0f;
            hot.seed = 11;
            llmrt::Cache c = m2.reserve(0);
            c.prefill_only(gprompt);
            std::string text;
            uint32_t tok = 3;
            for (int i = 0; i < 16 && !g.is_done(); i++) {
                tok = m2.decode_sample_constrained({c}, {tok}, {hot}, {&g})[0];
                if (!llmrt_token_is_eog(m2.get(), tok)) text += m2.token_piece(tok);
            }
            const bool shape = text.size() == 4 && text[0] >= '0' && text[0] <= '9' && text[1] >= '0' &&
                               text[1] <= '9' && (text.substr(2) == "ab" || text.substr(2) == "cd");
            CHECK(g.is_done() && g.can_stop() && shape, "constrained text \"%s\"", text.c_str());
            const uint32_t eos = m2.info().eos_token;
            CHECK(m2.decode_sample_constrained({c}, {tok}, {hot}, {&g})[0] == eos, "done grammar: not EOS");
            g.reset();
            CHECK(!g.is_done() && !g.can_stop(), "reset grammar is complete");
            EXPECT_THROW_STATUS(LLMRT_INVALID_ARGUMENT, g.accept(eos));
            EXPECT_THROW_STATUS(LLMRT_INVALID_ARGUMENT, m2.grammar(LLMRT_GRAMMAR_JSON_SCHEMA, "{"));
            EXPECT_THROW_STATUS(LLMRT_INVALID_ARGUMENT, m2.grammar(LLMRT_GRAMMAR_REGEX, "(ab"));
            const uint32_t len = c.length();
            EXPECT_THROW_STATUS(LLMRT_INVALID_ARGUMENT, m2.decode_sample_constrained({c}, {tok}, {hot}, {&g, &g}));
            CHECK(c.length() == len, "a rejected constrained step advanced the cache");
            // The caller-held variant draws what the step would, then accept() advances.
            llmrt::Cache d = m2.reserve(0);
            d.prefill_only(gprompt);
            std::vector<float> row = d.decode(3);
            std::vector<uint32_t> hist(gprompt.begin(), gprompt.end());
            hist.push_back(3);
            uint32_t t = llmrt::sample_logits_constrained(hot, g, row, hist, hist.size());
            CHECK(t < V && text.size() > 0, "sample_logits_constrained gave %u", t);
            g.accept(t);
        }
        {
            const std::string text = "Once upon a time";
            std::vector<uint32_t> ids = m2.tokenize(text, true);
            CHECK(!ids.empty() && ids[0] == m2.info().bos_token, "tokenize with BOS");
            std::vector<uint32_t> no_bos = m2.tokenize(text, false);
            CHECK(no_bos.size() + 1 == ids.size(), "BOS adds exactly one token");
            CHECK(std::equal(no_bos.begin(), no_bos.end(), ids.begin() + 1),
                  "tokenize(add_bos) is BOS + tokenize(no BOS)");
            std::string back = m2.detokenize(no_bos);
            CHECK(back == text, "round trip gave \"%s\"", back.c_str());
            // Long inputs go through the BUFFER_TOO_SMALL resize path.
            std::string longer;
            for (int i = 0; i < 200; i++) longer += "\xc3\xa9t\xc3\xa9 ";
            std::vector<uint32_t> many = m2.tokenize(longer, false);
            std::string long_back = m2.detokenize(many);
            CHECK(long_back == longer, "long round trip gave %zu bytes, want %zu",
                  long_back.size(), longer.size());
            EXPECT_THROW_STATUS(LLMRT_INVALID_ARGUMENT,
                                m2.detokenize(std::vector<uint32_t>{UINT32_MAX}));
            EXPECT_THROW_STATUS(LLMRT_INVALID_ARGUMENT,
                                m2.detokenize(std::vector<uint32_t>{static_cast<uint32_t>(V)}));
            EXPECT_THROW_STATUS(LLMRT_INVALID_ARGUMENT, m2.token_piece(static_cast<uint32_t>(V)));
            EXPECT_THROW_STATUS(LLMRT_INVALID_ARGUMENT, m2.tokenize("a\xff" "b", false));
            CHECK(m2.token_piece(m2.info().bos_token).empty(), "BOS has a piece: \"%s\"",
                  m2.token_piece(m2.info().bos_token).c_str());
            CHECK(m2.token_piece(m2.info().eos_token).empty(), "EOS has a piece");
        }
        {
            // Saved states: a loaded cache continues bit for bit; damaged ones throw.
            llmrt::Cache src = m2.reserve(32);
            src.prefill_only({1, 45, 96, 17, 211, 15, 197});
            std::vector<uint8_t> state = src.save();
            CHECK(state.size() == 52 + 4 * 7 + 7 * m2.info().kv_bytes_per_position,
                  "state of %zu bytes", state.size());
            llmrt::Cache back = m2.load_cache(state);
            CHECK(back.length() == 7, "loaded length %u", back.length());
            std::vector<float> x = src.decode(42), y = back.decode(42);
            CHECK(std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0,
                  "logits after the load differ");
            CHECK(back.save().size() == state.size() + 4 + m2.info().kv_bytes_per_position,
                  "the state grows by one position");
            std::vector<uint8_t> cut(state.begin(), state.end() - 1);
            EXPECT_THROW_STATUS(LLMRT_INVALID_ARGUMENT, m2.load_cache(cut));
            std::vector<uint8_t> flipped = state;
            flipped[100] ^= 1;
            EXPECT_THROW_STATUS(LLMRT_INVALID_ARGUMENT, m2.load_cache(flipped));
            EXPECT_THROW_STATUS(LLMRT_INVALID_ARGUMENT, m2.load_cache(state, 6));
        }
        // Caches go before their Model: m2 was declared last, so it would be
        // destroyed first; release them explicitly.
        assigned.release();
        a.release();

        // ---- embeddings against transformers (tools/make_embedding_fixtures.py) ----
        {
            llmrt::Model em = llmrt::Model::load(path, cpu_options());
            const std::string mean_bytes = slurp(fixture("llama_gqa/embed_mean_norm.f32"));
            const size_t H = em.info().hidden_size;
            CHECK(mean_bytes.size() == H * sizeof(float), "embed_mean_norm.f32 has %zu bytes",
                  mean_bytes.size());
            std::vector<float> want(H);
            std::memcpy(want.data(), mean_bytes.data(), H * sizeof(float));
            std::vector<float> got = em.embed(prompt); /* mean, normalized */
            double num = 0, den = 0;
            for (size_t i = 0; i < H && i < got.size(); i++) {
                num += (got[i] - want[i]) * (double)(got[i] - want[i]);
                den += want[i] * (double)want[i];
            }
            CHECK(got.size() == H && std::sqrt(num / den) < 1e-5,
                  "embed: %zu floats, relative L2 %.3e vs transformers", got.size(),
                  std::sqrt(num / den));
            CHECK(em.embed(prompt, LLMRT_POOLING_NONE, false).size() == prompt.size() * H,
                  "embed NONE size");
            EXPECT_THROW_STATUS(LLMRT_INVALID_ARGUMENT, em.embed({}));

            // ---- set_abort: a std::function polled during steps ----
            int polls = 0;
            em.set_abort([&polls] { return ++polls > 1; });
            llmrt::Cache c = em.reserve(0);
            EXPECT_THROW_STATUS(LLMRT_ABORTED, c.prefill(prompt));
            CHECK(c.length() == 0, "an aborted prefill committed %u positions", c.length());
            CHECK(polls == 2, "abort polled %d times before stopping", polls);
            em.set_abort([]() -> bool { throw std::runtime_error("boom"); });
            EXPECT_THROW_STATUS(LLMRT_ABORTED, c.prefill(prompt));
            em.set_abort(nullptr);
            std::vector<float> logits = c.prefill(prompt);
            CHECK(logits.size() == V && c.length() == prompt.size(),
                  "prefill after removing the abort function");
            c.release();

            // ---- generate: greedy equals transformers' greedy ids; pieces streamed ----
            llmrt::Cache g = em.reserve(0);
            std::string streamed;
            size_t calls = 0;
            llmrt::Generated out = g.generate(gprompt, static_cast<uint32_t>(greedy.size()), nullptr,
                                              [&](uint32_t id, std::string_view piece) {
                                                  calls++;
                                                  streamed += piece;
                                                  return !em.is_eog(id);
                                              });
            CHECK(out.reason == LLMRT_STOP_MAX_TOKENS && out.tokens == greedy,
                  "generate: %zu tokens (reason %d), not transformers' greedy ids", out.tokens.size(),
                  (int)out.reason);
            CHECK(calls == greedy.size(), "on_token called %zu times", calls);
            std::string pieces;
            for (uint32_t id : out.tokens) pieces += em.token_piece(id);
            CHECK(streamed == pieces, "streamed pieces differ from token_piece");
            CHECK(g.length() == gprompt.size() + greedy.size() - 1, "cache holds %u positions", g.length());
            // An exception in on_token stops the generation and reaches the caller.
            llmrt::Cache h = em.reserve(0);
            bool caught = false;
            try {
                h.generate(gprompt, 8, nullptr, [](uint32_t, std::string_view) -> bool {
                    throw std::runtime_error("stop here");
                });
            } catch (const std::runtime_error &e) {
                caught = std::string(e.what()) == "stop here";
            }
            CHECK(caught, "the callback's exception was not rethrown");
            CHECK(h.length() == gprompt.size(), "cache holds %u after the exception", h.length());
            // chat_apply with a given template (the fixture carries none).
            std::string r = em.chat_apply({{"user", "hi"}}, true, "{{ messages[0].content }}|{{ add_generation_prompt }}");
            CHECK(r == "hi|True", "chat_apply gave \"%s\"", r.c_str());
            EXPECT_THROW_STATUS(LLMRT_UNSUPPORTED, em.chat_apply({{"user", "hi"}}));
            EXPECT_THROW_STATUS(LLMRT_UNSUPPORTED, em.chat_template());
            std::vector<uint32_t> eog = em.eog_tokens();
            CHECK(eog.size() == 1 && eog[0] == em.info().eos_token && em.is_eog(eog[0]),
                  "eog_tokens: %zu ids", eog.size());
            // The stop matcher over pieces split inside a stop string and a character.
            llmrt::StopMatcher sm({"END", "\xc3\xa9t\xc3\xa9"});
            std::string shown;
            int hit = -2;
            for (const char *p : {"Sum", "mer E", "N", "D and more"}) shown += sm.feed(p, &hit);
            CHECK(shown == "Summer " && hit == 0, "stop matcher showed \"%s\", hit %d", shown.c_str(), hit);
            CHECK(sm.flush().empty(), "flush after a match gave text");
            llmrt::StopMatcher sm2({"END"});
            std::string s2 = sm2.feed("caf\xc3", &hit);
            s2 += sm2.feed("\xa9 E", &hit);
            CHECK(hit == -1 && s2 == "caf\xc3\xa9 ", "held back: \"%s\"", s2.c_str());
            s2 += sm2.flush();
            CHECK(s2 == "caf\xc3\xa9 E", "after flush: \"%s\"", s2.c_str());
            g.release();
            h.release();
        }

        check_text("llama_gqa/llama_gqa.f32.gguf", " "); // SentencePiece
        check_text("qwen2/qwen2.f32.gguf", "");          // byte-level BPE
    } catch (const llmrt::Error &e) {
        std::fprintf(stderr, "unexpected llmrt::Error: %s\n", e.what());
        return 1;
    }

    if (g_failures) {
        std::fprintf(stderr, "cpp_wrapper: %d failure(s)\n", g_failures);
        return 1;
    }
    std::printf("cpp_wrapper: ok\n");
    return 0;
}

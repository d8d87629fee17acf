/* llmrt.hpp: header-only C++17 wrapper over the llmrt C API (llmrt.h).
 *
 *   llmrt::Model model = llmrt::Model::load("model.gguf");
 *   llmrt::Cache cache = model.reserve(64);
 *   std::vector<float> logits = cache.prefill({1, 450, 4996});
 *   uint32_t next = cache.decode_greedy(llmrt::argmax(logits));
 *
 * Ownership
 * - Model owns one llmrt_model* and frees it in its destructor. Move-only; a
 *   moved-from Model is empty (get() == nullptr) and every call on it throws
 *   llmrt::Error(LLMRT_INVALID_ARGUMENT).
 * - Cache owns one cache id and holds a non-owning pointer to the C model; its
 *   destructor releases the id. Move-only. A Cache must be destroyed (or
 *   release()d) before the Model it came from: llmrt_model_free releases every
 *   cache of the model, and a Cache outliving it would touch a freed model.
 *   Moving the Model object is fine (the C model stays where it is).
 *
 * Errors: every failing call throws llmrt::Error, a std::runtime_error whose
 * status() is the llmrt_status and whose message() is llmrt_last_error() of the
 * failing call; what() is "function: LLMRT_STATUS: message". Destructors never
 * throw.
 *
 * Thread safety: as the C API. Any member may be called from any thread; calls
 * that touch one model are serialised inside the library. The C++ objects
 * themselves are not synchronised: do not move, assign or destroy a Model or
 * Cache while another thread is using that same object, and destroy every Cache
 * and use of a Model before destroying the Model.
 *
 * Text: Model::tokenize, Model::detokenize (a whole text) and Model::token_piece
 * (one token as it appears inside a text: what streaming output prints). Sampling:
 * default_sampler_params(), Cache::decode_sample, Model::decode_sample,
 * Model::decode_sample_each (per-cache params), sample_logits (caller-held logits).
 * Constrained output: Model::grammar (a JSON schema, regex or Lark grammar; one Grammar
 * per request, RAII, move-only), Model::decode_sample_constrained, and
 * sample_logits_constrained (caller-held logits; then Grammar::accept).
 * Chat: Model::chat_apply (the model's template, or one given), Model::chat_template,
 * Model::is_eog, Model::eog_tokens, StopMatcher (streamed stop strings),
 * Cache::generate (stops at end of generation, streams pieces). Embeddings: Model::embed. Cancellation: Model::set_abort (a std::function polled
 * during every step; true aborts it with LLMRT_ABORTED, nothing committed).
 */
#ifndef LLMRT_HPP
#define LLMRT_HPP

#include <cstddef>
#include <cstdint>
#include <exception>
#include <initializer_list>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "llmrt.h"

namespace llmrt {

/* A failed llmrt call: the status and llmrt_last_error() of that call. */
class Error : public std::runtime_error {
  public:
    Error(llmrt_status status, const std::string &function, const std::string &message)
        : std::runtime_error(function + ": " + llmrt_status_name(status) + ": " + message),
          status_(status), message_(message) {}

    llmrt_status status() const noexcept { return status_; }
    /* The library's message (llmrt_last_error()), without function and status. */
    const std::string &message() const noexcept { return message_; }
    /* "LLMRT_IO", ... */
    const char *status_name() const noexcept { return llmrt_status_name(status_); }

  private:
    llmrt_status status_;
    std::string message_;
};

namespace detail {
/* Throws llmrt::Error for anything but LLMRT_OK; reads llmrt_last_error() at once,
 * before any other llmrt call on this thread can replace it. */
inline void check(llmrt_status status, const char *function) {
    if (status != LLMRT_OK) throw Error(status, function, llmrt_last_error());
}
[[noreturn]] inline void fail(llmrt_status status, const char *function, const std::string &msg) {
    throw Error(status, function, msg);
}
} // namespace detail

inline const char *version() noexcept { return llmrt_version(); }

/* Index of the largest of n values (the first on ties); 0 for n == 0. */
inline uint32_t argmax(const float *values, size_t n) noexcept {
    size_t best = 0;
    for (size_t i = 1; i < n; i++)
        if (values[i] > values[best]) best = i;
    return static_cast<uint32_t>(best);
}
inline uint32_t argmax(const std::vector<float> &values) noexcept {
    return argmax(values.data(), values.size());
}

/* llmrt_model_options filled with the library's defaults. */
inline llmrt_model_options default_model_options() noexcept {
    llmrt_model_options options{};
    llmrt_model_options_init(&options, sizeof options); /* never overrun by a newer library */
    return options;
}

/* llmrt_sampler_params filled with the library's defaults (llama.cpp's: temperature
 * 0.8, top_k 40, top_p 0.95, min_p 0.05, repetition_penalty 1, seed 0; no
 * frequency/presence penalty or logit bias, penalty window the whole cache). */
inline llmrt_sampler_params default_sampler_params() noexcept {
    llmrt_sampler_params params{};
    llmrt_sampler_params_init(&params, sizeof params); /* never overrun by a newer library */
    return params;
}

/* A token sampled from caller-held logits (llmrt_sample_logits), as decode_sample
 * does: `history` plays the cache's tokens for the penalties, `position` the new
 * token's position for the seeded draw. params.logit_bias, when set, must stay alive
 * during the call. */
inline uint32_t sample_logits(const llmrt_sampler_params &params, const std::vector<float> &logits,
                              const std::vector<uint32_t> &history, uint64_t position) {
    uint32_t token = 0;
    detail::check(llmrt_sample_logits(&params, logits.data(), logits.size(),
                                      history.empty() ? nullptr : history.data(), history.size(),
                                      position, &token),
                  "llmrt_sample_logits");
    return token;
}

class Model;

/* One chat message (llmrt_chat_message with owned strings). */
struct ChatMessage {
    std::string role;
    std::string content;
};

/* What Cache::generate produced: the tokens (an end-of-generation id last when that
 * stopped it; the cache holds every one but the last) and why it stopped. */
struct Generated {
    std::vector<uint32_t> tokens;
    llmrt_stop_reason reason = LLMRT_STOP_EOG;
};

/* One KV cache (one request). Created by Model::reserve or Cache::fork. */
class Cache {
  public:
    Cache() noexcept = default;
    Cache(const Cache &) = delete;
    Cache &operator=(const Cache &) = delete;
    Cache(Cache &&other) noexcept
        : model_(std::exchange(other.model_, nullptr)), id_(std::exchange(other.id_, 0)) {}
    Cache &operator=(Cache &&other) noexcept {
        if (this != &other) {
            reset();
            model_ = std::exchange(other.model_, nullptr);
            id_ = std::exchange(other.id_, 0);
        }
        return *this;
    }
    ~Cache() { reset(); }

    /* Takes ownership of an id reserved on `model` with the C API. */
    static Cache adopt(llmrt_model *model, llmrt_cache id) noexcept { return Cache(model, id); }

    llmrt_cache id() const noexcept { return id_; }
    llmrt_model *model() const noexcept { return model_; }
    explicit operator bool() const noexcept { return id_ != 0; }
    /* Gives up ownership: the caller releases the id. */
    llmrt_cache detach() noexcept {
        model_ = nullptr;
        return std::exchange(id_, 0);
    }

    /* Releases the id now (throws on failure); the Cache becomes empty either way. */
    void release() {
        llmrt_model *m = std::exchange(model_, nullptr);
        llmrt_cache id = std::exchange(id_, 0);
        detail::check(llmrt_cache_release(m, id), "llmrt_cache_release");
    }

    /* Positions the cache holds. */
    uint32_t length() const {
        uint32_t n = 0;
        detail::check(llmrt_cache_length(model_, id_, &n), "llmrt_cache_length");
        return n;
    }

    /* Keeps the first `positions` tokens, drops the rest. */
    void truncate(uint32_t positions) {
        detail::check(llmrt_cache_truncate(model_, id_, positions), "llmrt_cache_truncate");
    }

    /* A new cache with the same tokens, sharing KV blocks copy-on-write. */
    Cache fork() const {
        llmrt_cache out = 0;
        detail::check(llmrt_cache_fork(model_, id_, &out), "llmrt_cache_fork");
        return Cache(model_, out);
    }

    /* The cache's saved state (llmrt_cache_save): its KV, tokens and capacity as bytes
     * that Model::load_cache turns back into a cache. The cache is not changed. */
    std::vector<uint8_t> save() const {
        std::vector<uint8_t> state;
        for (;;) {
            size_t n = 0;
            llmrt_status st = llmrt_cache_save(model_, id_, state.data(), state.size(), &n);
            if (st == LLMRT_BUFFER_TOO_SMALL && n > state.size()) {
                state.resize(n); /* again: the cache may have grown on another thread */
                continue;
            }
            detail::check(st, "llmrt_cache_save");
            state.resize(n);
            return state;
        }
    }

    /* Appends tokens as one prefill; logits_out: NULL or vocab_size floats. */
    void prefill(const uint32_t *tokens, size_t n, float *logits_out) {
        detail::check(llmrt_prefill(model_, id_, tokens, n, logits_out), "llmrt_prefill");
    }
    /* Appends tokens; returns the last token's logits (vocab_size floats). */
    std::vector<float> prefill(const std::vector<uint32_t> &tokens) {
        std::vector<float> logits(vocab());
        prefill(tokens.data(), tokens.size(), logits.data());
        return logits;
    }
    std::vector<float> prefill(std::initializer_list<uint32_t> tokens) {
        return prefill(std::vector<uint32_t>(tokens));
    }
    /* Appends tokens without computing logits. */
    void prefill_only(const std::vector<uint32_t> &tokens) {
        prefill(tokens.data(), tokens.size(), nullptr);
    }

    /* Appends tokens; returns every token's logits, tokens.size() x vocab_size row-major. */
    std::vector<float> prefill_all(const std::vector<uint32_t> &tokens) {
        std::vector<float> logits(tokens.size() * vocab());
        detail::check(llmrt_prefill_all(model_, id_, tokens.data(), tokens.size(), logits.data()),
                      "llmrt_prefill_all");
        return logits;
    }

    /* One decode step on this cache alone: appends `token`, returns its logits. */
    std::vector<float> decode(uint32_t token) {
        std::vector<float> logits(vocab());
        detail::check(llmrt_decode(model_, 1, &id_, &token, logits.data()), "llmrt_decode");
        return logits;
    }
    /* Appends `token`; returns the argmax of its logits. */
    uint32_t decode_greedy(uint32_t token) {
        uint32_t next = 0;
        detail::check(llmrt_decode_greedy(model_, 1, &id_, &token, &next), "llmrt_decode_greedy");
        return next;
    }
    /* Appends `token`; returns a token sampled from its logits. */
    uint32_t decode_sample(uint32_t token, const llmrt_sampler_params &params) {
        uint32_t next = 0;
        detail::check(llmrt_decode_sample(model_, 1, &id_, &token, &params, &next),
                      "llmrt_decode_sample");
        return next;
    }

    /* llmrt_generate: feeds `prompt` (at least one token; to continue, the last
     * generated one), then generates up to max_tokens tokens, sampled with `params`
     * (nullptr: greedy), stopping at an end-of-generation id. `on_token(id, piece)` is
     * called for each other token and returns false to stop; an exception it throws
     * stops the generation and is rethrown here. */
    Generated generate(const std::vector<uint32_t> &prompt, uint32_t max_tokens,
                       const llmrt_sampler_params *params = nullptr,
                       std::function<bool(uint32_t, std::string_view)> on_token = {}) {
        struct State {
            std::function<bool(uint32_t, std::string_view)> *fn;
            std::exception_ptr error;
        } st{&on_token, nullptr};
        auto trampoline = [](void *user, uint32_t token, const char *piece, size_t len) -> bool {
            State *s = static_cast<State *>(user);
            if (!*s->fn) return true;
            try {
                return (*s->fn)(token, std::string_view(piece, len));
            } catch (...) {
                s->error = std::current_exception();
                return false;
            }
        };
        Generated g;
        g.tokens.resize(max_tokens);
        size_t n = 0;
        llmrt_status status =
            llmrt_generate(model_, id_, prompt.data(), prompt.size(), params, max_tokens, trampoline,
                           &st, g.tokens.data(), g.tokens.size(), &n, &g.reason);
        g.tokens.resize(n);
        if (st.error) std::rethrow_exception(st.error);
        detail::check(status, "llmrt_generate");
        return g;
    }

  private:
    friend class Model;
    Cache(llmrt_model *model, llmrt_cache id) noexcept : model_(model), id_(id) {}

    void reset() noexcept {
        if (id_ != 0) (void)llmrt_cache_release(model_, id_);
        model_ = nullptr;
        id_ = 0;
    }

    size_t vocab() const {
        llmrt_model_info info{};
        info.struct_size = sizeof info;
        detail::check(llmrt_model_get_info(model_, &info), "llmrt_model_get_info");
        return info.vocab_size;
    }

    llmrt_model *model_ = nullptr;
    llmrt_cache id_ = 0;
};

/* One request's grammar state (llmrt_grammar): made by Model::grammar, freed by its
 * destructor. Move-only. It may outlive its Model but is used only with that model's
 * caches; one call at a time on a Grammar. */
class Grammar {
  public:
    Grammar() noexcept = default;
    Grammar(const Grammar &) = delete;
    Grammar &operator=(const Grammar &) = delete;
    Grammar(Grammar &&other) noexcept : g_(std::exchange(other.g_, nullptr)) {}
    Grammar &operator=(Grammar &&other) noexcept {
        if (this != &other) {
            llmrt_grammar_free(g_);
            g_ = std::exchange(other.g_, nullptr);
        }
        return *this;
    }
    ~Grammar() { llmrt_grammar_free(g_); }

    /* Compiles `source` of `kind` for `model` (llmrt_grammar_new): a bad or
     * unsatisfiable grammar throws llmrt::Error with llguidance's message. */
    Grammar(llmrt_model *model, llmrt_grammar_kind kind, const std::string &source) {
        detail::check(llmrt_grammar_new(model, kind, source.c_str(), &g_), "llmrt_grammar_new");
    }

    llmrt_grammar *get() const noexcept { return g_; }
    explicit operator bool() const noexcept { return g_ != nullptr; }

    /* Advances by a token chosen outside the constrained step; a token the grammar does
     * not allow throws and changes nothing. */
    void accept(uint32_t token) { detail::check(llmrt_grammar_accept(g_, token), "llmrt_grammar_accept"); }
    /* Back to the start state. */
    void reset() { detail::check(llmrt_grammar_reset(g_), "llmrt_grammar_reset"); }
    /* Done: only end-of-sequence can follow (a constrained step then gives EOS). */
    bool is_done() const {
        bool done = false;
        detail::check(llmrt_grammar_is_done(g_, &done), "llmrt_grammar_is_done");
        return done;
    }
    /* The output so far is complete (end-of-sequence is allowed now). */
    bool can_stop() const {
        bool stop = false;
        detail::check(llmrt_grammar_can_stop(g_, &stop), "llmrt_grammar_can_stop");
        return stop;
    }

  private:
    llmrt_grammar *g_ = nullptr;
};

/* sample_logits under `grammar` (llmrt_sample_logits_constrained): logits.size() must be
 * the model's vocabulary size. The grammar is not advanced: accept() the token. */
inline uint32_t sample_logits_constrained(const llmrt_sampler_params &params, Grammar &grammar,
                                          const std::vector<float> &logits,
                                          const std::vector<uint32_t> &history, uint64_t position) {
    uint32_t token = 0;
    detail::check(llmrt_sample_logits_constrained(&params, grammar.get(), logits.data(), logits.size(),
                                                  history.empty() ? nullptr : history.data(),
                                                  history.size(), position, &token),
                  "llmrt_sample_logits_constrained");
    return token;
}

/* A streaming stop-string matcher (llmrt_stop_matcher): feed() each generated piece and
 * show what it returns; it holds back text that may begin a stop string and never shows
 * part of one. Move-only; freed by its destructor. */
class StopMatcher {
  public:
    explicit StopMatcher(const std::vector<std::string> &stops) {
        std::vector<const char *> p;
        p.reserve(stops.size());
        for (const std::string &s : stops) p.push_back(s.c_str());
        detail::check(llmrt_stop_matcher_new(p.data(), p.size(), &m_), "llmrt_stop_matcher_new");
    }
    StopMatcher(const StopMatcher &) = delete;
    StopMatcher &operator=(const StopMatcher &) = delete;
    StopMatcher(StopMatcher &&other) noexcept : m_(std::exchange(other.m_, nullptr)) {}
    StopMatcher &operator=(StopMatcher &&other) noexcept {
        if (this != &other) {
            llmrt_stop_matcher_free(m_);
            m_ = std::exchange(other.m_, nullptr);
        }
        return *this;
    }
    ~StopMatcher() { llmrt_stop_matcher_free(m_); }

    /* The text now safe to show; `stop` (when not null) gets the index of the stop string
     * that matched, or -1. Once one matched the generation is over. */
    std::string feed(std::string_view piece, int *stop = nullptr) {
        std::string out(piece.size() + 64, '\0');
        for (int attempt = 0;; attempt++) {
            size_t len = 0;
            uint32_t hit = UINT32_MAX;
            llmrt_status st = llmrt_stop_matcher_feed(m_, piece.data(), piece.size(), &out[0], out.size(), &len, &hit);
            if (st == LLMRT_BUFFER_TOO_SMALL && attempt == 0 && len > out.size()) {
                out.resize(len);
                continue;
            }
            detail::check(st, "llmrt_stop_matcher_feed");
            out.resize(len);
            if (stop) *stop = hit == UINT32_MAX ? -1 : static_cast<int>(hit);
            return out;
        }
    }
    /* End of generation: the text still held back (nothing once a stop string matched). */
    std::string flush() {
        std::string out(64, '\0');
        for (int attempt = 0;; attempt++) {
            size_t len = 0;
            llmrt_status st = llmrt_stop_matcher_flush(m_, &out[0], out.size(), &len);
            if (st == LLMRT_BUFFER_TOO_SMALL && attempt == 0 && len > out.size()) {
                out.resize(len);
                continue;
            }
            detail::check(st, "llmrt_stop_matcher_flush");
            out.resize(len);
            return out;
        }
    }

  private:
    llmrt_stop_matcher *m_ = nullptr;
};

/* A batch for Model::decode*: references to distinct caches of one model. */
using CacheBatch = std::vector<std::reference_wrapper<Cache>>;

/* A loaded model. */
class Model {
  public:
    Model() noexcept = default;
    Model(const Model &) = delete;
    Model &operator=(const Model &) = delete;
    Model(Model &&other) noexcept
        : model_(std::exchange(other.model_, nullptr)), info_(other.info_),
          abort_(std::move(other.abort_)) {}
    Model &operator=(Model &&other) noexcept {
        if (this != &other) {
            llmrt_model_free(model_);
            model_ = std::exchange(other.model_, nullptr);
            info_ = other.info_;
            abort_ = std::move(other.abort_);
        }
        return *this;
    }
    ~Model() { llmrt_model_free(model_); }

    /* Loads a GGUF file; options NULL = defaults (see default_model_options()). */
    static Model load(const std::string &path, const llmrt_model_options *options = nullptr) {
        llmrt_model *m = nullptr;
        detail::check(llmrt_model_load(path.c_str(), options, &m), "llmrt_model_load");
        Model model(m);
        model.info_.struct_size = sizeof model.info_;
        llmrt_status st = llmrt_model_get_info(m, &model.info_);
        detail::check(st, "llmrt_model_get_info"); /* ~Model frees m */
        return model;
    }
    static Model load(const std::string &path, const llmrt_model_options &options) {
        return load(path, &options);
    }

    llmrt_model *get() const noexcept { return model_; }
    explicit operator bool() const noexcept { return model_ != nullptr; }

    /* The description read at load time. */
    const llmrt_model_info &info() const {
        live();
        return info_;
    }
    uint32_t vocab_size() const { return info().vocab_size; }

    /* A cache for `positions` tokens (0 = the full context length). */
    Cache reserve(uint32_t positions = 0) {
        live();
        llmrt_cache id = 0;
        detail::check(llmrt_cache_reserve(model_, positions, &id), "llmrt_cache_reserve");
        return Cache(model_, id);
    }

    /* A new cache from a saved state (llmrt_cache_load): `positions` reserved, 0 = the
     * saved cache's capacity. Another model's, a damaged or another version's state
     * throws LLMRT_INVALID_ARGUMENT naming the offset; nothing is reserved then. */
    Cache load_cache(const uint8_t *state, size_t len, uint32_t positions = 0) {
        live();
        llmrt_cache id = 0;
        detail::check(llmrt_cache_load(model_, state, len, positions, &id), "llmrt_cache_load");
        return Cache(model_, id);
    }
    Cache load_cache(const std::vector<uint8_t> &state, uint32_t positions = 0) {
        return load_cache(state.data(), state.size(), positions);
    }

    /* One step for several caches: appends tokens[i] to caches[i]. Returns
     * caches.size() x vocab_size logits, row i for caches[i]. */
    std::vector<float> decode(const CacheBatch &caches, const std::vector<uint32_t> &tokens) {
        std::vector<llmrt_cache> ids = batch_ids(caches, tokens, "llmrt_decode");
        std::vector<float> logits(ids.size() * static_cast<size_t>(info_.vocab_size));
        detail::check(llmrt_decode(model_, ids.size(), ids.data(), tokens.data(), logits.data()),
                      "llmrt_decode");
        return logits;
    }
    /* As decode, returning each cache's argmax token. */
    std::vector<uint32_t> decode_greedy(const CacheBatch &caches,
                                        const std::vector<uint32_t> &tokens) {
        std::vector<llmrt_cache> ids = batch_ids(caches, tokens, "llmrt_decode_greedy");
        std::vector<uint32_t> next(ids.size());
        detail::check(
            llmrt_decode_greedy(model_, ids.size(), ids.data(), tokens.data(), next.data()),
            "llmrt_decode_greedy");
        return next;
    }
    /* As decode, returning one sampled token per cache (params shared by all). */
    std::vector<uint32_t> decode_sample(const CacheBatch &caches,
                                        const std::vector<uint32_t> &tokens,
                                        const llmrt_sampler_params &params) {
        std::vector<llmrt_cache> ids = batch_ids(caches, tokens, "llmrt_decode_sample");
        std::vector<uint32_t> next(ids.size());
        detail::check(llmrt_decode_sample(model_, ids.size(), ids.data(), tokens.data(), &params,
                                          next.data()),
                      "llmrt_decode_sample");
        return next;
    }
    /* As decode_sample with one parameter set per cache (params[i] samples caches[i];
     * llmrt_decode_sample_each): each token is the one a lone decode_sample with
     * params[i] gives. Bad parameters anywhere fail the step; no cache moves. */
    std::vector<uint32_t> decode_sample_each(const CacheBatch &caches,
                                             const std::vector<uint32_t> &tokens,
                                             const std::vector<llmrt_sampler_params> &params) {
        std::vector<llmrt_cache> ids = batch_ids(caches, tokens, "llmrt_decode_sample_each");
        if (params.size() != ids.size())
            throw Error(LLMRT_INVALID_ARGUMENT, "llmrt_decode_sample_each",
                        std::to_string(params.size()) + " parameter sets for " +
                            std::to_string(ids.size()) + " caches");
        std::vector<const llmrt_sampler_params *> ptrs;
        ptrs.reserve(params.size());
        for (const llmrt_sampler_params &p : params) ptrs.push_back(&p);
        std::vector<uint32_t> next(ids.size());
        detail::check(llmrt_decode_sample_each(model_, ids.size(), ids.data(), tokens.data(),
                                               ptrs.data(), next.data()),
                      "llmrt_decode_sample_each");
        return next;
    }

    /* A grammar for one request of this model (llmrt_grammar_new). */
    Grammar grammar(llmrt_grammar_kind kind, const std::string &source) const {
        live();
        return Grammar(model_, kind, source);
    }

    /* As decode_sample_each under grammars (llmrt_decode_sample_constrained): grammars[i]
     * constrains caches[i] (nullptr: unconstrained) and is advanced by its token; a done
     * grammar gives the model's EOS. Any failure throws and changes no cache and no
     * grammar. */
    std::vector<uint32_t> decode_sample_constrained(const CacheBatch &caches,
                                                    const std::vector<uint32_t> &tokens,
                                                    const std::vector<llmrt_sampler_params> &params,
                                                    const std::vector<Grammar *> &grammars) {
        const char *fn = "llmrt_decode_sample_constrained";
        std::vector<llmrt_cache> ids = batch_ids(caches, tokens, fn);
        if (params.size() != ids.size() || grammars.size() != ids.size())
            detail::fail(LLMRT_INVALID_ARGUMENT, fn,
                         std::to_string(params.size()) + " parameter sets and " +
                             std::to_string(grammars.size()) + " grammars for " +
                             std::to_string(ids.size()) + " caches");
        std::vector<const llmrt_sampler_params *> ps;
        std::vector<llmrt_grammar *> gs;
        for (const llmrt_sampler_params &p : params) ps.push_back(&p);
        for (Grammar *g : grammars) gs.push_back(g ? g->get() : nullptr);
        std::vector<uint32_t> next(ids.size());
        detail::check(llmrt_decode_sample_constrained(model_, ids.size(), ids.data(), tokens.data(),
                                                      ps.data(), gs.data(), next.data()),
                      fn);
        return next;
    }

    /* Text -> token ids. add_bos puts BOS first where the model's tokenizer asks for
     * one (Llama-style SentencePiece models; usually not byte-level BPE ones). */
    std::vector<uint32_t> tokenize(std::string_view text, bool add_bos = true) const {
        return tokenize(text, add_bos, true);
    }
    /* llmrt_tokenize_ex: parse_special = false tokenizes special tokens written in the
     * text ("<s>", "<|im_start|>") as text: use it for untrusted input. */
    std::vector<uint32_t> tokenize(std::string_view text, bool add_bos, bool parse_special) const {
        live();
        std::vector<uint32_t> tokens(text.size() + 2);
        for (int attempt = 0;; attempt++) {
            size_t n = 0;
            llmrt_status st = llmrt_tokenize_ex(model_, text.data(), text.size(), add_bos, parse_special,
                                                tokens.data(), tokens.size(), &n);
            if (st == LLMRT_BUFFER_TOO_SMALL && attempt == 0 && n > tokens.size()) {
                tokens.resize(n);
                continue;
            }
            detail::check(st, "llmrt_tokenize_ex");
            tokens.resize(n);
            return tokens;
        }
    }
    /* Token ids -> the text they stand for: detokenize(tokenize(s)) == s (one leading
     * SentencePiece space is dropped). A byte-fallback token may end inside a
     * multi-byte character. For streaming, print token_piece() of each token. */
    std::string detokenize(const uint32_t *tokens, size_t n) const {
        live();
        std::string text(n * 8 + 16, '\0');
        for (int attempt = 0;; attempt++) {
            size_t len = 0;
            llmrt_status st = llmrt_detokenize(model_, tokens, n, &text[0], text.size(), &len);
            if (st == LLMRT_BUFFER_TOO_SMALL && attempt == 0 && len > text.size()) {
                text.resize(len);
                continue;
            }
            detail::check(st, "llmrt_detokenize");
            text.resize(len);
            return text;
        }
    }
    std::string detokenize(const std::vector<uint32_t> &tokens) const {
        return detokenize(tokens.data(), tokens.size());
    }
    std::string detokenize(uint32_t token) const { return detokenize(&token, 1); }

    /* One token's bytes as they appear inside a text (keeps its leading space;
     * control tokens give ""; a byte-fallback token gives one raw byte, possibly
     * part of a UTF-8 character): concatenating the pieces of generated tokens
     * gives the text. */
    std::string token_piece(uint32_t token) const {
        live();
        std::string piece(32, '\0');
        for (int attempt = 0;; attempt++) {
            size_t len = 0;
            llmrt_status st = llmrt_token_piece(model_, token, &piece[0], piece.size(), &len);
            if (st == LLMRT_BUFFER_TOO_SMALL && attempt == 0 && len > piece.size()) {
                piece.resize(len);
                continue;
            }
            detail::check(st, "llmrt_token_piece");
            piece.resize(len);
            return piece;
        }
    }

    /* llmrt_chat_apply: `messages` rendered with the model's chat template (or
     * `template_source` when not null), as transformers renders it. */
    std::string chat_apply(const std::vector<ChatMessage> &messages, bool add_generation_prompt = true,
                           const char *template_source = nullptr) const {
        live();
        std::vector<llmrt_chat_message> cm;
        cm.reserve(messages.size());
        for (const ChatMessage &m : messages) cm.push_back({m.role.c_str(), m.content.c_str()});
        std::string out(256, '\0');
        for (int attempt = 0;; attempt++) {
            size_t len = 0;
            llmrt_status st = llmrt_chat_apply(model_, template_source, cm.data(), cm.size(),
                                               add_generation_prompt, &out[0], out.size(), &len);
            if (st == LLMRT_BUFFER_TOO_SMALL && attempt == 0 && len > out.size()) {
                out.resize(len);
                continue;
            }
            detail::check(st, "llmrt_chat_apply");
            out.resize(len);
            return out;
        }
    }
    /* The model's own chat template source (llmrt_chat_template); throws
     * LLMRT_UNSUPPORTED when it carries none. */
    std::string chat_template() const {
        live();
        std::string out(1024, '\0');
        for (int attempt = 0;; attempt++) {
            size_t len = 0;
            llmrt_status st = llmrt_chat_template(model_, &out[0], out.size(), &len);
            if (st == LLMRT_BUFFER_TOO_SMALL && attempt == 0 && len > out.size()) {
                out.resize(len);
                continue;
            }
            detail::check(st, "llmrt_chat_template");
            out.resize(len);
            return out;
        }
    }
    /* The end-of-generation ids, ascending (llmrt_eog_tokens). */
    std::vector<uint32_t> eog_tokens() const {
        live();
        std::vector<uint32_t> ids(16);
        for (int attempt = 0;; attempt++) {
            size_t n = 0;
            llmrt_status st = llmrt_eog_tokens(model_, ids.data(), ids.size(), &n);
            if (st == LLMRT_BUFFER_TOO_SMALL && attempt == 0 && n > ids.size()) {
                ids.resize(n);
                continue;
            }
            detail::check(st, "llmrt_eog_tokens");
            ids.resize(n);
            return ids;
        }
    }
    /* Whether `token` ends a generation (llmrt_token_is_eog). */
    bool is_eog(uint32_t token) const {
        live();
        return llmrt_token_is_eog(model_, token);
    }

    /* Embeddings (llmrt_embed): the final norm's output of `tokens` as one sequence;
     * LLMRT_POOLING_NONE gives tokens.size() * hidden_size floats (row-major), MEAN and
     * LAST hidden_size floats; `normalize` scales each row to unit L2 norm. */
    std::vector<float> embed(const std::vector<uint32_t> &tokens,
                             llmrt_pooling pooling = LLMRT_POOLING_MEAN,
                             bool normalize = true) const {
        live();
        size_t need = 0;
        llmrt_status st = llmrt_embed(model_, tokens.data(), tokens.size(), pooling, normalize,
                                      nullptr, 0, &need);
        if (st != LLMRT_BUFFER_TOO_SMALL) detail::check(st, "llmrt_embed");
        std::vector<float> out(need);
        size_t len = 0;
        detail::check(llmrt_embed(model_, tokens.data(), tokens.size(), pooling, normalize,
                                  out.data(), out.size(), &len),
                      "llmrt_embed");
        out.resize(len);
        return out;
    }

    /* Polls `should_abort` during every later step (llmrt_set_abort_callback: between
     * layers on the CPU, on the calling thread, with the model's lock held: it must not
     * call into this Model); returning true fails the step with LLMRT_ABORTED and
     * commits nothing. An exception it throws aborts the step too. An empty function
     * removes it. Waits for a step running on another thread to finish. */
    void set_abort(std::function<bool()> should_abort) {
        live();
        std::unique_ptr<std::function<bool()>> next;
        if (should_abort) next.reset(new std::function<bool()>(std::move(should_abort)));
        detail::check(llmrt_set_abort_callback(model_, next ? &Model::abort_trampoline : nullptr,
                                               next.get()),
                      "llmrt_set_abort_callback");
        abort_ = std::move(next); /* the previous one is no longer called: free it */
    }

  private:
    explicit Model(llmrt_model *m) noexcept : model_(m), info_() {}

    static bool abort_trampoline(void *user) noexcept {
        try {
            return (*static_cast<std::function<bool()> *>(user))();
        } catch (...) {
            return true;
        }
    }

    void live() const {
        if (model_ == nullptr)
            detail::fail(LLMRT_INVALID_ARGUMENT, "llmrt::Model", "empty (moved-from) Model");
    }

    std::vector<llmrt_cache> batch_ids(const CacheBatch &caches,
                                       const std::vector<uint32_t> &tokens,
                                       const char *function) const {
        live();
        if (caches.size() != tokens.size())
            detail::fail(LLMRT_INVALID_ARGUMENT, function,
                         std::to_string(caches.size()) + " caches but " +
                             std::to_string(tokens.size()) + " tokens");
        std::vector<llmrt_cache> ids;
        ids.reserve(caches.size());
        for (const Cache &c : caches) ids.push_back(c.id());
        return ids;
    }

    llmrt_model *model_ = nullptr;
    llmrt_model_info info_{};
    /* The set_abort function; declared after model_, so destroyed after ~Model freed
     * the C model (which then no longer calls it). */
    std::unique_ptr<std::function<bool()>> abort_;
};

} // namespace llmrt

#endif /* LLMRT_HPP */

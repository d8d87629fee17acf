// chat: a multi-turn chat over one KV cache with the C++ wrapper (llmrt.hpp).
//
//   chat MODEL.gguf [-n N] [-t THREADS] [--temp T] [--template FILE] [TURN ...]
//
// Each turn renders the whole conversation with the model's chat template
// (Model::chat_apply; --template FILE gives another Jinja template; a model without
// one falls back to ChatML, said so at start), tokenizes it, keeps the longest prefix
// the cache already holds (Cache::truncate) and generates the answer from the rest
// (Cache::generate: up to N tokens, default 48, greedy or --temp T sampled, stopping
// at the model's end-of-generation ids), streaming the pieces as they come, a UTF-8
// character split across tokens held back until complete. `/undo` drops the last
// exchange, `/quit` ends. Turns come from the command line when given, else one per
// line from stdin.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <iterator>
#include <string>
#include <vector>

#include "llmrt.hpp"

namespace {

// ChatML, for models that carry no template (the wrapper passes it explicitly).
const char *const kChatML =
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

// The bytes of `s` that form complete UTF-8 characters; the rest stay in `s`.
std::string take_complete_utf8(std::string &s) {
    size_t n = s.size(), cut = n;
    for (size_t i = n; i > 0 && n - i < 3; i--) {
        unsigned char b = static_cast<unsigned char>(s[i - 1]);
        if ((b & 0xC0) == 0x80) continue;
        if (b >= 0xC0) {
            size_t need = b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : 2;
            if (n - (i - 1) < need) cut = i - 1;
        }
        break;
    }
    std::string ready = s.substr(0, cut);
    s.erase(0, cut);
    return ready;
}

// `s` with every byte that is not part of a valid UTF-8 character replaced by U+FFFD
// (chat templates take valid UTF-8; a small model may generate stray bytes).
std::string valid_utf8(const std::string &s) {
    std::string out;
    for (size_t i = 0; i < s.size();) {
        unsigned char b = static_cast<unsigned char>(s[i]);
        size_t len = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 0;
        bool ok = len > 0 && i + len <= s.size();
        for (size_t k = 1; ok && k < len; k++) ok = (static_cast<unsigned char>(s[i + k]) & 0xC0) == 0x80;
        if (ok && len > 1) {
            unsigned cp = b & (0x7F >> len);
            for (size_t k = 1; k < len; k++) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
            ok = cp >= (len == 2 ? 0x80u : len == 3 ? 0x800u : 0x10000u) && cp <= 0x10FFFF && (cp < 0xD800 || cp > 0xDFFF);
        }
        if (ok) {
            out.append(s, i, len);
            i += len;
        } else {
            out += "\xEF\xBF\xBD";
            i++;
        }
    }
    return out;
}

class Chat {
  public:
    Chat(llmrt::Model &model, std::string tmpl, uint32_t max_reply, const llmrt_sampler_params *params)
        : model_(model), cache_(model.reserve(0)), template_(std::move(tmpl)), max_reply_(max_reply),
          params_(params) {}

    void turn(const std::string &line) {
        messages_.push_back({"user", line});
        std::string prompt = model_.chat_apply(messages_, true, template_.empty() ? nullptr : template_.c_str());
        // As transformers does: no BOS added (templates that need one write it).
        std::vector<uint32_t> want = model_.tokenize(prompt, false);
        // Keep what the cache already holds of this rendering; feed the rest (at least
        // one token: generation starts from the last prompt token's step).
        size_t keep = 0;
        while (keep < held_.size() && keep + 1 < want.size() && held_[keep] == want[keep]) keep++;
        if (want.size() + max_reply_ > model_.info().context_length) {
            messages_.pop_back();
            std::cout << "[context full: /undo or restart]" << std::endl;
            return;
        }
        cache_.truncate(static_cast<uint32_t>(keep));
        std::vector<uint32_t> feed(want.begin() + static_cast<long>(keep), want.end());
        std::string answer, tail;
        std::cout << "> " << std::flush;
        llmrt::Generated g = cache_.generate(feed, max_reply_, params_, [&](uint32_t, std::string_view piece) {
            answer += piece;
            tail += piece;
            std::cout << take_complete_utf8(tail) << std::flush;
            return true;
        });
        std::cout << tail << "\n[" << g.tokens.size() << " tokens, "
                  << (g.reason == LLMRT_STOP_EOG ? "end of generation" : g.reason == LLMRT_STOP_MAX_TOKENS ? "max tokens" : "context full")
                  << ", kept " << keep << " of " << want.size() << " prompt tokens]" << std::endl;
        held_ = want;
        held_.insert(held_.end(), g.tokens.begin(), g.tokens.end());
        held_.pop_back(); // the last generated token is not in the cache
        messages_.push_back({"assistant", valid_utf8(answer)});
    }

    void undo() {
        if (messages_.size() < 2) {
            std::cout << "[nothing to undo]" << std::endl;
            return;
        }
        messages_.resize(messages_.size() - 2);
        std::cout << "[undone: " << messages_.size() << " messages left]" << std::endl;
    }

  private:
    llmrt::Model &model_;
    llmrt::Cache cache_;
    std::string template_;
    uint32_t max_reply_;
    const llmrt_sampler_params *params_;
    std::vector<llmrt::ChatMessage> messages_;
    std::vector<uint32_t> held_; // the tokens in the cache, in order
};

int usage(const char *argv0) {
    std::fprintf(stderr, "usage: %s MODEL.gguf [-n N] [-t THREADS] [--temp T] [--template FILE] [TURN ...]\n",
                 argv0);
    return 1;
}

} // namespace

int main(int argc, char **argv) {
    const char *path = nullptr;
    const char *template_file = nullptr;
    uint32_t max_reply = 48, threads = 0;
    float temp = 0;
    std::vector<std::string> turns;
    for (int i = 1; i < argc; i++) {
        std::string a = argv[i];
        if ((a == "-n" || a == "-t") && i + 1 < argc) {
            char *end = nullptr;
            unsigned long v = std::strtoul(argv[++i], &end, 10);
            if (*end != '\0') return usage(argv[0]);
            (a == "-n" ? max_reply : threads) = static_cast<uint32_t>(v);
        } else if (a == "--temp" && i + 1 < argc) {
            temp = std::strtof(argv[++i], nullptr);
        } else if (a == "--template" && i + 1 < argc) {
            template_file = argv[++i];
        } else if (path == nullptr && !a.empty() && a[0] != '-') {
            path = argv[i];
        } else if (path != nullptr) {
            turns.push_back(a);
        } else {
            return usage(argv[0]);
        }
    }
    if (path == nullptr || max_reply == 0) return usage(argv[0]);

    try {
        llmrt_model_options options = llmrt::default_model_options();
        options.threads = threads;
        llmrt::Model model = llmrt::Model::load(path, options);
        std::string tmpl;
        if (template_file != nullptr) {
            std::ifstream in(template_file, std::ios::binary);
            if (!in) {
                std::fprintf(stderr, "error: cannot read %s\n", template_file);
                return 1;
            }
            tmpl.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
        } else {
            try {
                (void)model.chat_apply({{"user", "hi"}});
            } catch (const llmrt::Error &e) {
                std::cout << "[no chat template in the model (" << e.message() << "): using ChatML]" << std::endl;
                tmpl = kChatML;
            }
        }
        llmrt_sampler_params params = llmrt::default_sampler_params();
        params.temperature = temp;
        std::cout << "llmrt " << llmrt::version() << " | " << model.info().architecture << " | "
                  << model.info().device_name << " | /undo, /quit" << std::endl;
        Chat chat(model, tmpl, max_reply, &params); // destroyed (cache released) before model
        auto handle = [&](const std::string &line) {
            std::cout << "you: " << line << std::endl;
            if (line == "/undo") chat.undo();
            else if (!line.empty()) chat.turn(line);
        };
        if (!turns.empty()) {
            for (const std::string &t : turns) {
                if (t == "/quit") break;
                handle(t);
            }
        } else {
            std::string line;
            while (std::getline(std::cin, line) && line != "/quit") handle(line);
        }
    } catch (const llmrt::Error &e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
    return 0;
}

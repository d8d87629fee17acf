// chat: a multi-turn loop over one KV cache with the C++ wrapper (llmrt.hpp).
//
//   chat MODEL.gguf [-n N] [-t THREADS] [TURN ...]
//
// Each user turn is appended to the same cache and the model answers with up to
// N tokens (default 24; greedy, stopping at EOS). `/undo` rewinds the cache to
// before the last turn (llmrt::Cache::truncate), `/quit` ends. Turns come from
// the command line when given, else one per line from stdin. Turns are text
// (Model::tokenize) and answers are streamed token by token with
// Model::token_piece, a UTF-8 character split across tokens held back until it
// is complete. A model without a tokenizer takes turns as token ids ("12,34 56")
// and answers with ids.
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "llmrt.hpp"

namespace {

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

// Whether the model carries a tokenizer (models without one: LLMRT_UNSUPPORTED).
bool has_tokenizer(const llmrt::Model &model) {
    try {
        (void)model.token_piece(0);
        return true;
    } catch (const llmrt::Error &e) {
        if (e.status() == LLMRT_UNSUPPORTED) return false;
        throw;
    }
}

class Chat {
  public:
    Chat(llmrt::Model &model, uint32_t max_reply)
        : model_(model), cache_(model.reserve(0)), max_reply_(max_reply),
          text_(has_tokenizer(model)) {}

    // One user turn: append it and print the answer.
    void turn(const std::string &line) {
        std::vector<uint32_t> tokens = to_tokens(line);
        if (tokens.empty()) return;
        const uint32_t ctx = model_.info().context_length;
        if (cache_.length() + pending_.size() + tokens.size() + max_reply_ + 1 > ctx) {
            std::cout << "[context full: /undo or restart]" << std::endl;
            return;
        }
        undo_.push_back({cache_.length(), pending_});
        // The last answer token was never fed to the cache: it goes first.
        std::vector<uint32_t> feed = pending_;
        feed.insert(feed.end(), tokens.begin(), tokens.end());
        uint32_t cur = llmrt::argmax(cache_.prefill(feed));
        std::string tail;
        std::cout << "> " << std::flush;
        for (uint32_t i = 0; i < max_reply_; i++) {
            if (cur == model_.info().eos_token) break;
            print_token(cur, tail);
            if (i + 1 == max_reply_) break;
            cur = cache_.decode_greedy(cur);
        }
        std::cout << tail << std::endl;
        pending_ = {cur};
    }

    // Rewinds to before the last turn.
    void undo() {
        if (undo_.empty()) {
            std::cout << "[nothing to undo]" << std::endl;
            return;
        }
        cache_.truncate(undo_.back().length);
        pending_ = undo_.back().pending;
        undo_.pop_back();
        std::cout << "[undone: " << cache_.length() << " positions]" << std::endl;
    }

  private:
    struct Mark {
        uint32_t length;
        std::vector<uint32_t> pending;
    };

    std::vector<uint32_t> to_tokens(const std::string &line) {
        // BOS (where the tokenizer wants one) only at the start of the conversation.
        if (text_) return model_.tokenize(line, cache_.length() == 0 && pending_.empty());
        std::vector<uint32_t> ids;
        std::string s = line;
        for (char &c : s)
            if (c == ',') c = ' ';
        std::istringstream in(s);
        unsigned long v;
        while (in >> v) ids.push_back(static_cast<uint32_t>(v));
        if (!in.eof()) {
            std::cout << "[this model has no tokenizer: turns are token ids, \"12,34 56\"]"
                      << std::endl;
            return {};
        }
        return ids;
    }

    // Prints `token` as it appears inside the text (its leading space kept),
    // holding back an incomplete UTF-8 tail in `tail`.
    void print_token(uint32_t token, std::string &tail) {
        if (!text_) {
            std::cout << token << ' ' << std::flush;
            return;
        }
        tail += model_.token_piece(token);
        std::cout << take_complete_utf8(tail) << std::flush;
    }

    llmrt::Model &model_;
    llmrt::Cache cache_;
    uint32_t max_reply_;
    bool text_;
    std::vector<uint32_t> pending_;
    std::vector<Mark> undo_;
};

int usage(const char *argv0) {
    std::fprintf(stderr, "usage: %s MODEL.gguf [-n N] [-t THREADS] [TURN ...]\n", argv0);
    return 1;
}

} // namespace

int main(int argc, char **argv) {
    const char *path = nullptr;
    uint32_t max_reply = 24, threads = 0;
    std::vector<std::string> turns;
    for (int i = 1; i < argc; i++) {
        std::string a = argv[i];
        if ((a == "-n" || a == "-t") && i + 1 < argc) {
            char *end = nullptr;
            unsigned long v = std::strtoul(argv[++i], &end, 10);
            if (*end != '\0') return usage(argv[0]);
            (a == "-n" ? max_reply : threads) = static_cast<uint32_t>(v);
        } else if (path == nullptr && !a.empty() && a[0] != '-') {
            path = argv[i];
        } else if (path != nullptr) {
            turns.push_back(a);
        } else {
            return usage(argv[0]);
        }
    }
    if (path == nullptr) return usage(argv[0]);

    try {
        llmrt_model_options options = llmrt::default_model_options();
        options.threads = threads;
        llmrt::Model model = llmrt::Model::load(path, options);
        std::cout << "llmrt " << llmrt::version() << " | " << model.info().architecture << " | "
                  << model.info().device_name << " | /undo, /quit" << std::endl;
        Chat chat(model, max_reply); // destroyed (cache released) before model
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

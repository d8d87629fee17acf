//! Chat: rendering a model's chat template over messages (`template`), the model's
//! end-of-generation tokens and chat metadata (`eog`), and stop strings over streamed text
//! (`stop`). The `Model` methods here are what the C API's `llmrt_chat_*`,
//! `llmrt_token_is_eog` and `llmrt_eog_tokens` call.

pub mod eog;
pub mod stop;
pub mod template;

pub use eog::ChatInfo;
pub use stop::{Fed, StopMatcher};
pub use template::{render, DateTime, Message, RenderOptions};

use crate::runtime::Model;
use crate::{Error, Result};

impl Model {
    /// The model's chat metadata (template, bos/eos strings, end-of-generation ids).
    pub fn chat_info(&self) -> &ChatInfo {
        &self.chat
    }

    /// The model's own chat template, if it carries one.
    pub fn chat_template(&self) -> Option<&str> {
        self.chat.template.as_deref()
    }

    /// Renders `template` (None: the model's own) over `messages` with the model's bos/eos
    /// strings. `now`: the date `strftime_now` sees (None: now, UTC). A model without a
    /// template asked for its own: LLMRT_UNSUPPORTED; a template that fails:
    /// LLMRT_INVALID_ARGUMENT naming its line (see [`template::render`]).
    pub fn chat_apply(
        &self,
        template: Option<&str>,
        messages: &[Message<'_>],
        add_generation_prompt: bool,
        now: Option<DateTime>,
    ) -> Result<String> {
        let src = match template {
            Some(t) => t,
            None => self.chat.template.as_deref().ok_or_else(|| {
                Error::unsupported(
                    "this model carries no chat template (GGUF tokenizer.chat_template, HF chat_template.jinja or \
                     tokenizer_config.json chat_template); pass one",
                )
            })?,
        };
        let opts = RenderOptions {
            add_generation_prompt,
            bos_token: &self.chat.bos_token,
            eos_token: &self.chat.eos_token,
            now,
        };
        render(src, messages, &opts)
    }

    /// Whether `token` ends a generation (see [`eog`]); false for ids outside the vocabulary.
    pub fn is_eog(&self, token: u32) -> bool {
        self.chat.is_eog(token)
    }

    /// The end-of-generation ids, ascending.
    pub fn eog_tokens(&self) -> &[u32] {
        &self.chat.eog
    }
}

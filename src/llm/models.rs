//! Context windows of well-known model families, in tokens, so the prompt window can be sized
//! without configuration. `agents.defaults.context_window` overrides the table; a model the
//! table does not know gets [`DEFAULT_CONTEXT_WINDOW`], a conservative size every current
//! hosted model and most local servers accept (docs/configuration.md).

/// The window assumed for a model the table does not know.
pub const DEFAULT_CONTEXT_WINDOW: u64 = 32_768;

/// (name fragment, window): the first fragment found in the lower-cased model name wins, so
/// more specific fragments come first.
const TABLE: &[(&str, u64)] = &[
    // OpenAI
    ("gpt-4.1", 1_047_576),
    ("gpt-5", 400_000),
    ("gpt-4o", 128_000),
    ("gpt-4-turbo", 128_000),
    ("gpt-4-32k", 32_768),
    ("gpt-4", 8_192),
    ("gpt-3.5-turbo", 16_385),
    ("o1-mini", 128_000),
    ("o1", 200_000),
    ("o3", 200_000),
    ("o4-mini", 200_000),
    // Anthropic
    ("claude", 200_000),
    // Google
    ("gemini-1.5", 1_048_576),
    ("gemini", 1_048_576),
    ("gemma", 8_192),
    // Meta
    ("llama3.1", 131_072),
    ("llama-3.1", 131_072),
    ("llama3.2", 131_072),
    ("llama-3.2", 131_072),
    ("llama3.3", 131_072),
    ("llama-3.3", 131_072),
    ("llama-4", 1_048_576),
    ("llama3", 8_192),
    ("llama-3", 8_192),
    ("llama2", 4_096),
    ("llama-2", 4_096),
    // Alibaba, Mistral, DeepSeek, others
    ("qwen3", 40_960),
    ("qwen2.5", 32_768),
    ("qwen", 32_768),
    ("mistral-large", 131_072),
    ("mistral-small", 32_768),
    ("mistral-nemo", 131_072),
    ("mixtral", 32_768),
    ("mistral", 32_768),
    ("deepseek", 65_536),
    ("phi-3", 4_096),
    ("phi3", 4_096),
    ("grok", 131_072),
];

/// The context window of `model` from the table, if the table knows it.
pub fn known_context_window(model: &str) -> Option<u64> {
    let m = model.to_ascii_lowercase();
    // `provider/model` names (OpenRouter) and `model:tag` names (Ollama) match on the model.
    let name = m.rsplit('/').next().unwrap_or(&m);
    TABLE
        .iter()
        .find(|(frag, _)| name.contains(frag))
        .map(|(_, w)| *w)
}

/// The context window of `model`: the table's, else [`DEFAULT_CONTEXT_WINDOW`].
pub fn context_window(model: &str) -> u64 {
    known_context_window(model).unwrap_or(DEFAULT_CONTEXT_WINDOW)
}

/// Fragments of model names that take images (`agents.*.vision = "auto"`): the first match
/// in this list decides, so the text-only exceptions come first.
const VISION: &[(&str, bool)] = &[
    ("gpt-3.5", false),
    ("o1-mini", false),
    ("o3-mini", false),
    ("gpt-4-32k", false),
    ("gpt-4-0", false),
    ("gpt-4o", true),
    ("gpt-4.1", true),
    ("gpt-4-turbo", true),
    ("gpt-5", true),
    ("o1", true),
    ("o3", true),
    ("o4", true),
    ("claude-2", false),
    ("claude-instant", false),
    ("claude", true),
    ("gemini", true),
    ("gemma3", true),
    ("gemma-3", true),
    ("llava", true),
    ("bakllava", true),
    ("vision", true),
    ("-vl", true),
    ("pixtral", true),
    ("llama-4", true),
    ("llama4", true),
    ("grok-4", true),
    ("minicpm-v", true),
    ("moondream", true),
];

/// Whether `model` takes images, from the table (unknown models: no).
pub fn supports_vision(model: &str) -> bool {
    let m = model.to_ascii_lowercase();
    let name = m.rsplit('/').next().unwrap_or(&m);
    VISION
        .iter()
        .find(|(frag, _)| name.contains(frag))
        .is_some_and(|(_, v)| *v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vision_follows_the_model_family() {
        assert!(supports_vision("gpt-4o-mini"));
        assert!(supports_vision("anthropic/claude-sonnet-4-5"));
        assert!(supports_vision("qwen2.5-vl:7b"));
        assert!(!supports_vision("gpt-3.5-turbo"));
        assert!(!supports_vision("o3-mini"));
        assert!(!supports_vision("llama3.1:8b"));
        assert!(!supports_vision("fake-model"));
    }

    #[test]
    fn well_known_families_and_a_conservative_default() {
        assert_eq!(context_window("gpt-4o-mini"), 128_000);
        assert_eq!(context_window("gpt-4.1-nano"), 1_047_576);
        assert_eq!(context_window("gpt-4"), 8_192);
        assert_eq!(context_window("claude-sonnet-4-20250514"), 200_000);
        assert_eq!(context_window("anthropic/claude-3.5-haiku"), 200_000);
        assert_eq!(context_window("llama3:8b"), 8_192);
        assert_eq!(context_window("llama3.1:70b"), 131_072);
        assert_eq!(context_window("Qwen2.5-7B-Instruct"), 32_768);
        assert_eq!(known_context_window("my-own-finetune"), None);
        assert_eq!(context_window("my-own-finetune"), DEFAULT_CONTEXT_WINDOW);
    }
}

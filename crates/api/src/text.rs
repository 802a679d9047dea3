//! Token ids back to text as they stream: whole characters only, and stop strings cut the
//! text where they begin (text that could still become a stop string is held back).

use std::sync::Arc;

use neuroshard_data::GenesisTokenizer;

pub struct Detokenizer {
    tokenizer: Arc<GenesisTokenizer>,
    stops: Vec<String>,
    ids: Vec<u32>,
    /// Bytes of the decoded text already handed out.
    sent: usize,
    stopped: bool,
}

impl Detokenizer {
    pub fn new(tokenizer: Arc<GenesisTokenizer>, stops: Vec<String>) -> Self {
        Self {
            tokenizer,
            stops,
            ids: Vec::new(),
            sent: 0,
            stopped: false,
        }
    }

    /// Tokens taken so far.
    pub fn tokens(&self) -> usize {
        self.ids.len()
    }

    /// Adds a token; returns the text now safe to send, and whether a stop string ended it.
    pub fn push(&mut self, id: u32) -> (String, bool) {
        if self.stopped {
            return (String::new(), true);
        }
        self.ids.push(id);
        let text = self.tokenizer.decode(&self.ids).unwrap_or_default();
        if let Some(at) = self
            .stops
            .iter()
            .filter_map(|s| text.find(s.as_str()))
            .min()
        {
            self.stopped = true;
            let out = text.get(self.sent..at).unwrap_or_default().to_string();
            self.sent = at;
            return (out, true);
        }
        // A byte-level token may end inside a character: wait for the rest of it.
        let mut end = text.len();
        if text.ends_with('\u{FFFD}') {
            end -= '\u{FFFD}'.len_utf8();
        }
        // Hold back a tail that is the start of some stop string.
        let hold = self
            .stops
            .iter()
            .flat_map(|s| {
                (1..s.len())
                    .filter(|k| s.is_char_boundary(*k))
                    .map(move |k| &s[..k])
            })
            .filter(|prefix| text[..end].ends_with(prefix))
            .map(str::len)
            .max()
            .unwrap_or(0);
        let end = end - hold;
        let out = text.get(self.sent..end).unwrap_or_default().to_string();
        self.sent = self.sent.max(end);
        (out, false)
    }

    /// The held-back rest, when the stream ended.
    pub fn finish(&mut self) -> String {
        if self.stopped {
            return String::new();
        }
        let text = self.tokenizer.decode(&self.ids).unwrap_or_default();
        let out = text.get(self.sent..).unwrap_or_default().to_string();
        self.sent = text.len();
        out
    }
}

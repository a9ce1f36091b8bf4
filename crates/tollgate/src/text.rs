//! Text built on the stack: a response's rate-limit fields, a check's ban keys.

use std::fmt;

use arrayvec::ArrayString;

use crate::key::KeyOut;

/// Text as it is written: on the stack up to 256 bytes, then on the heap. A piece is appended
/// with a bounds check and a copy, and the text is read as it is: a small vector's appends, or
/// a byte buffer's UTF-8 check when it is read, cost more than the rest of a field or key.
// It lives on the stack of the one call that writes it: its size is the point.
#[allow(clippy::large_enum_variant)]
pub(crate) enum StackText {
    Stack(ArrayString<256>),
    Heap(String),
}

impl StackText {
    #[inline]
    pub(crate) fn new() -> StackText {
        StackText::Stack(ArrayString::new())
    }

    #[inline]
    pub(crate) fn as_str(&self) -> &str {
        match self {
            StackText::Stack(text) => text,
            StackText::Heap(text) => text,
        }
    }

    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        match self {
            StackText::Stack(text) => text.is_empty(),
            StackText::Heap(text) => text.is_empty(),
        }
    }

    pub(crate) fn clear(&mut self) {
        match self {
            StackText::Stack(text) => text.clear(),
            StackText::Heap(text) => text.clear(),
        }
    }

    /// Moves the text to the heap (it outgrew the stack), with `more` after it.
    #[cold]
    fn spill(&mut self, more: &str) {
        let mut heap = String::with_capacity(2 * (self.as_str().len() + more.len()));
        heap.push_str(self.as_str());
        heap.push_str(more);
        *self = StackText::Heap(heap);
    }
}

impl fmt::Write for StackText {
    #[inline]
    fn write_str(&mut self, s: &str) -> fmt::Result {
        KeyOut::push_str(self, s);
        Ok(())
    }
}

impl KeyOut for StackText {
    #[inline]
    fn push_str(&mut self, s: &str) {
        let spilled = match self {
            StackText::Stack(text) => text.try_push_str(s).is_err(),
            StackText::Heap(text) => {
                text.push_str(s);
                false
            }
        };
        if spilled {
            self.spill(s);
        }
    }

    #[inline]
    fn push_ascii(&mut self, b: u8) {
        let mut buf = [0; 4];
        KeyOut::push_str(self, char::from(b).encode_utf8(&mut buf));
    }

    #[inline]
    fn len(&self) -> usize {
        self.as_str().len()
    }

    fn truncate(&mut self, len: usize) {
        match self {
            StackText::Stack(text) => text.truncate(len),
            StackText::Heap(text) => text.truncate(len),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::fmt::Write as _;

    use super::*;

    #[test]
    fn text_spills_to_the_heap_whole() {
        let mut text = StackText::new();
        let piece = "0123456789abcdef-";
        for _ in 0..40 {
            text.write_str(piece).unwrap();
            text.push_ascii(b'|');
        }
        assert!(
            matches!(text, StackText::Heap(_)),
            "680 bytes outgrow the stack"
        );
        assert_eq!(text.as_str(), format!("{piece}|").repeat(40));
        text.truncate(18);
        assert_eq!(text.as_str(), "0123456789abcdef-|");
        text.clear();
        assert_eq!(text.len(), 0);
    }
}

"""Task codecs: request → ONNX rows (windows) → response. Pure numpy + tokenizers, shared with
training-side evaluation so that what we evaluate is what we serve."""

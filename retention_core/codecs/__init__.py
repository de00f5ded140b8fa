"""Task codecs: request → graph rows (windows) → response. numpy + tokenizers only, shared by the
service and training-side evaluation so that what we evaluate is what we serve."""

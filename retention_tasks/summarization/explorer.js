// The explorer page's view of extractive summarization (served in /explorer/views.js;
// service/static/explorer.js): the explanation's own document is what its offsets index.
VIEWS.summarization = {
  title: "Summary",
  shade(explanation, body, of, layers) {
    shade($("shaded"), null, explanation.document, of("document"), layers, null);
  },
  result(body, box) {
    box.appendChild(element("div", body.summary || "(empty summary)"));
    box.appendChild(element("div", `${body.sentences.length} sentence(s) selected`, "muted"));
  },
};

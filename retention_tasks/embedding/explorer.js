// The explorer page's view of embeddings (served in /explorer/views.js; service/static/explorer.js).
VIEWS.embedding = {
  title: "Embedding",
  shade(explanation, body, of, layers) {
    shade($("shaded"), null, $("text").value, of("text"), layers, null);
  },
  result(body, box) {
    const vector = body.embedding;
    const norm = Math.sqrt(vector.reduce((sum, v) => sum + v * v, 0));
    box.appendChild(element("div", `${vector.length} dimensions, norm ${norm.toFixed(4)}`, "label"));
    box.appendChild(element("div", `[${vector.slice(0, 6).map((v) => v.toFixed(4)).join(", ")}, …]`, "muted"));
  },
};

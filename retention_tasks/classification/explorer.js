// The explorer page's view of classification (served in /explorer/views.js; service/static/explorer.js).
VIEWS.classification = {
  title: "Label",
  shade(explanation, body, of, layers) {
    shade($("shaded"), null, $("text").value, of("text"), layers, null);
  },
  result(body, box) {
    box.appendChild(element("div", body.label, "label"));
    const table = element("table");
    for (const [label, score] of Object.entries(body.scores)) {
      const row = element("tr");
      row.append(element("td", label), element("td", score.toFixed(4)));
      table.appendChild(row);
    }
    box.appendChild(table);
  },
};
